//! The PostgreSQL store (`--database-url postgres://…`), for several broker
//! replicas sharing one database. It loads the rows of the same decisions
//! ([`crate::decide`]) as the SQLite store and applies their writes, but the
//! database, not a replica's memory, is what makes them hold across replicas:
//!
//! - One transaction per store call (READ COMMITTED). Every write that touches
//!   a session first locks its row (`select … from sessions where session_id =
//!   $1 for update`): the per-session serialization point, so one claim per
//!   session, a claim id answering the same turn on any replica, completion
//!   fencing, enqueue idempotency and "no close while a claim is active" are
//!   decided one request at a time per session.
//! - Unique constraints back up what no session row guards: a claim id used on
//!   two sessions at once (`claims` primary key), one open session per bound
//!   tuple, a Lark event or message reaching two replicas at once, one chat per
//!   session. A unique violation (or a deadlock) that still slips through rolls
//!   the transaction back and the whole decision is taken again, which then
//!   sees the winner's commit and answers as the contract says
//!   (`claim_id_reused`, the existing session, a duplicate Lark event, …).
//! - Every change that reaches a session's event log is announced with
//!   `pg_notify('loopx_changes', session_id)` right after its transaction
//!   commits, not inside it: PostgreSQL lets one notifying transaction commit
//!   at a time (a cluster-wide lock held until its commit is flushed), which
//!   would serialize every write of every replica behind one disk flush each.
//!   One task per replica sends the announcements in batches, one statement
//!   per batch; a notifying transaction with no writes commits without a
//!   flush. A replica that dies between a commit and its announcement costs
//!   the other replicas' waiters at most the safety re-check below. [`Store::watch`] keeps one listening connection per replica
//!   (`PgListener`, application_name `loopx-listener`) and wakes the local
//!   waiters of each notified session. The listener is re-established with
//!   backoff when it drops (and pinged every 30 s, so a silently dead
//!   connection is found); right after it comes back, every open or recently
//!   closed session is woken once, since notifications sent while it was down
//!   are lost. As the slow safety net, parked claims and event streams re-check
//!   the store every 5 s ([`Store::recheck_interval`]).
//! - The Lark reply outbox hands a due reply to one dispatcher at a time: the
//!   batch is taken with `for update skip locked` and leased in the same
//!   statement (its next attempt pushed 30 s ahead); the dispatcher's record of
//!   the attempt replaces the lease. A dispatcher that dies mid-send leaves the
//!   reply to be sent again after the lease, with the same Lark uuid.
//!
//! Inside: `decisions` (each turn and session decision's rows, loaded under
//! the session's lock, and its writes), `permissions` and `lark` (the same
//! for permission requests and for Lark links and events), `notify`
//! (announcing and listening across replicas), `rows` (decoding PostgreSQL
//! rows); this file opens the pool, runs each call in its transaction and
//! answers the [`Store`] calls.
//!
//! Migrations (`migrations/postgres`) run at start-up on a dedicated
//! connection under sqlx's PostgreSQL advisory lock: sqlx 0.8's
//! `Migrator::run` takes `pg_advisory_lock(<id of the database name>)` before
//! reading `_sqlx_migrations` (its `locking` is on by default), so replicas
//! starting together apply each migration once, one after the other. The
//! connection is closed afterwards, so a failed migration cannot leave the
//! session-level lock held in a pool.
//!
//! Pool and timeouts: at most [`MAX_CONNECTIONS`] (16) connections per
//! replica, plus its listening one (so give the server `max_connections` of
//! at least 17 per replica, plus headroom), waiting at most 5 s for a
//! connection (then 503 `store_unavailable`); every
//! statement times out after 10 s (`statement_timeout`, which also bounds a
//! wait for a session's row lock) and a connection idle inside a transaction
//! for 30 s is ended by the server (`idle_in_transaction_session_timeout`), so
//! a stuck replica cannot hold a session's lock for long. Connections are
//! replaced after 30 minutes and closed after 10 idle minutes. While the
//! database is unreachable, requests answer 503 `store_unavailable` and the
//! pool reconnects by itself when it returns.
//!
//! A 2xx still means committed: each call's transaction has committed before
//! it answers. How durable a commit is belongs to the PostgreSQL server
//! (`synchronous_commit`, `fsync`, replication); `--durability` applies to
//! SQLite only.
//!
//! Times are integer milliseconds (bigint), as in SQLite. Message texts (and
//! the reply texts built from responses) are stored as `bytea`, their UTF-8
//! bytes: PostgreSQL text cannot hold U+0000, and a message may contain it.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPool, PgPoolOptions, PgRow};
use sqlx::{Connection, Row};
use tokio_util::sync::CancellationToken;

