-- Permission requests: an agent CLI's tool-approval dialogs relayed by its
-- bridge, answered once from the Web page, the API or Lark. The description and
-- preview are content, kept like message text (bytea, as turns' text: any
-- UTF-8, U+0000 included). `(session_id, request_id)` is the idempotency key
-- of a create, and the backstop for two replicas creating it at once.
create table permission_requests (
    session_id    text collate "C" not null references sessions (session_id),
    request_id    text collate "C" not null,
    tool_name     text not null,
    description   bytea not null,
    input_preview bytea not null,
    state         text not null check (state in ('pending', 'allowed', 'denied', 'expired')),
    created_at    bigint not null,
    -- when answered, or expired by the session's close.
    answered_at   bigint,
    answered_via  text check (answered_via in ('owner', 'lark')),
    primary key (session_id, request_id)
);

-- The event log gains `permission` events ({request_id, state}).
alter table session_events add column request_id text;
alter table session_events drop constraint session_events_kind_check;
alter table session_events add constraint session_events_kind_check
    check (kind in ('turn', 'session', 'permission'));
alter table session_events drop constraint session_events_state_check;
alter table session_events add constraint session_events_state_check
    check (state in ('queued', 'claimed', 'completed', 'released', 'cancelled', 'closed',
                     'pending', 'allowed', 'denied', 'expired'));

-- Who on a linked Lark chat may answer permission requests: a JSON array of
-- Lark open ids; empty, nobody (the Web page still can).
alter table lark_links add column approvers text not null default '[]';
