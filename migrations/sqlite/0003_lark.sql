-- The Lark connector: chat links, durable event dedup, and the reply outbox.

-- messages from a chat go to one open session; close removes the link.
create table lark_links (
    chat_id    text primary key,
    session_id text not null unique references sessions (session_id),
    linked_at  integer not null
);

-- every event accepted from Lark, kept so a redelivery (Lark retries for
-- about 7 hours, also across our restarts) is acknowledged and not enqueued twice.
create table lark_events (
    app_id      text not null,
    event_id    text not null,
    message_id  text,
    received_at integer not null,
    primary key (app_id, event_id)
) without rowid;
-- the second guard: one message, one turn, per app (two bots in one chat both get it).
create unique index lark_events_message on lark_events (app_id, message_id)
    where message_id is not null;

-- the outbox: written in the completion's transaction, sent by the dispatcher.
create table lark_replies (
    turn_id         text primary key references turns (turn_id),
    session_id      text not null,
    chat_id         text not null,
    message_id      text not null,
    -- the answer to send, split into parts of at most Lark's text limit.
    text            text not null,
    parts_sent      integer not null default 0,
    state           text not null check (state in ('pending', 'sent', 'failed')),
    attempts        integer not null default 0,
    error           text,
    next_attempt_at integer not null,
    created_at      integer not null,
    updated_at      integer not null
);
create index lark_replies_due on lark_replies (next_attempt_at) where state = 'pending';
