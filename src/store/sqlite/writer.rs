//! The SQLite writer: one thread owns the only writing connection. It takes
//! the jobs waiting in its queue, runs them in one `BEGIN IMMEDIATE`
//! transaction (a failed job's changes undone alone: see [`run_batch`]),
//! commits once, and only then answers them
//! (group commit: one fsync for a batch of concurrent writes); the flusher
//! syncs the WAL off the writer's path, the checkpointer copies it back. It
//! knows nothing of what a job writes.

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use super::Durability;
use crate::error::{Error, Result};

/// The most writes one transaction commits together.
const MAX_BATCH: usize = 256;

/// A write, run by the writer in the batch's transaction. It answers whether its
/// changes are kept, and the reply to send once the batch has committed.
type Job = Box<dyn FnOnce(&Connection) -> Finished + Send>;
type Reply = Box<dyn FnOnce(Result<()>) + Send>;
struct Finished {
    keep: bool,
    reply: Reply,
}

/// The writer: one thread owning the only writing connection, fed through a
/// bounded queue of jobs.
pub struct Writer {
    jobs: mpsc::Sender<Job>,
}

impl Writer {
    /// Opens the writer's connection and starts its thread (with the
    /// checkpointer, and the flusher at `full` durability).
    pub fn start(path: &Path, durability: Durability) -> Result<Self> {
        let writer = open_writer(path).map_err(|e| Error::store("opening the writer", e))?;
        let checkpointer = Checkpointer::start(path)?;
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
        Ok(Self { jobs })
    }

    /// Runs `op` on the writer, in the transaction of a group commit, and
    /// answers after the commit. An `Err` from `op` rolls back its own changes only.
    pub async fn write<T, F>(&self, op: F) -> Result<T>
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

/// Runs a batch in one transaction. A job whose changes are the first kept
/// in the transaction runs without a savepoint: should it fail, rolling the
/// whole transaction back undoes its changes only, and the next job begins a
/// new one. A savepoint is not free: every page a job then changes is first
/// copied into the savepoint's journal (in the profile, the savepoints were
/// ~15 % of the writer's CPU). So a write alone in its batch, the usual case
/// below full load and always on the wake path, pays none.
fn run_batch(conn: &Connection, batch: &mut Vec<Job>, replies: &mut Vec<Reply>) -> Result<()> {
    let result = (|| {
        execute(conn, "begin immediate")?;
        let mut kept_any = false;
        for job in batch.drain(..) {
            // Only a job after a kept one needs a savepoint of its own.
            let in_savepoint = kept_any;
            if in_savepoint {
                execute(conn, "savepoint job")?;
            }
            let finished = job(conn);
            replies.push(finished.reply);
            match (in_savepoint, finished.keep) {
                (true, keep) => {
                    if !keep {
                        execute(conn, "rollback to job")?;
                    }
                    execute(conn, "release job")?;
                }
                (false, true) => kept_any = true,
                (false, false) => {
                    execute(conn, "rollback")?;
                    execute(conn, "begin immediate")?;
                }
            }
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
pub fn nested<T>(conn: &Connection, op: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
    execute(conn, "savepoint nested")?;
    let outcome = op(conn);
    if outcome.is_err() {
        execute(conn, "rollback to nested")?;
    }
    execute(conn, "release nested")?;
    outcome
}

fn execute(conn: &Connection, statement: &'static str) -> Result<()> {
    conn.prepare_cached(statement)?.execute([])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job that inserts `id`, then fails or not.
    fn insert(id: i64, keep: bool) -> Job {
        Box::new(move |conn| {
            conn.execute("insert into t (id) values (?1)", [id])
                .unwrap();
            Finished {
                keep,
                reply: Box::new(|_| {}),
            }
        })
    }

    #[test]
    fn a_failed_job_loses_its_own_changes_only_with_or_without_a_savepoint() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open_writer(&dir.path().join("t.db")).unwrap();
        conn.execute("create table t (id integer primary key)", [])
            .unwrap();
        // The first two fail before anything is kept (no savepoint: the
        // transaction is rolled back and begun again); later ones share the
        // transaction with kept changes (a savepoint each).
        let outcomes = [false, false, true, false, true, false, true];
        let mut batch: Vec<Job> = (0..)
            .zip(outcomes)
            .map(|(id, keep)| insert(id, keep))
            .collect();
        let mut replies = Vec::new();
        run_batch(&conn, &mut batch, &mut replies).unwrap();
        assert_eq!(replies.len(), outcomes.len(), "every job is answered");
        let mut kept = conn.prepare("select id from t order by id").unwrap();
        let kept: Vec<i64> = kept
            .query_map([], |row| row.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(kept, [2, 4, 6]);
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