mod decisions;
mod lark;
mod notify;
mod permissions;
mod rows;

use super::retention::{self, PruneStep};
use super::{
    Bound, ChangeHook, ClaimOutcome, Closed, Decision, Enqueue, EventRow, HostIdentity, LarkEvent,
    LarkIngest, Outbound, PermissionRow, ReplyJob, ReplyUpdate, SessionRow, Store, TurnPage,
    TurnRow,
};
use crate::decide;
use crate::error::{Error, Result};
use crate::ids::Minter;
use crate::model::{AnsweredVia, Behavior, CreatePermissionRequest, PermissionState};
use crate::model::{
    BindRequest, CompleteRequest, EnqueueRequest, LarkLink, ListSessions, ListTurns, Receipt,
    RegisterAgentThread, Released,
};
use crate::permission;
use crate::time::now_ms;
use decisions::{bind, bind_rows, claim, close, complete, enqueue, release};
use notify::{Announcer, listen, start_listening};
use rows::{
    SESSION_COLUMNS, TURN_READBACK, enumeration, optional_enumeration, session_row, text, turn_row,
    unstorable, utf8,
};

/// The channel every change is announced on; the payload is the session id.
pub const CHANNEL: &str = "loopx_changes";
/// The most connections one replica opens (the listener's is extra).
pub const MAX_CONNECTIONS: u32 = 16;
/// How long a request waits for a connection before answering 503.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often parked claims and event streams re-check the store regardless.
const RECHECK: Duration = Duration::from_secs(5);
/// How long a dispatcher holds the replies it took before another may.
const REPLY_LEASE_MS: i64 = 30_000;
/// Takes and leases a batch of due replies (`$1` now, `$2` limit, `$3` lease).
const LEASE_REPLIES: &str = "with due as (
         select turn_id, next_attempt_at from lark_replies
         where state = 'pending' and next_attempt_at <= $1
         order by next_attempt_at limit $2
         for update skip locked
     )
     update lark_replies r set next_attempt_at = $1 + $3
     from due where r.turn_id = due.turn_id
     returning r.turn_id as key, r.message_id as target, r.chat_id, r.text, r.parts_sent,
               r.attempts, r.failures, due.next_attempt_at as due_at";
/// The same for permission-request messages.
const LEASE_PERMISSION_MESSAGES: &str = "with due as (
         select session_id, request_id, next_attempt_at from lark_permission_messages
         where state = 'pending' and next_attempt_at <= $1
         order by next_attempt_at limit $2
         for update skip locked
     )
     update lark_permission_messages m set next_attempt_at = $1 + $3
     from due where m.session_id = due.session_id and m.request_id = due.request_id
     returning m.session_id as key, m.request_id as target, m.chat_id, m.text, m.parts_sent,
               m.attempts, m.failures, due.next_attempt_at as due_at";
/// How often the listening connection is proven alive.
const LISTENER_PING: Duration = Duration::from_secs(30);
/// How many times one store call takes its decision again after a conflict
/// that a concurrent transaction caused (unique violation, deadlock).
const MAX_ATTEMPTS: u32 = 8;

pub struct PgStore {
    pool: PgPool,
    /// The listening connection's own pool (no statement timeout: it waits
    /// forever), and the listener itself until [`Store::watch`] takes it.
    listen_pool: PgPool,
    listener: std::sync::Mutex<Option<PgListener>>,
    minter: Arc<Minter>,
    /// Tells every replica (this one included) which sessions changed.
    announcer: Announcer,
    /// Ends the listener and the announcer when the store goes.
    stop: CancellationToken,
}

