-- Presence (HOOKS.md): whether a session's agent is there. `agent_state` is
-- what its host last reported ('working', 'waiting' or 'away'), since
-- `agent_since` (null: since the session was created); `agent_heard_at` is
-- when a host was last heard from (null: never), from which the projection
-- shows 'away' after 10 silent minutes. Content-free, like the projection.
alter table sessions add column agent_state text not null default 'away'
    check (agent_state in ('working', 'waiting', 'away'));
alter table sessions add column agent_since bigint;
alter table sessions add column agent_heard_at bigint;

-- The event log gains `agent` events ({state, since}) and `notification`
-- events (the agent's idle or permission prompt; its text is not stored).
alter table session_events drop constraint session_events_kind_check;
alter table session_events add constraint session_events_kind_check
    check (kind in ('turn', 'session', 'permission', 'agent', 'notification'));
alter table session_events drop constraint session_events_state_check;
alter table session_events add constraint session_events_state_check
    check (state in ('queued', 'claimed', 'completed', 'released', 'cancelled', 'closed',
                     'pending', 'allowed', 'denied', 'expired',
                     'working', 'waiting', 'away', 'idle_prompt', 'permission_prompt'));
