//! The PostgreSQL side of [`crate::store::dispatch`]: each row a decision
//! reads, in the call's transaction (a session to decide on is locked with
//! `for update`, the per-session serialization point across replicas; a
//! turn decision's rows are one statement, `load`), its writes applied,
//! and the outbox's bookkeeping.
//!
//! An id holding U+0000 names no stored row (PostgreSQL text refuses it):
//! a read by one finds nothing instead of failing the transaction, and an
//! event whose id it is counts as seen, so that it is dropped, never taken
//! halfway.

use sqlx::postgres::PgConnection;

use super::apply::{applied, guarded};
pub(super) use super::load::{self, Guard};
use super::permissions::load_permission;
use super::reads::{load_session, load_turn, lock_session};
use super::rows::{SESSION_COLUMNS, TURN_COLUMNS, session_row, turn_row, unstorable};
use super::step::{Fail, Step};
use crate::decide::lark::LinkRow;
use crate::decide::pairing::{ChatRow, PairCodeRow};
use crate::decide::session::{BindRows, CloseRows};
use crate::decide::turn::{ClaimRows, CompleteRows, ReleaseRows};
use crate::decide::{SessionRow, TurnRow, Writes};
use crate::ids::Minter;
use crate::model::BindRequest;
use crate::permission::PermissionRow;
use crate::store::dispatch::{self, Tx};
use crate::store::retention::PruneStep;
use crate::store::statement::Statement;
use crate::store::{Command, Done};

/// Takes `command` on `conn`, as `guard` says: in its transaction, its
/// session locked ([`Guard::Lock`]); or, for a turn decision (enqueue,
/// claim, complete, release), outside any transaction in two round trips
/// ([`Guard::Version`]): its rows read unlocked in one statement, its writes
/// applied in one statement that commits by itself if the session row has
/// not moved on since ([`guarded`]). Such a decision that needs more
/// (another row read, writes one statement cannot hold) or whose session
/// moved on fails [`Fail::Locked`], having written nothing: the caller
/// takes it again in a transaction.
pub(super) async fn command(
    conn: &mut PgConnection,
    command: &Command,
    minter: &Minter,
    guard: Guard,
) -> Step<Done> {
    dispatch::command(&mut OnConn { conn, guard }, command.clone(), minter).await
}

/// `first` and then `then` in the caller's transaction
/// ([`crate::store::Store::together`]): `then` runs under a savepoint, so
/// that its refusal undoes its own writes only; a database failure in either
/// fails the transaction (taken again from the start on contention).
pub(super) async fn together(
    conn: &mut PgConnection,
    first: &Command,
    then: &Command,
    minter: &Minter,
) -> Step<(Done, crate::error::Result<Done>)> {
    let first = command(conn, first, minter, Guard::Lock).await?;
    let mut savepoint = sqlx::Connection::begin(&mut *conn).await?;
    match command(&mut savepoint, then, minter, Guard::Lock).await {
        Ok(done) => {
            savepoint.commit().await?;
            Ok((first, Ok(done)))
        }
        Err(Fail::Refused(e)) => {
            savepoint.rollback().await?;
            Ok((first, Err(e)))
        }
        Err(fail) => Err(fail),
    }
}

/// A connection: inside the call's transaction (its session rows locked),
/// or outside any for a turn decision taken unlocked (its loads and its
/// writes only; every other step fails [`Fail::Locked`]).
struct OnConn<'c> {
    conn: &'c mut PgConnection,
    guard: Guard,
}

impl OnConn<'_> {
    /// The connection, for a step only a transaction can take.
    fn locked(&mut self) -> Step<&mut PgConnection> {
        match self.guard {
            Guard::Lock => Ok(&mut *self.conn),
            Guard::Version(_) => Err(Fail::Locked),
        }
    }
}

