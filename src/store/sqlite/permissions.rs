//! The SQLite side of the permission decisions
//! ([`crate::decide::permission`]): the rows a create or an answer reads, on
//! the writer's connection, and the statements that write a request and its
//! message to a linked chat. It decides nothing itself.

use rusqlite::Connection;

use super::decisions::decided;
use super::{load_permission, load_session, sql};
use crate::decide::permission::Decision;
use crate::decide::permission::{self, AnswerRows, CreateRows};
use crate::decide::{Change, Decided, Writes};
use crate::error::Result;
use crate::model::HostIdentity;
use crate::model::{AnsweredVia, Behavior, CreatePermissionRequest};
use crate::time::now_ms;

pub(super) fn create(
    conn: &Connection,
    session_id: String,
    host: HostIdentity,
    request: CreatePermissionRequest,
) -> Result<Decision> {
    let chat_id = sql::query_scalar("select chat_id from lark_links where session_id = ?")
        .bind(&session_id)
        .fetch_optional(conn)?;
    let rows = CreateRows {
        session: load_session(conn, &session_id)?,
        existing: load_permission(conn, &session_id, &request.request_id)?,
        chat_id,
    };
    decided(conn, permission::create(rows, &host, request, now_ms())?)
}

pub(super) fn answer(
    conn: &Connection,
    session_id: String,
    request_id: String,
    (behavior, via): (Behavior, AnsweredVia),
) -> Result<Decision> {
    on_request(conn, &session_id, &request_id, |rows, now| {
        permission::answer(rows, behavior, via, now)
    })
}

pub(super) fn withdraw(
    conn: &Connection,
    session_id: String,
    request_id: String,
    host: HostIdentity,
) -> Result<Decision> {
    on_request(conn, &session_id, &request_id, |rows, now| {
        permission::withdraw(rows, &host, now)
    })
}

pub(super) fn relayed(
    conn: &Connection,
    session_id: String,
    request_id: String,
    host: &HostIdentity,
) -> Result<Decision> {
    on_request(conn, &session_id, &request_id, |rows, now| {
        permission::relayed(rows, host, now)
    })
}

/// A decision on one existing request (answer, withdraw, relayed): loads the
/// request and its session, decides, and writes what was decided.
fn on_request(
    conn: &Connection,
    session_id: &str,
    request_id: &str,
    decide: impl FnOnce(AnswerRows, i64) -> Result<Decided<Decision>>,
) -> Result<Decision> {
    let rows = AnswerRows {
        session: load_session(conn, session_id)?,
        existing: load_permission(conn, session_id, request_id)?,
    };
    decided(conn, decide(rows, now_ms())?)
}

/// Writes a decision's permission request and its chat message, if any.
pub(super) fn apply(conn: &Connection, writes: &Writes) -> Result<()> {
    match &writes.permission {
        Some(Change::Insert(row)) => {
            sql::query(
                "insert into permission_requests (session_id, request_id, tool_name, description,
                     input_preview, state, created_at, answered_at, answered_via)
                 values (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&row.session_id)
            .bind(&row.request_id)
            .bind(&row.tool_name)
            .bind(&row.description)
            .bind(&row.input_preview)
            .bind(row.state)
            .bind(row.created_at)
            .bind(row.answered_at)
            .bind(row.answered_via)
            .execute(conn)?;
        }
        Some(Change::Update(row)) => {
            sql::query(
                "update permission_requests set state = ?, answered_at = ?, answered_via = ?,
                     relayed_at = ?
                 where session_id = ? and request_id = ?",
            )
            .bind(row.state)
            .bind(row.answered_at)
            .bind(row.answered_via)
            .bind(row.relayed_at)
            .bind(&row.session_id)
            .bind(&row.request_id)
            .execute(conn)?;
        }
        None => {}
    }
    if let Some(m) = &writes.permission_message {
        sql::query(
            "insert into lark_permission_messages (session_id, request_id, chat_id, text, state,
                 next_attempt_at, created_at, updated_at)
             values (?, ?, ?, ?, 'pending', ?, ?, ?)",
        )
        .bind(&m.session_id)
        .bind(&m.request_id)
        .bind(&m.chat_id)
        .bind(&m.text)
        .bind(m.at)
        .bind(m.at)
        .bind(m.at)
        .execute(conn)?;
    }
    Ok(())
}
