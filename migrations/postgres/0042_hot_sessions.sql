-- Every turn decision rewrites its session's row (its counters, the active
-- claim, the agent's state), three times a turn. PostgreSQL makes such an
-- update heap-only (HOT: the new version beside the old one on its page, no
-- index touched) only when no indexed column changes, a column named in a
-- partial index's predicate included, and the page has room for it.
-- sessions_queued (`where queued_count > 0`) made every enqueue and every
-- claim a full update instead: a new entry in each of the table's indexes,
-- a seventh of the WAL a decision wrote, and index scans that step over the
-- dead entries left behind (issue 40, BENCHMARKS.md). /metrics, which the
-- index served, counts the queued turns through `turns_queued_at` instead,
-- as SQLite has since its 0014.
drop index sessions_queued;
-- Room on each page for a session's next versions (new pages only; a row
-- already on a full page moves once, then stays HOT).
alter table sessions set (fillfactor = 50);
