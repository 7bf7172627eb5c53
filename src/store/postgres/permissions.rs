//! Permission request rows on PostgreSQL: their columns, decoded, and one
//! read by id.

use sqlx::Row;
use sqlx::postgres::PgRow;

use super::rows::{enumeration, optional_enumeration, optional_utf8, unstorable, utf8};
use crate::permission::PermissionRow;

pub(super) const PERMISSION_COLUMNS: &str = permission_columns!();

pub(super) fn permission_row(row: &PgRow) -> sqlx::Result<PermissionRow> {
    Ok(PermissionRow {
        session_id: row.try_get("session_id")?,
        request_id: row.try_get("request_id")?,
        tool_name: row.try_get("tool_name")?,
        description: utf8(row, "description")?,
        input_preview: utf8(row, "input_preview")?,
        state: enumeration(row, "state")?,
        created_at: row.try_get("created_at")?,
        answered_at: row.try_get("answered_at")?,
        answered_via: optional_enumeration(row, "answered_via")?,
        relayed_at: row.try_get("relayed_at")?,
        detail: optional_utf8(row, "detail")?,
        answer: optional_utf8(row, "answer")?,
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
    .as_ref()
    .map(permission_row)
    .transpose()
}
