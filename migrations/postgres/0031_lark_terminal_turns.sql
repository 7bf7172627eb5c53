-- A link may ask for the turns typed at the agent's terminal (issue 37):
-- 1, each is sent to the chat as one card (prompt and answer) once
-- answered; 0 (the default), never.
alter table lark_links add column terminal_turns bigint not null default 0;
