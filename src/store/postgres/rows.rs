//! How PostgreSQL rows become the store's rows: enumerations kept as their
//! snake_case text, messages as UTF-8 `bytea`, the column lists the
//! statements select.

use std::borrow::Cow;

use serde::de::DeserializeOwned;
use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::decide::ClaimRow;
use crate::decide::{SessionRow, TurnRow};

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

/// One stored row's columns inside a result row, under a prefix (`h_turn_id`,
/// …): a statement that loads several stored rows at once returns them side
/// by side, each under its own prefix (none for the first).
#[derive(Clone, Copy)]
pub(super) struct Cols<'r> {
    row: &'r PgRow,
    prefix: &'static str,
}

impl<'r> Cols<'r> {
    pub(super) fn new(row: &'r PgRow, prefix: &'static str) -> Self {
        Self { row, prefix }
    }

    fn name<'c>(&self, column: &'c str) -> Cow<'c, str> {
        match self.prefix {
            "" => Cow::Borrowed(column),
            prefix => Cow::Owned(format!("{prefix}{column}")),
        }
    }

    pub(super) fn get<T>(&self, column: &str) -> sqlx::Result<T>
    where
        T: for<'v> sqlx::Decode<'v, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
    {
        self.row.try_get(&*self.name(column))
    }

    /// An enumeration column.
    pub(super) fn enumeration<T: DeserializeOwned>(&self, column: &str) -> sqlx::Result<T> {
        let value: String = self.get(column)?;
        serde_json::from_value(serde_json::Value::String(value))
            .map_err(|e| decode_error(column, e))
    }

    /// A nullable enumeration column, or None when the row has no such column.
    pub(super) fn optional_enumeration<T: DeserializeOwned>(
        &self,
        column: &str,
    ) -> sqlx::Result<Option<T>> {
        match self.get::<Option<String>>(column) {
            Ok(Some(value)) => serde_json::from_value(serde_json::Value::String(value))
                .map(Some)
                .map_err(|e| decode_error(column, e)),
            Ok(None) | Err(sqlx::Error::ColumnNotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A `bytea` column that holds UTF-8 text.
    pub(super) fn utf8(&self, column: &str) -> sqlx::Result<String> {
        let bytes: Vec<u8> = self.get(column)?;
        String::from_utf8(bytes).map_err(|e| decode_error(column, e))
    }

    /// A nullable `bytea` column that holds UTF-8 text.
    pub(super) fn optional_utf8(&self, column: &str) -> sqlx::Result<Option<String>> {
        let bytes: Option<Vec<u8>> = self.get(column)?;
        bytes
            .map(|b| String::from_utf8(b).map_err(|e| decode_error(column, e)))
            .transpose()
    }

    /// A column a joined readback has and a written row has not.
    pub(super) fn joined<T>(&self, column: &str) -> sqlx::Result<Option<T>>
    where
        T: for<'v> sqlx::Decode<'v, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
    {
        match self.get::<Option<T>>(column) {
            Err(sqlx::Error::ColumnNotFound(_)) => Ok(None),
            other => other,
        }
    }

    /// Whether the (left-joined) row is there: its key column is not null.
    pub(super) fn present(&self, key: &str) -> sqlx::Result<bool> {
        Ok(self.get::<Option<String>>(key)?.is_some())
    }
}

/// An enumeration column.
pub(super) fn enumeration<T: DeserializeOwned>(row: &PgRow, column: &str) -> sqlx::Result<T> {
    Cols::new(row, "").enumeration(column)
}

/// A nullable enumeration column, or None when the row has no such column.
pub(super) fn optional_enumeration<T: DeserializeOwned>(
    row: &PgRow,
    column: &str,
) -> sqlx::Result<Option<T>> {
    Cols::new(row, "").optional_enumeration(column)
}

/// A `bytea` column that holds UTF-8 text.
pub(super) fn utf8(row: &PgRow, column: &str) -> sqlx::Result<String> {
    Cols::new(row, "").utf8(column)
}

/// A nullable `bytea` column that holds UTF-8 text.
pub(super) fn optional_utf8(row: &PgRow, column: &str) -> sqlx::Result<Option<String>> {
    Cols::new(row, "").optional_utf8(column)
}

pub(super) fn session_row(row: &PgRow) -> sqlx::Result<SessionRow> {
    session_cols(Cols::new(row, ""))
}

pub(super) fn session_cols(c: Cols<'_>) -> sqlx::Result<SessionRow> {
    Ok(SessionRow {
        session_id: c.get("session_id")?,
        goal_id: c.get("goal_id")?,
        agent_id: c.get("agent_id")?,
        host_surface: c.get("host_surface")?,
        host_session_id: c.get("host_session_id")?,
        executor_endpoint_id: c.get("executor_endpoint_id")?,
        state: c.enumeration("state")?,
        created_at: c.get("created_at")?,
        closed_at: c.get("closed_at")?,
        queued_count: c.get("queued_count")?,
        active_claim_id: c.get("active_claim_id")?,
        next_seq: c.get("next_seq")?,
        next_event_no: c.get("next_event_no")?,
        agent_state: c.enumeration("agent_state")?,
        agent_since: c.get("agent_since")?,
        agent_heard_at: c.get("agent_heard_at")?,
        holder_heard_at: c.get("holder_heard_at")?,
        waker_heard_at: c.get("waker_heard_at")?,
        agent_tool: c.get("agent_tool")?,
        tool_since: c.get("tool_since")?,
        terminal_turn_id: c.get("terminal_turn_id")?,
        stalled_at: c.get("stalled_at")?,
        terminal: c.get("terminal")?,
        continued_in: c.get("continued_in")?,
        continued_from: c.get("continued_from")?,
    })
}

pub(super) fn turn_row(row: &PgRow) -> sqlx::Result<TurnRow> {
    turn_cols(Cols::new(row, ""))
}

pub(super) fn turn_cols(c: Cols<'_>) -> sqlx::Result<TurnRow> {
    Ok(TurnRow {
        turn_id: c.get("turn_id")?,
        session_id: c.get("session_id")?,
        seq: c.get("seq")?,
        origin: c.enumeration("origin")?,
        text: c.utf8("text")?,
        client_message_id: c.get("client_message_id")?,
        lark_chat_id: c.get("lark_chat_id")?,
        lark_message_id: c.get("lark_message_id")?,
        state: c.enumeration("state")?,
        enqueued_at: c.get("enqueued_at")?,
        claimed_at: c.get("claimed_at")?,
        completed_at: c.get("completed_at")?,
        claim_count: c.get("claim_count")?,
        current_claim_id: c.get("current_claim_id")?,
        completion_id: c.get("completion_id")?,
        response: c.get("response")?,
        cancel_reason: c.optional_enumeration("cancel_reason")?,
        attachments: c.get("attachments")?,
        reply_state: c.optional_enumeration("reply_state")?,
        reply_attempts: c.joined("reply_attempts")?,
        reply_error: c.joined("reply_error")?,
    })
}

/// A left-joined turn: None when the join found none.
pub(super) fn optional_turn(c: Cols<'_>) -> sqlx::Result<Option<TurnRow>> {
    c.present("turn_id")?.then(|| turn_cols(c)).transpose()
}

pub(super) fn claim_cols(c: Cols<'_>) -> sqlx::Result<ClaimRow> {
    Ok(ClaimRow {
        claim_id: c.get("claim_id")?,
        session_id: c.get("session_id")?,
        turn_id: c.get("turn_id")?,
        attempt: c.get("attempt")?,
        state: c.enumeration("state")?,
        claimed_at: c.get("claimed_at")?,
        released_at: c.get("released_at")?,
    })
}

/// A left-joined claim: None when the join found none.
pub(super) fn optional_claim(c: Cols<'_>) -> sqlx::Result<Option<ClaimRow>> {
    c.present("claim_id")?.then(|| claim_cols(c)).transpose()
}

/// `alias.column as prefixcolumn, …` for each of `columns` (a column list
/// below): a stored row's columns in a wider select, read back with [`Cols`].
pub(super) fn select_as(alias: &str, columns: &str, prefix: &str) -> String {
    columns
        .split(',')
        .map(str::trim)
        .map(|column| format!("{alias}.{column} as {prefix}{column}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) use crate::store::SESSION_COLUMNS;
pub(super) use crate::store::reads::unstorable;

pub(super) const CLAIM_COLUMNS: &str =
    "claim_id, session_id, turn_id, attempt, state, claimed_at, released_at";

pub(super) const TURN_COLUMNS: &str = "turn_id, session_id, seq, origin, text, client_message_id, \
     lark_chat_id, lark_message_id, state, enqueued_at, claimed_at, completed_at, claim_count, \
     current_claim_id, completion_id, response, cancel_reason, attachments";

/// A turn with its Lark reply's state, for readbacks.
pub(super) const TURN_READBACK: &str = turn_readback!();
