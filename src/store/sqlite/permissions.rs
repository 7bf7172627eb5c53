//! The SQLite side of the permission decisions
//! ([`crate::decide::permission`]): the rows a create or an answer reads, on
//! the writer's connection, and the statements that write a request and its
//! message to a linked chat. It decides nothing itself.

use rusqlite::Connection;

use super::journal::decided;
use super::{load_permission, load_session, sql};
use crate::decide::Decided;
use crate::decide::permission::Decision;
use crate::decide::permission::{self, AnswerRows, CreateRows};
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
