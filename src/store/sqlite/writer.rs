//! The SQLite writer: the only writing connection, held by one thread at a
//! time (a lone write's caller, else the writer's own thread). It takes
//! the jobs waiting in its queue, runs them in one `BEGIN IMMEDIATE`
//! transaction (a failed job's changes undone alone: see [`run_batch`]),
//! commits once, and only then answers them
//! (group commit: one fsync for a batch of concurrent writes); the flusher
//! syncs the WAL off the writer's path, the checkpointer copies it back. It
//! knows nothing of what a job writes, but it runs the journal
//! ([`super::journal`]): replays it at start, folds it before a job that
//! reads the tables, folds it behind the answers, and rebuilds it after a
//! rollback.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use super::Durability;
use super::journal::{self, Marks};
use crate::error::{Error, Result};

/// How long the writer's connection waits on a lock held by another.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The most writes one transaction commits together.
pub(super) const MAX_BATCH: usize = 256;

/// A write, run by the writer in a batch's transaction, and answered once the
/// batch has committed. It may run more than once before it is answered: a
/// job that fails after changing rows has the whole transaction rolled back
/// and the others run again without it (see [`run_batch`]).
trait Job: Send {
    /// Whether the journal is folded into the tables before it runs (a job
    /// that reads them with its own queries).
    fn reads_tables(&self) -> bool;
    /// Runs the write and says whether its changes are kept.
    fn run(&mut self, conn: &Connection) -> bool;
    /// Answers the outcome of its last run, given that the batch committed
    /// (`Ok`), or the batch's failure.
    fn answer(self: Box<Self>, committed: Result<()>);
}

type Jobs = Vec<Box<dyn Job>>;

/// A [`Writer::write`]: the operation, the outcome of its last run, and
/// where the answer goes.
struct Write<T, F> {
    op: F,
    reads_tables: bool,
    outcome: Option<Result<T>>,
    reply: oneshot::Sender<Result<T>>,
}

/// A job for `op`, and where its answer arrives.
#[cfg(test)]
fn job<T, F>(op: F) -> (Box<dyn Job>, oneshot::Receiver<Result<T>>)
where
    T: Send + 'static,
    F: FnMut(&Connection) -> Result<T> + Send + 'static,
{
    job_on(op, true)
}

fn job_on<T, F>(op: F, reads_tables: bool) -> (Box<dyn Job>, oneshot::Receiver<Result<T>>)
where
    T: Send + 'static,
    F: FnMut(&Connection) -> Result<T> + Send + 'static,
{
    let (reply, answer) = oneshot::channel();
    let write = Write {
        op,
        reads_tables,
        outcome: None,
        reply,
    };
    (Box::new(write), answer)
}

impl<T, F> Job for Write<T, F>
where
    T: Send,
    F: FnMut(&Connection) -> Result<T> + Send,
{
    fn reads_tables(&self) -> bool {
        self.reads_tables
    }

    fn run(&mut self, conn: &Connection) -> bool {
        let outcome = (self.op)(conn);
        let keep = outcome.is_ok();
        self.outcome = Some(outcome);
        keep
    }

    fn answer(self: Box<Self>, committed: Result<()>) {
        let outcome = self
            .outcome
            .unwrap_or_else(|| Err(Error::store("writing", "the write did not run")));
        let _ = self.reply.send(committed.and(outcome));
    }
}

/// The writer: the only writing connection, with its queue of jobs. A
/// write runs on the caller's own thread when nobody holds the writer
/// ([`Writer::send`]), else it waits in the queue for the writer's thread,
/// which a doorbell wakes.
pub struct Writer {
    jobs: mpsc::Sender<Box<dyn Job>>,
    doorbell: std::sync::mpsc::SyncSender<()>,
    core: std::sync::Arc<std::sync::Mutex<Core>>,
    marks: std::sync::Arc<Marks>,
    /// Writes sent and not answered yet.
    under_way: std::sync::atomic::AtomicUsize,
}

