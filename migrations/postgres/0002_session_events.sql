-- The durable per-session event log behind GET /v1/sessions/{id}/events.
-- Written in the same transaction as the change it reports; content-free.
-- (sessions.next_event_no, the next number, is created with the table in 0001.)
-- Each change also sends `pg_notify('loopx_changes', session_id)` in its
-- transaction, delivered on commit: how a replica learns of another's changes.

create table session_events (
    session_id text collate "C" not null references sessions (session_id),
    -- 1, 2, 3, … per session: the SSE `id:`, resumed with Last-Event-ID.
    event_no   bigint not null,
    -- 'turn' (turn_id, seq, state set) or 'session' (state 'closed').
    kind       text not null check (kind in ('turn', 'session')),
    turn_id    text,
    seq        bigint,
    state      text not null check (state in
                   ('queued', 'claimed', 'completed', 'released', 'cancelled', 'closed')),
    at         bigint not null,
    primary key (session_id, event_no)
);
