//! The SQLite side of the decisions ([`crate::decide`]): for each, the rows
//! it needs, read on the writer's connection inside the job's transaction (the
//! single writer is what serializes them), and the statements that apply
//! the writes it returns. It decides nothing itself.

use rusqlite::Connection;

use super::{SESSION_COLUMNS, load_session, load_turn, sql};
use crate::decide::presence::Reported;
use crate::decide::session::{BindRows, Close, CloseRows};
use crate::decide::session::{Bound, Closed};
use crate::decide::turn::{ClaimOutcome, Enqueue};
use crate::decide::turn::{ClaimRows, CompleteRows, ReleaseRows, Releaser};
use crate::decide::{self, Change, ClaimRow, Decided, NewEvent, Writes};
use crate::decide::{SessionRow, TurnRow};
use crate::error::Result;
use crate::ids::Minter;
use crate::model::HostIdentity;
use crate::model::{
    AgentState, BindRequest, CompleteRequest, EnqueueRequest, NotificationKind, Receipt, Released,
    SessionState,
};
use crate::time::now_ms;

fn load_claim(conn: &Connection, claim_id: &str) -> Result<Option<ClaimRow>> {
    sql::query_as("select * from claims where claim_id = ?")
        .bind(claim_id)
        .fetch_optional(conn)
}

/// The session's active claim, if it has one.
fn active_claim(conn: &Connection, session: Option<&SessionRow>) -> Result<Option<ClaimRow>> {
    match session.and_then(|s| s.active_claim_id.as_ref()) {
        Some(claim_id) => load_claim(conn, claim_id),
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

/// Applies a decision's writes, in their order.
fn apply(conn: &Connection, writes: Writes) -> Result<()> {
    super::lark::apply(conn, &writes)?;
    super::permissions::apply(conn, &writes)?;
    match writes.turn {
        Some(Change::Insert(t)) => {
            sql::query(
                "insert into turns (turn_id, session_id, seq, origin, text, client_message_id,
                     lark_chat_id, lark_message_id, state, enqueued_at)
                 values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&t.turn_id)
            .bind(&t.session_id)
            .bind(t.seq)
            .bind(t.origin)
            .bind(&t.text)
            .bind(&t.client_message_id)
            .bind(&t.lark_chat_id)
            .bind(&t.lark_message_id)
            .bind(t.state)
            .bind(t.enqueued_at)
            .execute(conn)?;
        }
        // A claim or a release leaves the completion's columns as they were
        // (unset: a completed turn is final), so its statement does not name
        // them: SQLite rewrites an index entry whenever a column it covers
        // is assigned, changed or not, and `completion_id` is indexed.
        Some(Change::Update(t)) => {
            let completes = t.completion_id.is_some();
            let mut update = sql::query(if completes {
                "update turns set state = ?1, claimed_at = ?2, claim_count = ?3,
                     current_claim_id = ?4, completed_at = ?6, completion_id = ?7, response = ?8
                 where turn_id = ?5"
            } else {
                "update turns set state = ?1, claimed_at = ?2, claim_count = ?3,
                     current_claim_id = ?4
                 where turn_id = ?5"
            })
            .bind(t.state)
            .bind(t.claimed_at)
            .bind(t.claim_count)
            .bind(&t.current_claim_id)
            .bind(&t.turn_id);
            if completes {
                update = update
                    .bind(t.completed_at)
                    .bind(&t.completion_id)
                    .bind(&t.response);
            }
            update.execute(conn)?;
        }
        None => {}
    }
    match writes.claim {
        Some(Change::Insert(c)) => {
            sql::query(
                "insert into claims (claim_id, session_id, turn_id, attempt, state, claimed_at)
                 values (?, ?, ?, ?, ?, ?)",
            )
            .bind(&c.claim_id)
            .bind(&c.session_id)
            .bind(&c.turn_id)
            .bind(c.attempt)
            .bind(c.state)
            .bind(c.claimed_at)
            .execute(conn)?;
        }
        Some(Change::Update(c)) => {
            sql::query("update claims set state = ?, released_at = ? where claim_id = ?")
                .bind(c.state)
                .bind(c.released_at)
                .bind(&c.claim_id)
                .execute(conn)?;
        }
        None => {}
    }
    if let Some(s) = writes.session {
        write_session(conn, &s)?;
    }
    if let Some(e) = writes.event {
        insert_event(conn, &e)?;
    }
    if let Some(r) = writes.reply {
        sql::query(
            "insert into lark_replies (turn_id, session_id, chat_id, message_id, text, state,
                 next_attempt_at, created_at, updated_at)
             values (?, ?, ?, ?, ?, 'pending', ?, ?, ?)",
        )
        .bind(&r.turn_id)
        .bind(&r.session_id)
        .bind(&r.chat_id)
        .bind(&r.message_id)
        .bind(&r.text)
        .bind(r.at)
        .bind(r.at)
        .bind(r.at)
        .execute(conn)?;
    }
    Ok(())
}