impl Writer {
    /// Opens the writer's connection and starts its thread (with the
    /// checkpointer and the flusher), once it has replayed the journal.
    pub fn start(path: &Path, durability: Durability) -> Result<Self> {
        let writer = open_writer(path).map_err(|e| Error::store("opening the writer", e))?;
        let checkpointer = Checkpointer::start(path)?;
        let flusher = Flusher::start(wal_path(path), durability)
            .map_err(|e| Error::store("starting the flusher", e))?;
        let (jobs, queue) = mpsc::channel(4 * MAX_BATCH);
        let (doorbell, rung) = std::sync::mpsc::sync_channel(1);
        let (opened, replayed) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("loopx-sqlite-writer".into())
            .spawn(move || match replay(&writer) {
                Ok(marks) => {
                    let core = std::sync::Arc::new(std::sync::Mutex::new(Core {
                        conn: writer,
                        queue,
                        flusher,
                        checkpointer,
                        commits: 0,
                        held: journal::hand_over(),
                        untimed: true,
                    }));
                    let _ = opened.send(Ok((marks, core.clone())));
                    run_writer(&core, &rung);
                }
                Err(e) => {
                    let _ = opened.send(Err(e));
                }
            })
            .map_err(|e| Error::store("starting the writer", e))?;
        let (marks, core) = replayed
            .recv()
            .map_err(|_| Error::store("replaying the journal", "the writer has stopped"))??;
        Ok(Self {
            jobs,
            doorbell,
            core,
            marks,
            under_way: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// Runs `op` on the writer, in the transaction of a group commit, and
    /// answers after the commit. An `Err` from `op` rolls back its own changes
    /// only. `op` may run more than once (its transaction rolled back between
    /// runs: see [`run_batch`]); only its last run's outcome is answered, so
    /// it must do nothing but read and write through `conn`. The journal is
    /// folded first: `op` reads the tables as they are.
    pub async fn write<T, F>(&self, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&Connection) -> Result<T> + Send + 'static,
    {
        self.send(job_on(op, true)).await
    }

    /// As [`Writer::write`], for a decision of a turn's cycle: it reads
    /// its rows only through [`journal`]'s loads, so nothing is folded first.
    pub async fn write_cycle<T, F>(&self, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&Connection) -> Result<T> + Send + 'static,
    {
        self.send(job_on(op, false)).await
    }

    /// Runs a lone cycle's write here, on the caller's thread, when nobody
    /// holds the writer, else queues it for the writer's thread. Written here, a
    /// lone write is committed, synced and answered without waking another
    /// thread twice (to the writer and back): on a virtual machine each
    /// wake-up of an idle core costs tens of µs. Writes that overlap go
    /// to the writer's thread, which commits them together while the
    /// callers' threads serve other requests.
    async fn send<T>(&self, (job, rx): (Box<dyn Job>, oneshot::Receiver<Result<T>>)) -> Result<T> {
        let stopped = || Error::store("writing", "the writer has stopped");
        let _sent = UnderWay::count(&self.under_way);
        if let Some(job) = self.write_here(job) {
            self.queue(job).await.map_err(|_| stopped())?;
        }
        rx.await.map_err(|_| stopped())?
    }

    /// Writes `job` if it is a turn's cycle's decision (small, and bounded:
    /// it folds nothing), the only write under way, and this thread can take
    /// the writer at once; gives it back otherwise. Any other write may fold
    /// the whole journal first, which is the writer's thread's to wait on,
    /// not a worker's.
    fn write_here(&self, job: Box<dyn Job>) -> Option<Box<dyn Job>> {
        if job.reads_tables() || self.under_way.load(Ordering::Acquire) > 1 {
            return Some(job);
        }
        let Ok(core) = self.core.try_lock() else {
            return Some(job);
        };
        let mut held = Holding::on_this_thread(core);
        held.round(Some(job));
        if held.wants_upkeep() {
            let _ = self.doorbell.try_send(());
        }
        None
    }

    async fn queue(&self, job: Box<dyn Job>) -> std::result::Result<(), ()> {
        self.jobs.send(job).await.map_err(|_| ())?;
        let _ = self.doorbell.try_send(());
        Ok(())
    }

    /// Returns once the tables hold every record committed before the call
    /// (at once when they do): for reads of the read pool.
    pub async fn caught_up(&self) -> Result<()> {
        let Some(through) = self.marks.behind() else {
            return Ok(());
        };
        // A fold job, answered at its sync; the readers go on as soon as it
        // has committed (the mark moves then).
        let (job, rx) = job_on(|_: &Connection| Ok(()), true);
        let stopped = || Error::store("reading", "the writer has stopped");
        self.queue(job).await.map_err(|()| stopped())?;
        tokio::select! {
            () = self.marks.folded(through) => Ok(()),
            answer = rx => answer.map_err(|_| stopped())?,
        }
    }
}

/// The writer's connection: WAL without syncs of its own, foreign keys, a busy
/// timeout, and room in the statement cache for every statement it runs.
fn open_writer(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "journal_mode", "wal")?;
    // The flusher syncs the WAL after the commit: before any answer at
    // `full`, behind the answers at `relaxed` (see [`Flusher`]).
    conn.pragma_update(None, "synchronous", "normal")?;
    conn.pragma_update(None, "foreign_keys", "on")?;
    // The checkpointer copies most of the WAL back; the writer's own
    // checkpoint finishes the job (see [`WRITER_CHECKPOINT_PAGES`]).
    conn.pragma_update(None, "wal_autocheckpoint", WRITER_CHECKPOINT_PAGES)?;
    // After a spike (a reader pinning an old snapshot), the WAL file shrinks
    // back to this size when it restarts, instead of keeping its peak.
    conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT_BYTES as i64)?;
    // Statement journals in memory, not in temp files.
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

/// One write under way, counted until it is answered (or its caller
/// gives up on it).
struct UnderWay<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> UnderWay<'a> {
    fn count(under_way: &'a std::sync::atomic::AtomicUsize) -> Self {
        under_way.fetch_add(1, Ordering::AcqRel);
        Self(under_way)
    }
}

impl Drop for UnderWay<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What holding the writer gives: its connection, its queue, the threads
/// that sync and checkpoint behind it, and the journal (kept here while no
/// thread holds the writer).
struct Core {
    conn: Connection,
    queue: mpsc::Receiver<Box<dyn Job>>,
    flusher: Flusher,
    checkpointer: Checkpointer,
    commits: u32,
    held: journal::Held,
    /// Whether the writer's thread waits untimed (it had nothing to fold
    /// when it let go of the writer): a caller that leaves records to fold
    /// wakes it, so that the tables catch up when writes pause.
    untimed: bool,
}

/// The writer, held by this thread, with the journal installed on it; the
/// journal goes back into the core when it is let go.
struct Holding<'a>(std::sync::MutexGuard<'a, Core>);

