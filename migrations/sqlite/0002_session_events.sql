-- The durable per-session event log behind GET /v1/sessions/{id}/events.
-- Written in the same transaction as the change it reports; content-free.

alter table sessions add column next_event_no integer not null default 1;

create table session_events (
    session_id text not null references sessions (session_id),
    -- 1, 2, 3, … per session: the SSE `id:`, resumed with Last-Event-ID.
    event_no   integer not null,
    -- 'turn' (turn_id, seq, state set) or 'session' (state 'closed').
    kind       text not null check (kind in ('turn', 'session')),
    turn_id    text,
    seq        integer,
    state      text not null check (state in
                   ('queued', 'claimed', 'completed', 'released', 'cancelled', 'closed')),
    at         integer not null,
    primary key (session_id, event_no)
) without rowid;
