//! A decision's [`Writes`] in ONE statement: each part present (the turn,
//! the claim, the session, the event, the reply) is one data-modifying CTE of
//! `with … select 1`, so a turn decision costs one round trip to write
//! however many rows it changes (the rarer Lark, permission, sweep, file and
//! download writes are the statements both stores share,
//! [`crate::store::statement`], run before and after it). The statement's
//! text depends only on which parts are
//! present (a handful of shapes), so each connection prepares each shape once
//! and sqlx's statement cache reuses it. It decides nothing; the caller holds
//! the session's row lock and announces the change after its commit.
//!
//! The parts run as one statement: they see the same snapshot (none reads
//! another's rows) and fail together (a unique violation anywhere rolls the
//! whole decision back, and the caller takes it again).

use sqlx::Postgres;
use sqlx::postgres::{PgArguments, PgConnection};
use sqlx::query::Query;

use super::Step;
use super::rows::text;
use crate::decide::{Change, Changed, TurnRow, Writes};
use crate::store::statement::{self, Arg, Binder, Statement};

type PgQuery<'q> = Query<'q, sqlx::Postgres, PgArguments>;

const INSERT_TURN: &str = "insert into turns (turn_id, session_id, seq, origin, text,
         client_message_id, lark_chat_id, lark_message_id, state, enqueued_at, claimed_at,
         attachments)
     values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)";

const UPDATE_TURN: &str = "update turns set state = $1, claimed_at = $2, claim_count = $3,
         current_claim_id = $4, completed_at = $6, completion_id = $7, response = $8,
         cancel_reason = $9
     where turn_id = $5";

// The same claim id claimed on another session at this very moment: this
// insert waits for that transaction, fails if it committed, and the decision
// taken again answers claim_id_reused.
const INSERT_CLAIM: &str = "insert into claims (claim_id, session_id, turn_id, attempt, state,
         claimed_at)
     values ($1, $2, $3, $4, $5, $6)";

const UPDATE_CLAIM: &str = "update claims set state = $1, released_at = $2 where claim_id = $3";

/// What a decision changes in a (locked) session row.
const UPDATE_SESSION: &str = "update sessions set next_seq = $1, next_event_no = $2,
         queued_count = $3, active_claim_id = $4, agent_state = $6, agent_since = $7,
         agent_heard_at = $8, holder_heard_at = $9, waker_heard_at = $10, agent_tool = $11,
         tool_since = $12, terminal_turn_id = $13, stalled_at = $14, state = $15,
         closed_at = $16
     where session_id = $5";

const INSERT_EVENT: &str = "insert into session_events
         (session_id, event_no, kind, turn_id, seq, request_id, state, at)
     values ($1, $2, $3, $4, $5, $6, $7, $8)";

const INSERT_REPLY: &str = "insert into lark_replies (turn_id, session_id, chat_id, message_id,
         text, state, next_attempt_at, created_at, updated_at)
     values ($1, $2, $3, $4, $5, 'pending', $6, $6, $6)";

/// `template` with its parameters `$1…` numbered from `after + 1`, and how
/// many it has.
fn renumber(template: &str, after: usize) -> (String, usize) {
    let mut out = String::with_capacity(template.len() + 16);
    let mut count = 0;
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..=at]);
        rest = &rest[at + 1..];
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let n: usize = rest[..digits].parse().expect("a numbered parameter");
        count = count.max(n);
        out.push_str(&(n + after).to_string());
        rest = &rest[digits..];
    }
    out.push_str(rest);
    (out, count)
}

/// The statement for the parts present, in the order they are bound.
fn combined(parts: &[&str]) -> String {
    let mut after = 0;
    let ctes: Vec<String> = parts
        .iter()
        .enumerate()
        .map(|(i, part)| {
            let (sql, count) = renumber(part, after);
            after += count;
            format!("w{i} as ({sql})")
        })
        .collect();
    format!("with {} select 1", ctes.join(", "))
}

impl<'a> Binder<'a> for PgQuery<'a> {
    fn int(self, v: Option<i64>) -> Self {
        self.bind(v)
    }
    fn text(self, v: Option<&'a str>) -> Self {
        self.bind(v)
    }
    fn body(self, v: &'a str) -> Self {
        self.bind(v.as_bytes())
    }
    fn word(self, v: &impl serde::Serialize) -> Self {
        self.bind(text(v))
    }
}

/// A turn's values: a new one's, or an update's, all 9 of them (the
/// statement sets every column a decision may change).
fn turn_values<'q>(query: PgQuery<'q>, change: &'q Change<TurnRow>) -> PgQuery<'q> {
    match change {
        Change::Insert(t) => statement::turn_values(query, t),
        Change::Update(t) => statement::turn_update_values(query, t)
            .int(t.completed_at)
            .text(t.completion_id.as_deref())
            .text(t.response.as_deref())
            .bind(t.cancel_reason.as_ref().map(text)),
    }
}