impl Tx for OnConn<'_> {
    type Fail = Fail;

    async fn enqueue_rows(
        &mut self,
        session_id: &str,
        client_message_id: Option<&str>,
    ) -> Step<(Option<SessionRow>, Option<TurnRow>)> {
        Ok(load::enqueue_rows(self.conn, &mut self.guard, session_id, client_message_id).await?)
    }

    async fn claim_rows(&mut self, session_id: &str, claim_id: &str) -> Step<ClaimRows> {
        Ok(load::claim_rows(self.conn, &mut self.guard, session_id, claim_id).await?)
    }

    async fn complete_rows(
        &mut self,
        session_id: &str,
        turn_id: &str,
        completion_id: &str,
    ) -> Step<CompleteRows> {
        Ok(load::complete_rows(
            self.conn,
            &mut self.guard,
            session_id,
            turn_id,
            completion_id,
        )
        .await?)
    }

    async fn release_rows(&mut self, session_id: &str, claim_id: &str) -> Step<ReleaseRows> {
        Ok(load::release_rows(self.conn, &mut self.guard, session_id, claim_id).await?)
    }

    async fn close_rows(&mut self, session_id: &str) -> Step<CloseRows> {
        Ok(load::close_rows(self.locked()?, session_id).await?)
    }

    async fn bind_rows(&mut self, bind: &BindRequest) -> Step<BindRows> {
        let registered: Option<i32> = sqlx::query_scalar(
            "select 1 from agent_threads
             where goal_id = $1 and agent_id = $2 and host_surface = $3 and host_session_id = $4",
        )
        .bind(&bind.goal_id)
        .bind(&bind.agent_id)
        .bind(&bind.host_surface)
        .bind(&bind.host_session_id)
        .fetch_optional(self.locked()?)
        .await?;
        let sql = format!(
            "select {SESSION_COLUMNS} from sessions
             where goal_id = $1 and agent_id = $2 and host_surface = $3 and host_session_id = $4
               and state = 'open'"
        );
        let open = sqlx::query(&sql)
            .bind(&bind.goal_id)
            .bind(&bind.agent_id)
            .bind(&bind.host_surface)
            .bind(&bind.host_session_id)
            .fetch_optional(self.locked()?)
            .await?
            .as_ref()
            .map(session_row)
            .transpose()?;
        let predecessor = match (&open, &bind.terminal) {
            (None, Some(terminal)) => {
                sqlx::query_scalar(crate::store::TERMINALS_OPEN_SESSION)
                    .bind(&bind.goal_id)
                    .bind(&bind.agent_id)
                    .bind(&bind.host_surface)
                    .bind(&bind.executor_endpoint_id)
                    .bind(terminal)
                    .bind(&bind.host_session_id)
                    .fetch_optional(self.locked()?)
                    .await?
            }
            _ => None,
        };
        Ok(BindRows {
            registered: registered.is_some(),
            open,
            predecessor,
        })
    }

    async fn lock_session(&mut self, session_id: &str) -> Step<Option<SessionRow>> {
        Ok(lock_session(self.locked()?, session_id).await?)
    }

    async fn session(&mut self, session_id: &str) -> Step<Option<SessionRow>> {
        Ok(load_session(self.locked()?, session_id).await?)
    }

    async fn turn(&mut self, session_id: &str, turn_id: &str) -> Step<Option<TurnRow>> {
        Ok(load_turn(self.locked()?, session_id, turn_id).await?)
    }

    async fn earlier_turn(
        &mut self,
        session_id: &str,
        client_message_id: &str,
    ) -> Step<Option<TurnRow>> {
        if unstorable(session_id) || unstorable(client_message_id) {
            return Ok(None);
        }
        Ok(sqlx::query(&format!(
            "select {TURN_COLUMNS} from turns where session_id = $1 and client_message_id = $2"
        ))
        .bind(session_id)
        .bind(client_message_id)
        .fetch_optional(self.locked()?)
        .await?
        .as_ref()
        .map(turn_row)
        .transpose()?)
    }

    async fn permission(
        &mut self,
        session_id: &str,
        request_id: &str,
    ) -> Step<Option<PermissionRow>> {
        Ok(load_permission(self.locked()?, session_id, request_id).await?)
    }

    async fn attachment_bytes(&mut self, session_id: &str) -> Step<u64> {
        let held: i64 = sqlx::query_scalar(crate::store::SESSION_ATTACHMENT_BYTES)
            .bind(session_id)
            .fetch_one(self.locked()?)
            .await?;
        Ok(held.max(0) as u64)
    }

    async fn fetching(&mut self, turn_id: &str) -> Step<bool> {
        let pending: i64 = sqlx::query_scalar(crate::store::FETCH_PENDING)
            .bind(turn_id)
            .fetch_one(self.locked()?)
            .await?;
        Ok(pending > 0)
    }

    async fn terminal_feed(&mut self, session_id: &str) -> Step<Option<String>> {
        Ok(sqlx::query_scalar(crate::store::TERMINAL_FEED)
            .bind(session_id)
            .fetch_optional(self.locked()?)
            .await?)
    }

    async fn changes(&mut self, session_id: &str) -> Step<Option<(Vec<u8>, i64)>> {
        Ok(sqlx::query_as(crate::store::KEPT_CHANGES)
            .bind(session_id)
            .fetch_optional(self.locked()?)
            .await?)
    }

    async fn session_link(&mut self, session_id: &str) -> Step<Option<LinkRow>> {
        let link: Option<(String, String, i64, i64)> = sqlx::query_as(crate::store::SESSION_LINK)
            .bind(session_id)
            .fetch_optional(self.locked()?)
            .await?;
        Ok(
            link.map(|(chat_id, approvers, linked_at, terminal_turns)| LinkRow {
                chat_id,
                approvers,
                linked_at,
                terminal_turns: terminal_turns == 1,
            }),
        )
    }

    async fn chat(&mut self, chat_id: &str) -> Step<Option<ChatRow>> {
        let chat: Option<(String, i64, i64, Option<String>)> = sqlx::query_as(crate::store::CHAT)
            .bind(chat_id)
            .fetch_optional(self.locked()?)
            .await?;
        Ok(chat.map(
            |(chat_id, failed_codes, failed_since, current_session_id)| ChatRow {
                chat_id,
                failed_codes,
                failed_since,
                current_session_id,
            },
        ))
    }

    async fn chat_links(&mut self, chat_id: &str) -> Step<Vec<(String, String)>> {
        Ok(sqlx::query_as(crate::store::CHAT_SESSIONS)
            .bind(chat_id)
            .fetch_all(self.locked()?)
            .await?)
    }

    async fn sent_for(&mut self, message_id: &str) -> Step<Option<String>> {
        if unstorable(message_id) {
            return Ok(None);
        }
        Ok(sqlx::query_scalar(crate::store::SENT_FOR)
            .bind(message_id)
            .fetch_optional(self.locked()?)
            .await?)
    }

    async fn asked_in_chat(&mut self, chat_id: &str, request_id: &str) -> Step<Option<String>> {
        if unstorable(request_id) {
            return Ok(None);
        }
        Ok(sqlx::query_scalar(crate::store::ASKED_IN_CHAT)
            .bind(chat_id)
            .bind(request_id)
            .fetch_optional(self.locked()?)
            .await?)
    }

    async fn event_seen(
        &mut self,
        app_id: &str,
        event_id: &str,
        message_id: Option<&str>,
    ) -> Step<bool> {
        if unstorable(event_id) || message_id.is_some_and(unstorable) {
            return Ok(true);
        }
        // The same event reaching two replicas at once: both find it unseen,
        // and the second one's guard insert waits for the first transaction,
        // fails once it commits, and the decision taken again finds it seen.
        let seen: Option<i32> = sqlx::query_scalar(crate::store::EVENT_SEEN)
            .bind(app_id)
            .bind(event_id)
            .bind(message_id)
            .fetch_optional(self.locked()?)
            .await?;
        Ok(seen.is_some())
    }

    async fn pair_code(&mut self, code_hash: &str) -> Step<Option<PairCodeRow>> {
        let code: Option<(String, String, i64, Option<i64>)> =
            sqlx::query_as(crate::store::PAIR_CODE)
                .bind(code_hash)
                .fetch_optional(self.locked()?)
                .await?;
        Ok(
            code.map(|(code_hash, session_id, expires_at, used_at)| PairCodeRow {
                code_hash,
                session_id,
                expires_at,
                used_at,
            }),
        )
    }

    async fn card(
        &mut self,
        session_id: &str,
        request_id: &str,
    ) -> Step<Option<(String, Option<String>)>> {
        if unstorable(session_id) || unstorable(request_id) {
            return Ok(None);
        }
        Ok(sqlx::query_as(crate::store::CARD)
            .bind(session_id)
            .bind(request_id)
            .fetch_optional(self.locked()?)
            .await?)
    }

    async fn apply(&mut self, writes: Writes) -> Step<()> {
        match &self.guard {
            Guard::Lock => applied(self.conn, &writes).await,
            Guard::Version(Some(version)) if guarded(self.conn, &writes, version).await? => Ok(()),
            Guard::Version(_) => Err(Fail::Locked),
        }
    }

    async fn execute(&mut self, statement: Statement) -> Step<u64> {
        Ok(super::apply::execute(self.locked()?, &statement).await?)
    }

    async fn prune_step(&mut self, cutoff_ms: i64) -> Step<PruneStep> {
        super::reads::prune_step(self.locked()?, cutoff_ms).await
    }
}
