//! The SQLite side of the decisions ([`crate::decide`]): for each, the rows
//! it needs, read on the writer's connection inside the job's transaction (the
//! single writer is what serializes them), and the statements that apply
//! the writes it returns. It decides nothing itself.

use rusqlite::Connection;

use super::journal::decided;
use super::{SESSION_COLUMNS, journal, load_session, load_turn, sql};
use crate::decide::SessionRow;
use crate::decide::presence::Reported;
use crate::decide::session::{BindRows, CloseRows};
use crate::decide::session::{Bound, Closed};
use crate::decide::turn::{ClaimOutcome, Enqueue};
use crate::decide::turn::{ClaimRows, CompleteRows, ReleaseRows, Releaser};
use crate::decide::{self, ClaimRow};
use crate::error::Result;
use crate::ids::Minter;
use crate::model::{
    BindRequest, CompleteRequest, EnqueueRequest, NotificationKind, Receipt, Released,
};
use crate::model::{HostIdentity, Origin};
use crate::time::now_ms;

/// The session's active claim, if it has one.
fn active_claim(conn: &Connection, session: Option<&SessionRow>) -> Result<Option<ClaimRow>> {
    match session.and_then(|s| s.active_claim_id.as_ref()) {
        Some(claim_id) => journal::claim(conn, claim_id),
        None => Ok(None),
    }
}

pub(super) fn bind_rows(conn: &Connection, bind: &BindRequest) -> Result<BindRows> {
    let registered: Option<i64> = sql::query_scalar(
        "select 1 from agent_threads
         where goal_id = ? and agent_id = ? and host_surface = ? and host_session_id = ?",
    )
    .bind(&bind.goal_id)
    .bind(&bind.agent_id)
    .bind(&bind.host_surface)
    .bind(&bind.host_session_id)
    .fetch_optional(conn)?;
    let sql = format!(
        "select {SESSION_COLUMNS} from sessions
         where goal_id = ? and agent_id = ? and host_surface = ? and host_session_id = ? and state = 'open'"
    );
    let open = sql::query_as(&sql)
        .bind(&bind.goal_id)
        .bind(&bind.agent_id)
        .bind(&bind.host_surface)
        .bind(&bind.host_session_id)
        .fetch_optional(conn)?;
    Ok(BindRows {
        registered: registered.is_some(),
        open,
    })
}

pub(super) fn bind(conn: &Connection, request: BindRequest, minter: &Minter) -> Result<Bound> {
    let rows = bind_rows(conn, &request)?;
    let bound = decide::session::bind(rows, request, minter, now_ms())?;
    if let Bound::Created(s) = &bound {
        sql::query(
            "insert into sessions (session_id, goal_id, agent_id, host_surface, host_session_id,
                 executor_endpoint_id, state, created_at, next_seq, next_event_no)
             values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&s.session_id)
        .bind(&s.goal_id)
        .bind(&s.agent_id)
        .bind(&s.host_surface)
        .bind(&s.host_session_id)
        .bind(&s.executor_endpoint_id)
        .bind(s.state)
        .bind(s.created_at)
        .bind(s.next_seq)
        .bind(s.next_event_no)
        .execute(conn)?;
    }
    Ok(bound)
}

pub(super) fn enqueue(
    conn: &Connection,
    session_id: String,
    message: EnqueueRequest,
    minter: &Minter,
) -> Result<Enqueue> {
    let session = load_session(conn, &session_id)?;
    let earlier = match (&session, &message.client_message_id) {
        (Some(_), Some(client_message_id)) => {
            journal::turn_by_client_message_id(conn, &session_id, client_message_id)?
        }
        _ => None,
    };
    let held = match (&session, message.attachments.is_empty()) {
        (Some(_), false) => super::lark::attachment_bytes(conn, &session_id)?,
        _ => 0,
    };
    let decision = decide::turn::enqueue_within(session, earlier, message, held, minter, now_ms())?;
    decided(conn, decision)
}

fn claim_rows(conn: &Connection, session_id: &str, claim_id: &str) -> Result<ClaimRows> {
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
        Some(turn) if turn.origin == Origin::Lark => super::lark::fetching(conn, &turn.turn_id)?,
        _ => false,
    };
    Ok(ClaimRows {
        head_fetching,
        active: active_claim(conn, Some(&session))?,
        session: Some(session),
        earlier,
        earlier_turn,
        head,
    })
}

