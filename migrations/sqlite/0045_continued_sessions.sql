-- One conversation per terminal (issue 55): a session remembers the
-- terminal its agent ran in (`terminal`: an opaque digest the hooks give,
-- null when they cannot tell), and a new host session bound from the same
-- terminal continues it: the old one closes naming the new
-- (`continued_in`), the new one names the old (`continued_from`).
--
-- Three nullable columns at the end read as null in every stored row (what
-- ADD COLUMN does), made in `sqlite_schema` as 0043 did, for the reason it
-- gives. The lookup of a terminal's open session goes through the open
-- tuple's index (goal, agent, surface): no index of its own.
pragma writable_schema = on;
update sqlite_schema
   set sql = replace(sql,
       'terminal_turn_id text, stalled_at integer,',
       'terminal_turn_id text, stalled_at integer, terminal text, continued_in text, continued_from text,')
 where type = 'table' and name = 'sessions';
pragma writable_schema = off;

-- A schema change of its own, so the schema version moves on.
create table continued_sessions_marker (x integer);
drop table continued_sessions_marker;
