-- The broker core: registrations, sessions, turns and claims.
-- Times are integer milliseconds since the Unix epoch (UTC).

-- bind-agent-thread: the exact tuple a host session registered.
create table agent_threads (
    goal_id         text not null,
    agent_id        text not null,
    host_surface    text not null,
    host_session_id text not null,
    registered_at   integer not null,
    primary key (goal_id, agent_id, host_surface, host_session_id)
) without rowid;

create table sessions (
    -- ses_<ULID>: minted by one monotonic generator, so the id orders sessions
    -- by creation and serves as the list cursor.
    session_id           text primary key,
    goal_id              text not null,
    agent_id             text not null,
    host_surface         text not null,
    host_session_id      text not null,
    executor_endpoint_id text not null,
    state                text not null check (state in ('open', 'closed')),
    created_at           integer not null,
    closed_at            integer,
    -- the next turn's seq; seq is assigned in commit order.
    next_seq             integer not null default 1,
    -- kept beside the queue so the 10,000-turn limit costs no count.
    queued_count         integer not null default 0,
    -- the one active claim, so "claim_active" costs no scan.
    active_claim_id      text,
    foreign key (goal_id, agent_id, host_surface, host_session_id)
        references agent_threads (goal_id, agent_id, host_surface, host_session_id)
);

-- one open session per exact tuple; after close a new bind makes a new session.
create unique index sessions_open_tuple
    on sessions (goal_id, agent_id, host_surface, host_session_id)
    where state = 'open';
create index sessions_goal on sessions (goal_id, session_id);
create index sessions_agent on sessions (agent_id, session_id);

create table turns (
    turn_id           text primary key,
    session_id        text not null references sessions (session_id),
    seq               integer not null,
    origin            text not null check (origin in ('web', 'lark')),
    text              text not null,
    client_message_id text,
    lark_chat_id      text,
    lark_message_id   text,
    state             text not null check (state in ('queued', 'claimed', 'completed', 'cancelled')),
    enqueued_at       integer not null,
    claimed_at        integer,
    completed_at      integer,
    -- claims this turn has had; the next claim's attempt is claim_count + 1.
    claim_count       integer not null default 0,
    current_claim_id  text,
    completion_id     text,
    -- the completion's response object, as JSON text.
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

-- every claim ever made: a turn can be claimed again after a release, and each
-- claim id keeps answering the same turn, across restarts.
create table claims (
    claim_id    text primary key,
    session_id  text not null references sessions (session_id),
    turn_id     text not null references turns (turn_id),
    attempt     integer not null,
    state       text not null check (state in ('active', 'released', 'completed')),
    claimed_at  integer not null,
    released_at integer
);
