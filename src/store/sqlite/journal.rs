//! The journal: the SQLite store's record of truth for a turn's cycle.
//!
//! A decision that writes only a cycle's rows (a turn enqueued, claimed,
//! completed or released; presence; see [`Writes::journaled`]) is not
//! applied to the tables in its commit: its writes become one record,
//! appended to `journal` in the writer's batch, and the batch's one sync
//! makes it durable before any answer. The writer keeps, in memory, the rows
//! those records changed (the overlay), and the decisions that follow read
//! them from there first ([`session`], [`turn`], [`claim`], and the
//! cycle's lookups), so that they decide on what was journaled.
//!
//! The tables are brought up to date behind the answers: a fold applies the
//! oldest records' writes, in their order, through the statements a direct
//! write runs ([`super::apply`]), and deletes them from `journal` in the same
//! transaction, so a record is applied exactly once whatever crashes when.
//! Folding many records in one commit writes each page they touch once,
//! where applying each in its own commit wrote it again every time.
//!
//! Every other write folds everything first ([`fold_all`]), so it reads and
//! writes the tables as they are. Reads through the read pool wait until the
//! tables hold everything acknowledged ([`Marks`]); at start-up the records
//! a crash left are folded before the first write ([`open_on_writer`]); after a
//! rolled-back transaction the overlay is rebuilt from the records that
//! remain ([`reload`]).
//!
//! All of it lives on the thread that holds the writer (a `thread_local`,
//! like what the decisions changed, [`take_changed`], moved with the writer:
//! [`Held`]): the writer is the only one who decides. Every decision is
//! recorded here ([`decided`]); [`super::apply`] only writes tables, and
//! imports nothing of this module.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use rusqlite::Connection;

use super::apply::apply;
use super::sql;
use crate::decide::{Change, Changed, ClaimRow, SessionRow, TurnRow, Writes};
use crate::error::{Error, Result};
use crate::model::TurnState;

/// Records a decision's writes (journaled, or applied now); what they
/// change is kept for [`take_changed`].
pub(super) fn decided(conn: &Connection, writes: Writes) -> Result<()> {
    let changed = writes.changed();
    record(conn, writes)?;
    if let Some(changed) = changed {
        CHANGED.with(|all| all.borrow_mut().push(changed));
    }
    Ok(())
}

thread_local! {
    /// What the decisions applied on this (the writer's) thread changed,
    /// since the last [`take_changed`].
    static CHANGED: RefCell<Vec<Changed>> = const { RefCell::new(Vec::new()) };
}

/// What the decisions applied on this thread changed since the last call.
pub(super) fn take_changed() -> Vec<Changed> {
    CHANGED.with(|all| all.take())
}

/// How far the journal and the tables are, for the readers: the last record
/// committed, and the last one folded into the tables (both ids; the tables
/// hold everything acknowledged when `folded >= journaled`).
#[derive(Debug)]
pub struct Marks {
    journaled: AtomicI64,
    folded: tokio::sync::watch::Sender<i64>,
}

impl Marks {
    fn new(through: i64) -> Self {
        Self {
            journaled: AtomicI64::new(through),
            folded: tokio::sync::watch::Sender::new(through),
        }
    }

    /// The last record committed, if the tables do not hold it yet.
    pub fn behind(&self) -> Option<i64> {
        let journaled = self.journaled.load(Ordering::Acquire);
        (*self.folded.borrow() < journaled).then_some(journaled)
    }

    /// Waits until the tables hold record `id`.
    pub async fn folded(&self, id: i64) {
        let mut folded = self.folded.subscribe();
        let _ = folded.wait_for(|folded| *folded >= id).await;
    }
}

/// The writer's journal: the records not yet folded, in order, and the rows
/// they changed, each with the record that last wrote it.
struct Journal {
    marks: Arc<Marks>,
    next_id: i64,
    /// The last id a committed transaction journaled.
    committed: i64,
    /// The records not yet folded: id, size and writes.
    pending: VecDeque<(i64, usize, Writes)>,
    /// Their size, in bytes of records.
    pending_bytes: usize,
    /// The most records that ever waited at once.
    peak: usize,
    sessions: HashMap<String, (i64, SessionRow)>,
    turns: HashMap<String, (i64, TurnRow)>,
    claims: HashMap<String, (i64, ClaimRow)>,
}