impl Drop for PgStore {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl PgStore {
    /// Connects to `url`, runs the migrations under the advisory lock, and
    /// opens the pool.
    pub async fn open(url: &str) -> Result<Self> {
        let base = PgConnectOptions::from_str(url)
            .map_err(|e| Error::store("reading --database-url", e))?;
        let mut migrator =
            PgConnection::connect_with(&base.clone().application_name("loopx-migrate"))
                .await
                .map_err(|e| Error::store("connecting to PostgreSQL", e))?;
        sqlx::migrate!("./migrations/postgres")
            .run(&mut migrator)
            .await
            .map_err(|e| Error::store("migrating the database", e))?;
        migrator
            .close()
            .await
            .map_err(|e| Error::store("closing the migration connection", e))?;
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
        Ok(Self {
            announcer: Announcer::start(pool.clone(), stop.clone()),
            pool,
            listen_pool,
            listener: std::sync::Mutex::new(Some(listener)),
            minter: Default::default(),
            stop,
        })
    }
}

/// Why a decision did not go through: the contract refused it, or the database failed.
enum Fail {
    Refused(Error),
    Db(sqlx::Error),
}

impl From<sqlx::Error> for Fail {
    fn from(e: sqlx::Error) -> Self {
        Fail::Db(e)
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        Fail::Refused(e)
    }
}

type Step<T> = std::result::Result<T, Fail>;

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
async fn settle<T>(
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
            let _ = tx.rollback().await;
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
    }
}

/// Runs `$body` (an expression using `$conn: &mut PgConnection`, evaluating to
/// a future of `Step<T>`) in its own transaction, again from the start after a
/// conflict with a concurrent transaction.
macro_rules! transaction {
    ($store:expr, $what:literal, |$conn:ident| $body:expr) => {{
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut tx = $store
                .pool
                .begin()
                .await
                .map_err(|e| Error::store($what, e))?;
            let outcome = {
                let $conn: &mut PgConnection = &mut *tx;
                $body.await
            };
            if let Some(value) = settle(tx, outcome, attempt, $what).await? {
                break Ok::<_, Error>(value);
            }
        }
    }};
}

async fn load_session<'e, E>(db: E, session_id: &str) -> sqlx::Result<Option<SessionRow>>
where
    E: sqlx::PgExecutor<'e>,
{
    if unstorable(session_id) {
        return Ok(None);
    }
    let sql = format!("select {SESSION_COLUMNS} from sessions where session_id = $1");
    sqlx::query(&sql)
        .bind(session_id)
        .fetch_optional(db)
        .await?
        .map(session_row)
        .transpose()
}

/// Locks the session's row for the rest of the transaction: every write that
/// touches a session goes through here first.
async fn lock_session(
    conn: &mut PgConnection,
    session_id: &str,
) -> sqlx::Result<Option<SessionRow>> {
    if unstorable(session_id) {
        return Ok(None);
    }
    let sql = format!("select {SESSION_COLUMNS} from sessions where session_id = $1 for update");
    sqlx::query(&sql)
        .bind(session_id)
        .fetch_optional(&mut *conn)
        .await?
        .map(session_row)
        .transpose()
}

async fn load_turn<'e, E>(db: E, session_id: &str, turn_id: &str) -> sqlx::Result<Option<TurnRow>>
where
    E: sqlx::PgExecutor<'e>,
{
    if unstorable(session_id) || unstorable(turn_id) {
        return Ok(None);
    }
    sqlx::query(&format!(
        "{TURN_READBACK} where t.session_id = $1 and t.turn_id = $2"
    ))
    .bind(session_id)
    .bind(turn_id)
    .fetch_optional(db)
    .await?
    .map(turn_row)
    .transpose()
}

/// One transaction of retention: a chunk of the oldest prunable session's
/// rows, or the session itself once they are gone, or old Lark guards. The
/// session row is locked, skipping one another replica is pruning.
async fn prune_step(conn: &mut PgConnection, cutoff_ms: i64) -> Step<PruneStep> {
    let oldest: Option<String> = sqlx::query_scalar(&format!(
        "{} for update skip locked",
        retention::OLDEST_PRUNABLE
    ))
    .bind(cutoff_ms)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(session_id) = oldest else {
        let rows = sqlx::query(retention::DELETE_LARK_EVENTS)
            .bind(cutoff_ms)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        return Ok(match rows {
            0 => PruneStep::Done,
            rows => PruneStep::Rows(rows),
        });
    };
    for statement in retention::DELETE_CHILDREN {
        let rows = sqlx::query(statement)
            .bind(&session_id)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        if rows > 0 {
            return Ok(PruneStep::Rows(rows));
        }
    }
    sqlx::query(retention::DELETE_SESSION)
        .bind(&session_id)
        .execute(&mut *conn)
        .await?;
    Ok(PruneStep::Session)
}

const PERMISSION_COLUMNS: &str = "session_id, request_id, tool_name, description, \
     input_preview, state, created_at, answered_at, answered_via";

