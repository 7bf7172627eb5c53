//! The embedded SQLite store (WAL). Every write goes through one writer task
//! that owns the only writing connection: it takes the jobs waiting in its
//! queue, runs each inside its own savepoint of one `BEGIN IMMEDIATE`
//! transaction, commits once, and only then answers them (group commit: one
//! fsync for a batch of concurrent writes). Reads use a small pool of their own.

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::Connection;
use sqlx::Connection as _;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
};

use super::retention::{self, PruneStep};
use super::sync_sql as sql;
use tokio::sync::{mpsc, oneshot};

use super::{
    Bound, ClaimOutcome, Closed, Decision, Enqueue, EventRow, HostIdentity, LarkEvent, LarkIngest,
    Outbound, PermissionRow, ReplyJob, ReplyUpdate, SessionRow, Store, Subject, TurnRow,
};
use crate::decide::session::{BindRows, Close, CloseRows};
use crate::decide::turn::{ClaimRows, CompleteRows, ReleaseRows};
use crate::decide::{self, Change, ClaimRow, Decided, NewEvent, Writes};
use crate::error::{Error, ErrorCode, Result};
use crate::ids::Minter;
use crate::model::{AnsweredVia, Behavior, CreatePermissionRequest, PermissionState};
use crate::model::{
    BindRequest, CompleteRequest, EnqueueRequest, Ingress, LarkLink, LarkRef, ListSessions,
    ListTurns, Receipt, RegisterAgentThread, Released, SessionState,
};
use crate::permission::{self, LarkVerdict};
use crate::time::now_ms;

/// A row of [`super::DUE_OUTBOX`].
#[derive(sqlx::FromRow)]
struct OutboxRow {
    kind: String,
    key: String,
    target: String,
    chat_id: String,
    text: String,
    parts_sent: i64,
    attempts: i64,
    failures: i64,
}

impl OutboxRow {
    fn job(self) -> ReplyJob {
        ReplyJob::from_outbox(
            &self.kind,
            self.key,
            self.target,
            self.chat_id,
            self.text,
            (self.parts_sent, self.attempts, self.failures),
        )
    }
}

/// How much a power loss may take: `Full` nothing acknowledged (every commit
/// is synced to disk before it is answered), `Relaxed` the last commits
/// (SQLite `synchronous=NORMAL`: synced only at checkpoints; crash-safe).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Durability {
    #[default]
    Full,
    Relaxed,
}

/// The most writes one transaction commits together.
const MAX_BATCH: usize = 256;

/// A write, run by the writer inside its savepoint. It answers whether its
/// changes are kept, and the reply to send once the batch has committed.
type Job = Box<dyn FnOnce(&Connection) -> Finished + Send>;
type Reply = Box<dyn FnOnce(Result<()>) + Send>;
struct Finished {
    keep: bool,
    reply: Reply,
}

pub struct SqliteStore {
    jobs: mpsc::Sender<Job>,
    reads: SqlitePool,
    minter: std::sync::Arc<Minter>,
}

impl SqliteStore {
    /// Opens (creating and migrating) the database file and starts the writer.
    pub async fn open(path: &Path, durability: Durability) -> Result<Self> {
        create_private_file(path).map_err(|e| Error::store("creating the database file", e))?;
        let options = SqliteConnectOptions::new()
            .filename(path)
            .journal_mode(SqliteJournalMode::Wal)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(5));
        let mut migrator = SqliteConnection::connect_with(&options)
            .await
            .map_err(|e| Error::store("opening the database", e))?;
        sqlx::migrate!("./migrations/sqlite")
            .run(&mut migrator)
            .await
            .map_err(|e| Error::store("migrating the database", e))?;
        let _ = migrator.close().await;
        let writer = open_writer(path).map_err(|e| Error::store("opening the writer", e))?;
        let checkpointer = Checkpointer::start(path)?;
        let reads = SqlitePoolOptions::new()
            .max_connections(4)
            .min_connections(1)
            .connect_with(options.read_only(true))
            .await
            .map_err(|e| Error::store("opening the read pool", e))?;
        let flusher = match durability {
            Durability::Full => Some(
                Flusher::start(wal_path(path))
                    .map_err(|e| Error::store("starting the flusher", e))?,
            ),
            Durability::Relaxed => None,
        };
        let (jobs, queue) = mpsc::channel(4 * MAX_BATCH);
        std::thread::Builder::new()
            .name("loopx-sqlite-writer".into())
            .spawn(move || run_writer(writer, queue, flusher, checkpointer))
            .map_err(|e| Error::store("starting the writer", e))?;
        Ok(Self {
            jobs,
            reads,
            minter: Default::default(),
        })
    }

    /// Runs `op` on the writer, inside one savepoint of a group commit, and
    /// answers after the commit. An `Err` from `op` rolls back its own changes only.
    async fn write<T, F>(&self, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let outcome = op(conn);
            Finished {
                keep: outcome.is_ok(),
                reply: Box::new(move |committed: Result<()>| {
                    let _ = tx.send(committed.and(outcome));
                }),
            }
        });
        let stopped = || Error::store("writing", "the writer has stopped");
        self.jobs.send(job).await.map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }
}

/// The writer's connection: WAL without syncs of its own, foreign keys, a busy
/// timeout, and room in the statement cache for every statement it runs.
fn open_writer(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    conn.pragma_update(None, "journal_mode", "wal")?;
    // `full` syncs too, through the flusher, after the commit and before any
    // answer (see [`Flusher`]); `relaxed` syncs only at checkpoints.
    conn.pragma_update(None, "synchronous", "normal")?;
    conn.pragma_update(None, "foreign_keys", "on")?;
    // The checkpointer copies most of the WAL back; the writer's own
    // checkpoint finishes the job (see [`WRITER_CHECKPOINT_PAGES`]).
    conn.pragma_update(None, "wal_autocheckpoint", WRITER_CHECKPOINT_PAGES)?;
    // After a spike (a reader pinning an old snapshot), the WAL file shrinks
    // back to this size when it restarts, instead of keeping its peak.
    conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT_BYTES)?;
    // Savepoints' sub-journals in memory, not in temp files.
    conn.pragma_update(None, "temp_store", "memory")?;
    conn.set_prepared_statement_cache_capacity(128);
    Ok(conn)
}

