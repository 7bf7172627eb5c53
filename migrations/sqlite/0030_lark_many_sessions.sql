-- One bot, many sessions: a chat holds several sessions, one of them its
-- current one; a session stays linked to at most one chat (linking it
-- elsewhere moves it). Replies to what the broker sent find their session.

-- `lark_links` was keyed by chat (one session per chat): rebuilt keyed by
-- session, the chat's sessions numbered by `linked_at` (then session id).
create table lark_links_new (
    session_id text primary key references sessions (session_id),
    chat_id    text not null,
    linked_at  integer not null,
    approvers  text not null default '[]'
) without rowid;
insert into lark_links_new (session_id, chat_id, linked_at, approvers)
    select session_id, chat_id, linked_at, approvers from lark_links;
drop table lark_links;
alter table lark_links_new rename to lark_links;
create index lark_links_chat on lark_links (chat_id, linked_at, session_id);

-- the session a chat's plain messages go to (`/use N`, the last linked).
-- No foreign key: a session unlinked or pruned since is simply not current.
alter table lark_chats add column current_session_id text;

-- a note about a session (its link, its close) names it, so it is pruned
-- with it and a reply to it finds it; `reply` 0 is a note sent as a new
-- message in the chat (a close: there is no message to answer), `message_id`
-- then only its key.
alter table lark_notes add column session_id text;
alter table lark_notes add column reply integer not null default 1;
create index lark_notes_session on lark_notes (session_id) where session_id is not null;
-- answers to commands that named no session are pruned by age (retention).
create index lark_notes_old on lark_notes (created_at) where session_id is null;

-- every message the broker sent in a chat for a session (an answer's part,
-- a permission card, a note naming it): a person's reply to one (its
-- `parent_id`, or its thread's `root_id`) goes to that session.
create table lark_sent (
    message_id text primary key,
    session_id text not null,
    chat_id    text not null,
    sent_at    integer not null
) without rowid;
create index lark_sent_session on lark_sent (session_id);
