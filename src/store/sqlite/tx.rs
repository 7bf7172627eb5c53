//! The SQLite side of [`crate::store::dispatch`]: each row a decision
//! reads, on the writer's connection inside the job's transaction (the
//! single writer is what serializes the decisions, so a session "locked"
//! is a session read), its writes journaled or applied, and the outbox's
//! bookkeeping. Every step runs at once: nothing here waits.

use rusqlite::Connection;

use super::{SESSION_COLUMNS, journal, load_permission, load_session, load_turn, sql};
use crate::decide::lark::LinkRow;
use crate::decide::pairing::{ChatRow, PairCodeRow};
use crate::decide::session::{BindRows, CloseRows};
use crate::decide::turn::{ClaimRows, CompleteRows, ReleaseRows};
use crate::decide::{ClaimRow, SessionRow, TurnRow, Writes};
use crate::error::{Error, Result};
use crate::ids::Minter;
use crate::model::{BindRequest, Origin};
use crate::permission::PermissionRow;
use crate::store::dispatch::{self, Tx};
use crate::store::retention::PruneStep;
use crate::store::statement::Statement;
use crate::store::{CHAT, CHAT_SESSIONS, SENT_FOR, SESSION_LINK};
use crate::store::{Command, Done};

/// Takes `command` on `conn`: what it decided.
pub(super) fn command(conn: &Connection, command: Command, minter: &Minter) -> Result<Done> {
    dispatch::at_once(dispatch::command(&mut OnWriter(conn), command, minter))
}

/// The writer's connection, inside a job's transaction.
struct OnWriter<'c>(&'c Connection);

/// The session's active claim, if it has one.
fn active_claim(conn: &Connection, session: &SessionRow) -> Result<Option<ClaimRow>> {
    match &session.active_claim_id {
        Some(claim_id) => journal::claim(conn, claim_id),
        None => Ok(None),
    }
}

