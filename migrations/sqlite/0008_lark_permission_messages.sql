-- The Lark outbox of permission requests: a request made in a session linked
-- to a chat gets one message in that chat, saying what is asked and how to
-- answer. Written in the request's own transaction (so a crash cannot lose
-- it, and the primary key means once per request), sent by the reply
-- dispatcher with Lark's send-message API (there is no message to reply to),
-- with the same retries and backoff as replies. `text` is content, kept like
-- message text.
create table lark_permission_messages (
    session_id      text not null,
    request_id      text not null,
    chat_id         text not null,
    text            text not null,
    parts_sent      integer not null default 0,
    state           text not null check (state in ('pending', 'sent', 'failed')),
    attempts        integer not null default 0,
    -- failed attempts, apart from waits Lark asked for (as for replies).
    failures        integer not null default 0,
    error           text,
    next_attempt_at integer not null,
    created_at      integer not null,
    updated_at      integer not null,
    primary key (session_id, request_id),
    foreign key (session_id, request_id) references permission_requests (session_id, request_id)
) without rowid;
create index lark_permission_messages_due on lark_permission_messages (next_attempt_at)
    where state = 'pending';
