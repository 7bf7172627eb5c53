//! The PostgreSQL side of the decisions ([`crate::decide`]): for each, the
//! rows it needs, read after locking the session's row (the per-session
//! serialization point across replicas), and the statements that apply the
//! writes it returns, in the caller's transaction. It decides nothing itself.

use sqlx::Row;
use sqlx::postgres::{PgConnection, PgRow};

use super::rows::{
    SESSION_COLUMNS, TURN_COLUMNS, enumeration, session_row, text, turn_row, unstorable,
};
use super::{Step, load_turn, lock_session};
use crate::decide::session::{BindRows, Close, CloseRows};
use crate::decide::turn::{ClaimRows, CompleteRows, ReleaseRows};
use crate::decide::{self, Change, ClaimRow, Decided, NewEvent, Writes};
use crate::ids::Minter;
use crate::model::{BindRequest, CompleteRequest, EnqueueRequest, Receipt, Released};
use crate::store::{Bound, ClaimOutcome, Closed, Enqueue, HostIdentity, SessionRow, TurnRow};
use crate::time::now_ms;

pub(super) fn claim_row(row: PgRow) -> sqlx::Result<ClaimRow> {
    Ok(ClaimRow {
        claim_id: row.try_get("claim_id")?,
        session_id: row.try_get("session_id")?,
        turn_id: row.try_get("turn_id")?,
        attempt: row.try_get("attempt")?,
        state: enumeration(&row, "state")?,
        claimed_at: row.try_get("claimed_at")?,
        released_at: row.try_get("released_at")?,
    })
}

pub(super) async fn load_claim(
    conn: &mut PgConnection,
    claim_id: &str,
) -> sqlx::Result<Option<ClaimRow>> {
    if unstorable(claim_id) {
        return Ok(None);
    }
    sqlx::query(
        "select claim_id, session_id, turn_id, attempt, state, claimed_at, released_at
         from claims where claim_id = $1",
    )
    .bind(claim_id)
    .fetch_optional(conn)
    .await?
    .map(claim_row)
    .transpose()
}

/// The (locked) session's active claim, if it has one.
pub(super) async fn active_claim(
    conn: &mut PgConnection,
    session: Option<&SessionRow>,
) -> sqlx::Result<Option<ClaimRow>> {
    match session.and_then(|s| s.active_claim_id.as_ref()) {
        Some(claim_id) => load_claim(conn, claim_id).await,
        None => Ok(None),
    }
}

pub(super) async fn bind_rows(
    conn: &mut PgConnection,
    bind: &BindRequest,
) -> sqlx::Result<BindRows> {
    let registered: Option<i32> = sqlx::query_scalar(
        "select 1 from agent_threads
         where goal_id = $1 and agent_id = $2 and host_surface = $3 and host_session_id = $4",
    )
    .bind(&bind.goal_id)
    .bind(&bind.agent_id)
    .bind(&bind.host_surface)
    .bind(&bind.host_session_id)
    .fetch_optional(&mut *conn)
    .await?;
    let sql = format!(
        "select {SESSION_COLUMNS} from sessions
         where goal_id = $1 and agent_id = $2 and host_surface = $3 and host_session_id = $4
           and state = 'open'"
    );
    let open = sqlx::query(&sql)
        .bind(&bind.goal_id)
        .bind(&bind.agent_id)
        .bind(&bind.host_surface)
        .bind(&bind.host_session_id)
        .fetch_optional(&mut *conn)
        .await?
        .map(session_row)
        .transpose()?;
    Ok(BindRows {
        registered: registered.is_some(),
        open,
    })
}

