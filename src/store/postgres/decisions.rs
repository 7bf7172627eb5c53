//! The PostgreSQL side of the turn and session decisions ([`crate::decide`]):
//! for each, its rows loaded under the session's row lock (the per-session
//! serialization point across replicas; `load`, one statement for a turn
//! decision), the decision, and its writes applied (`apply`), in the caller's
//! transaction; binding a session and closing one keep their own statements.
//! It decides nothing itself.

use sqlx::postgres::PgConnection;

use super::Step;
use super::apply::decided;
use super::load::{claim_rows, close_rows, complete_rows, enqueue_rows, release_rows};
use super::pool::Fail;
use super::rows::{SESSION_COLUMNS, TURN_COLUMNS, session_row, text, turn_row};
use crate::decide;
use crate::decide::presence::Reported;
use crate::decide::session::BindRows;
use crate::decide::session::{Bound, Closed};
use crate::decide::turn::{ClaimOutcome, Enqueue};
use crate::decide::{SessionRow, TurnRow};
use crate::ids::Minter;
use crate::model::HostIdentity;
use crate::model::{
    BindRequest, CompleteRequest, EnqueueRequest, NotificationKind, Receipt, Released,
};
use crate::store::{Command, Done};
use crate::time::now_ms;

pub(super) async fn bind_rows(
    conn: &mut PgConnection,
    bind: &BindRequest,
) -> sqlx::Result<BindRows> {
    let registered: Option<i32> = sqlx::query_scalar(
        "select 1 from agent_threads
         where goal_id = $1 and agent_id = $2 and host_surface = $3 and host_session_id = $4",
    )
    .bind(&bind.goal_id)
    .bind(&bind.agent_id)
    .bind(&bind.host_surface)
    .bind(&bind.host_session_id)
    .fetch_optional(&mut *conn)
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
        .fetch_optional(&mut *conn)
        .await?
        .map(session_row)
        .transpose()?;
    Ok(BindRows {
        registered: registered.is_some(),
        open,
    })
}

pub(super) async fn bind(
    conn: &mut PgConnection,
    request: &BindRequest,
    minter: &Minter,
) -> Step<Bound> {
    let rows = bind_rows(conn, request).await?;
    let bound = decide::session::bind(rows, request.clone(), minter, now_ms())?;
    if let Bound::Created(s) = &bound {
        // Two replicas binding the same tuple at once: the second insert fails
        // on sessions_open_tuple, and the decision taken again answers the
        // first's session.
        sqlx::query(
            "insert into sessions (session_id, goal_id, agent_id, host_surface, host_session_id,
                 executor_endpoint_id, state, created_at, next_seq, next_event_no)
             values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(&s.session_id)
        .bind(&s.goal_id)
        .bind(&s.agent_id)
        .bind(&s.host_surface)
        .bind(&s.host_session_id)
        .bind(&s.executor_endpoint_id)
        .bind(text(&s.state))
        .bind(s.created_at)
        .bind(s.next_seq)
        .bind(s.next_event_no)
        .execute(conn)
        .await?;
    }
    Ok(bound)
}

/// The session's turn enqueued with this `client_message_id`, if any.
pub(super) async fn earlier_turn(
    conn: &mut PgConnection,
    session_id: &str,
    client_message_id: &str,
) -> sqlx::Result<Option<TurnRow>> {
    sqlx::query(&format!(
        "select {TURN_COLUMNS} from turns where session_id = $1 and client_message_id = $2"
    ))
    .bind(session_id)
    .bind(client_message_id)
    .fetch_optional(conn)
    .await?
    .map(turn_row)
    .transpose()
}