pub(super) fn claim(
    conn: &Connection,
    session_id: String,
    host: HostIdentity,
    claim_id: String,
) -> Result<ClaimOutcome> {
    let rows = claim_rows(conn, &session_id, &claim_id)?;
    decided(conn, decide::turn::claim(rows, &host, &claim_id, now_ms())?)
}

pub(super) fn complete(
    conn: &Connection,
    session_id: String,
    turn_id: String,
    completion: CompleteRequest,
) -> Result<Receipt> {
    let session = load_session(conn, &session_id)?;
    let turn = load_turn(conn, &session_id, &turn_id)?;
    let rows = CompleteRows {
        session,
        turn,
        completion_id_used: journal::completion_used(conn, &session_id, &completion.completion_id)?,
    };
    decided(conn, decide::turn::complete(rows, completion, now_ms())?)
}

pub(super) fn release(
    conn: &Connection,
    session_id: String,
    claim_id: String,
    by: &Releaser,
) -> Result<Released> {
    let session = load_session(conn, &session_id)?;
    let claim = journal::claim(conn, &claim_id)?.filter(|c| c.session_id == session_id);
    let turn = match &claim {
        Some(claim) => load_turn(conn, &session_id, &claim.turn_id)?,
        None => None,
    };
    let rows = ReleaseRows {
        session,
        claim,
        turn,
    };
    decided(conn, decide::turn::release(rows, by, now_ms())?)
}

pub(super) fn report_agent(
    conn: &Connection,
    session_id: String,
    host: HostIdentity,
    report: &decide::presence::Report,
    minter: &Minter,
) -> Result<Reported> {
    let session = load_session(conn, &session_id)?;
    let terminal = match session.as_ref().and_then(|s| s.terminal_turn_id.as_ref()) {
        Some(turn_id) => load_turn(conn, &session_id, turn_id)?,
        None => None,
    };
    let terminal_feed = if decide::presence::ReportRows::feeds(session.as_ref(), report) {
        sql::query_scalar(crate::store::TERMINAL_FEED)
            .bind(&session_id)
            .fetch_optional(conn)?
    } else {
        None
    };
    let rows = decide::presence::ReportRows {
        session,
        terminal,
        terminal_feed,
    };
    decided(
        conn,
        decide::presence::report(rows, &host, report, minter, now_ms())?,
    )
}

pub(super) fn lapse_agent(
    conn: &Connection,
    session_id: &str,
    stall_after_ms: i64,
    now: i64,
) -> Result<Reported> {
    let session = load_session(conn, session_id)?;
    let lark_chat = linked_chat(conn, session_id)?;
    decided(
        conn,
        decide::presence::lapse(session, lark_chat, stall_after_ms, now)?,
    )
}

/// The Lark chat the session is linked to, if any.
fn linked_chat(conn: &Connection, session_id: &str) -> Result<Option<String>> {
    sql::query_scalar(crate::store::LINKED_CHAT)
        .bind(session_id)
        .fetch_optional(conn)
}

pub(super) fn notify(
    conn: &Connection,
    session_id: String,
    host: HostIdentity,
    kind: NotificationKind,
) -> Result<SessionRow> {
    let session = load_session(conn, &session_id)?;
    decided(
        conn,
        decide::presence::notify(session, &host, kind, now_ms())?,
    )
}

fn close_rows(conn: &Connection, session_id: &str) -> Result<CloseRows> {
    let Some(session) = load_session(conn, session_id)? else {
        return Ok(CloseRows::default());
    };
    let queued =
        sql::query_scalar("select count(*) from turns where session_id = ? and state = 'queued'")
            .bind(session_id)
            .fetch_one(conn)?;
    let pending = sql::query_scalar(
        "select count(*) from permission_requests where session_id = ? and state = 'pending'",
    )
    .bind(session_id)
    .fetch_one(conn)?;
    let active = active_claim(conn, Some(&session))?;
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
        lark_chat: linked_chat(conn, session_id)?,
    })
}

pub(super) fn close(
    conn: &Connection,
    session_id: String,
    release_active_claim: bool,
) -> Result<Closed> {
    let rows = close_rows(conn, &session_id)?;
    decided(
        conn,
        decide::session::close(rows, release_active_claim, now_ms())?,
    )
}
