-- Every blocking prompt of the agent (issue 54): a permission request
-- gains what it asks beyond a tool's preview (`detail`: its kind, a
-- question's questions and options, a plan, "always allow" suggestions)
-- and what was chosen with its answer (`answer`). Both are content, kept
-- like message text (bytea: any UTF-8).
alter table permission_requests add column detail bytea;
alter table permission_requests add column answer bytea;

-- A request answered at the agent's terminal first is `expired` with
-- `answered_via = 'terminal'`.
alter table permission_requests drop constraint permission_requests_answered_via_check;
alter table permission_requests add constraint permission_requests_answered_via_check
    check (answered_via in ('owner', 'lark', 'terminal'));