impl<'a> Holding<'a> {
    fn on_this_thread(mut core: std::sync::MutexGuard<'a, Core>) -> Self {
        journal::take_over(std::mem::take(&mut core.held));
        Self(core)
    }

    /// Runs one batch: `own` after the jobs waiting in the queue (up to a
    /// batch). Answers whether there was anything to run.
    fn round(&mut self, own: Option<Box<dyn Job>>) -> bool {
        let core = &mut *self.0;
        let mut batch: Jobs = Vec::new();
        while batch.len() + usize::from(own.is_some()) < MAX_BATCH {
            match core.queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        batch.extend(own);
        if batch.is_empty() {
            return false;
        }
        journal::batch_of(batch.len());
        let committed = run_batch(&core.conn, &mut batch);
        if committed.is_ok() {
            if journal::committed() {
                super::crash::at(super::crash::Point::Journaled);
            }
            core.commits = core.commits.wrapping_add(1);
            if core.commits.is_multiple_of(CHECKPOINT_EVERY) {
                core.checkpointer.poke();
            }
        }
        match committed {
            Ok(()) => core.flusher.flush(batch, core.queue.is_empty()),
            committed => {
                for job in batch {
                    job.answer(committed.clone());
                }
            }
        }
        true
    }

    /// Whether the writer's thread has upkeep to do after a batch written on
    /// a caller's thread: a slice of the journal to fold, the WAL to check
    /// (every [`CHECKPOINT_EVERY`] commits), or records to fold when writes
    /// pause while it waits untimed. (Jobs still queued rang for themselves.)
    fn wants_upkeep(&mut self) -> bool {
        let core = &mut *self.0;
        let wake = journal::due()
            || core.commits.is_multiple_of(CHECKPOINT_EVERY)
            || (core.untimed && journal::pending() > 0);
        if wake {
            core.untimed = false;
        }
        wake
    }

    /// The writer's thread's upkeep after its batches: a slice of the
    /// journal folded when due, the WAL checkpointed when idle and
    /// restarted when over its limit.
    fn upkeep(&mut self) {
        let core = &mut *self.0;
        if journal::due() {
            let _ = fold_behind(&core.conn, journal::Fold::Slice);
        }
        if core.queue.is_empty() {
            core.checkpointer.finish_when_idle(&core.conn);
        }
        core.checkpointer.restart_when_over(&core.conn);
    }
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        self.0.held = journal::hand_over();
    }
}