/// Writes back what a decision changes in a (locked) session row. A session
/// that is still open has only its counters and active claim changed (open
/// is never entered again once left), so that statement leaves `state` and
/// `closed_at` alone: assigning them, even unchanged, makes SQLite rewrite
/// the entries of every index whose columns or condition name them
/// (`sessions_open_tuple`, `sessions_closed`) on every write of a turn.
fn write_session(conn: &Connection, s: &SessionRow) -> Result<()> {
    let open = s.state == SessionState::Open;
    let mut update = sql::query(if open {
        "update sessions set next_seq = ?1, next_event_no = ?2, queued_count = ?3,
             active_claim_id = ?4, agent_state = ?6, agent_since = ?7, agent_heard_at = ?8,
             holder_heard_at = ?9
         where session_id = ?5"
    } else {
        "update sessions set next_seq = ?1, next_event_no = ?2, queued_count = ?3,
             active_claim_id = ?4, agent_state = ?6, agent_since = ?7, agent_heard_at = ?8,
             holder_heard_at = ?9, state = ?10, closed_at = ?11
         where session_id = ?5"
    })
    .bind(s.next_seq)
    .bind(s.next_event_no)
    .bind(s.queued_count)
    .bind(&s.active_claim_id)
    .bind(&s.session_id)
    .bind(s.agent_state)
    .bind(s.agent_since)
    .bind(s.agent_heard_at)
    .bind(s.holder_heard_at);
    if !open {
        update = update.bind(s.state).bind(s.closed_at);
    }
    update.execute(conn)?;
    Ok(())
}

