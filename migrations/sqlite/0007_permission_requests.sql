-- Permission requests: an agent CLI's tool-approval dialogs relayed by its
-- bridge, answered once from the Web page, the API or Lark. The description and
-- preview are content, kept like message text. `(session_id, request_id)` is
-- the idempotency key of a create: request ids are unique per session.
create table permission_requests (
    session_id    text not null references sessions (session_id),
    request_id    text not null,
    tool_name     text not null,
    description   text not null,
    input_preview text not null,
    state         text not null check (state in ('pending', 'allowed', 'denied', 'expired')),
    created_at    integer not null,
    -- when answered, or expired by the session's close.
    answered_at   integer,
    answered_via  text check (answered_via in ('owner', 'lark')),
    primary key (session_id, request_id)
) without rowid;

-- The event log gains `permission` events ({request_id, state}). SQLite cannot
-- change a table's checks in place: the log is copied into a new table.
create table session_events_new (
    session_id text not null references sessions (session_id),
    event_no   integer not null,
    -- 'turn' (turn_id, seq, state), 'session' (state 'closed') or
    -- 'permission' (request_id, state).
    kind       text not null check (kind in ('turn', 'session', 'permission')),
    turn_id    text,
    seq        integer,
    request_id text,
    state      text not null check (state in
                   ('queued', 'claimed', 'completed', 'released', 'cancelled', 'closed',
                    'pending', 'allowed', 'denied', 'expired')),
    at         integer not null,
    primary key (session_id, event_no)
) without rowid;
insert into session_events_new (session_id, event_no, kind, turn_id, seq, state, at)
    select session_id, event_no, kind, turn_id, seq, state, at from session_events;
drop table session_events;
alter table session_events_new rename to session_events;

-- Who on a linked Lark chat may answer permission requests: a JSON array of
-- Lark open ids; empty, nobody (the Web page still can).
alter table lark_links add column approvers text not null default '[]';