impl Journal {
    fn new(marks: Arc<Marks>, next_id: i64) -> Self {
        Self {
            marks,
            next_id,
            committed: next_id - 1,
            pending: VecDeque::new(),
            pending_bytes: 0,
            peak: 0,
            sessions: HashMap::new(),
            turns: HashMap::new(),
            claims: HashMap::new(),
        }
    }

    /// Keeps the rows record `id` writes as the latest.
    fn remember(&mut self, id: i64, writes: &Writes) {
        if let Some(Change::Insert(t) | Change::Update(t)) = &writes.turn {
            self.turns.insert(t.turn_id.clone(), (id, t.clone()));
        }
        if let Some(Change::Insert(c) | Change::Update(c)) = &writes.claim {
            self.claims.insert(c.claim_id.clone(), (id, c.clone()));
        }
        if let Some(s) = &writes.session {
            self.sessions.insert(s.session_id.clone(), (id, s.clone()));
        }
    }

    /// Forgets the rows record `id` wrote, unless a later record wrote them
    /// again: the tables now hold them.
    fn forget(&mut self, id: i64, writes: &Writes) {
        if let Some(Change::Insert(t) | Change::Update(t)) = &writes.turn
            && self.turns.get(&t.turn_id).is_some_and(|(at, _)| *at <= id)
        {
            self.turns.remove(&t.turn_id);
        }
        if let Some(Change::Insert(c) | Change::Update(c)) = &writes.claim
            && self
                .claims
                .get(&c.claim_id)
                .is_some_and(|(at, _)| *at <= id)
        {
            self.claims.remove(&c.claim_id);
        }
        if let Some(s) = &writes.session
            && self
                .sessions
                .get(&s.session_id)
                .is_some_and(|(at, _)| *at <= id)
        {
            self.sessions.remove(&s.session_id);
        }
    }

    /// The last id the tables hold.
    fn folded_through(&self) -> i64 {
        self.pending
            .front()
            .map_or(self.next_id - 1, |(id, ..)| id - 1)
    }
}

thread_local! {
    static JOURNAL: RefCell<Option<Journal>> = const { RefCell::new(None) };
}

fn with<T>(f: impl FnOnce(&mut Journal) -> T) -> T {
    JOURNAL.with(|journal| {
        let mut journal = journal.borrow_mut();
        f(journal
            .as_mut()
            .expect("the journal is on the thread that holds the writer"))
    })
}

/// The writer's state on a thread: the journal, what the decisions changed,
/// and how the batch writes. It lives on whichever thread holds the writer
/// (its own, or a caller's that writes in its place: see
/// [`super::writer`]), moved there when that thread takes the writer and
/// back when it lets go.
#[derive(Default)]
pub(super) struct Held {
    journal: Option<Journal>,
    changed: Vec<Changed>,
    direct: bool,
}

/// Installs the writer's state on this thread.
pub(super) fn take_over(held: Held) {
    JOURNAL.with(|journal| *journal.borrow_mut() = held.journal);
    CHANGED.with(|changed| *changed.borrow_mut() = held.changed);
    DIRECT.with(|direct| direct.set(held.direct));
}

/// Takes the writer's state off this thread.
pub(super) fn hand_over() -> Held {
    Held {
        journal: JOURNAL.with(RefCell::take),
        changed: CHANGED.with(RefCell::take),
        direct: DIRECT.with(|direct| direct.replace(false)),
    }
}

/// Whether the journal is open on this thread (only the writer's).
fn open() -> bool {
    JOURNAL.with(|journal| journal.borrow().is_some())
}

