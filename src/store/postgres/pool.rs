//! Opening the PostgreSQL store (migrations under the advisory lock, the
//! pool, the listener, the announcer) and running one store call in its
//! transaction: [`transaction!`] begins it, [`settle`] commits a decision,
//! drops a refusal and takes the decision again after a conflict with a
//! concurrent transaction. It knows no table and decides nothing.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPool, PgPoolOptions};
use tokio_util::sync::CancellationToken;

use super::apply::{CHANGED, take_changed};
use super::load::Guard;
use super::notify::{Announcer, ChangeHook, listen, start_listening};
use super::step::{Fail, Step};
use super::{ACQUIRE_TIMEOUT, CHANNEL, MAX_CONNECTIONS, PgStore, RECHECK};
use crate::decide::Changed;
use crate::error::{Error, Result};
use crate::store::{Change, ChangeFeed, Command, Done};

/// A pooled connection idle this long is pinged before it serves a request.
const IDLE_TEST: Duration = Duration::from_secs(1);
/// How many times one store call takes its decision again after a conflict
/// that a concurrent transaction caused (unique violation, deadlock).
const MAX_ATTEMPTS: u32 = 8;

impl PgStore {
    /// Connects to `url`, runs the migrations under the advisory lock, and
    /// opens the pool.
    pub async fn open(url: &str) -> Result<Self> {
        let base = PgConnectOptions::from_str(url)
            .map_err(|e| Error::store("reading --database-url", e))?;
        crate::store::migrate::<PgConnection>(
            &base.clone().application_name("loopx-migrate"),
            sqlx::migrate!("./migrations/postgres"),
            "connecting to PostgreSQL",
        )
        .await?;
        let options = base.clone().application_name("loopx").options([
            ("statement_timeout", "10s"),
            ("idle_in_transaction_session_timeout", "30s"),
        ]);
        let pool = PgPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .min_connections(1)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .idle_timeout(Duration::from_secs(600))
            .max_lifetime(Duration::from_secs(1800))
            // sqlx pings every connection it returns to the pool; pinging it
            // again when it is taken costs each request a round trip. Only a
            // connection idle for a while is tested first (a server restart
            // meanwhile).
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= IDLE_TEST {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .connect_with(options)
            .await
            .map_err(|e| Error::store("opening the connection pool", e))?;
        // Listening before the broker serves: nothing another replica commits
        // from then on goes unannounced here.
        let listen_pool = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .max_lifetime(None)
            .idle_timeout(None)
            .connect_lazy_with(base.application_name("loopx-listener"));
        let listener = start_listening(&listen_pool)
            .await
            .map_err(|e| Error::store("listening for other replicas' changes", e))?;
        tracing::info!(
            max_connections = MAX_CONNECTIONS,
            channel = CHANNEL,
            "PostgreSQL store ready (migrations applied, listening for changes)"
        );
        let stop = CancellationToken::new();
        let feed = start_feed(listener, listen_pool, pool.clone(), stop.clone());
        Ok(Self {
            announcer: Announcer::start(pool.clone(), stop.clone()),
            pool,
            feed,
            minter: Default::default(),
            stop,
        })
    }
}

/// The store's change feed, fed by what this replica commits and, from
/// `listener`, what other replicas announce (its kind is not told, so it may
/// free a turn for a parked claim), and its safety re-check.
fn start_feed(
    listener: PgListener,
    listen_pool: PgPool,
    pool: PgPool,
    stop: CancellationToken,
) -> Arc<ChangeFeed> {
    let feed: Arc<ChangeFeed> = Default::default();
    let elsewhere = feed.clone();
    let hook: ChangeHook = Arc::new(move |session_id: &str| {
        elsewhere.publish(&Change::Session(Changed {
            session_id: session_id.to_owned(),
            claimable: true,
        }))
    });
    tokio::spawn(listen(
        Some(listener),
        listen_pool,
        pool,
        hook,
        stop.clone(),
    ));
    tokio::spawn(recheck(feed.clone(), stop));
    feed
}

/// Every [`RECHECK`], until `stop`: every waiter re-checks the store, for
/// the announcements that were lost (while the listening connection was
/// down, or when a batch of them failed).
async fn recheck(feed: Arc<ChangeFeed>, stop: CancellationToken) {
    let mut every = tokio::time::interval(RECHECK);
    every.tick().await;
    loop {
        tokio::select! {
            _ = every.tick() => feed.publish(&Change::Unknown),
            _ = stop.cancelled() => return,
        }
    }
}

/// Whether the failure came from a concurrent transaction, so that taking the
/// decision again (in a new transaction) answers as the contract says: a unique
/// violation (the other transaction committed the same key first), a deadlock
/// or a serialization failure.
fn is_contention(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(e) => {
            e.is_unique_violation() || matches!(e.code().as_deref(), Some("40P01" | "40001"))
        }
        _ => false,
    }
}

