-- Pairing a Lark chat with a session by a one-time code (`/link <code>` sent
-- to the bot), and the broker's own answers to such commands.

-- a code the owner asked for: valid 10 minutes, once. Only its SHA-256 is
-- kept (codes are random, so no salt is needed): a copy of the database
-- never gives a usable code away.
create table lark_pair_codes (
    code_hash  text primary key,
    session_id text not null references sessions (session_id),
    created_at integer not null,
    expires_at integer not null,
    used_at    integer
) without rowid;
create index lark_pair_codes_session on lark_pair_codes (session_id);

-- what the broker remembers of a chat apart from its links: the wrong codes
-- sent from it (`failed_codes` since `failed_since`), which throttle `/link`.
create table lark_chats (
    chat_id      text primary key,
    failed_codes integer not null default 0,
    failed_since integer not null default 0
) without rowid;

-- the outbox of the broker's answers to commands: one reply to the command's
-- message (the primary key: a redelivered command is never answered twice),
-- a card written in the command's transaction, sent by the reply dispatcher
-- with the same retries as replies. `text` is the card's JSON.
create table lark_notes (
    message_id      text primary key,
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
    updated_at      integer not null
) without rowid;
create index lark_notes_due on lark_notes (next_attempt_at) where state = 'pending';