pub(super) async fn enqueue(
    conn: &mut PgConnection,
    session_id: &str,
    message: &EnqueueRequest,
    minter: &Minter,
) -> Step<Enqueue> {
    let client_message_id = message.client_message_id.as_deref();
    let (session, earlier) = enqueue_rows(conn, session_id, client_message_id).await?;
    let held = match (&session, message.attachments.is_empty()) {
        (Some(_), false) => super::lark::attachment_bytes(conn, session_id).await?,
        _ => 0,
    };
    let decision =
        decide::turn::enqueue_within(session, earlier, message.clone(), held, minter, now_ms())?;
    decided(conn, decision).await
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
    let first = super::commands::command(conn, first, minter).await?;
    let mut savepoint = sqlx::Connection::begin(&mut *conn).await?;
    match super::commands::command(&mut savepoint, then, minter).await {
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

pub(super) async fn claim(
    conn: &mut PgConnection,
    session_id: &str,
    host: &HostIdentity,
    claim_id: &str,
) -> Step<ClaimOutcome> {
    let rows = claim_rows(conn, session_id, claim_id).await?;
    let decision = decide::turn::claim(rows, host, claim_id, now_ms())?;
    decided(conn, decision).await
}

pub(super) async fn complete(
    conn: &mut PgConnection,
    session_id: &str,
    turn_id: &str,
    completion: &CompleteRequest,
) -> Step<Receipt> {
    let completion_id = &completion.completion_id;
    let rows = complete_rows(conn, session_id, turn_id, completion_id).await?;
    let decision = decide::turn::complete(rows, completion.clone(), now_ms())?;
    decided(conn, decision).await
}

pub(super) async fn release(
    conn: &mut PgConnection,
    session_id: &str,
    claim_id: &str,
    by: &decide::turn::Releaser,
) -> Step<Released> {
    let rows = release_rows(conn, session_id, claim_id).await?;
    let decision = decide::turn::release(rows, by, now_ms())?;
    decided(conn, decision).await
}

pub(super) async fn close(
    conn: &mut PgConnection,
    session_id: &str,
    release_active_claim: bool,
) -> Step<Closed> {
    let rows = close_rows(conn, session_id).await?;
    decided(
        conn,
        decide::session::close(rows, release_active_claim, now_ms())?,
    )
    .await
}

/// A silent agent announced away, under the session's row lock.
pub(super) async fn lapse_agent(
    conn: &mut PgConnection,
    session_id: &str,
    stall_after_ms: i64,
    now: i64,
) -> Step<Reported> {
    let session = super::reads::lock_session(conn, session_id).await?;
    let lark_chat = super::load::linked_chat(conn, session_id).await?;
    let decision = decide::presence::lapse(session, lark_chat, stall_after_ms, now)?;
    decided(conn, decision).await
}

/// The host's agent waits at its terminal, under the session's row lock.
pub(super) async fn notify(
    conn: &mut PgConnection,
    session_id: &str,
    host: &HostIdentity,
    kind: NotificationKind,
) -> Step<SessionRow> {
    let session = super::reads::lock_session(conn, session_id).await?;
    decided(
        conn,
        decide::presence::notify(session, host, kind, now_ms())?,
    )
    .await
}

/// The host reports its agent's state, under the session's row lock.
pub(super) async fn report_agent(
    conn: &mut PgConnection,
    session_id: &str,
    host: &HostIdentity,
    report: &decide::presence::Report,
    minter: &Minter,
) -> Step<Reported> {
    let session = super::reads::lock_session(conn, session_id).await?;
    let terminal = match session.as_ref().and_then(|s| s.terminal_turn_id.as_deref()) {
        Some(turn_id) => super::reads::load_turn(&mut *conn, session_id, turn_id).await?,
        None => None,
    };
    let terminal_feed = if decide::presence::ReportRows::feeds(session.as_ref(), report) {
        sqlx::query_scalar(crate::store::TERMINAL_FEED)
            .bind(session_id)
            .fetch_optional(&mut *conn)
            .await?
    } else {
        None
    };
    let rows = decide::presence::ReportRows {
        session,
        terminal,
        terminal_feed,
    };
    let decision = decide::presence::report(rows, host, report, minter, now_ms())?;
    decided(conn, decision).await
}