thread_local! {
    /// Whether the writer's current batch applies its writes directly.
    static DIRECT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The most jobs a batch has for its cycle's writes to be journaled. A
/// larger batch applies them to the tables directly (after the records
/// before it): its commit already writes each page it touches once for
/// all of its jobs, so records would only add their own pages. Measured
/// against applying every batch directly: at 16 sessions (batches of up to
/// 16) journaling gives 0.69x the bytes and 0.87x the writer CPU per cycle;
/// at 128 sessions, journaling every batch gave 1.07x and 1.12x, and
/// batches of up to 32 still 0.95x the cycles/s.
pub(super) const JOURNALED_BATCH: usize = 16;

/// Says how the writer's next batch, of `jobs` jobs, writes a cycle's rows.
pub(super) fn batch_of(jobs: usize) {
    DIRECT.with(|direct| direct.set(jobs > JOURNALED_BATCH));
}

/// A decision's writes: journaled when they are a cycle's (in a batch small
/// enough), else applied to the tables (after everything journaled before
/// them).
pub(super) fn record(conn: &Connection, writes: Writes) -> Result<()> {
    if !writes.journaled() || !open() || DIRECT.with(std::cell::Cell::get) {
        fold_all(conn)?;
        return apply(conn, writes);
    }
    let rec = serde_json::to_vec(&writes).map_err(|e| Error::store("journaling a write", e))?;
    let id = with(|j| j.next_id);
    conn.prepare_cached("insert into journal (id, rec) values (?, ?)")?
        .execute(rusqlite::params![id, rec])?;
    with(|j| {
        j.next_id = id + 1;
        j.remember(id, &writes);
        j.pending_bytes += rec.len();
        j.pending.push_back((id, rec.len(), writes));
        j.peak = j.peak.max(j.pending.len());
    });
    Ok(())
}

/// The most records one fold behind the answers applies, and about the
/// most bytes of records (a fold holds up the writer's next batch while it
/// runs, and a slice of large turns must not grow the WAL past its limit).
const SLICE_RECORDS: usize = 128;
const SLICE_BYTES: usize = 512 * 1024;

/// Whether a slice is due to be folded behind the answers.
pub(super) fn due() -> bool {
    open() && with(|j| j.pending.len() >= SLICE_RECORDS || j.pending_bytes >= SLICE_BYTES)
}

/// How many records wait to be folded.
pub(super) fn pending() -> usize {
    if !open() {
        return 0;
    }
    with(|j| j.pending.len())
}

/// How much one fold takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fold {
    /// The oldest records, up to a slice ([`SLICE_RECORDS`], [`SLICE_BYTES`]).
    Slice,
    /// Every record.
    All,
}

/// Folds the oldest records into the tables, in the caller's transaction:
/// their writes applied in order, the records deleted. Answers how many it
/// folded.
pub(super) fn fold(conn: &Connection, fold: Fold) -> Result<usize> {
    if !open() {
        return Ok(0);
    }
    let slice: Vec<(i64, usize, Writes)> = with(|j| {
        let mut n = 0;
        let mut bytes = 0;
        while n < j.pending.len()
            && (fold == Fold::All || (n < SLICE_RECORDS && bytes < SLICE_BYTES))
        {
            bytes += j.pending[n].1;
            n += 1;
        }
        j.pending_bytes -= bytes;
        j.pending.drain(..n).collect()
    });
    let Some(&(through, ..)) = slice.last() else {
        return Ok(0);
    };
    let folded = slice.len();
    let mut records = Vec::with_capacity(folded);
    for (id, _, writes) in slice {
        with(|j| j.forget(id, &writes));
        records.push(writes);
    }
    let applied = super::apply::apply_final(conn, records);
    let deleted = applied.and_then(|()| {
        conn.prepare_cached("delete from journal where id <= ?")?
            .execute([through])?;
        Ok(())
    });
    if let Err(e) = deleted {
        // The records are still in `journal` (its delete did not run): the
        // overlay is rebuilt from them, and the writer rolls back whatever
        // of the slice was applied.
        reload(conn)?;
        return Err(e);
    }
    Ok(folded)
}

/// Folds every record, in the caller's transaction.
pub(super) fn fold_all(conn: &Connection) -> Result<usize> {
    fold(conn, Fold::All)
}