pub(super) async fn bind(
    conn: &mut PgConnection,
    request: &BindRequest,
    minter: &Minter,
) -> Step<Bound> {
    let rows = bind_rows(conn, request).await?;
    let bound = decide::session::bind(rows, request.clone(), minter, now_ms())?;
    if let Bound::Created(s) = &bound {
        // Two replicas binding the same tuple at once: the second insert fails
        // on sessions_open_tuple, and the decision taken again answers the
        // first's session.
        sqlx::query(
            "insert into sessions (session_id, goal_id, agent_id, host_surface, host_session_id,
                 executor_endpoint_id, state, created_at, next_seq, next_event_no)
             values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(&s.session_id)
        .bind(&s.goal_id)
        .bind(&s.agent_id)
        .bind(&s.host_surface)
        .bind(&s.host_session_id)
        .bind(&s.executor_endpoint_id)
        .bind(text(&s.state))
        .bind(s.created_at)
        .bind(s.next_seq)
        .bind(s.next_event_no)
        .execute(conn)
        .await?;
    }
    Ok(bound)
}

/// Applies a decision's writes, in their order, in the caller's transaction.
/// The caller announces the change once its transaction has committed
/// ([`Announcer`]).
pub(super) async fn apply(conn: &mut PgConnection, writes: Writes) -> Step<()> {
    super::lark::apply(conn, &writes).await?;
    super::permissions::apply(conn, &writes).await?;
    match writes.turn {
        Some(Change::Insert(t)) => {
            sqlx::query(
                "insert into turns (turn_id, session_id, seq, origin, text, client_message_id,
                     lark_chat_id, lark_message_id, state, enqueued_at)
                 values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            )
            .bind(&t.turn_id)
            .bind(&t.session_id)
            .bind(t.seq)
            .bind(text(&t.origin))
            .bind(t.text.as_bytes())
            .bind(&t.client_message_id)
            .bind(&t.lark_chat_id)
            .bind(&t.lark_message_id)
            .bind(text(&t.state))
            .bind(t.enqueued_at)
            .execute(&mut *conn)
            .await?;
        }
        Some(Change::Update(t)) => {
            sqlx::query(
                "update turns set state = $1, claimed_at = $2, completed_at = $3,
                     claim_count = $4, current_claim_id = $5, completion_id = $6, response = $7
                 where turn_id = $8",
            )
            .bind(text(&t.state))
            .bind(t.claimed_at)
            .bind(t.completed_at)
            .bind(t.claim_count)
            .bind(&t.current_claim_id)
            .bind(&t.completion_id)
            .bind(&t.response)
            .bind(&t.turn_id)
            .execute(&mut *conn)
            .await?;
        }
        None => {}
    }
    match writes.claim {
        // The same claim id claimed on another session at this very moment:
        // this insert waits for that transaction, fails if it committed, and
        // the decision taken again answers claim_id_reused.
        Some(Change::Insert(c)) => {
            sqlx::query(
                "insert into claims (claim_id, session_id, turn_id, attempt, state, claimed_at)
                 values ($1, $2, $3, $4, $5, $6)",
            )
            .bind(&c.claim_id)
            .bind(&c.session_id)
            .bind(&c.turn_id)
            .bind(c.attempt)
            .bind(text(&c.state))
            .bind(c.claimed_at)
            .execute(&mut *conn)
            .await?;
        }
        Some(Change::Update(c)) => {
            sqlx::query("update claims set state = $1, released_at = $2 where claim_id = $3")
                .bind(text(&c.state))
                .bind(c.released_at)
                .bind(&c.claim_id)
                .execute(&mut *conn)
                .await?;
        }
        None => {}
    }
    if let Some(s) = writes.session {
        write_session(conn, &s).await?;
    }
    if let Some(e) = writes.event {
        insert_event(conn, &e).await?;
    }
    if let Some(r) = writes.reply {
        sqlx::query(
            "insert into lark_replies (turn_id, session_id, chat_id, message_id, text, state,
                 next_attempt_at, created_at, updated_at)
             values ($1, $2, $3, $4, $5, 'pending', $6, $6, $6)",
        )
        .bind(&r.turn_id)
        .bind(&r.session_id)
        .bind(&r.chat_id)
        .bind(&r.message_id)
        .bind(r.text.as_bytes())
        .bind(r.at)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Writes back what a decision changes in a (locked) session row.
