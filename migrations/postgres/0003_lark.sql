-- The Lark connector: chat links, durable event dedup, and the reply outbox.

-- messages from a chat go to one open session; close removes the link.
create table lark_links (
    chat_id    text primary key,
    session_id text collate "C" not null unique references sessions (session_id),
    linked_at  bigint not null
);

-- every event accepted from Lark, kept so a redelivery (Lark retries for
-- about 7 hours, also across our restarts, and may reach any replica) is
-- acknowledged and not enqueued twice. Two replicas inserting the same event
-- at once: the second waits for the first and then finds it.
create table lark_events (
    app_id      text not null,
    event_id    text not null,
    message_id  text,
    received_at bigint not null,
    primary key (app_id, event_id)
);
-- the second guard: one message, one turn, per app (two bots in one chat both get it).
create unique index lark_events_message on lark_events (app_id, message_id)
    where message_id is not null;

-- the outbox: written in the completion's transaction, sent by a dispatcher.
-- A dispatcher leases the rows it takes (`for update skip locked`, then
-- next_attempt_at pushed 30 s ahead), so two replicas never send one reply at once.
create table lark_replies (
    turn_id         text collate "C" primary key references turns (turn_id),
    session_id      text collate "C" not null,
    chat_id         text not null,
    message_id      text not null,
    -- the answer to send (UTF-8 bytes, as turns.text), split into parts of at
    -- most Lark's text limit when sent.
    text            bytea not null,
    parts_sent      bigint not null default 0,
    state           text not null check (state in ('pending', 'sent', 'failed')),
    attempts        bigint not null default 0,
    error           text,
    next_attempt_at bigint not null,
    created_at      bigint not null,
    updated_at      bigint not null
);
create index lark_replies_due on lark_replies (next_attempt_at) where state = 'pending';
