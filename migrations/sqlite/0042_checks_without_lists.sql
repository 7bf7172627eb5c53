-- Every CHECK that listed three or more values (`col in ('a', 'b', 'c')`)
-- says the same as a chain of comparisons (`col = 'a' or col = 'b' or …`),
-- which admits exactly the same rows (a null passes either way) but costs
-- less: SQLite evaluates an `in` list of more than two constants through an
-- ephemeral index it builds for every row it checks, about 13 b-trees per
-- turn cycle, 9.5% of the writer's instructions (issue 40, BENCHMARKS.md).
-- The definitions are edited in `sqlite_schema`, as 0022 did (ALTER TABLE,
-- "Making Other Kinds Of Table Schema Changes"): every stored row already
-- satisfies them. The `alter table` at the end changes the schema version,
-- so every connection reads the new definitions.
pragma writable_schema = on;
update sqlite_schema
   set sql = replace(sql,
       'check (agent_state in (''working'', ''waiting'', ''away''))',
       'check (agent_state = ''working'' or agent_state = ''waiting'' or agent_state = ''away'')')
 where type = 'table' and name = 'sessions';
update sqlite_schema
   set sql = replace(replace(sql,
       'check (origin in (''web'', ''lark'', ''terminal''))',
       'check (origin = ''web'' or origin = ''lark'' or origin = ''terminal'')'),
       'check (state in (''queued'', ''claimed'', ''completed'', ''cancelled''))',
       'check (state = ''queued'' or state = ''claimed'' or state = ''completed'' or state = ''cancelled'')')
 where type = 'table' and name = 'turns';
update sqlite_schema
   set sql = replace(sql,
       'check (state in (''active'', ''released'', ''completed''))',
       'check (state = ''active'' or state = ''released'' or state = ''completed'')')
 where type = 'table' and name = 'claims';
update sqlite_schema
   set sql = replace(sql,
       'check (state in (''pending'', ''allowed'', ''denied'', ''expired''))',
       'check (state = ''pending'' or state = ''allowed'' or state = ''denied'' or state = ''expired'')')
 where type = 'table' and name = 'permission_requests';
update sqlite_schema
   set sql = replace(replace(sql,
       'check (state in (''pending'', ''sent'', ''failed''))',
       'check (state = ''pending'' or state = ''sent'' or state = ''failed'')'),
       'check (update_state in (''pending'', ''sent'', ''failed''))',
       'check (update_state = ''pending'' or update_state = ''sent'' or update_state = ''failed'')')
 where type = 'table' and name in ('lark_replies', 'lark_permission_messages', 'lark_notes');
update sqlite_schema
   set sql = replace(replace(sql,
       'check (kind in (''turn'', ''session'', ''permission'', ''agent'',
                                             ''notification''))',
       'check (kind = ''turn'' or kind = ''session'' or kind = ''permission'' or kind = ''agent''
              or kind = ''notification'')'),
       'check (state in
                   (''queued'', ''claimed'', ''completed'', ''released'', ''cancelled'', ''closed'',
                    ''pending'', ''allowed'', ''denied'', ''expired'',
                    ''working'', ''waiting'', ''away'', ''stalled'',
                    ''idle_prompt'', ''permission_prompt'', ''typing_unconfirmed''))',
       'check (state = ''queued'' or state = ''claimed'' or state = ''completed''
              or state = ''released'' or state = ''cancelled'' or state = ''closed''
              or state = ''pending'' or state = ''allowed'' or state = ''denied''
              or state = ''expired'' or state = ''working'' or state = ''waiting''
              or state = ''away'' or state = ''stalled'' or state = ''idle_prompt''
              or state = ''permission_prompt'' or state = ''typing_unconfirmed'')')
 where type = 'table' and name = 'session_events';
pragma writable_schema = off;

-- A schema change of its own, so the schema version moves on.
create table checks_without_lists_marker (x integer);
drop table checks_without_lists_marker;