/// SQLite's write-ahead log beside the database file.
fn wal_path(path: &Path) -> std::path::PathBuf {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    wal.into()
}

/// The database file is created owner-only before SQLite opens it; SQLite
/// gives its WAL and shared-memory files the same mode.
fn create_private_file(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

/// The writer thread: takes every waiting job (up to a batch), runs them in
/// one transaction, commits once, then answers them all; at `full`
/// durability it hands the answers to the flusher, which answers them once
/// the commit is on disk, while the writer goes on with the next batch.
fn run_writer(
    conn: Connection,
    mut queue: mpsc::Receiver<Job>,
    flusher: Option<Flusher>,
    checkpointer: Checkpointer,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut replies = Vec::with_capacity(MAX_BATCH);
    let mut commits: u32 = 0;
    while let Some(first) = queue.blocking_recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let committed = run_batch(&conn, &mut batch, &mut replies);
        // Jobs left in `batch` after a failure are dropped: their callers see
        // a closed reply channel and answer store_unavailable.
        batch.clear();
        if committed.is_ok() {
            commits = commits.wrapping_add(1);
            if commits.is_multiple_of(CHECKPOINT_EVERY) {
                checkpointer.poke();
            }
        }
        match (&flusher, committed) {
            (Some(flusher), Ok(())) => flusher.flush(std::mem::take(&mut replies)),
            (_, committed) => {
                for reply in replies.drain(..) {
                    reply(committed.clone());
                }
            }
        }
    }
}

/// How many commits the writer makes between two pokes of the checkpointer.
const CHECKPOINT_EVERY: u32 = 32;
/// The WAL size (pages) at which the writer checkpoints itself, inside a
/// commit. The checkpointer alone never lets the WAL restart under steady
/// writes: its passive checkpoint copies the frames it saw while the writer
/// appends more, so when the writer begins its next transaction the log is
/// never fully copied, and only a complete copy lets SQLite start the log
/// over. Under load the WAL therefore grew to this backstop (it was 4,000
/// pages, ~16 MB) and sat there. The writer's own checkpoint completes (no
/// write runs meanwhile) and is cheap, since the checkpointer has already
/// copied all but the last frames; at 1,000 pages the WAL stays near 4 MB.
const WRITER_CHECKPOINT_PAGES: i64 = 1000;
/// The WAL file's size after a restart: the backstop plus slack.
const WAL_SIZE_LIMIT_BYTES: i64 = 8 * 1024 * 1024;

/// Copies the WAL back into the database file off the writer's path. Every
/// [`CHECKPOINT_EVERY`] commits the writer pokes this thread, which runs a
/// `PASSIVE` checkpoint on its own connection while the writer goes on
/// (before, every 1,000 WAL pages a commit ran the checkpoint and the batches
/// behind it waited). Pokes coalesce, and an idle broker pokes nothing (no
/// CPU while parked). A passive checkpoint racing steady writes may never
/// catch up with the end of the WAL, so the writer still checkpoints itself
/// past [`WRITER_CHECKPOINT_PAGES`].
struct Checkpointer {
    pokes: std::sync::mpsc::SyncSender<()>,
}

impl Checkpointer {
    fn start(path: &Path) -> Result<Self> {
        let failed =
            |e: &dyn crate::error::StoreCause| Error::store("starting the checkpointer", e);
        let conn = Connection::open(path).map_err(|e| failed(&e))?;
        conn.busy_timeout(Duration::from_secs(5))
            .map_err(|e| failed(&e))?;
        let (pokes, queue) = std::sync::mpsc::sync_channel::<()>(1);
        std::thread::Builder::new()
            .name("loopx-sqlite-ckpt".into())
            .spawn(move || {
                while queue.recv().is_ok() {
                    let done = conn.query_row("pragma wal_checkpoint(passive)", [], |_| Ok(()));
                    if let Err(e) = done {
                        tracing::warn!(error = %e, "checkpointing the write-ahead log failed");
                    }
                }
            })
            .map_err(|e| failed(&e))?;
        Ok(Self { pokes })
    }

    fn poke(&self) {
        let _ = self.pokes.try_send(());
    }
}

/// Makes commits durable off the writer's path (`full` durability). SQLite
/// commits with `synchronous=NORMAL`, which writes the WAL but does not sync
/// it; the flusher then `fdatasync`s the WAL file and only then answers the
/// batch. A sync that starts after a batch's commit covers that batch and
/// every earlier one, so one sync answers every batch committed while the
/// previous sync ran, and the writer executes the next batch meanwhile
/// instead of waiting for the disk. Nothing is answered before it is on disk,
/// as with `synchronous=FULL`. (Reads may see a commit a moment before it is
/// durable; nobody is told it is done until it is.)
struct Flusher {
    batches: std::sync::mpsc::Sender<Vec<Reply>>,
}

impl Flusher {
    fn start(wal_path: std::path::PathBuf) -> std::io::Result<Self> {
        let (batches, queue) = std::sync::mpsc::channel::<Vec<Reply>>();
        std::thread::Builder::new()
            .name("loopx-sqlite-flush".into())
            .spawn(move || {
                let mut wal = WalFile::new(wal_path);
                while let Ok(mut replies) = queue.recv() {
                    while let Ok(more) = queue.try_recv() {
                        replies.extend(more);
                    }
                    let synced = wal.sync();
                    if let Err(e) = &synced {
                        tracing::error!(error = %e, "syncing the write-ahead log failed");
                    }
                    for reply in replies {
                        reply(synced.clone());
                    }
                }
            })?;
        Ok(Self { batches })
    }

    fn flush(&self, replies: Vec<Reply>) {
        if let Err(std::sync::mpsc::SendError(replies)) = self.batches.send(replies) {
            let stopped = Error::store("syncing", "the flusher has stopped");
            for reply in replies {
                reply(Err(stopped.clone()));
            }
        }
    }
}

/// The database's `-wal` file, opened for syncing; reopened should SQLite
/// ever replace it.
struct WalFile {
    path: std::path::PathBuf,
    file: Option<std::fs::File>,
}

impl WalFile {
    fn new(path: std::path::PathBuf) -> Self {
        Self { path, file: None }
    }

