//! The PostgreSQL store (`--database-url postgres://…`), for several broker
//! replicas sharing one database. It loads the rows of the same decisions
//! ([`crate::decide`]) as the SQLite store and applies their writes, but the
//! database, not a replica's memory, is what makes them hold across replicas:
//!
//! - A turn decision (enqueue, claim, complete, release) is first taken
//!   outside any transaction, in two round trips: ONE statement reads every
//!   row it needs, without a lock, with the session row's version (its
//!   `xmin`); ONE statement of data-modifying CTEs applies its writes and
//!   commits by itself, its session update guarded by that version and every
//!   other write by the session update (`apply::guarded`). The session row
//!   is the per-session serialization point: every write a turn decision
//!   reads also writes it, so an unchanged version means unchanged rows, and
//!   a moved-on one means nothing was written. A refusal or an answer that
//!   writes nothing is decided on one statement's snapshot, so it holds as
//!   of that snapshot (an enqueue not yet committed was not acknowledged
//!   either), and waits for no other transaction's lock. A decision whose
//!   session moved on, that needs more rows or writes than one statement
//!   holds (files, a Lark event), or that lost a key to a concurrent write
//!   is taken again as below, locked.
//! - Every other store call, and a turn decision taken again, runs in one
//!   transaction (READ COMMITTED). A turn decision there costs four round
//!   trips: BEGIN; ONE statement that locks the session's row
//!   (`for update of s`) and reads every row the decision needs beside it
//!   (`load`); ONE statement of data-modifying CTEs that applies its writes
//!   (`apply`); COMMIT. A refusal is rolled back without waiting for it. The
//!   session's row lock is the per-session serialization point, so one claim
//!   per session, a claim id answering the same turn on any replica,
//!   completion fencing, enqueue idempotency and "no close while a claim is
//!   active" are decided one request at a time per session.
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
//!   flush. The announcements, like the local wake-ups, come from one place:
//!   what a committed store call's decisions changed ([`Store::feed`]). A
//!   replica that dies between a commit and its announcement costs
//!   the other replicas' waiters at most the safety re-check below. One
//!   listening connection per replica (`PgListener`, application_name
//!   `loopx-listener`) publishes each notified session on the store's
//!   change feed, from which the broker wakes the local waiters. The
//!   listener is re-established with
//!   backoff when it drops (and pinged every 30 s, so a silently dead
//!   connection is found); right after it comes back, every open or recently
//!   closed session is woken once, since notifications sent while it was down
//!   are lost. As the slow safety net, the feed tells every waiter to re-check
//!   the store every 5 s ([`crate::store::Change::Unknown`]).
//! - The Lark reply outbox hands a due reply to one dispatcher at a time: the
//!   batch is taken with `for update skip locked` and leased in the same
//!   statement (its next attempt pushed 30 s ahead); the dispatcher's record of
//!   the attempt replaces the lease. A dispatcher that dies mid-send leaves the
//!   reply to be sent again after the lease, with the same Lark uuid.
//!
//! Inside: `pool` (opening the store, running a call in its transaction,
//! deciding again after a conflict), `load` (each turn decision's rows in one
//! locked statement), `apply` (a decision's writes, a turn decision's in one
//! statement), `tx` (every row a decision reads and the bookkeeping
//! statements, for [`crate::store::dispatch`], which decides), `permissions`
//! (permission request rows), `reads` (row access and listings outside the
//! decisions, retention), `outbox` and `cards` (leasing Lark replies and
//! card updates), `notify` (announcing and listening across
//! replicas), `rows` (decoding PostgreSQL rows); this file answers the
//! [`Store`] calls.
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
//! replaced after 30 minutes and closed after 10 idle minutes. sqlx tests
//! every connection it gets back (a round trip off the request's path); one
//! taken from the pool is tested again only after 1 s idle. While the
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

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnection, PgPool, PgRow};
use tokio_util::sync::CancellationToken;

#[macro_use]
mod pool;

mod apply;
mod cards;
mod load;
mod notify;
mod outbox;
mod permissions;
mod reads;
mod rows;
mod step;
mod tx;