/// After a commit: what it journaled and folded is so, for the readers.
/// Answers whether it journaled anything.
pub(super) fn committed() -> bool {
    if !open() {
        return false;
    }
    with(|j| {
        let journaled = j.next_id - 1 > j.committed;
        j.committed = j.next_id - 1;
        let folded = j.folded_through();
        j.marks.folded.send_if_modified(|mark| {
            let moved = *mark != folded;
            *mark = folded;
            moved
        });
        j.marks.journaled.store(j.committed, Ordering::Release);
        journaled
    })
}

/// Reads the records a transaction left in `journal` (after a rollback, or
/// at start-up) into the pending records and the overlay.
pub(super) fn reload(conn: &Connection) -> Result<()> {
    if !open() {
        return Ok(());
    }
    let records = read_all(conn)?;
    with(|j| {
        j.pending.clear();
        j.pending_bytes = 0;
        j.sessions.clear();
        j.turns.clear();
        j.claims.clear();
        // Ids stay past every id a committed transaction gave, so that the
        // readers' marks only grow.
        j.next_id = j.committed + 1;
        for (id, bytes, writes) in records {
            j.remember(id, &writes);
            j.pending_bytes += bytes;
            j.pending.push_back((id, bytes, writes));
            j.next_id = j.next_id.max(id + 1);
        }
    });
    Ok(())
}

fn read_all(conn: &Connection) -> Result<Vec<(i64, usize, Writes)>> {
    let mut statement = conn.prepare_cached("select id, rec from journal order by id")?;
    let mut rows = statement.query([])?;
    let mut records = Vec::new();
    while let Some(row) = rows.next()? {
        let id: i64 = row.get(0)?;
        let rec: Vec<u8> = row.get(1)?;
        let writes: Writes =
            serde_json::from_slice(&rec).map_err(|e| Error::store("reading the journal", e))?;
        records.push((id, rec.len(), writes));
    }
    Ok(records)
}

/// On the writer's thread, before its first write: opens the journal with
/// the records a crash left in it (the writer then folds them, before its
/// first job). Answers the readers' marks.
pub(super) fn open_on_writer(conn: &Connection) -> Result<Arc<Marks>> {
    let last: Option<i64> = conn.query_row("select max(id) from journal", [], |row| row.get(0))?;
    let marks = Arc::new(Marks::new(0));
    JOURNAL.with(|journal| {
        *journal.borrow_mut() = Some(Journal::new(marks.clone(), last.unwrap_or(0) + 1));
    });
    reload(conn)?;
    committed();
    Ok(marks)
}

/// A session, as last written: journaled, else in the table.
pub(super) fn session(conn: &Connection, session_id: &str) -> Result<Option<SessionRow>> {
    if let Some(row) = open()
        .then(|| with(|j| j.sessions.get(session_id).map(|(_, s)| s.clone())))
        .flatten()
    {
        return Ok(Some(row));
    }
    super::stored_session(conn, session_id)
}

/// A session's turn, as last written.
pub(super) fn turn(conn: &Connection, session_id: &str, turn_id: &str) -> Result<Option<TurnRow>> {
    if let Some(row) = journaled_turn(turn_id) {
        return Ok(Some(row).filter(|t| t.session_id == session_id));
    }
    super::stored_turn(conn, session_id, turn_id)
}

fn journaled_turn(turn_id: &str) -> Option<TurnRow> {
    open()
        .then(|| with(|j| j.turns.get(turn_id).map(|(_, t)| t.clone())))
        .flatten()
}

/// A claim by id, as last written.
pub(super) fn claim(conn: &Connection, claim_id: &str) -> Result<Option<ClaimRow>> {
    if let Some(row) = open()
        .then(|| with(|j| j.claims.get(claim_id).map(|(_, c)| c.clone())))
        .flatten()
    {
        return Ok(Some(row));
    }
    sql::query_as("select * from claims where claim_id = ?")
        .bind(claim_id)
        .fetch_optional(conn)
}