fn permission_row(row: PgRow) -> sqlx::Result<PermissionRow> {
    Ok(PermissionRow {
        session_id: row.try_get("session_id")?,
        request_id: row.try_get("request_id")?,
        tool_name: row.try_get("tool_name")?,
        description: utf8(&row, "description")?,
        input_preview: utf8(&row, "input_preview")?,
        state: enumeration(&row, "state")?,
        created_at: row.try_get("created_at")?,
        answered_at: row.try_get("answered_at")?,
        answered_via: optional_enumeration(&row, "answered_via")?,
    })
}

async fn load_permission<'e, E>(
    db: E,
    session_id: &str,
    request_id: &str,
) -> sqlx::Result<Option<PermissionRow>>
where
    E: sqlx::PgExecutor<'e>,
{
    if unstorable(session_id) || unstorable(request_id) {
        return Ok(None);
    }
    sqlx::query(&format!(
        "select {PERMISSION_COLUMNS} from permission_requests
         where session_id = $1 and request_id = $2"
    ))
    .bind(session_id)
    .bind(request_id)
    .fetch_optional(db)
    .await?
    .map(permission_row)
    .transpose()
}

#[async_trait]
impl Store for PgStore {
    fn watch(&self, hook: ChangeHook) {
        let listener = self
            .listener
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        tokio::spawn(listen(
            listener,
            self.listen_pool.clone(),
            self.pool.clone(),
            hook,
            self.stop.clone(),
        ));
    }

    fn recheck_interval(&self) -> Option<Duration> {
        Some(RECHECK)
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("select 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn register(&self, thread: RegisterAgentThread) -> Result<bool> {
        let inserted = sqlx::query(
            "insert into agent_threads (goal_id, agent_id, host_surface, host_session_id, registered_at)
             values ($1, $2, $3, $4, $5) on conflict do nothing",
        )
        .bind(&thread.goal_id)
        .bind(&thread.agent_id)
        .bind(&thread.host_surface)
        .bind(&thread.host_session_id)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        Ok(inserted.rows_affected() == 1)
    }

    async fn preview_bind(&self, request: BindRequest) -> Result<Option<SessionRow>> {
        let mut conn = self.pool.acquire().await?;
        let rows = bind_rows(&mut conn, &request).await?;
        decide::session::check_bind(rows, &request)
    }

    async fn bind(&self, request: BindRequest) -> Result<Bound> {
        transaction!(self, "binding a session", |conn| bind(
            conn,
            &request,
            &self.minter
        ))
    }

    async fn session(&self, session_id: &str) -> Result<Option<SessionRow>> {
        Ok(load_session(&self.pool, session_id).await?)
    }

    async fn sessions(&self, filter: ListSessions, limit: u32) -> Result<Vec<SessionRow>> {
        let sql = format!(
            "select {SESSION_COLUMNS} from sessions
             where ($1::text is null or state = $1) and ($2::text is null or goal_id = $2)
               and ($3::text is null or agent_id = $3) and ($4::text is null or session_id > $4)
             order by session_id limit $5"
        );
        let rows = sqlx::query(&sql)
            .bind(filter.state.as_ref().map(text))
            .bind(filter.goal_id)
            .bind(filter.agent_id)
            .bind(filter.cursor)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .into_iter()
            .map(session_row)
            .collect::<sqlx::Result<_>>()?)
    }

    async fn enqueue(&self, session_id: String, message: EnqueueRequest) -> Result<Enqueue> {
        let done = transaction!(self, "enqueueing", |conn| enqueue(
            conn,
            &session_id,
            &message,
            &self.minter
        ))?;
        if !done.duplicate {
            self.announcer.changed(&session_id);
        }
        Ok(done)
    }

    async fn claim(
        &self,
        session_id: String,
        host: HostIdentity,
        claim_id: String,
    ) -> Result<ClaimOutcome> {
        let outcome = transaction!(self, "claiming", |conn| claim(
            conn,
            &session_id,
            &host,
            &claim_id
        ))?;
        if let ClaimOutcome::Claimed {
            replayed: false, ..
        } = &outcome
        {
            self.announcer.changed(&session_id);
        }
        Ok(outcome)
    }

    async fn complete(
        &self,
        session_id: String,
        turn_id: String,
        completion: CompleteRequest,
    ) -> Result<Receipt> {
        let receipt = transaction!(self, "completing", |conn| complete(
            conn,
            &session_id,
            &turn_id,
            &completion
        ))?;
        if !receipt.replayed {
            self.announcer.changed(&session_id);
        }
        Ok(receipt)
    }