pub(super) async fn write_session(conn: &mut PgConnection, s: &SessionRow) -> sqlx::Result<()> {
    sqlx::query(
        "update sessions set state = $1, closed_at = $2, next_seq = $3, next_event_no = $4,
             queued_count = $5, active_claim_id = $6
         where session_id = $7",
    )
    .bind(text(&s.state))
    .bind(s.closed_at)
    .bind(s.next_seq)
    .bind(s.next_event_no)
    .bind(s.queued_count)
    .bind(&s.active_claim_id)
    .bind(&s.session_id)
    .execute(conn)
    .await?;
    Ok(())
}

pub(super) async fn insert_event(conn: &mut PgConnection, e: &NewEvent) -> sqlx::Result<()> {
    sqlx::query(
        "insert into session_events
             (session_id, event_no, kind, turn_id, seq, request_id, state, at)
         values ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(&e.session_id)
    .bind(e.event_no)
    .bind(e.kind)
    .bind(&e.turn_id)
    .bind(e.seq)
    .bind(&e.request_id)
    .bind(e.state)
    .bind(e.at)
    .execute(conn)
    .await?;
    Ok(())
}

/// Applies a decision's writes and answers its answer.
pub(super) async fn decided<T>(conn: &mut PgConnection, decided: Decided<T>) -> Step<T> {
    apply(conn, decided.writes).await?;
    Ok(decided.answer)
}

/// The session's turn enqueued with this `client_message_id`, if any.
pub(super) async fn earlier_turn(
    conn: &mut PgConnection,
    session_id: &str,
    client_message_id: &str,
) -> sqlx::Result<Option<TurnRow>> {
    sqlx::query(&format!(
        "select {TURN_COLUMNS} from turns where session_id = $1 and client_message_id = $2"
    ))
    .bind(session_id)
    .bind(client_message_id)
    .fetch_optional(conn)
    .await?
    .map(turn_row)
    .transpose()
}

pub(super) async fn enqueue(
    conn: &mut PgConnection,
    session_id: &str,
    message: &EnqueueRequest,
    minter: &Minter,
) -> Step<Enqueue> {
    let session = lock_session(conn, session_id).await?;
    let earlier = match (&session, &message.client_message_id) {
        (Some(_), Some(client_message_id)) => {
            earlier_turn(conn, session_id, client_message_id).await?
        }
        _ => None,
    };
    let decision = decide::turn::enqueue(session, earlier, message.clone(), minter, now_ms())?;
    decided(conn, decision).await
}

pub(super) async fn claim_rows(
    conn: &mut PgConnection,
    session_id: &str,
    claim_id: &str,
) -> sqlx::Result<ClaimRows> {
    let Some(session) = lock_session(conn, session_id).await? else {
        return Ok(ClaimRows::default());
    };
    let earlier = load_claim(conn, claim_id).await?;
    let earlier_turn = match &earlier {
        Some(claim) => load_turn(&mut *conn, session_id, &claim.turn_id).await?,
        None => None,
    };
    let head = sqlx::query(&format!(
        "select {TURN_COLUMNS} from turns where session_id = $1 and state = 'queued'
         order by seq limit 1"
    ))
    .bind(session_id)
    .fetch_optional(&mut *conn)
    .await?
    .map(turn_row)
    .transpose()?;
    Ok(ClaimRows {
        active: active_claim(conn, Some(&session)).await?,
        session: Some(session),
        earlier,
        earlier_turn,
        head,
    })
}

pub(super) async fn claim(
    conn: &mut PgConnection,
    session_id: &str,
    host: &HostIdentity,
    claim_id: &str,
) -> Step<ClaimOutcome> {
    let rows = claim_rows(conn, session_id, claim_id).await?;
    let decision = decide::turn::claim(rows, host, claim_id, now_ms())?;
    decided(conn, decision).await
}

pub(super) async fn complete(
    conn: &mut PgConnection,
    session_id: &str,
    turn_id: &str,
    completion: &CompleteRequest,
) -> Step<Receipt> {
    let session = lock_session(conn, session_id).await?;
    let turn = load_turn(&mut *conn, session_id, turn_id).await?;
    let used: Option<i32> =
        sqlx::query_scalar("select 1 from turns where session_id = $1 and completion_id = $2")
            .bind(session_id)
            .bind(&completion.completion_id)
            .fetch_optional(&mut *conn)
            .await?;
    let rows = CompleteRows {
        session,
        turn,
        completion_id_used: used.is_some(),
    };
    let decision = decide::turn::complete(rows, completion.clone(), now_ms())?;
    decided(conn, decision).await
}

pub(super) async fn release(
    conn: &mut PgConnection,
    session_id: &str,
    claim_id: &str,
    host: &HostIdentity,
) -> Step<Released> {
    let session = lock_session(conn, session_id).await?;
    let claim = load_claim(conn, claim_id)
        .await?
        .filter(|c| c.session_id == session_id);
    let turn = match &claim {
        Some(claim) => load_turn(&mut *conn, session_id, &claim.turn_id).await?,
        None => None,
    };
    let rows = ReleaseRows {
        session,
        claim,
        turn,
    };
    let decision = decide::turn::release(rows, host, now_ms())?;
    decided(conn, decision).await
}

pub(super) async fn close_rows(
    conn: &mut PgConnection,
    session_id: &str,
) -> sqlx::Result<CloseRows> {
    let Some(session) = lock_session(conn, session_id).await? else {
        return Ok(CloseRows::default());
    };
    let (queued, pending): (i64, i64) = sqlx::query_as(
        "select (select count(*) from turns where session_id = $1 and state = 'queued'),
                (select count(*) from permission_requests
                 where session_id = $1 and state = 'pending')",
    )
    .bind(session_id)
    .fetch_one(&mut *conn)
    .await?;
    Ok(CloseRows {
        active: active_claim(conn, Some(&session)).await?,
        session: Some(session),
        queued,
        pending,
    })
}

pub(super) async fn close(conn: &mut PgConnection, session_id: &str) -> Step<Closed> {
    let rows = close_rows(conn, session_id).await?;
    let closing = match decide::session::close(rows, now_ms())? {
        Close::Replayed(closed) => return Ok(closed),
        Close::Close(closing) => closing,
    };
    let at = closing.event.at;
    let cancelled = sqlx::query(
        "insert into session_events (session_id, event_no, kind, turn_id, seq, state, at)
         select session_id, $1 - 1 + row_number() over (order by seq), 'turn', turn_id, seq,
                $2, $3
         from turns where session_id = $4 and state = 'queued'",
    )
    .bind(closing.cancelled_from)
    .bind(text(&closing.cancelled))
    .bind(at)
    .bind(session_id)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    sqlx::query(
        "update turns set state = $1, cancel_reason = $2
         where session_id = $3 and state = 'queued'",
    )
    .bind(text(&closing.cancelled))
    .bind(text(&closing.cancel_reason))
    .bind(session_id)
    .execute(&mut *conn)
    .await?;
    let expired = sqlx::query(
        "insert into session_events (session_id, event_no, kind, request_id, state, at)
         select session_id, $1 - 1 + row_number() over (order by created_at, request_id),
                'permission', request_id, $2, $3
         from permission_requests where session_id = $4 and state = 'pending'",
    )
    .bind(closing.expired_from)
    .bind(closing.expired.as_str())
    .bind(at)
    .bind(session_id)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    sqlx::query(
        "update permission_requests set state = $1, answered_at = $2
         where session_id = $3 and state = 'pending'",
    )
    .bind(closing.expired.as_str())
    .bind(at)
    .bind(session_id)
    .execute(&mut *conn)
    .await?;
    write_session(conn, &closing.session).await?;
    insert_event(conn, &closing.event).await?;
    sqlx::query("delete from lark_links where session_id = $1")
        .bind(session_id)
        .execute(&mut *conn)
        .await?;
    Ok(Closed {
        session: closing.session,
        cancelled,
        expired,
    })
}
