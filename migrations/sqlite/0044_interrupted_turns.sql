-- The terminal's real life (issue 55): a turn the agent worked on when the
-- person at its terminal interrupted it (Esc, Ctrl-C: no Stop hook runs) is
-- cancelled `interrupted`. The check admits one value more, which every
-- stored row satisfies, edited in `sqlite_schema` as 0022, 0042 and 0043 did.
pragma writable_schema = on;
update sqlite_schema
   set sql = replace(sql,
       'check (cancel_reason in (''session_closed'', ''unanswered''))',
       'check (cancel_reason = ''session_closed'' or cancel_reason = ''unanswered''
              or cancel_reason = ''interrupted'')')
 where type = 'table' and name = 'turns';
pragma writable_schema = off;

-- A schema change of its own, so the schema version moves on.
create table interrupted_turns_marker (x integer);
drop table interrupted_turns_marker;
