-- Presence (HOOKS.md): whether a session's agent is there. `agent_state` is
-- what its host last reported ('working', 'waiting' or 'away'), since
-- `agent_since` (null: since the session was created); `agent_heard_at` is
-- when a host was last heard from (null: never), from which the projection
-- shows 'away' after 10 silent minutes. Content-free, like the projection.
alter table sessions add column agent_state text not null default 'away'
    check (agent_state in ('working', 'waiting', 'away'));
alter table sessions add column agent_since integer;
alter table sessions add column agent_heard_at integer;

-- The event log gains `agent` events ({state, since}: working, waiting, away)
-- and `notification` events (the agent's idle or permission prompt at its
-- terminal; its text is not stored). SQLite cannot change a table's checks in
-- place: the log is copied into a new table.
create table session_events_new (
    session_id text not null references sessions (session_id),
    event_no   integer not null,
    -- 'turn' (turn_id, seq, state), 'session' (state 'closed'),
    -- 'permission' (request_id, state), 'agent' (state) or 'notification' (state).
    kind       text not null check (kind in ('turn', 'session', 'permission', 'agent',
                                             'notification')),
    turn_id    text,
    seq        integer,
    request_id text,
    state      text not null check (state in
                   ('queued', 'claimed', 'completed', 'released', 'cancelled', 'closed',
                    'pending', 'allowed', 'denied', 'expired',
                    'working', 'waiting', 'away',
                    'idle_prompt', 'permission_prompt')),
    at         integer not null,
    primary key (session_id, event_no)
) without rowid;
insert into session_events_new (session_id, event_no, kind, turn_id, seq, request_id, state, at)
    select session_id, event_no, kind, turn_id, seq, request_id, state, at from session_events;
drop table session_events;
alter table session_events_new rename to session_events;
