//! Retention: which sessions are pruned (closed ones, closed before a cutoff)
//! and the statements that remove one's rows a small chunk at a time, children
//! before parents, so no writer job ever holds the database for long. Both
//! stores run these same statements (SQLite and PostgreSQL both read `$n`
//! parameters); this module owns the rule and the driving loop, and never
//! touches an open session.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Store;
use crate::error::Result;

const DAY_MS: i64 = 86_400_000;

/// The cutoff for "closed more than `days` days ago".
pub fn cutoff_ms(now_ms: i64, days: u32) -> i64 {
    now_ms - i64::from(days) * DAY_MS
}

/// The rule: the oldest session closed before the cutoff (`$1`).
pub const OLDEST_PRUNABLE: &str = "select session_id from sessions \
     where state = 'closed' and closed_at < $1 order by closed_at limit 1";

/// A session's (`$1`) rows, children first; each removes at most 500 rows
/// (a step stays a few milliseconds), and a step runs them in order until one removes something.
pub const DELETE_CHILDREN: [&str; 14] = [
    "delete from turn_attachments where session_id = $1 and turn_id in \
     (select turn_id from turn_attachments where session_id = $1 limit 50)",
    "delete from claims where turn_id in \
     (select turn_id from turns where session_id = $1 order by seq limit 500)",
    "delete from lark_replies where turn_id in \
     (select turn_id from lark_replies where session_id = $1 limit 500)",
    "delete from session_events where session_id = $1 and event_no in \
     (select event_no from session_events where session_id = $1 order by event_no limit 500)",
    "delete from turns where turn_id in \
     (select turn_id from turns where session_id = $1 order by seq limit 500)",
    "delete from session_changes where session_id = $1",
    "delete from turn_changes where turn_id in \
     (select turn_id from turn_changes where session_id = $1 limit 500)",
    "delete from lark_links where session_id = $1",
    "delete from lark_fetches where session_id = $1",
    "delete from lark_pair_codes where session_id = $1",
    "delete from lark_sent where message_id in \
     (select message_id from lark_sent where session_id = $1 limit 500)",
    "delete from lark_notes where message_id in \
     (select message_id from lark_notes where session_id = $1 limit 500)",
    "delete from lark_permission_messages where session_id = $1 and request_id in \
     (select request_id from lark_permission_messages where session_id = $1 limit 500)",
    "delete from permission_requests where session_id = $1 and request_id in \
     (select request_id from permission_requests where session_id = $1 limit 500)",
];

/// The session itself (`$1`), once its rows are gone; only if still closed.
pub const DELETE_SESSION: &str = "delete from sessions where session_id = $1 and state = 'closed'";

/// Files' bytes no turn names any more (their sessions pruned; stored by a
/// broker before bytes were written with their turn), untouched since the
/// cutoff (`$1`); ten at a time (each up to 20 MiB). Run by retention and,
/// whatever its setting, by [`sweep_blobs`].
pub const DELETE_UNNAMED_BLOBS: &str = "delete from attachment_blobs where sha256 in \
     (select b.sha256 from attachment_blobs b where b.created_at < $1 \
      and not exists (select 1 from turn_attachments a where a.sha256 = b.sha256) limit 10)";

/// What belongs to no session and is old (`$1`: the cutoff), each a chunk
/// at a time: attachments' bytes no turn names, Lark's redelivery guards received before the cutoff (Lark
/// stops redelivering after about 7 hours, so older ones guard nothing), and
/// the broker's answers to commands that named no session, made before it
/// and no longer waiting to be sent.
pub const DELETE_OLD: [&str; 3] = [
    DELETE_UNNAMED_BLOBS,
    "delete from lark_events where (app_id, event_id) in \
     (select app_id, event_id from lark_events where received_at < $1 limit 500)",
    "delete from lark_notes where message_id in \
     (select message_id from lark_notes where session_id is null and created_at < $1 \
      and state <> 'pending' limit 500)",
];

/// What one step removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PruneStep {
    /// Some rows of a session (or old Lark redelivery guards); more may follow.
    Rows(u64),
    /// A session's last row: the session is gone.
    Session,
    /// Nothing qualifies any more.
    Done,
}

/// What a whole run removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub sessions: u64,
    pub rows: u64,
}

/// Prunes everything closed before `cutoff_ms`, one small step at a time with
/// a pause between steps, so the broker's own writes go first.
pub async fn prune(store: &dyn Store, cutoff_ms: i64, pause: Duration) -> Result<Pruned> {
    let mut pruned = Pruned::default();
    loop {
        match store.prune_step(cutoff_ms).await? {
            PruneStep::Done => return Ok(pruned),
            PruneStep::Session => {
                pruned.sessions += 1;
                pruned.rows += 1;
            }
            PruneStep::Rows(rows) => pruned.rows += rows,
        }
        tokio::time::sleep(pause).await;
    }
}

/// `--retain-closed-days`: prunes at start and then every hour, until shutdown.
pub async fn run(store: Arc<dyn Store>, days: u32, shutdown: CancellationToken) {
    const EVERY: Duration = Duration::from_secs(3600);
    const PAUSE: Duration = Duration::from_millis(5);
    loop {
        let cutoff = cutoff_ms(crate::time::now_ms(), days);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            pruned = prune(store.as_ref(), cutoff, PAUSE) => match pruned {
                Ok(p) if p.rows > 0 => tracing::info!(sessions = p.sessions, rows = p.rows, days, "pruned closed sessions"),
                Ok(_) => {}
                // Logged by the store; the next round tries again.
                Err(_) => {}
            },
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(EVERY) => {}
        }
    }
}

/// How long a file's bytes no turn names are kept before [`sweep_blobs`]
/// removes them.
pub const UNNAMED_BLOB_GRACE_MS: i64 = 3_600_000;

/// Removes the files' bytes no turn names, stored over
/// [`UNNAMED_BLOB_GRACE_MS`] before `now_ms`, ten at a time: how many.
pub async fn sweep_unnamed_blobs(store: &dyn Store, now_ms: i64) -> Result<u64> {
    let cutoff_ms = now_ms - UNNAMED_BLOB_GRACE_MS;
    let mut removed = 0;
    loop {
        match store.sweep_blobs(cutoff_ms).await? {
            0 => return Ok(removed),
            n => removed += n,
        }
    }
}

/// Always on, whatever `--retain-closed-days` says: at start and then every
/// hour, the files' bytes no turn names are removed, so no upload, refused
/// or not, holds the disk for long.
pub async fn sweep_blobs(store: Arc<dyn Store>, shutdown: CancellationToken) {
    const EVERY: Duration = Duration::from_secs(3600);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            swept = sweep_unnamed_blobs(store.as_ref(), crate::time::now_ms()) => match swept {
                Ok(n) if n > 0 => tracing::info!(blobs = n, "removed files no turn names"),
                // Nothing to do, or logged by the store; the next round tries again.
                _ => {}
            },
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(EVERY) => {}
        }
    }
}
