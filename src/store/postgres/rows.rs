//! How PostgreSQL rows become the store's rows: enumerations kept as their
//! snake_case text, messages as UTF-8 `bytea`, the column lists the
//! statements select.

use serde::de::DeserializeOwned;
use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::store::{SessionRow, TurnRow};

/// An enumeration as the text the columns hold (its snake_case name).
pub(super) use crate::model::wire as text;

pub(super) fn decode_error(
    column: &str,
    e: impl std::error::Error + Send + Sync + 'static,
) -> sqlx::Error {
    sqlx::Error::ColumnDecode {
        index: column.to_owned(),
        source: Box::new(e),
    }
}

/// An enumeration column.
pub(super) fn enumeration<T: DeserializeOwned>(row: &PgRow, column: &str) -> sqlx::Result<T> {
    let value: String = row.try_get(column)?;
    serde_json::from_value(serde_json::Value::String(value)).map_err(|e| decode_error(column, e))
}

/// A nullable enumeration column, or None when the row has no such column.
pub(super) fn optional_enumeration<T: DeserializeOwned>(
    row: &PgRow,
    column: &str,
) -> sqlx::Result<Option<T>> {
    match row.try_get::<Option<String>, _>(column) {
        Ok(Some(value)) => serde_json::from_value(serde_json::Value::String(value))
            .map(Some)
            .map_err(|e| decode_error(column, e)),
        Ok(None) | Err(sqlx::Error::ColumnNotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A `bytea` column that holds UTF-8 text.
pub(super) fn utf8(row: &PgRow, column: &str) -> sqlx::Result<String> {
    let bytes: Vec<u8> = row.try_get(column)?;
    String::from_utf8(bytes).map_err(|e| decode_error(column, e))
}

/// A column a joined readback has and a written row has not.
pub(super) fn joined<T>(row: &PgRow, column: &str) -> sqlx::Result<Option<T>>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    match row.try_get::<Option<T>, _>(column) {
        Err(sqlx::Error::ColumnNotFound(_)) => Ok(None),
        other => other,
    }
}

pub(super) fn session_row(row: PgRow) -> sqlx::Result<SessionRow> {
    Ok(SessionRow {
        session_id: row.try_get("session_id")?,
        goal_id: row.try_get("goal_id")?,
        agent_id: row.try_get("agent_id")?,
        host_surface: row.try_get("host_surface")?,
        host_session_id: row.try_get("host_session_id")?,
        executor_endpoint_id: row.try_get("executor_endpoint_id")?,
        state: enumeration(&row, "state")?,
        created_at: row.try_get("created_at")?,
        closed_at: row.try_get("closed_at")?,
        queued_count: row.try_get("queued_count")?,
        active_claim_id: row.try_get("active_claim_id")?,
        next_seq: row.try_get("next_seq")?,
        next_event_no: row.try_get("next_event_no")?,
    })
}

pub(super) fn turn_row(row: PgRow) -> sqlx::Result<TurnRow> {
    Ok(TurnRow {
        turn_id: row.try_get("turn_id")?,
        session_id: row.try_get("session_id")?,
        seq: row.try_get("seq")?,
        origin: enumeration(&row, "origin")?,
        text: utf8(&row, "text")?,
        client_message_id: row.try_get("client_message_id")?,
        lark_chat_id: row.try_get("lark_chat_id")?,
        lark_message_id: row.try_get("lark_message_id")?,
        state: enumeration(&row, "state")?,
        enqueued_at: row.try_get("enqueued_at")?,
        claimed_at: row.try_get("claimed_at")?,
        completed_at: row.try_get("completed_at")?,
        claim_count: row.try_get("claim_count")?,
        current_claim_id: row.try_get("current_claim_id")?,
        completion_id: row.try_get("completion_id")?,
        response: row.try_get("response")?,
        cancel_reason: optional_enumeration(&row, "cancel_reason")?,
        reply_state: optional_enumeration(&row, "reply_state")?,
        reply_attempts: joined(&row, "reply_attempts")?,
        reply_error: joined(&row, "reply_error")?,
    })
}

/// An id that can name no stored row: every stored id is a minted one or a
/// checked client id, neither of which holds U+0000 (which PostgreSQL text
/// refuses outright, so asking would be a store error instead of a 404).
pub(super) fn unstorable(id: &str) -> bool {
    id.contains('\0')
}

pub(super) const SESSION_COLUMNS: &str = "session_id, goal_id, agent_id, host_surface, host_session_id, \
     executor_endpoint_id, state, created_at, closed_at, queued_count, active_claim_id, \
     next_seq, next_event_no";

pub(super) const TURN_COLUMNS: &str = "turn_id, session_id, seq, origin, text, client_message_id, \
     lark_chat_id, lark_message_id, state, enqueued_at, claimed_at, completed_at, claim_count, \
     current_claim_id, completion_id, response, cancel_reason";

/// A turn with its Lark reply's state, for readbacks.
pub(super) const TURN_READBACK: &str = "select t.turn_id, t.session_id, t.seq, t.origin, t.text, \
     t.client_message_id, t.lark_chat_id, t.lark_message_id, t.state, t.enqueued_at, \
     t.claimed_at, t.completed_at, t.claim_count, t.current_claim_id, t.completion_id, \
     t.response, t.cancel_reason, r.state as reply_state, r.attempts as reply_attempts, \
     r.error as reply_error from turns t left join lark_replies r on r.turn_id = t.turn_id";