/// Ends a transaction: commits a decision, rolls back a refusal, and tells
/// whether the decision must be taken again.
pub(super) async fn settle<T>(
    tx: sqlx::Transaction<'_, sqlx::Postgres>,
    outcome: Step<T>,
    attempt: u32,
    what: &'static str,
) -> Result<Option<T>> {
    match outcome {
        Ok(value) => {
            tx.commit().await.map_err(|e| Error::store(what, e))?;
            Ok(Some(value))
        }
        Err(Fail::Refused(e)) => {
            // Rolled back without waiting: sqlx queues the ROLLBACK and sends
            // it with the ping that returns the connection to the pool.
            drop(tx);
            Err(e)
        }
        Err(Fail::Db(e)) if attempt < MAX_ATTEMPTS && is_contention(&e) => {
            let _ = tx.rollback().await;
            tracing::debug!(error = %e, attempt, "{what}: a concurrent transaction won; deciding again");
            // A short, growing pause, so a deadlock's parties do not meet again.
            tokio::time::sleep(Duration::from_millis(u64::from(attempt) * 3)).await;
            Ok(None)
        }
        Err(Fail::Db(e)) => {
            let _ = tx.rollback().await;
            Err(Error::store(what, e))
        }
        // Only a decision taken unlocked asks for the lock: in a
        // transaction, which holds it, this is a bug, answered as a failure.
        Err(Fail::Locked) => {
            drop(tx);
            Err(Error::store(
                what,
                "a transaction asked for the lock it holds",
            ))
        }
    }
}

impl PgStore {
    /// Takes a turn decision unlocked, outside a transaction
    /// ([`Guard::Version`]): what it decided, or None when it must be
    /// taken in a transaction (it needs the lock, its session moved on, or
    /// a concurrent write won a key).
    pub(super) async fn unlocked(&self, command: &Command) -> Result<Option<Done>> {
        let what = command.what();
        CHANGED
            .scope(Default::default(), async {
                let mut conn = self
                    .pool
                    .acquire()
                    .await
                    .map_err(|e| Error::store(what, e))?;
                let unlocked = Guard::Version(None);
                match super::tx::command(&mut conn, command, &self.minter, unlocked).await {
                    Ok(done) => {
                        self.committed(take_changed());
                        Ok(Some(done))
                    }
                    Err(Fail::Refused(e)) => Err(e),
                    Err(Fail::Locked) => Ok(None),
                    Err(Fail::Db(e)) if is_contention(&e) => Ok(None),
                    Err(Fail::Db(e)) => Err(Error::store(what, e)),
                }
            })
            .await
    }
}

/// Runs `$body` (an expression using `$conn: &mut PgConnection`, evaluating to
/// a future of `Step<T>`) in its own transaction, again from the start after a
/// conflict with a concurrent transaction.
macro_rules! transaction {
    ($store:expr, $what:expr, |$conn:ident| $body:expr) => {{
        let store: &PgStore = $store;
        $crate::store::postgres::apply::CHANGED
            .scope(Default::default(), async {
                let mut attempt = 0;
                loop {
                    attempt += 1;
                    $crate::store::postgres::apply::take_changed();
                    let mut tx = store
                        .pool
                        .begin()
                        .await
                        .map_err(|e| Error::store($what, e))?;
                    let outcome = {
                        let $conn: &mut PgConnection = &mut *tx;
                        $body.await
                    };
                    if let Some(value) = settle(tx, outcome, attempt, $what).await? {
                        store.committed($crate::store::postgres::apply::take_changed());
                        break Ok::<_, Error>(value);
                    }
                }
            })
            .await
    }};
}
