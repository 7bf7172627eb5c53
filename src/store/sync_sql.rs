//! A small synchronous query builder over `rusqlite` for the SQLite writer
//! thread, shaped like sqlx's (`query(sql).bind(v).execute(conn)`), so the
//! writer's transaction code reads like the rest of the store. Statements are
//! prepared once and cached on the connection. The writer runs every
//! statement of a batch on its own thread: no hop between threads per
//! statement, which is what made group commit pay.

use std::marker::PhantomData;

use rusqlite::types::{FromSql, Value};
use rusqlite::{Connection, OptionalExtension, Row, params_from_iter};

use crate::decide::lark::LinkRow;
use crate::decide::pairing::{ChatRow, PairCodeRow};
use crate::decide::{ClaimRow, ClaimState};
use crate::decide::{SessionRow, TurnRow};
use crate::error::Result;
use crate::model::{
    AgentState, AnsweredVia, CancelReason, Origin, PermissionState, ReplyState, SessionState,
    TurnState,
};
use crate::permission::PermissionRow;
use crate::store::statement::{Arg, Binder, Statement};

/// A value a statement can bind.
pub trait Bind {
    fn value(self) -> Value;
}

impl Bind for &str {
    fn value(self) -> Value {
        Value::Text(self.to_owned())
    }
}
impl Bind for String {
    fn value(self) -> Value {
        Value::Text(self)
    }
}
impl Bind for &String {
    fn value(self) -> Value {
        Value::Text(self.clone())
    }
}
impl Bind for i64 {
    fn value(self) -> Value {
        Value::Integer(self)
    }
}
impl Bind for bytes::Bytes {
    fn value(self) -> Value {
        Value::Blob(self.to_vec())
    }
}
impl Bind for u32 {
    fn value(self) -> Value {
        Value::Integer(i64::from(self))
    }
}
impl<T: Bind> Bind for Option<T> {
    fn value(self) -> Value {
        self.map_or(Value::Null, Bind::value)
    }
}
impl<T: Bind + Clone> Bind for &Option<T> {
    fn value(self) -> Value {
        self.clone().value()
    }
}

impl Bind for &Arg {
    fn value(self) -> Value {
        match self {
            Arg::Int(v) => v.map_or(Value::Null, Value::Integer),
            Arg::Text(v) | Arg::Body(v) => v.clone().map_or(Value::Null, Value::Text),
            Arg::Bytes(b) => Value::Blob(b.to_vec()),
        }
    }
}

/// Runs a statement both stores share: the rows it changed.
pub fn execute(statement: &Statement, conn: &Connection) -> Result<u64> {
    let query = statement
        .args
        .iter()
        .fold(query(statement.sql), Query::bind);
    Ok(query.execute(conn)?.rows_affected())
}

/// The contract's enums are stored as their snake_case wire names.
macro_rules! text_enum {
    ($($t:ty),*) => {$(
        impl Bind for $t {
            fn value(self) -> Value {
                Value::Text(crate::model::wire(&self))
            }
        }
        impl FromSql for $t {
            fn column_result(v: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
                let text = v.as_str()?;
                serde_json::from_value(serde_json::Value::String(text.to_owned()))
                    .map_err(|e| rusqlite::types::FromSqlError::Other(Box::new(e)))
            }
        }
    )*};
}
text_enum!(
    Origin,
    SessionState,
    TurnState,
    CancelReason,
    ReplyState,
    PermissionState,
    AnsweredVia,
    ClaimState,
    AgentState
);

/// A row type the writer reads.
pub trait FromRow: Sized {
    fn from_row(row: &Row<'_>) -> rusqlite::Result<Self>;
}

// Rows are read by position, in the order the statements select them
// (`SESSION_COLUMNS`; a turn's columns in table order, as `select *`,
// `t.*` and `returning *` give them): looking a column up by name costs a
// scan of the statement's column names per field. A migration that adds a
// column appends it, so these positions hold.

impl FromRow for SessionRow {
    fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(SessionRow {
            session_id: r.get(0)?,
            goal_id: r.get(1)?,
            agent_id: r.get(2)?,
            host_surface: r.get(3)?,
            host_session_id: r.get(4)?,
            executor_endpoint_id: r.get(5)?,
            state: r.get(6)?,
            created_at: r.get(7)?,
            closed_at: r.get(8)?,
            queued_count: r.get(9)?,
            active_claim_id: r.get(10)?,
            next_seq: r.get(11)?,
            next_event_no: r.get(12)?,
            agent_state: r.get(13)?,
            agent_since: r.get(14)?,
            agent_heard_at: r.get(15)?,
            holder_heard_at: r.get(16)?,
            waker_heard_at: r.get(17)?,
            agent_tool: r.get(18)?,
            tool_since: r.get(19)?,
            terminal_turn_id: r.get(20)?,
            stalled_at: r.get(21)?,
            terminal: r.get(22)?,
            continued_in: r.get(23)?,
            continued_from: r.get(24)?,
        })
    }
}

/// How many columns the `turns` table has.
const TURN_COLUMNS: usize = 18;