/// The first journaled turn of a session that `matches`, by seq.
fn first_journaled(session_id: &str, matches: impl Fn(&TurnRow) -> bool) -> Option<TurnRow> {
    if !open() {
        return None;
    }
    with(|j| {
        j.turns
            .values()
            .map(|(_, t)| t)
            .filter(|t| t.session_id == session_id && matches(t))
            .min_by_key(|t| t.seq)
            .cloned()
    })
}

/// Whether a journaled turn of the session `matches`.
fn any_journaled(session_id: &str, matches: impl Fn(&TurnRow) -> bool) -> bool {
    open()
        && with(|j| {
            j.turns
                .values()
                .any(|(_, t)| t.session_id == session_id && matches(t))
        })
}

/// The session's turn enqueued with this `client_message_id`, if any.
pub(super) fn turn_by_client_message_id(
    conn: &Connection,
    session_id: &str,
    client_message_id: &str,
) -> Result<Option<TurnRow>> {
    let cmid = Some(client_message_id);
    if let Some(t) = first_journaled(session_id, |t| t.client_message_id.as_deref() == cmid) {
        return Ok(Some(t));
    }
    let stored: Option<TurnRow> =
        sql::query_as("select * from turns where session_id = ? and client_message_id = ?")
            .bind(session_id)
            .bind(client_message_id)
            .fetch_optional(conn)?;
    Ok(stored.map(|t| journaled_turn(&t.turn_id).unwrap_or(t)))
}

/// Whether a turn of the session was completed with this `completion_id`.
pub(super) fn completion_used(
    conn: &Connection,
    session_id: &str,
    completion_id: &str,
) -> Result<bool> {
    let id = Some(completion_id);
    if any_journaled(session_id, |t| t.completion_id.as_deref() == id) {
        return Ok(true);
    }
    // A completion, once written, is never unwritten: the table's is final.
    let used: Option<i64> =
        sql::query_scalar("select 1 from turns where session_id = ? and completion_id = ?")
            .bind(session_id)
            .bind(completion_id)
            .fetch_optional(conn)?;
    Ok(used.is_some())
}