    fn sync(&mut self) -> Result<()> {
        use std::os::unix::fs::MetadataExt;
        let failed = |e| Error::store("syncing the write-ahead log", e);
        let current = std::fs::metadata(&self.path).map_err(failed)?.ino();
        let stale = match &self.file {
            Some(file) => file.metadata().map_err(failed)?.ino() != current,
            None => true,
        };
        if stale {
            self.file = Some(std::fs::File::open(&self.path).map_err(failed)?);
        }
        match &self.file {
            Some(file) => file.sync_data().map_err(failed),
            None => Ok(()),
        }
    }
}

fn run_batch(conn: &Connection, batch: &mut Vec<Job>, replies: &mut Vec<Reply>) -> Result<()> {
    let result = (|| {
        execute(conn, "begin immediate")?;
        for job in batch.drain(..) {
            execute(conn, "savepoint job")?;
            let finished = job(conn);
            replies.push(finished.reply);
            if !finished.keep {
                execute(conn, "rollback to job")?;
            }
            execute(conn, "release job")?;
        }
        execute(conn, "commit")
    })();
    if result.is_err() {
        let _ = execute(conn, "rollback");
    }
    result
}

/// Runs `op` inside a nested savepoint of the job's: an `Err` rolls back
/// `op`'s changes only.
fn nested<T>(conn: &Connection, op: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
    execute(conn, "savepoint nested")?;
    let outcome = op(conn);
    if outcome.is_err() {
        execute(conn, "rollback to nested")?;
    }
    execute(conn, "release nested")?;
    outcome
}

/// Only the sessions with queued turns (an index), and each one's head of
/// queue, its oldest queued turn: a scrape scans no whole table.
const QUEUE_STATS: &str = "select coalesce(sum(queued_count), 0),
        min((select t.enqueued_at from turns t
             where t.session_id = s.session_id and t.state = 'queued'
             order by t.seq limit 1))
    from sessions s where s.queued_count > 0";

/// One writer job of retention: a chunk of the oldest prunable session's
/// rows, or the session itself once they are gone, or old Lark guards.
fn prune_step(conn: &Connection, cutoff_ms: i64) -> Result<PruneStep> {
    use rusqlite::OptionalExtension;
    let oldest: Option<String> = conn
        .prepare_cached(retention::OLDEST_PRUNABLE)?
        .query_row([cutoff_ms], |row| row.get(0))
        .optional()?;
    let Some(session_id) = oldest else {
        let rows = conn
            .prepare_cached(retention::DELETE_LARK_EVENTS)?
            .execute([cutoff_ms])?;
        return Ok(match rows {
            0 => PruneStep::Done,
            rows => PruneStep::Rows(rows as u64),
        });
    };
    for statement in retention::DELETE_CHILDREN {
        let rows = conn.prepare_cached(statement)?.execute([&session_id])?;
        if rows > 0 {
            return Ok(PruneStep::Rows(rows as u64));
        }
    }
    conn.prepare_cached(retention::DELETE_SESSION)?
        .execute([&session_id])?;
    Ok(PruneStep::Session)
}

fn execute(conn: &Connection, statement: &'static str) -> Result<()> {
    conn.prepare_cached(statement)?.execute([])?;
    Ok(())
}

/// Appends one event to the session's log, in the caller's transaction.
fn append_event(
    conn: &Connection,
    session_id: &str,
    subject: Subject<'_>,
    state: &str,
) -> Result<()> {
    let (turn_id, seq, request_id) = subject.columns();
    sql::query(
        "insert into session_events
             (session_id, event_no, kind, turn_id, seq, request_id, state, at)
         select session_id, next_event_no, ?, ?, ?, ?, ?, ? from sessions where session_id = ?",
    )
    .bind(subject.kind())
    .bind(turn_id)
    .bind(seq)
    .bind(request_id)
    .bind(state)
    .bind(now_ms())
    .bind(session_id)
    .execute(conn)?;
    sql::query("update sessions set next_event_no = next_event_no + 1 where session_id = ?")
        .bind(session_id)
        .execute(conn)?;
    Ok(())
}

/// A turn with its Lark reply's state, for readbacks.
macro_rules! turn_readback {
    () => {
        "select t.*, r.state as reply_state, r.attempts as reply_attempts, \
         r.error as reply_error from turns t left join lark_replies r on r.turn_id = t.turn_id"
    };
}
const TURN_READBACK: &str = turn_readback!();
/// One turn with its reply, by session and turn id.
const SELECT_TURN: &str = concat!(
    turn_readback!(),
    " where t.session_id = ? and t.turn_id = ?"
);

/// A session's columns, in the order [`SessionRow`] is read.
macro_rules! session_columns {
    () => {
        "session_id, goal_id, agent_id, host_surface, host_session_id, \
         executor_endpoint_id, state, created_at, closed_at, queued_count, active_claim_id, \
         next_seq, next_event_no"
    };
}
const SESSION_COLUMNS: &str = session_columns!();
/// One session by id.
const SELECT_SESSION: &str = concat!(
    "select ",
    session_columns!(),
    " from sessions where session_id = ?"
);

/// A session, read through the read pool.
async fn read_session(db: &SqlitePool, session_id: &str) -> Result<Option<SessionRow>> {
    Ok(sqlx::query_as(SELECT_SESSION)
        .bind(session_id)
        .fetch_optional(db)
        .await?)
}

/// A turn with its reply, read through the read pool.
async fn read_turn(db: &SqlitePool, session_id: &str, turn_id: &str) -> Result<Option<TurnRow>> {
    Ok(sqlx::query_as(SELECT_TURN)
        .bind(session_id)
        .bind(turn_id)
        .fetch_optional(db)
        .await?)
}

fn load_session(db: &Connection, session_id: &str) -> Result<Option<SessionRow>> {
    sql::query_as(SELECT_SESSION)
        .bind(session_id)
        .fetch_optional(db)
}

fn existing_session(conn: &Connection, session_id: &str) -> Result<SessionRow> {
    decide::existing(load_session(conn, session_id)?)
}

fn load_turn(db: &Connection, session_id: &str, turn_id: &str) -> Result<Option<TurnRow>> {
    sql::query_as(SELECT_TURN)
        .bind(session_id)
        .bind(turn_id)
        .fetch_optional(db)
}

fn load_claim(conn: &Connection, claim_id: &str) -> Result<Option<ClaimRow>> {
    sql::query_as("select * from claims where claim_id = ?")
        .bind(claim_id)
        .fetch_optional(conn)
}

