-- The broker core on PostgreSQL: registrations, sessions, turns and claims.
-- The same tables and columns as migrations/sqlite, with PostgreSQL types:
-- times are bigint milliseconds since the Unix epoch (UTC), counters bigint,
-- enumerations text with a check. Ids compare bytewise (collate "C"), so the
-- ULID order of session ids is the list order whatever the database's locale.
--
-- Several broker replicas share these tables. Every write that touches a
-- session first locks its row (`select … from sessions … for update`): that
-- row is the per-session serialization point. The unique constraints below are
-- the backstops for what no single session row guards (a claim id used on two
-- sessions at once, a Lark event reaching two replicas at once).

-- bind-agent-thread: the exact tuple a host session registered.
create table agent_threads (
    goal_id         text not null,
    agent_id        text not null,
    host_surface    text not null,
    host_session_id text not null,
    registered_at   bigint not null,
    primary key (goal_id, agent_id, host_surface, host_session_id)
);

create table sessions (
    -- ses_<ULID>: the id orders sessions by creation (closely enough across
    -- replicas) and serves as the list cursor.
    session_id           text collate "C" primary key,
    goal_id              text not null,
    agent_id             text not null,
    host_surface         text not null,
    host_session_id      text not null,
    executor_endpoint_id text not null,
    state                text not null check (state in ('open', 'closed')),
    created_at           bigint not null,
    closed_at            bigint,
    -- the next turn's seq; seq is assigned in commit order (under the row lock).
    next_seq             bigint not null default 1,
    -- kept beside the queue so the 10,000-turn limit costs no count.
    queued_count         bigint not null default 0,
    -- the one active claim, so "claim_active" costs no scan.
    active_claim_id      text,
    -- the next entry's number in the session's event log (0002).
    next_event_no        bigint not null default 1,
    foreign key (goal_id, agent_id, host_surface, host_session_id)
        references agent_threads (goal_id, agent_id, host_surface, host_session_id)
);

-- one open session per exact tuple; after close a new bind makes a new session.
-- Two replicas binding the same tuple at once: the second insert fails here
-- and the broker takes the decision again (it then finds the first session).
create unique index sessions_open_tuple
    on sessions (goal_id, agent_id, host_surface, host_session_id)
    where state = 'open';
create index sessions_goal on sessions (goal_id, session_id);
create index sessions_agent on sessions (agent_id, session_id);

create table turns (
    turn_id           text collate "C" primary key,
    session_id        text collate "C" not null references sessions (session_id),
    seq               bigint not null,
    origin            text not null check (origin in ('web', 'lark')),
    -- the message, as its UTF-8 bytes: PostgreSQL text cannot hold U+0000,
    -- which a message may contain.
    text              bytea not null,
    client_message_id text,
    lark_chat_id      text,
    lark_message_id   text,
    state             text not null check (state in ('queued', 'claimed', 'completed', 'cancelled')),
    enqueued_at       bigint not null,
    claimed_at        bigint,
    completed_at      bigint,
    -- claims this turn has had; the next claim's attempt is claim_count + 1.
    claim_count       bigint not null default 0,
    current_claim_id  text,
    completion_id     text,
    -- the completion's response object, as JSON text (escaped, so never U+0000).
    response          text,
    cancel_reason     text check (cancel_reason in ('session_closed')),
    unique (session_id, seq)
);

-- enqueue idempotency for the life of the session (not a time window).
create unique index turns_client_message_id
    on turns (session_id, client_message_id)
    where client_message_id is not null;
create unique index turns_completion_id
    on turns (session_id, completion_id)
    where completion_id is not null;
-- the queue head: the oldest queued turn of a session, whatever the history size.
create index turns_queued on turns (session_id, seq) where state = 'queued';
-- the oldest queued turn over all sessions (the /metrics age gauge).
create index turns_queued_at on turns (enqueued_at) where state = 'queued';

-- every claim ever made: a turn can be claimed again after a release, and each
-- claim id keeps answering the same turn, across restarts and replicas. The
-- primary key is what refuses one claim id on two sessions claimed at once.
create table claims (
    claim_id    text primary key,
    session_id  text collate "C" not null references sessions (session_id),
    turn_id     text collate "C" not null references turns (turn_id),
    attempt     bigint not null,
    state       text not null check (state in ('active', 'released', 'completed')),
    claimed_at  bigint not null,
    released_at bigint
);
