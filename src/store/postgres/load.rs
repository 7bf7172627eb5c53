//! Each turn decision's rows in ONE statement: the session's row locked
//! (`for update of s`, the per-session serialization point across replicas)
//! and every other row the decision reads joined beside it, each stored row's
//! columns under a prefix of its own ([`Cols`]). It reads; it never writes.
//!
//! A statement that locks one row and reads others has a trap under READ
//! COMMITTED: when it had to wait for the lock, PostgreSQL hands it the
//! session row as the lock holder committed it, but the joined rows as they
//! were when the statement started, before that commit. So every statement
//! also answers `fresh`: whether the locked session row is the version its
//! own snapshot saw (`xmin` compared with a sub-select, evaluated once from
//! the statement's snapshot). Every write that changes what a turn decision
//! reads also writes the session row (its event counter advances), so a
//! fresh answer is a consistent one. A stale answer (the statement waited for
//! another transaction's commit) is read once more: the lock is now held, so
//! the second statement's snapshot has every commit that touched the session.
//!
//! Each statement also comes unlocked ([`Guard::Version`]): the same rows,
//! outside any transaction and without the lock, with the session row's
//! version (its `xmin`) read beside them. One statement's rows are one
//! snapshot, so a decision taken on them is consistent as of that snapshot;
//! its writes are then applied only if the session row is still that version
//! ([`super::apply::guarded`]), or the decision is taken again, locked.

use std::sync::LazyLock;

use sqlx::Row;
use sqlx::postgres::{PgConnection, PgRow};

use super::rows::{
    CLAIM_COLUMNS, Cols, SESSION_COLUMNS, TURN_COLUMNS, optional_claim, optional_turn, select_as,
    session_cols, unstorable,
};
use crate::decide::session::CloseRows;
use crate::decide::turn::{ClaimRows, CompleteRows, ReleaseRows};
use crate::decide::{SessionRow, TurnRow};

/// One load statement, in both forms: the session `s` (`$1`), the `joins`,
/// and the `more` columns they bring.
pub(super) struct Load {
    /// The session's row locked, with whether it is the version the
    /// statement's snapshot saw (`fresh`).
    locked: String,
    /// No lock, the session row's version (`version`) beside the rows.
    unlocked: String,
}

fn statement(more: &[String], joins: &str) -> Load {
    let mut columns = vec![select_as("s", SESSION_COLUMNS, "")];
    columns.extend_from_slice(more);
    let columns = columns.join(", ");
    Load {
        locked: format!(
            "select {columns}, s.xmin = (select xmin from sessions where session_id = $1) as fresh
             from sessions s {joins}
             where s.session_id = $1
             for update of s"
        ),
        unlocked: format!(
            "select {columns}, s.xmin::text as version
             from sessions s {joins}
             where s.session_id = $1"
        ),
    }
}

/// How a turn decision's rows are read.
pub(super) enum Guard {
    /// In the call's transaction, the session's row locked.
    Lock,
    /// Outside a transaction, unlocked: the version of the session row read
    /// (None before a read, or when the session is unknown).
    Version(Option<String>),
}

/// Enqueue: the turn already enqueued with the message's client_message_id
/// (`$2`, null when it has none).
static ENQUEUE: LazyLock<Load> = LazyLock::new(|| {
    statement(
        &[select_as("e", TURN_COLUMNS, "e_")],
        "left join turns e on e.session_id = s.session_id and e.client_message_id = $2",
    )
});

/// Claim: the claim stored under the claim id (`$2`, on any session) and its
/// turn if it is this session's, the session's active claim, and its oldest
/// queued turn, with whether its files are still being fetched.
static CLAIM: LazyLock<Load> = LazyLock::new(|| {
    statement(
        &[
            select_as("ec", CLAIM_COLUMNS, "ec_"),
            select_as("et", TURN_COLUMNS, "et_"),
            select_as("ac", CLAIM_COLUMNS, "ac_"),
            select_as("h", TURN_COLUMNS, "h_"),
            "exists (select 1 from lark_fetches f where f.turn_id = h.turn_id) as h_fetching"
                .to_owned(),
        ],
        &format!(
            "left join claims ec on ec.claim_id = $2
             left join turns et on et.turn_id = ec.turn_id and et.session_id = s.session_id
             left join claims ac on ac.claim_id = s.active_claim_id
             left join lateral (
                 select {TURN_COLUMNS} from turns
                 where session_id = s.session_id and state = 'queued' order by seq limit 1
             ) h on true"
        ),
    )
});

/// Complete: the turn (`$2`), and whether any turn of the session already
/// carries the completion id (`$3`).
static COMPLETE: LazyLock<Load> = LazyLock::new(|| {
    statement(
        &[
            select_as("t", TURN_COLUMNS, "t_"),
            "exists (select 1 from turns u
                     where u.session_id = s.session_id and u.completion_id = $3) as used"
                .to_owned(),
        ],
        "left join turns t on t.session_id = s.session_id and t.turn_id = $2",
    )
});

/// Release: the claim (`$2`) if it is this session's, and its turn.
static RELEASE: LazyLock<Load> = LazyLock::new(|| {
    statement(
        &[
            select_as("c", CLAIM_COLUMNS, "c_"),
            select_as("t", TURN_COLUMNS, "t_"),
        ],
        "left join claims c on c.claim_id = $2 and c.session_id = s.session_id
         left join turns t on t.turn_id = c.turn_id and t.session_id = s.session_id",
    )
});