/// Applies a decision's writes in the caller's transaction: a Lark event
/// guard, a link change and a permission request with its message in their
/// own statements first (none of them is part of a turn decision), then the
/// turn, claim, session, event and reply in one statement (nothing to write:
/// no statement).
pub(super) async fn apply(conn: &mut PgConnection, writes: &Writes) -> Step<()> {
    // The steps taken before, first (a step may have one of its own).
    let mut steps = vec![writes];
    while let Some(before) = steps.last().and_then(|step| step.before.as_deref()) {
        steps.push(before);
    }
    for step in steps.into_iter().rev() {
        apply_step(conn, step).await?;
    }
    Ok(())
}

/// One step's writes (not the step taken before it).
async fn apply_step(conn: &mut PgConnection, writes: &Writes) -> Step<()> {
    for side in statement::side_writes(writes) {
        execute(conn, &side).await?;
    }
    let mut parts = Vec::new();
    if let Some(change) = &writes.turn {
        parts.push(match change {
            Change::Insert(_) => INSERT_TURN,
            Change::Update(_) => UPDATE_TURN,
        });
    }
    if let Some(change) = &writes.claim {
        parts.push(match change {
            Change::Insert(_) => INSERT_CLAIM,
            Change::Update(_) => UPDATE_CLAIM,
        });
    }
    if writes.session.is_some() {
        parts.push(UPDATE_SESSION);
    }
    if writes.event.is_some() {
        parts.push(INSERT_EVENT);
    }
    if writes.reply.is_some() {
        parts.push(INSERT_REPLY);
    }
    if !parts.is_empty() {
        write_turn_decision(conn, writes, &parts).await?;
    }
    let mut after = Vec::new();
    if let Some(Change::Insert(t)) = &writes.turn {
        after.extend(statement::attachment_rows(t));
    }
    if let Some(fetch) = &writes.fetch {
        after.extend(statement::fetch_writes(fetch));
    }
    for write in after {
        execute(conn, &write).await?;
    }
    Ok(())
}

/// A turn decision's rows (turn, claim, session, event, reply), `parts` of
/// one statement.
async fn write_turn_decision(
    conn: &mut PgConnection,
    writes: &Writes,
    parts: &[&str],
) -> sqlx::Result<()> {
    let sql = combined(parts);
    let mut query = sqlx::query(&sql);
    if let Some(change) = &writes.turn {
        query = turn_values(query, change);
    }
    if let Some(change) = &writes.claim {
        query = statement::claim_values(query, change);
    }
    if let Some(s) = &writes.session {
        query = statement::session_values(query, s)
            .word(&s.state)
            .int(s.closed_at);
    }
    if let Some(e) = &writes.event {
        query = statement::event_values(query, e);
    }
    if let Some(r) = &writes.reply {
        query = statement::reply_values(query, r);
    }
    query.execute(&mut *conn).await?;
    Ok(())
}

/// Runs a statement both stores share: the rows it changed.
pub(super) async fn execute(conn: &mut PgConnection, statement: &Statement) -> sqlx::Result<u64> {
    Ok(bound(statement).execute(conn).await?.rows_affected())
}

/// A neutral statement with its values bound, a person's text as bytes.
pub(super) fn bound(statement: &Statement) -> Query<'_, Postgres, PgArguments> {
    let mut query = sqlx::query(statement.sql);
    for arg in &statement.args {
        query = match arg {
            Arg::Int(v) => query.bind(*v),
            Arg::Text(v) => query.bind(v.as_deref()),
            Arg::Body(v) => query.bind(v.as_ref().map(String::as_bytes)),
            Arg::Bytes(b) => query.bind(b.as_ref()),
        };
    }
    query
}

/// Applies a decision's writes; what they change is kept for
/// [`take_changed`].
pub(super) async fn applied(conn: &mut PgConnection, writes: &Writes) -> Step<()> {
    apply(conn, writes).await?;
    if let Some(changed) = writes.changed() {
        let _ = CHANGED.try_with(|all| all.borrow_mut().push(changed));
    }
    Ok(())
}

tokio::task_local! {
    /// What the decisions applied in this store call's transaction changed
    /// (`transaction!` scopes it, and publishes it once committed).
    pub(crate) static CHANGED: std::cell::RefCell<Vec<Changed>>;
}

/// What the decisions applied in this store call changed since the last call.
pub(crate) fn take_changed() -> Vec<Changed> {
    CHANGED.try_with(|all| all.take()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_part_numbers_its_parameters_after_the_ones_before() {
        let sql = combined(&[UPDATE_CLAIM, "insert into x values ($1, $2, $1)"]);
        assert!(sql.starts_with("with w0 as (update claims set state = $1, released_at = $2"));
        assert!(sql.contains("where claim_id = $3), w1 as (insert into x values ($4, $5, $4))"));
        assert!(sql.ends_with(" select 1"));
    }
}