impl FromRow for TurnRow {
    fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        // The reply's left join, when selected, follows the turn's columns.
        let joined = r.as_ref().column_count() > TURN_COLUMNS;
        Ok(TurnRow {
            turn_id: r.get(0)?,
            session_id: r.get(1)?,
            seq: r.get(2)?,
            origin: r.get(3)?,
            text: r.get(4)?,
            client_message_id: r.get(5)?,
            lark_chat_id: r.get(6)?,
            lark_message_id: r.get(7)?,
            state: r.get(8)?,
            enqueued_at: r.get(9)?,
            claimed_at: r.get(10)?,
            completed_at: r.get(11)?,
            claim_count: r.get(12)?,
            current_claim_id: r.get(13)?,
            completion_id: r.get(14)?,
            response: r.get(15)?,
            cancel_reason: r.get(16)?,
            attachments: r.get(17)?,
            reply_state: if joined { r.get(TURN_COLUMNS)? } else { None },
            reply_attempts: if joined {
                r.get(TURN_COLUMNS + 1)?
            } else {
                None
            },
            reply_error: if joined {
                r.get(TURN_COLUMNS + 2)?
            } else {
                None
            },
        })
    }
}

/// In the order of `PERMISSION_COLUMNS` (the store's).
impl FromRow for PermissionRow {
    fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(PermissionRow {
            session_id: r.get(0)?,
            request_id: r.get(1)?,
            tool_name: r.get(2)?,
            description: r.get(3)?,
            input_preview: r.get(4)?,
            state: r.get(5)?,
            created_at: r.get(6)?,
            answered_at: r.get(7)?,
            answered_via: r.get(8)?,
            relayed_at: r.get(9)?,
            detail: r.get(10)?,
            answer: r.get(11)?,
        })
    }
}

/// In the `claims` table's column order (`select *`).
impl FromRow for ClaimRow {
    fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(ClaimRow {
            claim_id: r.get(0)?,
            session_id: r.get(1)?,
            turn_id: r.get(2)?,
            attempt: r.get(3)?,
            state: r.get(4)?,
            claimed_at: r.get(5)?,
            released_at: r.get(6)?,
        })
    }
}

impl FromRow for PairCodeRow {
    fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(PairCodeRow {
            code_hash: r.get(0)?,
            session_id: r.get(1)?,
            expires_at: r.get(2)?,
            used_at: r.get(3)?,
        })
    }
}

impl FromRow for ChatRow {
    fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(ChatRow {
            chat_id: r.get(0)?,
            failed_codes: r.get(1)?,
            failed_since: r.get(2)?,
            current_session_id: r.get(3)?,
        })
    }
}

impl FromRow for LinkRow {
    fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(LinkRow {
            chat_id: r.get(0)?,
            approvers: r.get(1)?,
            linked_at: r.get(2)?,
            terminal_turns: r.get::<_, i64>(3)? == 1,
        })
    }
}

/// Two columns, in order.
impl<A: FromSql, B: FromSql> FromRow for (A, B) {
    fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok((r.get(0)?, r.get(1)?))
    }
}

/// What an executed statement changed.
pub struct Done(usize);

impl Done {
    pub fn rows_affected(&self) -> u64 {
        self.0 as u64
    }
}

/// A statement and its parameters; `T` is what a row maps to.
pub struct Query<'q, T> {
    sql: &'q str,
    params: Vec<Value>,
    row: PhantomData<T>,
}

pub fn query(sql: &str) -> Query<'_, ()> {
    query_as(sql)
}

pub fn query_as<T>(sql: &str) -> Query<'_, T> {
    Query {
        sql,
        params: Vec::new(),
        row: PhantomData,
    }
}

pub fn query_scalar<T>(sql: &str) -> ScalarQuery<'_, T> {
    ScalarQuery(query_as(sql))
}

/// The first column of a row.
struct Scalar<T>(T);

impl<T: FromSql> FromRow for Scalar<T> {
    fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
        row.get(0).map(Scalar)
    }
}

impl<'a, T> Binder<'a> for Query<'_, T> {
    fn int(self, v: Option<i64>) -> Self {
        self.bind(v)
    }
    fn text(self, v: Option<&'a str>) -> Self {
        self.bind(v)
    }
    fn body(self, v: &'a str) -> Self {
        self.bind(v)
    }
    fn word(self, v: &impl serde::Serialize) -> Self {
        self.bind(crate::model::wire(v))
    }
}

impl<T> Query<'_, T> {
    pub fn bind(mut self, value: impl Bind) -> Self {
        self.params.push(value.value());
        self
    }

    pub fn execute(self, conn: &Connection) -> Result<Done> {
        let mut statement = conn.prepare_cached(self.sql)?;
        Ok(Done(statement.execute(params_from_iter(self.params))?))
    }
}

impl<T: FromRow> Query<'_, T> {
    pub fn fetch_optional(self, conn: &Connection) -> Result<Option<T>> {
        let mut statement = conn.prepare_cached(self.sql)?;
        Ok(statement
            .query_row(params_from_iter(self.params), T::from_row)
            .optional()?)
    }

    pub fn fetch_one(self, conn: &Connection) -> Result<T> {
        let mut statement = conn.prepare_cached(self.sql)?;
        Ok(statement.query_row(params_from_iter(self.params), T::from_row)?)
    }

    pub fn fetch_all(self, conn: &Connection) -> Result<Vec<T>> {
        let mut statement = conn.prepare_cached(self.sql)?;
        let rows = statement.query_map(params_from_iter(self.params), T::from_row)?;
        Ok(rows.collect::<rusqlite::Result<Vec<T>>>()?)
    }
}

/// A statement whose answer is its first column.
pub struct ScalarQuery<'q, T>(Query<'q, Scalar<T>>);

impl<T: FromSql> ScalarQuery<'_, T> {
    pub fn bind(self, value: impl Bind) -> Self {
        Self(self.0.bind(value))
    }

    pub fn fetch_optional(self, conn: &Connection) -> Result<Option<T>> {
        Ok(self.0.fetch_optional(conn)?.map(|s| s.0))
    }

    pub fn fetch_one(self, conn: &Connection) -> Result<T> {
        Ok(self.0.fetch_one(conn)?.0)
    }
}
