-- Turns typed at the agent's terminal (origin 'terminal'; HOOKS.md
-- "Presence"): recorded by the UserPromptSubmit hook, answered by the Stop
-- hook; never queued or claimed. A terminal turn left without an answer (a
-- new prompt came first, or the agent stopped with nothing to say) is
-- cancelled as 'unanswered'. An `agent` event may say 'stalled'.
--
-- Each check only admits one value more, which every stored row already
-- satisfies: SQLite's documented way for such a change edits the table's
-- definition in `sqlite_schema` (ALTER TABLE, "Making Other Kinds Of Table
-- Schema Changes"), instead of copying `turns`, which `claims` and
-- `lark_replies` reference (a copy needs foreign keys off, which cannot be
-- switched inside the transaction sqlx runs a migration in). The `alter
-- table` statements after it change the schema version, so every
-- connection reads the new definitions.
pragma writable_schema = on;
update sqlite_schema
   set sql = replace(replace(sql,
       'check (origin in (''web'', ''lark''))',
       'check (origin in (''web'', ''lark'', ''terminal''))'),
       'check (cancel_reason in (''session_closed''))',
       'check (cancel_reason in (''session_closed'', ''unanswered''))')
 where type = 'table' and name = 'turns';
update sqlite_schema
   set sql = replace(sql, '''working'', ''waiting'', ''away'',',
                     '''working'', ''waiting'', ''away'', ''stalled'',')
 where type = 'table' and name = 'session_events';
pragma writable_schema = off;

-- The one open terminal turn (null: none), and when the broker announced
-- the working agent stalled (null: it is not).
alter table sessions add column terminal_turn_id text;
alter table sessions add column stalled_at integer;
