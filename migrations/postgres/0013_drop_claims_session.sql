-- Every claim wrote an entry of `claims_session` on the hot path (BENCHMARKS.md,
-- "The cause: three indexes on the hot path"). Its readers were retention,
-- which now finds a pruned session's claims through its turns (`turns`'
-- (session_id, seq) key, then `claims_turn`), and the foreign key from
-- `claims.session_id`, checked on each session's delete. That key goes too: a
-- claim reaches its session through its turn, whose own key to `sessions`
-- stays.
alter table claims drop constraint if exists claims_session_id_fkey;
drop index if exists claims_session;
