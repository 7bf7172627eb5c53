-- The tool the session's agent runs now, by name only (null: none), and when
-- it last changed: PreToolUse / PostToolUse hooks report it, written at most
-- every 2 s per session (src/decide/presence.rs).
alter table sessions add column agent_tool text;
alter table sessions add column tool_since bigint;
