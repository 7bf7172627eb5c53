-- Every blocking prompt of the agent (issue 54): a permission request
-- gains what it asks beyond a tool's preview (`detail`: its kind, a
-- question's questions and options, a plan, "always allow" suggestions)
-- and what was chosen with its answer (`answer`: answers, a suggestion, a
-- plan's mode, a message). Both are content, kept like message text (JSON).
-- A request answered at the agent's terminal first is `expired` with
-- `answered_via = 'terminal'`.
--
-- Both changes are made in `sqlite_schema`, as 0022 and 0042 did: the
-- wider check admits every stored row, and two nullable columns at the end
-- read as null in every stored row (what ADD COLUMN does). Not ADD COLUMN:
-- on the connection that has just run 0042's edit it placed the new
-- column's text by the table's old definition, inside the check.
pragma writable_schema = on;
update sqlite_schema
   set sql = replace(replace(sql,
       'check (answered_via in (''owner'', ''lark''))',
       'check (answered_via = ''owner'' or answered_via = ''lark'' or answered_via = ''terminal'')'),
       'relayed_at integer',
       'relayed_at integer, detail text, answer text')
 where type = 'table' and name = 'permission_requests';
pragma writable_schema = off;

-- A schema change of its own, so the schema version moves on.
create table permission_kinds_marker (x integer);
drop table permission_kinds_marker;
