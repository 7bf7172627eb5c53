-- Every claim wrote a leaf of `claims_session`, a different page for each
-- session, on the hot path, twice (WAL, then checkpoint): about a fifth of
-- the bytes a cycle writes (BENCHMARKS.md, "The cause: three indexes on the
-- hot path"). Its readers were retention, which now finds a pruned session's
-- claims through its turns (`turns`' (session_id, seq) key, then
-- `claims_turn`), and the foreign key from `claims.session_id`, checked on
-- each session's delete. That key goes too: a claim reaches its session
-- through its turn, whose own key to `sessions` stays. SQLite changes a
-- table's keys only by rebuilding it; nothing references `claims`. The
-- rebuilt table is keyed by `claim_id` itself (`without rowid`): a rowid
-- table with a text key keeps the key in a second B-tree, one more page
-- each claim wrote. Its rows are small, as `without rowid` wants.
create table claims_rebuilt (
    claim_id    text primary key,
    session_id  text not null,
    turn_id     text not null references turns (turn_id),
    attempt     integer not null,
    state       text not null check (state in ('active', 'released', 'completed')),
    claimed_at  integer not null,
    released_at integer
) without rowid;
insert into claims_rebuilt
    (claim_id, session_id, turn_id, attempt, state, claimed_at, released_at)
    select claim_id, session_id, turn_id, attempt, state, claimed_at, released_at
    from claims;
drop table claims;
alter table claims_rebuilt rename to claims;
create index claims_turn on claims (turn_id);