fn insert_event(conn: &Connection, e: &NewEvent) -> Result<()> {
    sql::query(
        "insert into session_events
             (session_id, event_no, kind, turn_id, seq, request_id, state, at)
         values (?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&e.session_id)
    .bind(e.event_no)
    .bind(e.kind)
    .bind(&e.turn_id)
    .bind(e.seq)
    .bind(&e.request_id)
    .bind(e.state)
    .bind(e.at)
    .execute(conn)?;
    Ok(())
}

/// Applies a decision's writes and answers its answer.
pub(super) fn decided<T>(conn: &Connection, decided: Decided<T>) -> Result<T> {
    apply(conn, decided.writes)?;
    Ok(decided.answer)
}

/// The session's turn enqueued with this `client_message_id`, if any.
pub(super) fn earlier_turn(
    conn: &Connection,
    session_id: &str,
    client_message_id: &str,
) -> Result<Option<TurnRow>> {
    sql::query_as("select * from turns where session_id = ? and client_message_id = ?")
        .bind(session_id)
        .bind(client_message_id)
        .fetch_optional(conn)
}

pub(super) fn enqueue(
    conn: &Connection,
    session_id: String,
    message: EnqueueRequest,
    minter: &Minter,
) -> Result<Enqueue> {
    let session = load_session(conn, &session_id)?;
    let earlier = match (&session, &message.client_message_id) {
        (Some(_), Some(client_message_id)) => earlier_turn(conn, &session_id, client_message_id)?,
        _ => None,
    };
    let decision = decide::turn::enqueue(session, earlier, message, minter, now_ms())?;
    decided(conn, decision)
}

fn claim_rows(conn: &Connection, session_id: &str, claim_id: &str) -> Result<ClaimRows> {
    let Some(session) = load_session(conn, session_id)? else {
        return Ok(ClaimRows::default());
    };
    let earlier = load_claim(conn, claim_id)?;
    let earlier_turn = match &earlier {
        Some(claim) => load_turn(conn, session_id, &claim.turn_id)?,
        None => None,
    };
    let head = sql::query_as(
        "select * from turns where session_id = ? and state = 'queued' order by seq limit 1",
    )
    .bind(session_id)
    .fetch_optional(conn)?;
    Ok(ClaimRows {
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
    let used: Option<i64> =
        sql::query_scalar("select 1 from turns where session_id = ? and completion_id = ?")
            .bind(&session_id)
            .bind(&completion.completion_id)
            .fetch_optional(conn)?;
    let rows = CompleteRows {
        session,
        turn,
        completion_id_used: used.is_some(),
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
    let claim = load_claim(conn, &claim_id)?.filter(|c| c.session_id == session_id);
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
    state: Option<AgentState>,
    claim_id: Option<&str>,
) -> Result<Reported> {
    let session = load_session(conn, &session_id)?;
    decided(
        conn,
        decide::presence::report(session, &host, state, claim_id, now_ms())?,
    )
}

pub(super) fn lapse_agent(conn: &Connection, session_id: &str, now: i64) -> Result<Reported> {
    let session = load_session(conn, session_id)?;
    decided(conn, decide::presence::lapse(session, now)?)
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
    })
}

pub(super) fn close(
    conn: &Connection,
    session_id: String,
    release_active_claim: bool,
) -> Result<Closed> {
    let rows = close_rows(conn, &session_id)?;
    let closing = match decide::session::close(rows, release_active_claim, now_ms())? {
        Close::Replayed(closed) => return Ok(closed),
        Close::Close(closing) => closing,
    };
    // The released turn is queued again, so the cancellation below takes it.
    if let Some(released) = closing.released {
        apply(conn, *released)?;
    }
    let at = closing.event.at;
    let cancelled = sql::query(
        "insert into session_events (session_id, event_no, kind, turn_id, seq, state, at)
         select session_id, ?1 - 1 + row_number() over (order by seq), 'turn', turn_id, seq,
                ?2, ?3
         from turns where session_id = ?4 and state = 'queued'",
    )
    .bind(closing.cancelled_from)
    .bind(closing.cancelled)
    .bind(at)
    .bind(&session_id)
    .execute(conn)?
    .rows_affected();
    sql::query(
        "update turns set state = ?, cancel_reason = ? where session_id = ? and state = 'queued'",
    )
    .bind(closing.cancelled)
    .bind(closing.cancel_reason)
    .bind(&session_id)
    .execute(conn)?;
    let expired = sql::query(
        "insert into session_events (session_id, event_no, kind, request_id, state, at)
         select session_id, ?1 - 1 + row_number() over (order by created_at, request_id),
                'permission', request_id, ?2, ?3
         from permission_requests where session_id = ?4 and state = 'pending'",
    )
    .bind(closing.expired_from)
    .bind(closing.expired)
    .bind(at)
    .bind(&session_id)
    .execute(conn)?
    .rows_affected();
    sql::query(
        "update permission_requests set state = ?, answered_at = ?
         where session_id = ? and state = 'pending'",
    )
    .bind(closing.expired)
    .bind(at)
    .bind(&session_id)
    .execute(conn)?;
    write_session(conn, &closing.session)?;
    insert_event(conn, &closing.event)?;
    sql::query("delete from lark_links where session_id = ?")
        .bind(&session_id)
        .execute(conn)?;
    Ok(Closed {
        session: closing.session,
        cancelled,
        expired,
    })
}