/// The writer thread: woken by the doorbell, it takes the writer and runs
/// batches of what waits in the queue (see [`Holding::round`]), each in one
/// transaction, committed once, then answered; at `full` durability it hands
/// the answers to the flusher, which answers them once the commit is on
/// disk, while the writer goes on with the next batch. A caller that finds
/// the writer free writes in its place (see [`Writer::send`]) and rings the
/// doorbell for the upkeep.
fn run_writer(core: &std::sync::Mutex<Core>, doorbell: &std::sync::mpsc::Receiver<()>) {
    let hold = || match core.lock() {
        Ok(core) => Some(Holding::on_this_thread(core)),
        Err(poisoned) => {
            // A write panicked while holding the writer: nothing more is
            // written. What waits is answered "stopped" (its reply dropped).
            let mut core = poisoned.into_inner();
            core.queue.close();
            while core.queue.try_recv().is_ok() {}
            None
        }
    };
    // The journal starts replayed, with nothing to fold.
    let mut untimed = true;
    loop {
        let rung = if untimed {
            doorbell
                .recv()
                .map_err(|_| std::sync::mpsc::RecvTimeoutError::Disconnected)
        } else {
            // Only while the journal has records to fold: when writes
            // pause, the tables catch up (an idle broker waits untimed).
            doorbell.recv_timeout(FOLD_IDLE)
        };
        let Some(mut held) = hold() else { break };
        match rung {
            // Each batch is followed by the upkeep, which also runs alone
            // when a caller rang for it.
            Ok(()) => loop {
                let ran = held.round(None);
                held.upkeep();
                if !ran || held.0.queue.is_empty() {
                    break;
                }
            },
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let _ = fold_behind(&held.0.conn, journal::Fold::Slice);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                // The store is dropped: what is still journaled goes into
                // the tables now rather than at the next start.
                while held.round(None) {}
                if journal::pending() > 0 {
                    let _ = fold_behind(&held.0.conn, journal::Fold::All);
                }
                break;
            }
        }
        untimed = journal::pending() == 0;
        held.0.untimed = untimed;
    }
}

/// How long the writer waits for a job, with records to fold, before it
/// folds a slice (so that the tables catch up when writes pause).
const FOLD_IDLE: Duration = Duration::from_millis(20);

/// Opens the journal and folds what a crash left in it, in one transaction
/// (a crash during it leaves the records as they were), before the first
/// job.
fn replay(conn: &Connection) -> Result<std::sync::Arc<Marks>> {
    let marks = journal::open_on_writer(conn)?;
    if journal::pending() > 0 {
        super::crash::at(super::crash::Point::Replaying);
        fold_behind(conn, journal::Fold::All)?;
    }
    Ok(marks)
}

/// Folds journal records in a transaction of their own. Its
/// commit needs no sync of its own: a crash that loses it loses the
/// records' deletion with it, and they are folded again at start-up; the
/// next batch's sync covers it. A failure is logged and answered; the
/// records stay, to be folded again.
fn fold_behind(conn: &Connection, fold: journal::Fold) -> Result<()> {
    let folded = execute(conn, "begin immediate")
        .and_then(|()| journal::fold(conn, fold))
        .and_then(|_| execute(conn, "commit"));
    match folded {
        Ok(()) => {
            journal::committed();
            Ok(())
        }
        Err(e) => {
            tracing::warn!(error = %e, "folding the journal into the tables failed");
            rolled_back(conn);
            Err(e)
        }
    }
}

