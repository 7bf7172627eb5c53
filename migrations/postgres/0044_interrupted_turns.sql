-- The terminal's real life (issue 55): a turn the agent worked on when the
-- person at its terminal interrupted it (Esc, Ctrl-C: no Stop hook runs) is
-- cancelled `interrupted`.
alter table turns drop constraint turns_cancel_reason_check;
alter table turns add constraint turns_cancel_reason_check
    check (cancel_reason in ('session_closed', 'unanswered', 'interrupted'));