/// The session's active claim, if it has one.
fn active_claim(conn: &Connection, session: Option<&SessionRow>) -> Result<Option<ClaimRow>> {
    match session.and_then(|s| s.active_claim_id.as_ref()) {
        Some(claim_id) => load_claim(conn, claim_id),
        None => Ok(None),
    }
}

fn bind_rows(conn: &Connection, bind: &BindRequest) -> Result<BindRows> {
    let registered: Option<i64> = sql::query_scalar(
        "select 1 from agent_threads
         where goal_id = ? and agent_id = ? and host_surface = ? and host_session_id = ?",
    )
    .bind(&bind.goal_id)
    .bind(&bind.agent_id)
    .bind(&bind.host_surface)
    .bind(&bind.host_session_id)
    .fetch_optional(conn)?;
    let sql = format!(
        "select {SESSION_COLUMNS} from sessions
         where goal_id = ? and agent_id = ? and host_surface = ? and host_session_id = ? and state = 'open'"
    );
    let open = sql::query_as(&sql)
        .bind(&bind.goal_id)
        .bind(&bind.agent_id)
        .bind(&bind.host_surface)
        .bind(&bind.host_session_id)
        .fetch_optional(conn)?;
    Ok(BindRows {
        registered: registered.is_some(),
        open,
    })
}

fn bind(conn: &Connection, request: BindRequest, minter: &Minter) -> Result<Bound> {
    let rows = bind_rows(conn, &request)?;
    let bound = decide::session::bind(rows, request, minter, now_ms())?;
    if let Bound::Created(s) = &bound {
        sql::query(
            "insert into sessions (session_id, goal_id, agent_id, host_surface, host_session_id,
                 executor_endpoint_id, state, created_at, next_seq, next_event_no)
             values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&s.session_id)
        .bind(&s.goal_id)
        .bind(&s.agent_id)
        .bind(&s.host_surface)
        .bind(&s.host_session_id)
        .bind(&s.executor_endpoint_id)
        .bind(s.state)
        .bind(s.created_at)
        .bind(s.next_seq)
        .bind(s.next_event_no)
        .execute(conn)?;
    }
    Ok(bound)
}

/// Applies a decision's writes, in their order.
fn apply(conn: &Connection, writes: Writes) -> Result<()> {
    match writes.turn {
        Some(Change::Insert(t)) => {
            sql::query(
                "insert into turns (turn_id, session_id, seq, origin, text, client_message_id,
                     lark_chat_id, lark_message_id, state, enqueued_at)
                 values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&t.turn_id)
            .bind(&t.session_id)
            .bind(t.seq)
            .bind(t.origin)
            .bind(&t.text)
            .bind(&t.client_message_id)
            .bind(&t.lark_chat_id)
            .bind(&t.lark_message_id)
            .bind(t.state)
            .bind(t.enqueued_at)
            .execute(conn)?;
        }
        Some(Change::Update(t)) => {
            sql::query(
                "update turns set state = ?, claimed_at = ?, completed_at = ?, claim_count = ?,
                     current_claim_id = ?, completion_id = ?, response = ?
                 where turn_id = ?",
            )
            .bind(t.state)
            .bind(t.claimed_at)
            .bind(t.completed_at)
            .bind(t.claim_count)
            .bind(&t.current_claim_id)
            .bind(&t.completion_id)
            .bind(&t.response)
            .bind(&t.turn_id)
            .execute(conn)?;
        }
        None => {}
    }
    match writes.claim {
        Some(Change::Insert(c)) => {
            sql::query(
                "insert into claims (claim_id, session_id, turn_id, attempt, state, claimed_at)
                 values (?, ?, ?, ?, ?, ?)",
            )
            .bind(&c.claim_id)
            .bind(&c.session_id)
            .bind(&c.turn_id)
            .bind(c.attempt)
            .bind(c.state)
            .bind(c.claimed_at)
            .execute(conn)?;
        }
        Some(Change::Update(c)) => {
            sql::query("update claims set state = ?, released_at = ? where claim_id = ?")
                .bind(c.state)
                .bind(c.released_at)
                .bind(&c.claim_id)
                .execute(conn)?;
        }
        None => {}
    }
    if let Some(s) = writes.session {
        write_session(conn, &s)?;
    }
    if let Some(e) = writes.event {
        insert_event(conn, &e)?;
    }
    if let Some(r) = writes.reply {
        sql::query(
            "insert into lark_replies (turn_id, session_id, chat_id, message_id, text, state,
                 next_attempt_at, created_at, updated_at)
             values (?, ?, ?, ?, ?, 'pending', ?, ?, ?)",
        )
        .bind(&r.turn_id)
        .bind(&r.session_id)
        .bind(&r.chat_id)
        .bind(&r.message_id)
        .bind(&r.text)
        .bind(r.at)
        .bind(r.at)
        .bind(r.at)
        .execute(conn)?;
    }
    Ok(())
}

/// Writes back what a decision changes in a (locked) session row.
fn write_session(conn: &Connection, s: &SessionRow) -> Result<()> {
    sql::query(
        "update sessions set state = ?, closed_at = ?, next_seq = ?, next_event_no = ?,
             queued_count = ?, active_claim_id = ?
         where session_id = ?",
    )
    .bind(s.state)
    .bind(s.closed_at)
    .bind(s.next_seq)
    .bind(s.next_event_no)
    .bind(s.queued_count)
    .bind(&s.active_claim_id)
    .bind(&s.session_id)
    .execute(conn)?;
    Ok(())
}

