-- A `notification` event may say `typing_unconfirmed`: a message a waker
-- typed into the idle agent was not confirmed by its UserPromptSubmit hook
-- and stays queued (HOOKS.md "Waking an idle agent").
alter table session_events drop constraint session_events_state_check;
alter table session_events add constraint session_events_state_check
    check (state in ('queued', 'claimed', 'completed', 'released', 'cancelled', 'closed',
                     'pending', 'allowed', 'denied', 'expired',
                     'working', 'waiting', 'away', 'idle_prompt', 'permission_prompt',
                     'typing_unconfirmed'));