impl Tx for OnWriter<'_> {
    type Fail = Error;

    async fn enqueue_rows(
        &mut self,
        session_id: &str,
        client_message_id: Option<&str>,
    ) -> Result<(Option<SessionRow>, Option<TurnRow>)> {
        let session = load_session(self.0, session_id)?;
        let earlier = match (&session, client_message_id) {
            (Some(_), Some(client_message_id)) => {
                journal::turn_by_client_message_id(self.0, session_id, client_message_id)?
            }
            _ => None,
        };
        Ok((session, earlier))
    }

    async fn claim_rows(&mut self, session_id: &str, claim_id: &str) -> Result<ClaimRows> {
        let conn = self.0;
        let Some(session) = load_session(conn, session_id)? else {
            return Ok(ClaimRows::default());
        };
        let earlier = journal::claim(conn, claim_id)?;
        let earlier_turn = match &earlier {
            Some(claim) => load_turn(conn, session_id, &claim.turn_id)?,
            None => None,
        };
        let head = journal::head(conn, session_id)?;
        // Only a Lark turn can wait for its files.
        let head_fetching = match &head {
            Some(turn) if turn.origin == Origin::Lark => self.fetching(&turn.turn_id).await?,
            _ => false,
        };
        Ok(ClaimRows {
            head_fetching,
            active: active_claim(conn, &session)?,
            session: Some(session),
            earlier,
            earlier_turn,
            head,
        })
    }

    async fn complete_rows(
        &mut self,
        session_id: &str,
        turn_id: &str,
        completion_id: &str,
    ) -> Result<CompleteRows> {
        Ok(CompleteRows {
            session: load_session(self.0, session_id)?,
            turn: load_turn(self.0, session_id, turn_id)?,
            completion_id_used: journal::completion_used(self.0, session_id, completion_id)?,
        })
    }

    async fn release_rows(&mut self, session_id: &str, claim_id: &str) -> Result<ReleaseRows> {
        let session = load_session(self.0, session_id)?;
        let claim = journal::claim(self.0, claim_id)?.filter(|c| c.session_id == session_id);
        let turn = match &claim {
            Some(claim) => load_turn(self.0, session_id, &claim.turn_id)?,
            None => None,
        };
        Ok(ReleaseRows {
            session,
            claim,
            turn,
        })
    }

    async fn close_rows(&mut self, session_id: &str) -> Result<CloseRows> {
        let conn = self.0;
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
        let active = active_claim(conn, &session)?;
        let active_turn = match &active {
            Some(claim) => load_turn(conn, session_id, &claim.turn_id)?,
            None => None,
        };
        Ok(CloseRows {
            active,
            active_turn,
            session: Some(session),
            queued,
            pending,
            lark_chat: self.session_link(session_id).await?.map(|l| l.chat_id),
        })
    }

    async fn bind_rows(&mut self, bind: &BindRequest) -> Result<BindRows> {
        let registered: Option<i64> = sql::query_scalar(
            "select 1 from agent_threads
             where goal_id = ? and agent_id = ? and host_surface = ? and host_session_id = ?",
        )
        .bind(&bind.goal_id)
        .bind(&bind.agent_id)
        .bind(&bind.host_surface)
        .bind(&bind.host_session_id)
        .fetch_optional(self.0)?;
        let sql = format!(
            "select {SESSION_COLUMNS} from sessions
             where goal_id = ? and agent_id = ? and host_surface = ? and host_session_id = ?
               and state = 'open'"
        );
        let open = sql::query_as(&sql)
            .bind(&bind.goal_id)
            .bind(&bind.agent_id)
            .bind(&bind.host_surface)
            .bind(&bind.host_session_id)
            .fetch_optional(self.0)?;
        let predecessor = match (&open, &bind.terminal) {
            (None, Some(terminal)) => sql::query_scalar(crate::store::TERMINALS_OPEN_SESSION)
                .bind(&bind.goal_id)
                .bind(&bind.agent_id)
                .bind(&bind.host_surface)
                .bind(&bind.executor_endpoint_id)
                .bind(terminal)
                .bind(&bind.host_session_id)
                .fetch_optional(self.0)?,
            _ => None,
        };
        Ok(BindRows {
            registered: registered.is_some(),
            open,
            predecessor,
        })
    }

    async fn lock_session(&mut self, session_id: &str) -> Result<Option<SessionRow>> {
        load_session(self.0, session_id)
    }

    async fn session(&mut self, session_id: &str) -> Result<Option<SessionRow>> {
        load_session(self.0, session_id)
    }

    async fn turn(&mut self, session_id: &str, turn_id: &str) -> Result<Option<TurnRow>> {
        load_turn(self.0, session_id, turn_id)
    }

    async fn earlier_turn(
        &mut self,
        session_id: &str,
        client_message_id: &str,
    ) -> Result<Option<TurnRow>> {
        journal::turn_by_client_message_id(self.0, session_id, client_message_id)
    }

    async fn permission(
        &mut self,
        session_id: &str,
        request_id: &str,
    ) -> Result<Option<PermissionRow>> {
        load_permission(self.0, session_id, request_id)
    }

    /// The journal is folded first (only a message with files pays for it).
    async fn attachment_bytes(&mut self, session_id: &str) -> Result<u64> {
        journal::fold_all(self.0)?;
        let held: i64 = sql::query_scalar(crate::store::SESSION_ATTACHMENT_BYTES)
            .bind(session_id)
            .fetch_one(self.0)?;
        Ok(held.max(0) as u64)
    }

    async fn fetching(&mut self, turn_id: &str) -> Result<bool> {
        let pending: i64 = sql::query_scalar(crate::store::FETCH_PENDING)
            .bind(turn_id)
            .fetch_one(self.0)?;
        Ok(pending > 0)
    }

    async fn terminal_feed(&mut self, session_id: &str) -> Result<Option<String>> {
        sql::query_scalar(crate::store::TERMINAL_FEED)
            .bind(session_id)
            .fetch_optional(self.0)
    }

    async fn session_link(&mut self, session_id: &str) -> Result<Option<LinkRow>> {
        sql::query_as(SESSION_LINK)
            .bind(session_id)
            .fetch_optional(self.0)
    }

    async fn changes(&mut self, session_id: &str) -> Result<Option<(Vec<u8>, i64)>> {
        sql::query_as(crate::store::KEPT_CHANGES)
            .bind(session_id)
            .fetch_optional(self.0)
    }

    async fn chat(&mut self, chat_id: &str) -> Result<Option<ChatRow>> {
        sql::query_as(CHAT).bind(chat_id).fetch_optional(self.0)
    }

    async fn chat_links(&mut self, chat_id: &str) -> Result<Vec<(String, String)>> {
        sql::query_as(CHAT_SESSIONS).bind(chat_id).fetch_all(self.0)
    }

    async fn sent_for(&mut self, message_id: &str) -> Result<Option<String>> {
        sql::query_scalar(SENT_FOR)
            .bind(message_id)
            .fetch_optional(self.0)
    }

    async fn asked_in_chat(&mut self, chat_id: &str, request_id: &str) -> Result<Option<String>> {
        sql::query_scalar(crate::store::ASKED_IN_CHAT)
            .bind(chat_id)
            .bind(request_id)
            .fetch_optional(self.0)
    }

    async fn event_seen(
        &mut self,
        app_id: &str,
        event_id: &str,
        message_id: Option<&str>,
    ) -> Result<bool> {
        let seen: Option<i64> = sql::query_scalar(crate::store::EVENT_SEEN)
            .bind(app_id)
            .bind(event_id)
            .bind(message_id)
            .fetch_optional(self.0)?;
        Ok(seen.is_some())
    }

    async fn pair_code(&mut self, code_hash: &str) -> Result<Option<PairCodeRow>> {
        sql::query_as(crate::store::PAIR_CODE)
            .bind(code_hash)
            .fetch_optional(self.0)
    }

    async fn card(
        &mut self,
        session_id: &str,
        request_id: &str,
    ) -> Result<Option<(String, Option<String>)>> {
        sql::query_as(crate::store::CARD)
            .bind(session_id)
            .bind(request_id)
            .fetch_optional(self.0)
    }

    async fn apply(&mut self, writes: Writes) -> Result<()> {
        journal::decided(self.0, writes)
    }

    async fn execute(&mut self, statement: Statement) -> Result<u64> {
        sql::execute(&statement, self.0)
    }

    async fn prune_step(&mut self, cutoff_ms: i64) -> Result<PruneStep> {
        super::prune_step(self.0, cutoff_ms)
    }
}
