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

use sqlx::postgres::{PgArguments, PgConnection};
use sqlx::query::Query;
use sqlx::{Postgres, Row};

use super::Step;
use super::rows::text;
use crate::decide::{Change, Changed, TurnRow, Writes};
use crate::store::statement::{self, Arg, Binder, Statement};

type PgQuery<'q> = Query<'q, sqlx::Postgres, PgArguments>;

// The inserts are `insert … select`, not `values`, so that a guarded
// statement can add its `where` ([`guarded`]).
const INSERT_TURN: &str = "insert into turns (turn_id, session_id, seq, origin, text,
         client_message_id, lark_chat_id, lark_message_id, state, enqueued_at, claimed_at,
         attachments)
     select $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12";

const UPDATE_TURN: &str = "update turns set state = $1, claimed_at = $2, claim_count = $3,
         current_claim_id = $4, completed_at = $6, completion_id = $7, response = $8,
         cancel_reason = $9
     where turn_id = $5";

// The same claim id claimed on another session at this very moment: this
// insert waits for that transaction, fails if it committed, and the decision
// taken again answers claim_id_reused.
const INSERT_CLAIM: &str = "insert into claims (claim_id, session_id, turn_id, attempt, state,
         claimed_at)
     select $1, $2, $3, $4, $5, $6";

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
     select $1, $2, $3, $4, $5, $6, $7, $8";

const INSERT_REPLY: &str = "insert into lark_replies (turn_id, session_id, chat_id, message_id,
         text, state, next_attempt_at, created_at, updated_at)
     select $1, $2, $3, $4, $5, 'pending', $6, $6, $6";

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

/// One part of a turn decision's statement: its SQL, and how a guard
/// conditions it.
#[derive(Clone, Copy)]
struct Part {
    sql: &'static str,
    kind: Kind,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Insert,
    Update,
    /// The session's update, the guard itself.
    Session,
}

/// The statement for the parts present, in the order they are bound. A
/// `guarded` one has one more parameter, last: the session row's version
/// read ([`super::load::Guard::Version`]). Its session update (`g`) applies
/// only to that version, every other part only if it did, and it answers
/// how many sessions it updated (1, or 0: the row had moved on, nothing
/// written).
fn combined(parts: &[Part], guarded: bool) -> String {
    let mut after = 0;
    let numbered: Vec<(String, Kind)> = parts
        .iter()
        .map(|part| {
            let (sql, count) = renumber(part.sql, after);
            after += count;
            (sql, part.kind)
        })
        .collect();
    let version = after + 1;
    // A part may only name the parts before it: the guard comes first
    // (the parameters keep their numbers, which follow the binding order).
    let (guard, rest): (Vec<_>, Vec<_>) = numbered
        .into_iter()
        .partition(|(_, kind)| guarded && *kind == Kind::Session);
    let ctes: Vec<String> = guard
        .into_iter()
        .chain(rest)
        .enumerate()
        .map(|(i, (sql, kind))| match (guarded, kind) {
            (false, _) => format!("w{i} as ({sql})"),
            (true, Kind::Session) => {
                format!("g as ({sql} and xmin::text = ${version} returning 1)")
            }
            (true, Kind::Update) => format!("w{i} as ({sql} and exists (select 1 from g))"),
            (true, Kind::Insert) => format!("w{i} as ({sql} where exists (select 1 from g))"),
        })
        .collect();
    let answer = if guarded { "count(*) from g" } else { "1" };
    format!("with {} select {answer}", ctes.join(", "))
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
    let parts = parts(writes);
    if !parts.is_empty() {
        write_turn_decision(conn, writes, &parts, None).await?;
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

/// The parts of the statement for a decision's turn, claim, session, event
/// and reply, those it writes.
fn parts(writes: &Writes) -> Vec<Part> {
    let mut parts = Vec::new();
    let insert = |sql| Part {
        sql,
        kind: Kind::Insert,
    };
    let update = |sql| Part {
        sql,
        kind: Kind::Update,
    };
    if let Some(change) = &writes.turn {
        parts.push(match change {
            Change::Insert(_) => insert(INSERT_TURN),
            Change::Update(_) => update(UPDATE_TURN),
        });
    }
    if let Some(change) = &writes.claim {
        parts.push(match change {
            Change::Insert(_) => insert(INSERT_CLAIM),
            Change::Update(_) => update(UPDATE_CLAIM),
        });
    }
    if writes.session.is_some() {
        parts.push(Part {
            sql: UPDATE_SESSION,
            kind: Kind::Session,
        });
    }
    if writes.event.is_some() {
        parts.push(insert(INSERT_EVENT));
    }
    if writes.reply.is_some() {
        parts.push(insert(INSERT_REPLY));
    }
    parts
}

/// Applies a decision's writes outside a transaction, in ONE statement that
/// commits by itself, if the session row is still the `version` its rows
/// were read at ([`super::load::Guard::Version`]): whether they were applied.
/// Not applied (nothing written): the session row moved on since, or the
/// writes are more than one statement can hold (a step before, a Lark,
/// permission, sweep, file or download write), or none of them is the
/// session's, which the guard is; the caller takes the decision again in a
/// transaction. What they change is kept for [`take_changed`].
pub(super) async fn guarded(
    conn: &mut PgConnection,
    writes: &Writes,
    version: &str,
) -> sqlx::Result<bool> {
    let attachments = match &writes.turn {
        Some(Change::Insert(t)) => !statement::attachment_rows(t).is_empty(),
        _ => false,
    };
    let more = writes.before.is_some()
        || writes.fetch.is_some()
        || attachments
        || !statement::side_writes(writes).is_empty();
    let parts = parts(writes);
    let applied = match (more, parts.is_empty(), &writes.session) {
        (true, _, _) | (false, false, None) => false,
        (false, true, _) => true,
        (false, false, Some(_)) => write_turn_decision(conn, writes, &parts, Some(version)).await?,
    };
    if let (true, Some(changed)) = (applied, writes.changed()) {
        let _ = CHANGED.try_with(|all| all.borrow_mut().push(changed));
    }
    Ok(applied)
}

/// A turn decision's rows (turn, claim, session, event, reply), `parts` of
/// one statement, guarded by the session row's `version` if given: whether
/// they were written.
async fn write_turn_decision(
    conn: &mut PgConnection,
    writes: &Writes,
    parts: &[Part],
    version: Option<&str>,
) -> sqlx::Result<bool> {
    let sql = combined(parts, version.is_some());
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
    match version {
        None => {
            query.execute(&mut *conn).await?;
            Ok(true)
        }
        Some(version) => {
            let row = query.bind(version).fetch_one(&mut *conn).await?;
            Ok(row.try_get::<i64, _>(0)? == 1)
        }
    }
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
        let parts = [
            Part {
                sql: UPDATE_CLAIM,
                kind: Kind::Update,
            },
            Part {
                sql: "insert into x values ($1, $2, $1)",
                kind: Kind::Insert,
            },
        ];
        let sql = combined(&parts, false);
        assert!(sql.starts_with("with w0 as (update claims set state = $1, released_at = $2"));
        assert!(sql.contains("where claim_id = $3), w1 as (insert into x values ($4, $5, $4))"));
        assert!(sql.ends_with(" select 1"));
    }
}
