-- A `notification` event may say `typing_unconfirmed`: a message a waker
-- typed into the idle agent was not confirmed by its UserPromptSubmit hook
-- and stays queued (HOOKS.md "Waking an idle agent"). SQLite cannot change
-- a table's checks in place: the log is copied into a new table, as in 0009.
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
                    'idle_prompt', 'permission_prompt', 'typing_unconfirmed')),
    at         integer not null,
    primary key (session_id, event_no)
) without rowid;
insert into session_events_new (session_id, event_no, kind, turn_id, seq, request_id, state, at)
    select session_id, event_no, kind, turn_id, seq, request_id, state, at from session_events;
drop table session_events;
alter table session_events_new rename to session_events;