fn insert_event(conn: &Connection, e: &NewEvent) -> Result<()> {
    sql::query(
        "insert into session_events
             (session_id, event_no, kind, turn_id, seq, request_id, state, at)
         values (?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&e.session_id)
    .bind(e.event_no)
    .bind(e.kind)
    .bind(&e.turn_id)
    .bind(e.seq)
    .bind(&e.request_id)
    .bind(e.state)
    .bind(e.at)
    .execute(conn)?;
    Ok(())
}

/// Applies a decision's writes and answers its answer.
fn decided<T>(conn: &Connection, decided: Decided<T>) -> Result<T> {
    apply(conn, decided.writes)?;
    Ok(decided.answer)
}

fn enqueue(
    conn: &Connection,
    session_id: String,
    message: EnqueueRequest,
    minter: &Minter,
) -> Result<Enqueue> {
    let session = load_session(conn, &session_id)?;
    let earlier = match (&session, &message.client_message_id) {
        (Some(_), Some(client_message_id)) => {
            sql::query_as("select * from turns where session_id = ? and client_message_id = ?")
                .bind(&session_id)
                .bind(client_message_id)
                .fetch_optional(conn)?
        }
        _ => None,
    };
    let decision = decide::turn::enqueue(session, earlier, message, minter, now_ms())?;
    decided(conn, decision)
}

fn claim_rows(conn: &Connection, session_id: &str, claim_id: &str) -> Result<ClaimRows> {
    let Some(session) = load_session(conn, session_id)? else {
        return Ok(ClaimRows::default());
    };
    let earlier = load_claim(conn, claim_id)?;
    let earlier_turn = match &earlier {
        Some(claim) => load_turn(conn, session_id, &claim.turn_id)?,
        None => None,
    };
    let head = sql::query_as(
        "select * from turns where session_id = ? and state = 'queued' order by seq limit 1",
    )
    .bind(session_id)
    .fetch_optional(conn)?;
    Ok(ClaimRows {
        active: active_claim(conn, Some(&session))?,
        session: Some(session),
        earlier,
        earlier_turn,
        head,
    })
}

fn claim(
    conn: &Connection,
    session_id: String,
    host: HostIdentity,
    claim_id: String,
) -> Result<ClaimOutcome> {
    let rows = claim_rows(conn, &session_id, &claim_id)?;
    decided(conn, decide::turn::claim(rows, &host, &claim_id, now_ms())?)
}

fn complete(
    conn: &Connection,
    session_id: String,
    turn_id: String,
    completion: CompleteRequest,
) -> Result<Receipt> {
    let session = load_session(conn, &session_id)?;
    let turn = load_turn(conn, &session_id, &turn_id)?;
    let used: Option<i64> =
        sql::query_scalar("select 1 from turns where session_id = ? and completion_id = ?")
            .bind(&session_id)
            .bind(&completion.completion_id)
            .fetch_optional(conn)?;
    let rows = CompleteRows {
        session,
        turn,
        completion_id_used: used.is_some(),
    };
    decided(conn, decide::turn::complete(rows, completion, now_ms())?)
}

fn release(
    conn: &Connection,
    session_id: String,
    claim_id: String,
    host: HostIdentity,
) -> Result<Released> {
    let session = load_session(conn, &session_id)?;
    let claim = load_claim(conn, &claim_id)?.filter(|c| c.session_id == session_id);
    let turn = match &claim {
        Some(claim) => load_turn(conn, &session_id, &claim.turn_id)?,
        None => None,
    };
    let rows = ReleaseRows {
        session,
        claim,
        turn,
    };
    decided(conn, decide::turn::release(rows, &host, now_ms())?)
}

fn close_rows(conn: &Connection, session_id: &str) -> Result<CloseRows> {
    let Some(session) = load_session(conn, session_id)? else {
        return Ok(CloseRows::default());
    };
    let queued = sql::query_scalar(
        "select count(*) from turns where session_id = ? and state = 'queued'",
    )
    .bind(session_id)
    .fetch_one(conn)?;
    let pending = sql::query_scalar(
        "select count(*) from permission_requests where session_id = ? and state = 'pending'",
    )
    .bind(session_id)
    .fetch_one(conn)?;
    Ok(CloseRows {
        active: active_claim(conn, Some(&session))?,
        session: Some(session),
        queued,
        pending,
    })
}

fn close(conn: &Connection, session_id: String) -> Result<Closed> {
    let rows = close_rows(conn, &session_id)?;
    let closing = match decide::session::close(rows, now_ms())? {
        Close::Replayed(closed) => return Ok(closed),
        Close::Close(closing) => closing,
    };
    let at = closing.event.at;
    let cancelled = sql::query(
        "insert into session_events (session_id, event_no, kind, turn_id, seq, state, at)
         select session_id, ?1 - 1 + row_number() over (order by seq), 'turn', turn_id, seq,
                ?2, ?3
         from turns where session_id = ?4 and state = 'queued'",
    )
    .bind(closing.cancelled_from)
    .bind(closing.cancelled)
    .bind(at)
    .bind(&session_id)
    .execute(conn)?
    .rows_affected();
    sql::query(
        "update turns set state = ?, cancel_reason = ? where session_id = ? and state = 'queued'",
    )
    .bind(closing.cancelled)
    .bind(closing.cancel_reason)
    .bind(&session_id)
    .execute(conn)?;
    let expired = sql::query(
        "insert into session_events (session_id, event_no, kind, request_id, state, at)
         select session_id, ?1 - 1 + row_number() over (order by created_at, request_id),
                'permission', request_id, ?2, ?3
         from permission_requests where session_id = ?4 and state = 'pending'",
    )
    .bind(closing.expired_from)
    .bind(closing.expired)
    .bind(at)
    .bind(&session_id)
    .execute(conn)?
    .rows_affected();
    sql::query(
        "update permission_requests set state = ?, answered_at = ?
         where session_id = ? and state = 'pending'",
    )
    .bind(closing.expired)
    .bind(at)
    .bind(&session_id)
    .execute(conn)?;
    write_session(conn, &closing.session)?;
    insert_event(conn, &closing.event)?;
    sql::query("delete from lark_links where session_id = ?")
        .bind(&session_id)
        .execute(conn)?;
    Ok(Closed {
        session: closing.session,
        cancelled,
        expired,
    })
}

/// A permission request's columns, in the order [`PermissionRow`] is read.
macro_rules! permission_columns {
    () => {
        "session_id, request_id, tool_name, description, input_preview, state, created_at, \
         answered_at, answered_via"
    };
}
const SELECT_PERMISSION: &str = concat!(
    "select ",
    permission_columns!(),
    " from permission_requests where session_id = ? and request_id = ?"
);

fn load_permission(
    conn: &Connection,
    session_id: &str,
    request_id: &str,
) -> Result<Option<PermissionRow>> {
    sql::query_as(SELECT_PERMISSION)
        .bind(session_id)
        .bind(request_id)
        .fetch_optional(conn)
}

fn create_permission(
    conn: &Connection,
    session_id: String,
    host: HostIdentity,
    request: CreatePermissionRequest,
) -> Result<Decision> {
    let session = existing_session(conn, &session_id)?;
    let existing = load_permission(conn, &session_id, &request.request_id)?;
    let decision = permission::create(&session, &host, existing, request, now_ms())?;
    if let Decision::Write(row) = &decision {
        sql::query(concat!(
            "insert into permission_requests (",
            permission_columns!(),
            ") values (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        ))
        .bind(&row.session_id)
        .bind(&row.request_id)
        .bind(&row.tool_name)
        .bind(&row.description)
        .bind(&row.input_preview)
        .bind(row.state)
        .bind(row.created_at)
        .bind(row.answered_at)
        .bind(row.answered_via)
        .execute(conn)?;
        append_permission_event(conn, row)?;
        queue_lark_message(conn, row)?;
    }
    Ok(decision)
}

/// A new request in a session linked to a Lark chat: its message to the chat,
/// into the outbox, in the request's transaction. Unlinked: nothing.
fn queue_lark_message(conn: &Connection, row: &PermissionRow) -> Result<()> {
    let now = now_ms();
    sql::query(
        "insert into lark_permission_messages (session_id, request_id, chat_id, text, state,
             next_attempt_at, created_at, updated_at)
         select session_id, ?, chat_id, ?, 'pending', ?, ?, ? from lark_links
         where session_id = ?",
    )
    .bind(&row.request_id)
    .bind(permission::lark_message(row))
    .bind(now)
    .bind(now)
    .bind(now)
    .bind(&row.session_id)
    .execute(conn)?;
    Ok(())
}

fn answer_permission(
    conn: &Connection,
    session_id: String,
    request_id: String,
    (behavior, via): (Behavior, AnsweredVia),
) -> Result<Decision> {
    existing_session(conn, &session_id)?;
    let existing = load_permission(conn, &session_id, &request_id)?;
    let decision = permission::answer(existing, behavior, via, now_ms())?;
    write_answer(conn, &decision)?;
    Ok(decision)
}

/// Writes an answer the rules decided (a replay writes nothing).
fn write_answer(conn: &Connection, decision: &Decision) -> Result<()> {
    if let Decision::Write(row) = decision {
        sql::query(
            "update permission_requests set state = ?, answered_at = ?, answered_via = ?
             where session_id = ? and request_id = ?",
        )
        .bind(row.state)
        .bind(row.answered_at)
        .bind(row.answered_via)
        .bind(&row.session_id)
        .bind(&row.request_id)
        .execute(conn)?;
        append_permission_event(conn, row)?;
    }
    Ok(())
}

fn append_permission_event(conn: &Connection, row: &PermissionRow) -> Result<()> {
    append_event(
        conn,
        &row.session_id,
        Subject::Permission(&row.request_id),
        row.state.as_str(),
    )
}

fn lark_link(
    conn: &Connection,
    session_id: String,
    chat_id: String,
    approvers: Vec<String>,
) -> Result<LarkLink> {
    let session = existing_session(conn, &session_id)?;
    if session.state == SessionState::Closed {
        return Err(Error::new(
            ErrorCode::SessionClosed,
            "The session is closed.",
        ));
    }
    let holder: Option<String> =
        sql::query_scalar("select session_id from lark_links where chat_id = ?")
            .bind(&chat_id)
            .fetch_optional(conn)?;
    if holder.as_ref().is_some_and(|h| *h != session_id) {
        return Err(Error::new(
            ErrorCode::ChatLinked,
            "This Lark chat is linked to another open session; unlink it there first.",
        ));
    }
    sql::query("delete from lark_links where session_id = ?")
        .bind(&session_id)
        .execute(conn)?;
    sql::query(
        "insert into lark_links (chat_id, session_id, linked_at, approvers) values (?, ?, ?, ?)",
    )
    .bind(&chat_id)
    .bind(&session_id)
    .bind(now_ms())
    .bind(permission::approvers_to_stored(&approvers))
    .execute(conn)?;
    Ok(LarkLink {
        session_id,
        chat_id: Some(chat_id),
        approvers,
    })
}

fn lark_event(conn: &Connection, event: LarkEvent, minter: &Minter) -> Result<LarkIngest> {
    let seen: Option<i64> = sql::query_scalar(
        "select 1 from lark_events where app_id = ?1 and (event_id = ?2 or message_id = ?3)",
    )
    .bind(&event.app_id)
    .bind(&event.event_id)
    .bind(&event.message_id)
    .fetch_optional(conn)?;
    if seen.is_some() {
        return Ok(LarkIngest::Duplicate);
    }
    sql::query(
        "insert into lark_events (app_id, event_id, message_id, received_at) values (?, ?, ?, ?)",
    )
    .bind(&event.app_id)
    .bind(&event.event_id)
    .bind(&event.message_id)
    .bind(now_ms())
    .execute(conn)?;
    let (Some(text), Some(chat_id), Some(message_id)) = (
        event.text.clone(),
        event.chat_id.clone(),
        event.message_id.clone(),
    ) else {
        return Ok(LarkIngest::Unsupported);
    };
    let linked: Option<(String, String)> =
        sql::query_as("select session_id, approvers from lark_links where chat_id = ?")
            .bind(&chat_id)
            .fetch_optional(conn)?;
    let Some((session_id, approvers)) = linked else {
        return Ok(LarkIngest::Unlinked);
    };
    let existing = match event.named_request() {
        Some(request_id) => load_permission(conn, &session_id, request_id)?,
        None => None,
    };
    match event.verdict(existing, &approvers) {
        LarkVerdict::Turn => {}
        LarkVerdict::Ignore => return Ok(LarkIngest::Ignored),
        LarkVerdict::Answer(decision) => {
            write_answer(conn, &decision)?;
            return Ok(LarkIngest::Answered {
                session_id,
                decision,
            });
        }
    }
    let message = EnqueueRequest {
        origin: crate::model::Origin::Lark,
        text,
        client_message_id: Some(event.event_id),
        ingress: Ingress::SessionQueue,
        lark: Some(LarkRef {
            chat_id,
            message_id,
        }),
    };
    let done = enqueue(conn, session_id.clone(), message, minter)?;
    Ok(LarkIngest::Enqueued {
        session_id,
        turn: Box::new(done.turn),
    })
}

#[async_trait]
impl Store for SqliteStore {
    async fn ping(&self) -> Result<()> {
        sqlx::query("select 1").execute(&self.reads).await?;
        // A read alone does not prove the writer is alive.
        self.write(|_| Ok(())).await
    }

    async fn register(&self, thread: RegisterAgentThread) -> Result<bool> {
        self.write(move |conn| {
                let inserted = sql::query(
                    "insert into agent_threads (goal_id, agent_id, host_surface, host_session_id, registered_at)
                     values (?, ?, ?, ?, ?) on conflict do nothing",
                )
                .bind(&thread.goal_id)
                .bind(&thread.agent_id)
                .bind(&thread.host_surface)
                .bind(&thread.host_session_id)
                .bind(now_ms())
                .execute(conn)?;
                Ok(inserted.rows_affected() == 1)
        })
        .await
    }

    async fn preview_bind(&self, request: BindRequest) -> Result<Option<SessionRow>> {
        // Through the writer, which writes nothing: the checks are the bind's own.
        self.write(move |conn| decide::session::check_bind(bind_rows(conn, &request)?, &request))
            .await
    }

    async fn bind(&self, request: BindRequest) -> Result<Bound> {
        let minter = self.minter.clone();
        self.write(move |conn| bind(conn, request, &minter)).await
    }

    async fn session(&self, session_id: &str) -> Result<Option<SessionRow>> {
        read_session(&self.reads, session_id).await
    }

    async fn sessions(&self, filter: ListSessions, limit: u32) -> Result<Vec<SessionRow>> {
        let sql = format!(
            "select {SESSION_COLUMNS} from sessions
             where (?1 is null or state = ?1) and (?2 is null or goal_id = ?2)
               and (?3 is null or agent_id = ?3) and (?4 is null or session_id > ?4)
             order by session_id limit ?5"
        );
        Ok(sqlx::query_as(&sql)
            .bind(filter.state)
            .bind(filter.goal_id)
            .bind(filter.agent_id)
            .bind(filter.cursor)
            .bind(limit)
            .fetch_all(&self.reads)
            .await?)
    }

    async fn enqueue(&self, session_id: String, message: EnqueueRequest) -> Result<Enqueue> {
        let minter = self.minter.clone();
        self.write(move |conn| enqueue(conn, session_id, message, &minter))
            .await
    }

    fn hands_off(&self) -> bool {
        true
    }

    async fn enqueue_and_claim(
        &self,
        session_id: String,
        message: EnqueueRequest,
        (host, claim_id): (HostIdentity, String),
    ) -> Result<(Enqueue, Result<ClaimOutcome>)> {
        let minter = self.minter.clone();
        self.write(move |conn| {
            let enqueued = enqueue(conn, session_id.clone(), message, &minter)?;
            // The claim runs in a savepoint of its own: refusing the claimer
            // (another claim is active, say) keeps the enqueue.
            let claimed = nested(conn, |conn| claim(conn, session_id, host, claim_id));
            Ok((enqueued, claimed))
        })
        .await
    }

    async fn claim(
        &self,
        session_id: String,
        host: HostIdentity,
        claim_id: String,
    ) -> Result<ClaimOutcome> {
        self.write(move |conn| claim(conn, session_id, host, claim_id))
            .await
    }

    async fn complete(
        &self,
        session_id: String,
        turn_id: String,
        completion: CompleteRequest,
    ) -> Result<Receipt> {
        self.write(move |conn| complete(conn, session_id, turn_id, completion))
            .await
    }

    async fn release(
        &self,
        session_id: String,
        claim_id: String,
        host: HostIdentity,
    ) -> Result<Released> {
        self.write(move |conn| release(conn, session_id, claim_id, host))
            .await
    }

    async fn close(&self, session_id: String) -> Result<Closed> {
        self.write(move |conn| close(conn, session_id)).await
    }

    async fn create_permission(
        &self,
        session_id: String,
        host: HostIdentity,
        request: CreatePermissionRequest,
    ) -> Result<Decision> {
        self.write(move |conn| create_permission(conn, session_id, host, request))
            .await
    }

    async fn answer_permission(
        &self,
        session_id: String,
        request_id: String,
        behavior: Behavior,
        via: AnsweredVia,
    ) -> Result<Decision> {
        self.write(move |conn| answer_permission(conn, session_id, request_id, (behavior, via)))
            .await
    }

    async fn permission(&self, session_id: &str, request_id: &str) -> Result<PermissionRow> {
        if read_session(&self.reads, session_id).await?.is_none() {
            return Err(Error::not_found("session"));
        }
        sqlx::query_as(SELECT_PERMISSION)
            .bind(session_id)
            .bind(request_id)
            .fetch_optional(&self.reads)
            .await?
            .ok_or_else(|| Error::not_found("permission request"))
    }

    async fn permissions(
        &self,
        session_id: &str,
        state: Option<PermissionState>,
    ) -> Result<Vec<PermissionRow>> {
        if read_session(&self.reads, session_id).await?.is_none() {
            return Err(Error::not_found("session"));
        }
        Ok(sqlx::query_as(concat!(
            "select ",
            permission_columns!(),
            " from permission_requests where session_id = ?1 and (?2 is null or state = ?2)
             order by state = 'pending' desc, created_at desc, request_id desc limit ?3"
        ))
        .bind(session_id)
        .bind(state)
        .bind(permission::LIST_LIMIT)
        .fetch_all(&self.reads)
        .await?)
    }

    async fn lark_link(
        &self,
        session_id: String,
        chat_id: String,
        approvers: Vec<String>,
    ) -> Result<LarkLink> {
        self.write(move |conn| lark_link(conn, session_id, chat_id, approvers))
            .await
    }

    async fn lark_unlink(&self, session_id: String) -> Result<LarkLink> {
        self.write(move |conn| {
            existing_session(conn, &session_id)?;
            sql::query("delete from lark_links where session_id = ?")
                .bind(&session_id)
                .execute(conn)?;
            Ok(LarkLink::none(session_id))
        })
        .await
    }

    async fn lark_link_status(&self, session_id: &str) -> Result<LarkLink> {
        if read_session(&self.reads, session_id).await?.is_none() {
            return Err(Error::not_found("session"));
        }
        let link: Option<(String, String)> =
            sqlx::query_as("select chat_id, approvers from lark_links where session_id = ?")
                .bind(session_id)
                .fetch_optional(&self.reads)
                .await?;
        Ok(LarkLink::stored(session_id, link))
    }

    async fn lark_event(&self, event: LarkEvent) -> Result<LarkIngest> {
        let minter = self.minter.clone();
        self.write(move |conn| lark_event(conn, event, &minter))
            .await
    }

    async fn due_replies(&self, now_ms: i64, limit: u32) -> Result<Vec<ReplyJob>> {
        let rows: Vec<OutboxRow> = sqlx::query_as(super::DUE_OUTBOX)
            .bind(now_ms)
            .bind(limit)
            .fetch_all(&self.reads)
            .await?;
        Ok(rows.into_iter().map(OutboxRow::job).collect())
    }

    async fn next_reply_due(&self) -> Result<Option<i64>> {
        Ok(sqlx::query_scalar(super::NEXT_OUTBOX_DUE)
            .fetch_one(&self.reads)
            .await?)
    }

    async fn record_reply(&self, outbound: Outbound, update: ReplyUpdate) -> Result<()> {
        self.write(move |conn| {
            let (statement, keys) = super::record_outbox(outbound);
            let mut query = sql::query(statement)
                .bind(update.parts_sent)
                .bind(update.state)
                .bind(update.attempts)
                .bind(update.failures)
                .bind(update.error)
                .bind(update.next_attempt_at)
                .bind(now_ms());
            for key in keys {
                query = query.bind(key);
            }
            query.execute(conn)?;
            Ok(())
        })
        .await
    }

    async fn queue_stats(&self) -> Result<(i64, Option<i64>)> {
        Ok(sqlx::query_as(QUEUE_STATS).fetch_one(&self.reads).await?)
    }

    async fn prune_step(&self, cutoff_ms: i64) -> Result<PruneStep> {
        self.write(move |conn| prune_step(conn, cutoff_ms)).await
    }

    async fn last_event_no(&self, session_id: &str) -> Result<i64> {
        let next: Option<i64> =
            sqlx::query_scalar("select next_event_no from sessions where session_id = ?")
                .bind(session_id)
                .fetch_optional(&self.reads)
                .await?;
        next.map(|n| n - 1)
            .ok_or_else(|| Error::not_found("session"))
    }

    async fn events(&self, session_id: &str, after: i64, limit: u32) -> Result<Vec<EventRow>> {
        Ok(sqlx::query_as(
            "select event_no, kind, turn_id, seq, request_id, state from session_events
             where session_id = ? and event_no > ? order by event_no limit ?",
        )
        .bind(session_id)
        .bind(after)
        .bind(limit)
        .fetch_all(&self.reads)
        .await?)
    }

    async fn turn(&self, session_id: &str, turn_id: &str) -> Result<TurnRow> {
        if read_session(&self.reads, session_id).await?.is_none() {
            return Err(Error::not_found("session"));
        }
        read_turn(&self.reads, session_id, turn_id)
            .await?
            .ok_or_else(|| Error::not_found("turn"))
    }

    async fn turns(
        &self,
        session_id: &str,
        page: ListTurns,
        limit: u32,
    ) -> Result<(Vec<TurnRow>, bool)> {
        if read_session(&self.reads, session_id).await?.is_none() {
            return Err(Error::not_found("session"));
        }
        // Paging back (before_seq alone) reads newest first, then restores seq order.
        let backwards = page.before_seq.is_some() && page.after_seq.is_none();
        let sql = if backwards {
            "where t.session_id = ?1 and t.seq < ?3 order by t.seq desc limit ?4"
        } else {
            "where t.session_id = ?1 and t.seq > ?2 and (?3 is null or t.seq < ?3)
             order by t.seq limit ?4"
        };
        let sql = format!("{TURN_READBACK} {sql}");
        let mut turns: Vec<TurnRow> = sqlx::query_as(&sql)
            .bind(session_id)
            .bind(page.after_seq.unwrap_or(0))
            .bind(page.before_seq)
            .bind(limit + 1)
            .fetch_all(&self.reads)
            .await?;
        let has_more = turns.len() > limit as usize;
        turns.truncate(limit as usize);
        if backwards {
            turns.reverse();
        }
        Ok((turns, has_more))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/metrics` and every retention statement go through indexes: none
    /// scans a whole table, however large the history.
    #[tokio::test]
    async fn scrapes_and_pruning_scan_no_whole_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.db");
        let _store = SqliteStore::open(&path, Durability::Relaxed).await.unwrap();
        let conn = Connection::open(&path).unwrap();
        let mut statements = vec![
            QUEUE_STATS,
            retention::OLDEST_PRUNABLE,
            retention::DELETE_SESSION,
            retention::DELETE_LARK_EVENTS,
        ];
        statements.extend(retention::DELETE_CHILDREN);
        for statement in statements {
            let mut plan = conn
                .prepare(&format!("explain query plan {statement}"))
                .unwrap();
            let params = vec![1; plan.parameter_count()];
            let steps: Vec<String> = plan
                .query_map(rusqlite::params_from_iter(params), |row| {
                    row.get::<_, String>(3)
                })
                .unwrap()
                .map(Result::unwrap)
                .collect();
            let whole_table = steps
                .iter()
                .find(|step| step.starts_with("SCAN ") && !step.contains(" USING "));
            assert!(whole_table.is_none(), "{statement}\n{steps:#?}");
        }
    }

    #[test]
    fn the_wal_file_is_reopened_when_replaced_and_a_missing_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.db-wal");
        let mut wal = WalFile::new(path.clone());
        assert!(wal.sync().is_err(), "no log yet: nothing can be synced");
        std::fs::write(&path, b"first").unwrap();
        wal.sync().unwrap();
        let first = wal.file.as_ref().unwrap().metadata().unwrap();
        let replacement = dir.path().join("new");
        std::fs::write(&replacement, b"second").unwrap();
        std::fs::rename(&replacement, &path).unwrap();
        wal.sync().unwrap();
        let second = wal.file.as_ref().unwrap().metadata().unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_ne!(
            first.ino(),
            second.ino(),
            "the replaced file is the one synced"
        );
    }
}
