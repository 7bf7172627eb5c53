//! The PostgreSQL side of the permission decisions
//! ([`crate::decide::permission`]): permission request rows (decoded, read by
//! id), the rows a create or an answer reads,
//! after locking the session's row, and the statements that write a request
//! and its message to a linked chat, in the caller's transaction. It decides
//! nothing itself.

use sqlx::Row;
use sqlx::postgres::{PgConnection, PgRow};

use super::apply::decided;
use super::rows::{enumeration, optional_enumeration, unstorable, utf8};
use super::{Step, lock_session};
use crate::decide::Decided;
use crate::decide::permission::Decision;
use crate::decide::permission::{self, AnswerRows, CreateRows};
use crate::model::HostIdentity;
use crate::model::{AnsweredVia, Behavior, CreatePermissionRequest};
use crate::permission::PermissionRow;
use crate::time::now_ms;

pub(super) const PERMISSION_COLUMNS: &str = "session_id, request_id, tool_name, description, \
     input_preview, state, created_at, answered_at, answered_via, relayed_at";

pub(super) fn permission_row(row: PgRow) -> sqlx::Result<PermissionRow> {
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
        relayed_at: row.try_get("relayed_at")?,
    })
}

pub(super) async fn load_permission<'e, E>(
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

pub(super) async fn create(
    conn: &mut PgConnection,
    session_id: &str,
    host: &HostIdentity,
    request: &CreatePermissionRequest,
) -> Step<Decision> {
    let session = lock_session(conn, session_id).await?;
    let existing = load_permission(&mut *conn, session_id, &request.request_id).await?;
    let chat_id = match &session {
        Some(_) => {
            sqlx::query_scalar("select chat_id from lark_links where session_id = $1")
                .bind(session_id)
                .fetch_optional(&mut *conn)
                .await?
        }
        None => None,
    };
    let rows = CreateRows {
        session,
        existing,
        chat_id,
    };
    let decision = permission::create(rows, host, request.clone(), now_ms())?;
    decided(conn, decision).await
}

pub(super) async fn answer(
    conn: &mut PgConnection,
    session_id: &str,
    request_id: &str,
    (behavior, via): (Behavior, AnsweredVia),
) -> Step<Decision> {
    on_request(conn, session_id, request_id, |rows, now| {
        permission::answer(rows, behavior, via, now)
    })
    .await
}

pub(super) async fn withdraw(
    conn: &mut PgConnection,
    session_id: &str,
    request_id: &str,
    host: &HostIdentity,
) -> Step<Decision> {
    on_request(conn, session_id, request_id, |rows, now| {
        permission::withdraw(rows, host, now)
    })
    .await
}

pub(super) async fn relayed(
    conn: &mut PgConnection,
    session_id: &str,
    request_id: &str,
    host: &HostIdentity,
) -> Step<Decision> {
    on_request(conn, session_id, request_id, |rows, now| {
        permission::relayed(rows, host, now)
    })
    .await
}

/// A decision on one existing request (answer, withdraw, relayed), under the
/// session's row lock: loads the request, decides, and writes what was decided.
async fn on_request(
    conn: &mut PgConnection,
    session_id: &str,
    request_id: &str,
    decide: impl FnOnce(AnswerRows, i64) -> crate::error::Result<Decided<Decision>>,
) -> Step<Decision> {
    let rows = AnswerRows {
        session: lock_session(conn, session_id).await?,
        existing: load_permission(&mut *conn, session_id, request_id).await?,
    };
    decided(conn, decide(rows, now_ms())?).await
}