/// Close: the active claim, and how many turns are queued and permission
/// requests pending.
static CLOSE: LazyLock<Load> = LazyLock::new(|| {
    statement(
        &[
            select_as("ac", CLAIM_COLUMNS, "ac_"),
            select_as("act", TURN_COLUMNS, "act_"),
            "(select count(*) from turns q
              where q.session_id = s.session_id and q.state = 'queued') as queued"
                .to_owned(),
            "(select count(*) from permission_requests p
              where p.session_id = s.session_id and p.state = 'pending') as pending"
                .to_owned(),
        ],
        "left join claims ac on ac.claim_id = s.active_claim_id
         left join turns act on act.turn_id = ac.turn_id and act.session_id = s.session_id",
    )
});

/// Runs a load statement (its parameters: the session id, then `ids`, each
/// absent or unstorable one bound as null, which matches nothing), as
/// `guard` says: the session's row with the rest beside it, None for an
/// unknown session.
async fn load(
    conn: &mut PgConnection,
    load: &Load,
    guard: &mut Guard,
    session_id: &str,
    ids: &[Option<&str>],
) -> sqlx::Result<Option<PgRow>> {
    if unstorable(session_id) {
        return Ok(None);
    }
    let run = |sql| {
        let mut query = sqlx::query(sql).bind(session_id);
        for id in ids {
            query = query.bind(id.filter(|id| !unstorable(id)));
        }
        query
    };
    match guard {
        Guard::Lock => {
            let row = run(&load.locked).fetch_optional(&mut *conn).await?;
            match &row {
                // Waited for another commit: read again under the lock now held.
                Some(r) if !r.try_get::<bool, _>("fresh")? => {
                    run(&load.locked).fetch_optional(conn).await
                }
                _ => Ok(row),
            }
        }
        Guard::Version(version) => {
            let row = run(&load.unlocked).fetch_optional(conn).await?;
            *version = row.as_ref().map(|r| r.try_get("version")).transpose()?;
            Ok(row)
        }
    }
}

fn session(row: &PgRow) -> sqlx::Result<Option<SessionRow>> {
    session_cols(Cols::new(row, "")).map(Some)
}

/// What an enqueue decision reads: the session and the turn already enqueued
/// under the message's client_message_id.
pub(super) async fn enqueue_rows(
    conn: &mut PgConnection,
    guard: &mut Guard,
    session_id: &str,
    client_message_id: Option<&str>,
) -> sqlx::Result<(Option<SessionRow>, Option<TurnRow>)> {
    let Some(row) = load(conn, &ENQUEUE, guard, session_id, &[client_message_id]).await? else {
        return Ok((None, None));
    };
    Ok((session(&row)?, optional_turn(Cols::new(&row, "e_"))?))
}

pub(super) async fn claim_rows(
    conn: &mut PgConnection,
    guard: &mut Guard,
    session_id: &str,
    claim_id: &str,
) -> sqlx::Result<ClaimRows> {
    let Some(row) = load(conn, &CLAIM, guard, session_id, &[Some(claim_id)]).await? else {
        return Ok(ClaimRows::default());
    };
    Ok(ClaimRows {
        session: session(&row)?,
        earlier: optional_claim(Cols::new(&row, "ec_"))?,
        earlier_turn: optional_turn(Cols::new(&row, "et_"))?,
        active: optional_claim(Cols::new(&row, "ac_"))?,
        head: optional_turn(Cols::new(&row, "h_"))?,
        head_fetching: row.try_get("h_fetching")?,
    })
}

pub(super) async fn complete_rows(
    conn: &mut PgConnection,
    guard: &mut Guard,
    session_id: &str,
    turn_id: &str,
    completion_id: &str,
) -> sqlx::Result<CompleteRows> {
    let ids = [Some(turn_id), Some(completion_id)];
    let Some(row) = load(conn, &COMPLETE, guard, session_id, &ids).await? else {
        return Ok(CompleteRows::default());
    };
    Ok(CompleteRows {
        session: session(&row)?,
        turn: optional_turn(Cols::new(&row, "t_"))?,
        completion_id_used: row.try_get("used")?,
    })
}

pub(super) async fn release_rows(
    conn: &mut PgConnection,
    guard: &mut Guard,
    session_id: &str,
    claim_id: &str,
) -> sqlx::Result<ReleaseRows> {
    let Some(row) = load(conn, &RELEASE, guard, session_id, &[Some(claim_id)]).await? else {
        return Ok(ReleaseRows::default());
    };
    Ok(ReleaseRows {
        session: session(&row)?,
        claim: optional_claim(Cols::new(&row, "c_"))?,
        turn: optional_turn(Cols::new(&row, "t_"))?,
    })
}

/// The Lark chat the session is linked to, if any.
pub(super) async fn linked_chat(
    conn: &mut PgConnection,
    session_id: &str,
) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar(crate::store::LINKED_CHAT)
        .bind(session_id)
        .fetch_optional(conn)
        .await
}

pub(super) async fn close_rows(
    conn: &mut PgConnection,
    session_id: &str,
) -> sqlx::Result<CloseRows> {
    let Some(row) = load(conn, &CLOSE, &mut Guard::Lock, session_id, &[]).await? else {
        return Ok(CloseRows::default());
    };
    let lark_chat = linked_chat(&mut *conn, session_id).await?;
    Ok(CloseRows {
        session: session(&row)?,
        active: optional_claim(Cols::new(&row, "ac_"))?,
        active_turn: optional_turn(Cols::new(&row, "act_"))?,
        queued: row.try_get("queued")?,
        pending: row.try_get("pending")?,
        lark_chat,
    })
}
