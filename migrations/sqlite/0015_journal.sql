-- The journal (src/store/sqlite/journal.rs): each record is the writes of
-- one decision of a turn's cycle, appended in the writer's batch and folded
-- into the tables behind the answers (its rows deleted in the fold's
-- transaction). What is here at start-up is folded before the first write.
create table journal (
    id integer primary key,
    rec blob not null
);
