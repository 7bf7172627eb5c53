-- Turns typed at the agent's terminal (origin 'terminal'; HOOKS.md
-- "Presence"): recorded by the UserPromptSubmit hook, answered by the Stop
-- hook; never queued or claimed. A terminal turn left without an answer is
-- cancelled as 'unanswered'. `sessions.terminal_turn_id` is the one open
-- terminal turn; `sessions.stalled_at` when the broker announced the working
-- agent stalled (null: it is not). An `agent` event may say `stalled`.
alter table turns drop constraint turns_origin_check;
alter table turns add constraint turns_origin_check
    check (origin in ('web', 'lark', 'terminal'));
alter table turns drop constraint turns_cancel_reason_check;
alter table turns add constraint turns_cancel_reason_check
    check (cancel_reason in ('session_closed', 'unanswered'));
alter table session_events drop constraint session_events_state_check;
alter table session_events add constraint session_events_state_check
    check (state in ('queued', 'claimed', 'completed', 'released', 'cancelled', 'closed',
                     'pending', 'allowed', 'denied', 'expired',
                     'working', 'waiting', 'away', 'stalled', 'idle_prompt', 'permission_prompt',
                     'typing_unconfirmed'));
alter table sessions add column terminal_turn_id text;
alter table sessions add column stalled_at bigint;
