//! Cross-replica announcements on PostgreSQL: the [`Announcer`] that sends
//! `pg_notify(CHANNEL, session_id)` for committed changes, outside their
//! transactions and in batches, and the listener that hands each notified
//! session id to the broker's change hook, re-establishing itself (and waking
//! every recent session once) when its connection drops. It knows nothing of
//! what changed, only which session.

use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool};
use tokio_util::sync::CancellationToken;

use super::{ACQUIRE_TIMEOUT, CHANNEL, LISTENER_PING};
use crate::time::now_ms;

/// Called with each session id announced on [`CHANNEL`] (by any replica,
/// this one included).
pub(super) type ChangeHook = std::sync::Arc<dyn Fn(&str) + Send + Sync>;

/// Sends `pg_notify(CHANNEL, session_id)` for committed changes, outside
/// their transactions, in batches: each batch is one statement in its own
/// transaction, which writes nothing and so commits without a disk flush.
pub(super) struct Announcer {
    sessions: tokio::sync::mpsc::UnboundedSender<String>,
}

impl Announcer {
    pub(super) fn start(pool: PgPool, stop: CancellationToken) -> Self {
        let (sessions, mut queue) = tokio::sync::mpsc::unbounded_channel::<String>();
        tokio::spawn(async move {
            loop {
                let first = tokio::select! {
                    first = queue.recv() => first,
                    _ = stop.cancelled() => None,
                };
                let Some(first) = first else { break };
                let mut batch = vec![first];
                while let Ok(more) = queue.try_recv() {
                    batch.push(more);
                }
                batch.sort_unstable();
                batch.dedup();
                let sent = sqlx::query("select pg_notify($1, s) from unnest($2::text[]) as s")
                    .bind(CHANNEL)
                    .bind(&batch)
                    .execute(&pool)
                    .await;
                if let Err(e) = sent {
                    // Other replicas' waiters find the change at their next
                    // safety re-check.
                    tracing::warn!(error = %e, sessions = batch.len(), "announcing changes to other replicas failed");
                }
            }
        });
        Self { sessions }
    }

    /// Announces a committed change to the session.
    pub(super) fn changed(&self, session_id: &str) {
        let _ = self.sessions.send(session_id.to_owned());
    }
}

pub(super) async fn start_listening(listen_pool: &PgPool) -> sqlx::Result<PgListener> {
    let mut listener = PgListener::connect_with(listen_pool).await?;
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

/// Listens on [`CHANNEL`] until `stop`, calling `hook` with each notified
/// session id. A lost connection is re-established with backoff; since what
/// was announced meanwhile is lost, every open or recently closed session is
/// then woken once (the waiters re-check the store).
pub(super) async fn listen(
    mut listener: Option<PgListener>,
    listen_pool: PgPool,
    pool: PgPool,
    hook: ChangeHook,
    stop: CancellationToken,
) {
    let mut backoff = Duration::from_millis(100);
    // When notifications may have started to go missing.
    let mut lost_since: Option<i64> = None;
    loop {
        let connected = match listener.take() {
            Some(listener) => Ok(listener),
            None => tokio::select! {
                _ = stop.cancelled() => return,
                connected = start_listening(&listen_pool) => connected,
            },
        };
        match connected {
            Ok(mut listener) => {
                backoff = Duration::from_millis(100);
                if let Some(since) = lost_since.take() {
                    tracing::info!("listening for other replicas' changes again");
                    wake_recent(&pool, &hook, since).await;
                }
                let error = tokio::select! {
                    _ = stop.cancelled() => return,
                    error = relay(&mut listener, &pool, &hook) => error,
                };
                tracing::warn!(%error, "lost the connection that listens for other replicas' changes; reconnecting");
                lost_since = Some(now_ms());
            }
            Err(error) => {
                tracing::warn!(%error, retry_in_ms = backoff.as_millis() as u64, "cannot listen for other replicas' changes");
                lost_since.get_or_insert_with(now_ms);
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Hands each notification to `hook` until the listening connection fails
/// for good (a drop that `PgListener` re-established at once is handled here).
pub(super) async fn relay(
    listener: &mut PgListener,
    pool: &PgPool,
    hook: &ChangeHook,
) -> sqlx::Error {
    loop {
        tokio::select! {
            received = listener.try_recv() => match received {
                Ok(Some(notification)) => hook(notification.payload()),
                Ok(None) => {
                    // The connection dropped and PgListener listens again on a
                    // new one; what was announced in between is lost.
                    tracing::info!("the listening connection dropped and was re-established");
                    wake_recent(pool, hook, now_ms()).await;
                }
                Err(error) => return error,
            },
            _ = tokio::time::sleep(LISTENER_PING) => {
                // A silently dead connection (no reset ever arrives) would
                // otherwise listen to nothing for hours.
                let ping = sqlx::query("select 1").execute(&mut *listener);
                match tokio::time::timeout(ACQUIRE_TIMEOUT, ping).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(error)) => return error,
                    Err(_) => return sqlx::Error::PoolTimedOut,
                }
            }
        }
    }
}

/// Wakes every open session, and every session closed since shortly before
/// `since`: their waiters re-check the store for what they may have missed.
pub(super) async fn wake_recent(pool: &PgPool, hook: &ChangeHook, since: i64) {
    let sessions: sqlx::Result<Vec<String>> = sqlx::query_scalar(
        "select session_id from sessions where state = 'open' or closed_at >= $1",
    )
    .bind(since - 60_000)
    .fetch_all(pool)
    .await;
    match sessions {
        Ok(sessions) => sessions.iter().for_each(|s| hook(s)),
        // The periodic re-check still covers them.
        Err(error) => tracing::warn!(%error, "cannot list the sessions to wake after a reconnect"),
    }
}