    async fn release(
        &self,
        session_id: String,
        claim_id: String,
        host: HostIdentity,
    ) -> Result<Released> {
        let released = transaction!(self, "releasing", |conn| release(
            conn,
            &session_id,
            &claim_id,
            &host
        ))?;
        self.announcer.changed(&session_id);
        Ok(released)
    }

    async fn close(&self, session_id: String) -> Result<Closed> {
        let closed = transaction!(self, "closing", |conn| close(conn, &session_id))?;
        self.announcer.changed(&session_id);
        Ok(closed)
    }

    async fn create_permission(
        &self,
        session_id: String,
        host: HostIdentity,
        request: CreatePermissionRequest,
    ) -> Result<Decision> {
        let decision = transaction!(self, "recording a permission request", |conn| {
            permissions::create(conn, &session_id, &host, &request)
        })?;
        if let Decision::Write(_) = decision {
            self.announcer.changed(&session_id);
        }
        Ok(decision)
    }

    async fn answer_permission(
        &self,
        session_id: String,
        request_id: String,
        behavior: Behavior,
        via: AnsweredVia,
    ) -> Result<Decision> {
        let decision = transaction!(self, "answering a permission request", |conn| {
            permissions::answer(conn, &session_id, &request_id, (behavior, via))
        })?;
        if let Decision::Write(_) = decision {
            self.announcer.changed(&session_id);
        }
        Ok(decision)
    }

    async fn permission(&self, session_id: &str, request_id: &str) -> Result<PermissionRow> {
        decide::existing(load_session(&self.pool, session_id).await?)?;
        load_permission(&self.pool, session_id, request_id)
            .await?
            .ok_or_else(|| Error::not_found("permission request"))
    }

