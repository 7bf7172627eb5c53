-- Every claim wrote a leaf of `claims_session`, a different page for each
-- session, on the hot path, twice (WAL, then checkpoint): about a fifth of
-- the bytes a cycle writes (BENCHMARKS.md, "The cause: three indexes on the
-- hot path"). Its one reader was retention, which now finds a pruned
-- session's claims through its turns (`turns`' (session_id, seq) key, then
-- `claims_turn`).
drop index if exists claims_session;