use super::reads::Rows;
use super::statement::Statement;
use super::{CardUpdateJob, FetchJob};
use super::{Change, ChangeFeed, Command, Done, Found, Read, ReplyJob, Store};
use crate::decide::{Changed, SessionRow, TurnRow};
use crate::error::{Error, Result};
use crate::ids::Minter;
use crate::permission::PermissionRow;
use notify::Announcer;
use pool::settle;
use step::Step;

/// The channel every change is announced on; the payload is the session id.
pub const CHANNEL: &str = "loopx_changes";
/// The most connections one replica opens (the listener's is extra).
pub const MAX_CONNECTIONS: u32 = 16;
/// How long a request waits for a connection before answering 503.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often parked claims and event streams re-check the store regardless.
const RECHECK: Duration = Duration::from_secs(5);
/// How often the listening connection is proven alive.
const LISTENER_PING: Duration = Duration::from_secs(30);
pub struct PgStore {
    pool: PgPool,
    /// What this replica's decisions and (through the listener) other
    /// replicas' changed.
    feed: Arc<ChangeFeed>,
    minter: Arc<Minter>,
    /// Tells every replica (this one included) which sessions changed.
    announcer: Announcer,
    /// Ends the listener and the announcer when the store goes.
    stop: CancellationToken,
}

impl PgStore {
    /// Publishes what a committed store call changed, and announces it to
    /// every replica (this one included).
    fn committed(&self, changed: Vec<Changed>) {
        for changed in changed {
            self.announcer.changed(&changed.session_id);
            self.feed.publish(&Change::Session(changed));
        }
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[async_trait]
impl Store for PgStore {
    fn feed(&self) -> &ChangeFeed {
        &self.feed
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("select 1").execute(&self.pool).await?;
        Ok(())
    }

    fn shared(&self) -> bool {
        true
    }

    async fn decide(&self, command: Command) -> Result<Done> {
        if matches!(
            command,
            Command::Enqueue { .. }
                | Command::Claim { .. }
                | Command::Complete { .. }
                | Command::Release { .. }
        ) && let Some(done) = self.unlocked(&command).await?
        {
            return Ok(done);
        }
        transaction!(self, command.what(), |conn| tx::command(
            conn,
            &command,
            &self.minter,
            tx::Guard::Lock
        ))
    }

    async fn together(&self, first: Command, then: Command) -> Result<(Done, Result<Done>)> {
        transaction!(self, "deciding", |conn| tx::together(
            conn,
            &first,
            &then,
            &self.minter
        ))
    }

    async fn read(&self, read: Read<'_>) -> Result<Found> {
        read.answer(self).await
    }
}

/// The plain reads ([`super::reads`]) on the pool; the due Lark jobs leased
/// to this replica.
#[async_trait]
impl Rows for PgStore {
    type Row = PgRow;

    async fn rows<T: Send + 'static>(
        &self,
        statement: Statement,
        decode: for<'r> fn(&'r PgRow) -> sqlx::Result<T>,
    ) -> Result<Vec<T>> {
        let rows = apply::bound(&statement).fetch_all(&self.pool).await?;
        Ok(rows.iter().map(decode).collect::<sqlx::Result<_>>()?)
    }

    fn session_row(row: &PgRow) -> sqlx::Result<SessionRow> {
        rows::session_row(row)
    }

    fn turn_row(row: &PgRow) -> sqlx::Result<TurnRow> {
        rows::turn_row(row)
    }

    fn permission_row(row: &PgRow) -> sqlx::Result<PermissionRow> {
        permissions::permission_row(row)
    }

    async fn replies_due(&self, now_ms: i64, limit: u32) -> Result<Vec<ReplyJob>> {
        Ok(outbox::due(&self.pool, now_ms, limit).await?)
    }

    async fn card_updates_due(&self, now_ms: i64, limit: u32) -> Result<Vec<CardUpdateJob>> {
        Ok(cards::due(&self.pool, now_ms, limit).await?)
    }

    async fn fetches_due(&self, now_ms: i64, limit: u32) -> Result<Vec<FetchJob>> {
        Ok(outbox::due_fetches(&self.pool, now_ms, limit).await?)
    }
}