    async fn permissions(
        &self,
        session_id: &str,
        state: Option<PermissionState>,
    ) -> Result<Vec<PermissionRow>> {
        decide::existing(load_session(&self.pool, session_id).await?)?;
        let rows = sqlx::query(&format!(
            "select {PERMISSION_COLUMNS} from permission_requests
             where session_id = $1 and ($2::text is null or state = $2)
             order by state = 'pending' desc, created_at desc, request_id desc limit $3"
        ))
        .bind(session_id)
        .bind(state.map(PermissionState::as_str))
        .bind(i64::from(permission::LIST_LIMIT))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(permission_row)
            .collect::<sqlx::Result<_>>()?)
    }

    async fn lark_link(
        &self,
        session_id: String,
        chat_id: String,
        approvers: Vec<String>,
    ) -> Result<LarkLink> {
        transaction!(self, "linking a Lark chat", |conn| lark::link(
            conn,
            &session_id,
            &chat_id,
            &approvers
        ))
    }

    async fn lark_unlink(&self, session_id: String) -> Result<LarkLink> {
        transaction!(self, "unlinking a Lark chat", |conn| lark::unlink(
            conn,
            &session_id
        ))
    }

    async fn lark_link_status(&self, session_id: &str) -> Result<LarkLink> {
        decide::existing(load_session(&self.pool, session_id).await?)?;
        let link: Option<(String, String)> =
            sqlx::query_as("select chat_id, approvers from lark_links where session_id = $1")
                .bind(session_id)
                .fetch_optional(&self.pool)
                .await?;
        Ok(LarkLink::stored(session_id, link))
    }

    async fn lark_event(&self, event: LarkEvent) -> Result<LarkIngest> {
        let ingest = transaction!(self, "recording a Lark event", |conn| lark::event(
            conn,
            &event,
            &self.minter
        ))?;
        match &ingest {
            LarkIngest::Enqueued { session_id, .. }
            | LarkIngest::Answered {
                session_id,
                decision: Decision::Write(_),
            } => self.announcer.changed(session_id),
            _ => {}
        }
        Ok(ingest)
    }

    async fn due_replies(&self, now_ms: i64, limit: u32) -> Result<Vec<ReplyJob>> {
        // Each table's due rows are taken and leased in one statement: rows
        // another dispatcher holds are skipped, and the lease keeps them from
        // the next batch of anyone.
        let mut jobs = Vec::new();
        for (statement, kind) in [
            (LEASE_REPLIES, "reply"),
            (LEASE_PERMISSION_MESSAGES, "permission"),
        ] {
            let rows = sqlx::query(statement)
                .bind(now_ms)
                .bind(i64::from(limit))
                .bind(REPLY_LEASE_MS)
                .fetch_all(&self.pool)
                .await?;
            for row in rows {
                jobs.push((
                    row.try_get::<i64, _>("due_at")?,
                    ReplyJob::from_outbox(
                        kind,
                        row.try_get("key")?,
                        row.try_get("target")?,
                        row.try_get("chat_id")?,
                        utf8(&row, "text")?,
                        (
                            row.try_get("parts_sent")?,
                            row.try_get("attempts")?,
                            row.try_get("failures")?,
                        ),
                    ),
                ));
            }
        }
        // Oldest first over both; the rest of a batch over `limit` stays
        // leased and is sent after the lease, as after a dispatcher's death.
        jobs.sort_by_key(|(due_at, _)| *due_at);
        Ok(jobs.into_iter().map(|(_, job)| job).collect())
    }

    async fn next_reply_due(&self) -> Result<Option<i64>> {
        Ok(sqlx::query_scalar(super::NEXT_OUTBOX_DUE)
            .fetch_one(&self.pool)
            .await?)
    }

    async fn record_reply(&self, outbound: Outbound, update: ReplyUpdate) -> Result<()> {
        // A diagnostic from afar: never let a stray U+0000 make it unstorable.
        let error = update.error.map(|e| e.replace('\0', "\u{fffd}"));
        let (statement, keys) = super::record_outbox(outbound);
        let mut query = sqlx::query(statement)
            .bind(update.parts_sent)
            .bind(text(&update.state))
            .bind(update.attempts)
            .bind(update.failures)
            .bind(error)
            .bind(update.next_attempt_at)
            .bind(now_ms());
        for key in keys {
            query = query.bind(key);
        }
        query.execute(&self.pool).await?;
        Ok(())
    }

    async fn queue_stats(&self) -> Result<(i64, Option<i64>)> {
        Ok(sqlx::query_as(
            // Only the sessions with queued turns (an index), and each one's
            // head of queue, its oldest queued turn: no scan of all sessions.
            "select coalesce(sum(queued_count), 0)::bigint,
                    min((select t.enqueued_at from turns t
                         where t.session_id = s.session_id and t.state = 'queued'
                         order by t.seq limit 1))
             from sessions s where s.queued_count > 0",
        )
        .fetch_one(&self.pool)
        .await?)
    }

    async fn prune_step(&self, cutoff_ms: i64) -> Result<PruneStep> {
        transaction!(self, "pruning", |conn| prune_step(conn, cutoff_ms))
    }

    async fn last_event_no(&self, session_id: &str) -> Result<i64> {
        if unstorable(session_id) {
            return decide::last_event_no(None);
        }
        let next: Option<i64> =
            sqlx::query_scalar("select next_event_no from sessions where session_id = $1")
                .bind(session_id)
                .fetch_optional(&self.pool)
                .await?;
        decide::last_event_no(next)
    }

    async fn events(&self, session_id: &str, after: i64, limit: u32) -> Result<Vec<EventRow>> {
        if unstorable(session_id) {
            return Ok(Vec::new());
        }
        Ok(sqlx::query_as(
            "select event_no, kind, turn_id, seq, request_id, state from session_events
             where session_id = $1 and event_no > $2 order by event_no limit $3",
        )
        .bind(session_id)
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?)
    }

    async fn turn(&self, session_id: &str, turn_id: &str) -> Result<TurnRow> {
        decide::existing(load_session(&self.pool, session_id).await?)?;
        load_turn(&self.pool, session_id, turn_id)
            .await?
            .ok_or_else(|| Error::not_found("turn"))
    }

    async fn turns(
        &self,
        session_id: &str,
        page: ListTurns,
        limit: u32,
    ) -> Result<(Vec<TurnRow>, bool)> {
        decide::existing(load_session(&self.pool, session_id).await?)?;
        let paging = TurnPage::new(&page, limit);
        let sql = if paging.backwards {
            "where t.session_id = $1 and t.seq < $3 order by t.seq desc limit $4"
        } else {
            "where t.session_id = $1 and t.seq > $2 and ($3::bigint is null or t.seq < $3)
             order by t.seq limit $4"
        };
        let sql = format!("{TURN_READBACK} {sql}");
        let rows = sqlx::query(&sql)
            .bind(session_id)
            .bind(page.after_seq.unwrap_or(0))
            .bind(page.before_seq)
            .bind(i64::from(paging.read_limit()))
            .fetch_all(&self.pool)
            .await?;
        let turns = rows
            .into_iter()
            .map(turn_row)
            .collect::<sqlx::Result<Vec<_>>>()?;
        Ok(paging.finish(turns))
    }
}