/// The session's oldest queued turn: the first of the table's queued turns
/// that no record has since taken, or a journaled one before it.
pub(super) fn head(conn: &Connection, session_id: &str) -> Result<Option<TurnRow>> {
    if !any_journaled(session_id, |_| true) {
        // No record changed a turn of this session: the table's head is it.
        return sql::query_as(
            "select * from turns where session_id = ? and state = 'queued' order by seq limit 1",
        )
        .bind(session_id)
        .fetch_optional(conn);
    }
    let journaled = first_journaled(session_id, |t| t.state == TurnState::Queued);
    let mut statement = conn.prepare_cached(
        "select turn_id, seq from turns where session_id = ? and state = 'queued' order by seq",
    )?;
    let mut rows = statement.query([session_id])?;
    while let Some(row) = rows.next()? {
        let seq: i64 = row.get(1)?;
        if journaled.as_ref().is_some_and(|t| t.seq < seq) {
            break;
        }
        let turn_id: String = row.get(0)?;
        if journaled_turn(&turn_id).is_some() {
            // Taken (or queued again: then `journaled` has it) since.
            continue;
        }
        return turn(conn, session_id, &turn_id);
    }
    Ok(journaled)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::session::Bound;
    use crate::decide::turn::{ClaimOutcome, Releaser};
    use crate::model::{
        AgentState, BindRequest, CompleteRequest, EnqueueRequest, HostIdentity, Origin,
        RegisterAgentThread,
    };
    use crate::store::sqlite::{Durability, SqliteStore};

    /// What the writer decides on for the ids a test used: every row, each
    /// session's head, and the lookups by client message and completion id.
    #[derive(Debug, PartialEq)]
    struct Seen {
        rows: Vec<String>,
        pending: usize,
    }

    fn seen(conn: &Connection, ids: &Ids) -> Result<Seen> {
        let mut rows = Vec::new();
        for session_id in &ids.sessions {
            let session_id = session_id.as_str();
            rows.push(format!("{:?}", session(conn, session_id)?));
            rows.push(format!("head {:?}", head(conn, session_id)?));
            for n in 0..ids.keys {
                let (cmid, k) = (format!("m{n}"), format!("k{n}"));
                rows.push(format!(
                    "{:?}",
                    turn_by_client_message_id(conn, session_id, &cmid)?
                ));
                rows.push(format!("{}", completion_used(conn, session_id, &k)?));
                rows.push(format!("{:?}", claim(conn, &format!("c{n}"))?));
            }
        }
        for (session, turn_id) in &ids.turns {
            rows.push(format!("{:?}", turn(conn, session, turn_id)?));
        }
        Ok(Seen {
            rows,
            pending: pending(),
        })
    }

    #[derive(Clone, Default)]
    struct Ids {
        sessions: Vec<String>,
        turns: Vec<(String, String)>,
        keys: usize,
    }

    /// A small deterministic generator (xorshift), so that a failing seed
    /// can be run again.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    fn host(n: usize) -> HostIdentity {
        HostIdentity {
            host_surface: "codex-cli".into(),
            host_session_id: format!("h{n}"),
        }
    }

    /// The store as the broker holds it, with its typed calls.
    fn as_dyn(store: &SqliteStore) -> &dyn crate::store::Store {
        store
    }

    async fn store_with_sessions(dir: &std::path::Path, n: usize) -> (SqliteStore, Ids) {
        let store = SqliteStore::open(&dir.join("broker.db"), Durability::Relaxed)
            .await
            .unwrap();
        let mut ids = Ids::default();
        for i in 0..n {
            let host = host(i);
            as_dyn(&store)
                .register(RegisterAgentThread {
                    goal_id: "g".into(),
                    agent_id: "a".into(),
                    host_surface: host.host_surface.clone(),
                    host_session_id: host.host_session_id.clone(),
                })
                .await
                .unwrap();
            let bound = as_dyn(&store)
                .bind(BindRequest {
                    goal_id: "g".into(),
                    agent_id: "a".into(),
                    host_surface: host.host_surface,
                    host_session_id: host.host_session_id,
                    executor_endpoint_id: "e".into(),
                    terminal: None,
                    dry_run: false,
                })
                .await
                .unwrap();
            let (Bound::Created(s) | Bound::Existing(s)) = bound;
            ids.sessions.push(s.session_id);
        }
        (store, ids)
    }

    fn message(text: String, client_message_id: Option<String>) -> EnqueueRequest {
        EnqueueRequest {
            attachments: Vec::new(),
            origin: Origin::Web,
            text,
            client_message_id,
            ingress: Default::default(),
            lark: None,
        }
    }

    /// The property: after any sequence of a cycle's operations (enqueues
    /// with reused and conflicting client message ids, claims with reused
    /// claim ids, completions with reused completion ids, releases, presence
    /// reports), what the writer decides on from the journal's overlay is
    /// exactly what the tables hold once the journal is folded.
    #[tokio::test]
    async fn the_overlay_and_the_tables_agree_after_any_sequence_of_operations() {
        let mut compared_with_records = 0;
        for seed in 1..=6u64 {
            let dir = tempfile::tempdir().unwrap();
            let (store, mut ids) = store_with_sessions(dir.path(), 3).await;
            ids.keys = 24;
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let mut claims: Vec<(usize, String, String)> = Vec::new();
            for step in 0..400 {
                let s = rng.below(3) as usize;
                let session = ids.sessions[s].clone();
                let n = rng.below(ids.keys as u64);
                match rng.below(7) {
                    0..=2 => {
                        let cmid = (rng.below(3) > 0).then(|| format!("m{n}"));
                        // Mostly the same text for an id (a duplicate), now
                        // and then another (refused).
                        let text = format!("t{n}-{}", rng.below(5) / 4);
                        if let Ok(done) = as_dyn(&store)
                            .enqueue(session.clone(), message(text, cmid), Vec::new())
                            .await
                        {
                            ids.turns.push((session, done.turn.turn_id));
                        }
                    }
                    3 => {
                        let claim_id = format!("c{n}");
                        if let Ok(ClaimOutcome::Claimed { turn, .. }) = as_dyn(&store)
                            .claim(session.clone(), host(s), claim_id.clone())
                            .await
                        {
                            claims.push((s, claim_id, turn.turn_id));
                        }
                    }
                    4 if !claims.is_empty() => {
                        let (s, claim_id, turn_id) =
                            claims[rng.below(claims.len() as u64) as usize].clone();
                        let completion = CompleteRequest {
                            host_surface: "codex-cli".into(),
                            host_session_id: host(s).host_session_id,
                            claim_id,
                            completion_id: format!("k{}", rng.below(ids.keys as u64)),
                            response: serde_json::Map::new(),
                        };
                        let _ = as_dyn(&store)
                            .complete(ids.sessions[s].clone(), turn_id, completion)
                            .await;
                    }
                    5 if !claims.is_empty() => {
                        let (s, claim_id, _) =
                            claims[rng.below(claims.len() as u64) as usize].clone();
                        let _ = as_dyn(&store)
                            .release(ids.sessions[s].clone(), claim_id, Releaser::Host(host(s)))
                            .await;
                    }
                    _ => {
                        let state = [AgentState::Working, AgentState::Waiting, AgentState::Away]
                            [rng.below(3) as usize];
                        let report = crate::decide::presence::Report {
                            state: Some(state),
                            typing_in: (rng.below(4) == 0).then(|| rng.below(2) == 0),
                            ..Default::default()
                        };
                        let _ = as_dyn(&store).report_agent(session, host(s), report).await;
                    }
                }
                if step % 20 == 19 {
                    let (journaled, folded) = (ids.clone(), ids.clone());
                    let before = store
                        .writer
                        .write_cycle(move |conn| seen(conn, &journaled))
                        .await
                        .unwrap();
                    // A write that reads the tables folds every record first.
                    let after = store
                        .writer
                        .write(move |conn| seen(conn, &folded))
                        .await
                        .unwrap();
                    assert_eq!(after.pending, 0, "the fold took every record");
                    let differs = before.rows.iter().zip(&after.rows).find(|(b, a)| b != a);
                    assert_eq!(differs, None, "seed {seed}, step {step}: journaled, stored");
                    assert_eq!(before.rows.len(), after.rows.len());
                    if before.pending > 0 {
                        compared_with_records += 1;
                    }
                }
            }
        }
        assert!(
            compared_with_records > 20,
            "the overlay was compared while it held records ({compared_with_records} times)"
        );
    }

    /// With 10,000 turns queued, the writer holds no more than a fold's
    /// slice and a batch of records in memory: the queued turns are in the
    /// tables, not in the overlay.
    #[tokio::test]
    async fn memory_stays_bounded_with_10000_queued_turns() {
        let dir = tempfile::tempdir().unwrap();
        let (store, ids) = store_with_sessions(dir.path(), 1).await;
        let store = std::sync::Arc::new(store);
        let mut writers = Vec::new();
        for w in 0..50 {
            let (store, session) = (store.clone(), ids.sessions[0].clone());
            writers.push(tokio::spawn(async move {
                for i in 0..200 {
                    let text = format!("turn {w}-{i}");
                    as_dyn(&store)
                        .enqueue(session.clone(), message(text, None), Vec::new())
                        .await
                        .unwrap();
                }
            }));
        }
        for writer in writers {
            writer.await.unwrap();
        }
        let (peak, overlay) = store
            .writer
            .write_cycle(|_| {
                Ok(with(|j| {
                    (j.peak, j.turns.len() + j.sessions.len() + j.claims.len())
                }))
            })
            .await
            .unwrap();
        let bound = SLICE_RECORDS + super::super::writer::MAX_BATCH;
        assert!(
            peak <= bound,
            "{peak} records waited at once (bound {bound})"
        );
        assert!(overlay <= bound, "the overlay holds {overlay} rows");
        let queued: i64 = sqlx::query_scalar("select count(*) from turns where state = 'queued'")
            .fetch_one(store.reads().await.unwrap())
            .await
            .unwrap();
        assert_eq!(queued, 10_000);
    }
}