/// After a transaction was rolled back (or failed to commit): the
/// journal's records and overlay are read again from what is committed.
fn rolled_back(conn: &Connection) {
    if !conn.is_autocommit() {
        let _ = execute(conn, "rollback");
    }
    if let Err(e) = journal::reload(conn) {
        // The overlay may now disagree with the journal: nothing may be
        // decided on it. The writer stops; the broker fails closed.
        tracing::error!(error = %e, "reading the journal after a rollback failed");
        std::process::abort();
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
/// write runs meanwhile), but it syncs the WAL and the database file on the
/// writer's thread while the batch waits, so each restart costs the writer:
/// at 1,000 pages (round 2) bytes and writer CPU per cycle at 128 sessions
/// were 1.06x and 1.04x what they are at 1,500 with the idle completion
/// below (issue 29), where the WAL file stays under ~6.5 MB.
const WRITER_CHECKPOINT_PAGES: i64 = 1500;
/// The WAL file's size after a restart: the backstop plus slack. A WAL file
/// past it has missed a restart (see [`Checkpointer::restart_when_over`]).
const WAL_SIZE_LIMIT_BYTES: u64 = 8 * 1024 * 1024;
/// How long the writer waits for readers when it forces a restart.
const RESTART_WAIT: Duration = Duration::from_millis(200);
/// How long after a forced restart that failed the writer tries again.
const RESTART_RETRY: Duration = Duration::from_secs(1);
/// The WAL size (pages, as the checkpointer last saw it) past which the
/// writer, when its queue is empty, completes the checkpoint itself, so that
/// under writes that pause the log restarts at a moment nobody waits on, and
/// the checkpoint inside a commit at [`WRITER_CHECKPOINT_PAGES`] is left to
/// writes that never pause.
const IDLE_CHECKPOINT_PAGES: i64 = 1000;

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
    /// The WAL's size in pages at the end of the last passive checkpoint
    /// (0 once the writer has completed one: the log restarts).
    wal_pages: std::sync::Arc<std::sync::atomic::AtomicI64>,
    /// The write-ahead log's file, whose size says when a restart was missed.
    wal: std::path::PathBuf,
    /// When the last forced restart found readers still in the log.
    restart_failed_at: Option<std::time::Instant>,
}

impl Checkpointer {
    fn start(path: &Path) -> Result<Self> {
        let failed =
            |e: &dyn crate::error::StoreCause| Error::store("starting the checkpointer", e);
        let conn = Connection::open(path).map_err(|e| failed(&e))?;
        conn.busy_timeout(Duration::from_secs(5))
            .map_err(|e| failed(&e))?;
        let (pokes, queue) = std::sync::mpsc::sync_channel::<()>(1);
        let wal_pages = std::sync::Arc::<std::sync::atomic::AtomicI64>::default();
        let seen = wal_pages.clone();
        std::thread::Builder::new()
            .name("loopx-sqlite-ckpt".into())
            .spawn(move || {
                while queue.recv().is_ok() {
                    match checkpoint(&conn) {
                        Ok((pages, _)) => seen.store(pages, Ordering::Relaxed),
                        Err(e) => {
                            tracing::warn!(error = %e, "checkpointing the write-ahead log failed");
                        }
                    }
                }
            })
            .map_err(|e| failed(&e))?;
        Ok(Self {
            pokes,
            wal_pages,
            wal: wal_path(path),
            restart_failed_at: None,
        })
    }

    fn poke(&self) {
        let _ = self.pokes.try_send(());
    }

    /// On the writer's idle connection: completes the checkpoint when the
    /// WAL has grown past [`IDLE_CHECKPOINT_PAGES`], so that the next
    /// transaction starts the log over. A checkpoint that cannot complete
    /// (the checkpointer's is running, or a reader holds an old snapshot) is
    /// tried again at the next idle moment.
    fn finish_when_idle(&self, conn: &Connection) {
        if self.wal_pages.load(Ordering::Relaxed) < IDLE_CHECKPOINT_PAGES {
            return;
        }
        match checkpoint(conn) {
            Ok((pages, copied)) if pages >= 0 && copied == pages => {
                self.wal_pages.store(0, Ordering::Relaxed);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "checkpointing the write-ahead log failed"),
        }
    }

    /// After a commit: when the WAL file has grown past
    /// [`WAL_SIZE_LIMIT_BYTES`], the log missed its restart (a passive
    /// checkpoint only copies what no reader still reads, and the log starts
    /// over only if no reader holds an old snapshot when the next write
    /// begins; on a loaded machine, with readers descheduled mid-read, that
    /// missed several times in a row and the WAL reached 12 MB). The writer
    /// then runs a `RESTART` checkpoint, which waits up to [`RESTART_WAIT`]
    /// for those readers, so that its next write starts the log over and
    /// truncates the file back to the limit. One `stat` per commit; the wait
    /// only when the file is past the limit, and not again within
    /// [`RESTART_RETRY`] of a wait that failed (a reader holding its snapshot
    /// that long would otherwise hold up every batch).
    fn restart_when_over(&mut self, conn: &Connection) {
        let size = std::fs::metadata(&self.wal).map_or(0, |m| m.len());
        if size <= WAL_SIZE_LIMIT_BYTES
            || self
                .restart_failed_at
                .is_some_and(|at| at.elapsed() < RESTART_RETRY)
        {
            return;
        }
        let restarted = conn
            .busy_timeout(RESTART_WAIT)
            .and_then(|()| {
                conn.query_row("pragma wal_checkpoint(restart)", [], |row| {
                    row.get::<_, i64>(0)
                })
            })
            .map(|busy| busy == 0);
        let _ = conn.busy_timeout(BUSY_TIMEOUT);
        self.restart_failed_at = match restarted {
            Ok(true) => {
                self.wal_pages.store(0, Ordering::Relaxed);
                None
            }
            Ok(false) => Some(std::time::Instant::now()),
            Err(e) => {
                tracing::warn!(error = %e, "restarting the write-ahead log failed");
                Some(std::time::Instant::now())
            }
        };
    }
}

/// A passive checkpoint: the WAL's size in pages and how many of them are
/// copied back (both -1 when another checkpoint was running).
fn checkpoint(conn: &Connection) -> rusqlite::Result<(i64, i64)> {
    conn.query_row("pragma wal_checkpoint(passive)", [], |row| {
        Ok((row.get(1)?, row.get(2)?))
    })
}

/// Makes commits durable off the writer's path (at `full`, before they are
/// answered). SQLite
/// commits with `synchronous=NORMAL`, which writes the WAL but does not sync
/// it; the flusher then `fdatasync`s the WAL file and only then answers the
/// batch. A sync that starts after a batch's commit covers that batch and
/// every earlier one, so one sync answers every batch committed while the
/// previous sync ran, and the writer executes the next batch meanwhile
/// instead of waiting for the disk. Nothing is answered before it is on disk,
/// as with `synchronous=FULL`. (Reads may see a commit a moment before it is
/// durable; nobody is told it is done until it is.)
///
/// A lone batch (nothing queued behind it, no sync under way) is synced on
/// the thread that holds the writer and answered from there: handing it to the
/// flusher would only add a thread's wake-up to its wait, with nothing for
/// the writer to do meanwhile (at one session, each write of a cycle
/// waited for it).
///
/// At `relaxed` durability the answers go out at the commit, and the flusher
/// still syncs the WAL behind them. Nobody waits for it, but the WAL then
/// reaches the disk between checkpoints, as it does at `full`: otherwise
/// the writer's own checkpoint had to sync all of it, on the writer's thread
/// (28 % of its time in disk waits under load, which made `relaxed` slower
/// than `full` at 128 sessions).
struct Flusher {
    batches: std::sync::mpsc::Sender<Jobs>,
    durability: Durability,
    /// Batches handed to the flusher's thread and not answered yet.
    in_flight: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// The WAL, for a lone batch's sync on the thread holding the writer.
    wal: WalFile,
}

impl Flusher {
    fn start(wal_path: std::path::PathBuf, durability: Durability) -> std::io::Result<Self> {
        let (batches, queue) = std::sync::mpsc::channel::<Jobs>();
        let in_flight = std::sync::Arc::<std::sync::atomic::AtomicUsize>::default();
        let answered = in_flight.clone();
        let mut wal = WalFile::new(wal_path.clone());
        std::thread::Builder::new()
            .name("loopx-sqlite-flush".into())
            .spawn(move || {
                while let Ok(mut jobs) = queue.recv() {
                    let mut taken = 1;
                    while let Ok(more) = queue.try_recv() {
                        jobs.extend(more);
                        taken += 1;
                    }
                    answer(jobs, wal.sync());
                    answered.fetch_sub(taken, Ordering::Release);
                }
            })?;
        Ok(Self {
            batches,
            durability,
            in_flight,
            wal: WalFile::new(wal_path),
        })
    }

    /// Answers a committed batch once the WAL is synced (`full`): here when
    /// it is `alone` (nothing queued behind it) and the flusher's thread
    /// has nothing in hand, else there; or at once with a sync to follow
    /// (`relaxed`).
    fn flush(&mut self, mut jobs: Jobs, alone: bool) {
        if self.durability == Durability::Relaxed {
            for job in jobs.drain(..) {
                job.answer(Ok(()));
            }
        } else if alone && self.in_flight.load(Ordering::Acquire) == 0 {
            return answer(jobs, self.wal.sync());
        }
        self.in_flight.fetch_add(1, Ordering::Release);
        if let Err(std::sync::mpsc::SendError(jobs)) = self.batches.send(jobs) {
            self.in_flight.fetch_sub(1, Ordering::Release);
            answer(
                jobs,
                Err(Error::store("syncing", "the flusher has stopped")),
            );
        }
    }
}

/// Answers a batch with its sync's outcome.
fn answer(jobs: Jobs, synced: Result<()>) {
    if let Err(e) = &synced {
        tracing::error!(error = %e, "syncing the write-ahead log failed");
    }
    for job in jobs {
        job.answer(synced.clone());
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

/// Runs a batch in one transaction, with no savepoints. A savepoint is not
/// free: every page a job changes after it is first copied into the
/// savepoint's journal (in the profile, savepoints were ~11 % of the
/// writer's CPU). Jobs are refused before they write (a decision's refusal
/// comes before its writes), so a failed job has almost always changed
/// nothing and is simply answered. A job that fails after changing rows (a
/// statement's error midway, which a decision does not foresee) has the
/// whole transaction rolled back and the batch run again without it; its
/// failure is its answer. Each such round settles one job, so a batch runs
/// at most once more than it has such jobs.
fn run_batch(conn: &Connection, batch: &mut Jobs) -> Result<()> {
    let mut settled = vec![false; batch.len()];
    let result = 'batch: loop {
        if let Err(e) = execute(conn, "begin immediate") {
            break Err(e);
        }
        for (job, settled) in batch.iter_mut().zip(settled.iter_mut()) {
            if *settled {
                continue;
            }
            if job.reads_tables()
                && let Err(e) = journal::fold_all(conn)
            {
                break 'batch Err(e);
            }
            let changes = conn.total_changes();
            let kept = job.run(conn);
            if conn.is_autocommit() {
                // SQLite rolled the transaction back itself (an I/O error,
                // a full disk): every job's changes are gone.
                break 'batch Err(Error::store("writing", "the transaction was rolled back"));
            }
            if !kept && conn.total_changes() != changes {
                *settled = true;
                rolled_back(conn);
                if !conn.is_autocommit() {
                    break 'batch Err(Error::store("writing", "the rollback failed"));
                }
                continue 'batch;
            }
        }
        break execute(conn, "commit");
    };
    if result.is_err() {
        rolled_back(conn);
    }
    result
}

/// Runs `op` as a part of the job that may be refused alone: a refusal
/// (an `Err` before `op` changed anything) leaves the job's other changes
/// in place. Should `op` fail after changing rows, the job fails with it,
/// and the writer undoes the job (see [`run_batch`]).
pub fn nested<T>(
    conn: &Connection,
    op: impl FnOnce(&Connection) -> Result<T>,
) -> Result<Result<T>> {
    let changes = conn.total_changes();
    let outcome = op(conn);
    match outcome {
        Err(e) if conn.total_changes() != changes => Err(e),
        outcome => Ok(outcome),
    }
}

fn execute(conn: &Connection, statement: &'static str) -> Result<()> {
    conn.prepare_cached(statement)?.execute([])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How a test job ends: kept, refused before it writes, or failing
    /// after its insert.
    #[derive(Clone, Copy, PartialEq)]
    enum End {
        Kept,
        Refused,
        FailsAfterWriting,
    }

    /// A job that inserts `id` (unless refused first), then ends as told;
    /// `runs` counts its runs and `answer` receives its answer.
    fn ending(
        id: i64,
        end: End,
        runs: std::sync::Arc<std::sync::atomic::AtomicU32>,
    ) -> (Box<dyn Job>, oneshot::Receiver<Result<i64>>) {
        job(move |conn: &Connection| {
            runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if end == End::Refused {
                return Err(Error::invalid("refused"));
            }
            conn.execute("insert into t (id) values (?1)", [id])?;
            match end {
                End::FailsAfterWriting => Err(Error::store("writing", "failed midway")),
                _ => Ok(id),
            }
        })
    }

    /// A writer's connection to a new database with one table, `t (id)`.
    fn table_t() -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let conn = open_writer(&dir.path().join("t.db")).unwrap();
        conn.execute("create table t (id integer primary key)", [])
            .unwrap();
        (dir, conn)
    }

    fn kept_ids(conn: &Connection) -> Vec<i64> {
        let mut kept = conn.prepare("select id from t order by id").unwrap();
        kept.query_map([], |row| row.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    #[test]
    fn a_failed_job_loses_its_own_changes_only_and_refusals_cost_no_rerun() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU32, Ordering};
        let (_dir, conn) = table_t();
        let ends = [
            End::Refused,
            End::Kept,
            End::FailsAfterWriting,
            End::Kept,
            End::Refused,
            End::FailsAfterWriting,
            End::Kept,
        ];
        let runs: Vec<Arc<AtomicU32>> = ends.iter().map(|_| Arc::default()).collect();
        let (mut batch, answers): (Jobs, Vec<_>) = (0..)
            .zip(ends)
            .zip(&runs)
            .map(|((id, end), runs)| ending(id, end, runs.clone()))
            .unzip();
        run_batch(&conn, &mut batch).unwrap();
        assert_eq!(kept_ids(&conn), [1, 3, 6], "only the kept jobs' rows stay");
        for job in batch {
            job.answer(Ok(()));
        }
        let answers: Vec<Option<i64>> = answers
            .into_iter()
            .map(|mut a| a.try_recv().unwrap().ok())
            .collect();
        assert_eq!(answers, [None, Some(1), None, Some(3), None, None, Some(6)]);
        // Two jobs failed after writing: the batch ran three times, each
        // failed job up to its failure and never again.
        let runs: Vec<u32> = runs.iter().map(|r| r.load(Ordering::Relaxed)).collect();
        assert_eq!(runs, [3, 3, 1, 2, 2, 1, 1]);
    }

    #[test]
    fn a_refusal_inside_a_job_keeps_the_rest_of_it_and_a_midway_failure_fails_it() {
        let (_dir, conn) = table_t();
        let insert = |conn: &Connection, id: i64| -> Result<()> {
            conn.execute("insert into t (id) values (?1)", [id])?;
            Ok(())
        };
        type Op = Box<dyn FnMut(&Connection) -> Result<()> + Send>;
        let write = |op: Op| job(op).0;
        let mut batch: Jobs = vec![
            // Its nested part is refused before it writes: the job's insert stays.
            write(Box::new(move |conn| {
                insert(conn, 1)?;
                nested(conn, |_| Err::<(), _>(Error::invalid("refused")))?.ok();
                Ok(())
            })),
            // Its nested part fails after writing: the whole job is undone.
            write(Box::new(move |conn| {
                insert(conn, 2)?;
                nested(conn, |conn| {
                    insert(conn, 3)?;
                    Err::<(), _>(Error::store("writing", "failed midway"))
                })?
            })),
            write(Box::new(move |conn| insert(conn, 4))),
        ];
        run_batch(&conn, &mut batch).unwrap();
        assert_eq!(kept_ids(&conn), [1, 4]);
    }

    /// The name of the thread a write ran on.
    fn ran_on(_: &Connection) -> Result<Option<String>> {
        Ok(std::thread::current().name().map(str::to_owned))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lone_write_runs_on_its_callers_thread_and_overlapping_ones_on_the_writers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.db");
        // The journal's table, and a write-ahead log to sync.
        open_writer(&path)
            .unwrap()
            .execute(
                "create table journal (id integer primary key, rec blob)",
                [],
            )
            .unwrap();
        let writer = std::sync::Arc::new(Writer::start(&path, Durability::Full).unwrap());
        let writers = Some("loopx-sqlite-writer".to_owned());
        let alone = writer.write_cycle(ran_on).await.unwrap();
        assert!(alone.is_some());
        assert_ne!(alone, writers, "a lone write is written by its caller");

        // A write held in flight (here, on its caller's thread, holding the
        // writer) while a second one is sent: the second goes to the
        // writer's thread, and is answered once the first lets go.
        let (release, held) = std::sync::mpsc::channel::<()>();
        let first = tokio::spawn({
            let writer = writer.clone();
            async move {
                writer
                    .write_cycle(move |conn| {
                        let _ = held.recv_timeout(Duration::from_secs(10));
                        ran_on(conn)
                    })
                    .await
            }
        });
        while writer.under_way.load(Ordering::Acquire) < 1 {
            tokio::task::yield_now().await;
        }
        let second = tokio::spawn({
            let writer = writer.clone();
            async move { writer.write_cycle(ran_on).await }
        });
        while writer.under_way.load(Ordering::Acquire) < 2 {
            tokio::task::yield_now().await;
        }
        release.send(()).unwrap();
        assert_ne!(first.await.unwrap().unwrap(), writers);
        assert_eq!(second.await.unwrap().unwrap(), writers);

        // The writer's thread left it free: the next lone write is its
        // caller's, unless it reads the tables (it may fold the journal).
        let free = |writer: &Writer| writer.core.try_lock().is_ok();
        // (Its thread may hold the writer a moment after answering, for the
        // batch's upkeep: a lone write then queues, as it should.)
        while !free(&writer) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_ne!(writer.write_cycle(ran_on).await.unwrap(), writers);
        assert_eq!(writer.write(ran_on).await.unwrap(), writers);

        // Another write under way with the writer free (as while its batch's
        // sync runs on the flusher): a cycle write goes to the writer's
        // thread, so that overlapping writes are committed together.
        writer.under_way.fetch_add(1, Ordering::AcqRel);
        assert_eq!(writer.write_cycle(ran_on).await.unwrap(), writers);
        writer.under_way.fetch_sub(1, Ordering::AcqRel);
        while !free(&writer) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_ne!(writer.write_cycle(ran_on).await.unwrap(), writers);
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
