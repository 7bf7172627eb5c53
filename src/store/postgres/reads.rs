//! Row access outside the turn decisions: a session or turn read (or a
//! session's row locked) by id, the session and turn listings, and the steps
//! of retention. It decides nothing.

use sqlx::postgres::{PgConnection, PgPool};

use super::Step;
use super::rows::{SESSION_COLUMNS, TURN_READBACK, session_row, text, turn_row, unstorable};
use crate::decide;
use crate::decide::{SessionRow, TurnRow};
use crate::error::Result;
use crate::model::{ListSessions, ListTurns};
use crate::store::TurnPage;
use crate::store::retention::{self, PruneStep};

pub(super) async fn load_session<'e, E>(db: E, session_id: &str) -> sqlx::Result<Option<SessionRow>>
where
    E: sqlx::PgExecutor<'e>,
{
    if unstorable(session_id) {
        return Ok(None);
    }
    let sql = format!("select {SESSION_COLUMNS} from sessions where session_id = $1");
    sqlx::query(&sql)
        .bind(session_id)
        .fetch_optional(db)
        .await?
        .map(session_row)
        .transpose()
}

/// Locks the session's row for the rest of the transaction: every write that
/// touches a session goes through here first.
pub(super) async fn lock_session(
    conn: &mut PgConnection,
    session_id: &str,
) -> sqlx::Result<Option<SessionRow>> {
    if unstorable(session_id) {
        return Ok(None);
    }
    let sql = format!("select {SESSION_COLUMNS} from sessions where session_id = $1 for update");
    sqlx::query(&sql)
        .bind(session_id)
        .fetch_optional(&mut *conn)
        .await?
        .map(session_row)
        .transpose()
}

pub(super) async fn load_turn<'e, E>(
    db: E,
    session_id: &str,
    turn_id: &str,
) -> sqlx::Result<Option<TurnRow>>
where
    E: sqlx::PgExecutor<'e>,
{
    if unstorable(session_id) || unstorable(turn_id) {
        return Ok(None);
    }
    sqlx::query(&format!(
        "{TURN_READBACK} where t.session_id = $1 and t.turn_id = $2"
    ))
    .bind(session_id)
    .bind(turn_id)
    .fetch_optional(db)
    .await?
    .map(turn_row)
    .transpose()
}

/// One transaction of retention: a chunk of the oldest prunable session's
/// rows, or the session itself once they are gone, or old Lark guards. The
/// session row is locked, skipping one another replica is pruning.
pub(super) async fn prune_step(conn: &mut PgConnection, cutoff_ms: i64) -> Step<PruneStep> {
    let oldest: Option<String> = sqlx::query_scalar(&format!(
        "{} for update skip locked",
        retention::OLDEST_PRUNABLE
    ))
    .bind(cutoff_ms)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(session_id) = oldest else {
        for statement in retention::DELETE_OLD {
            let rows = sqlx::query(statement)
                .bind(cutoff_ms)
                .execute(&mut *conn)
                .await?
                .rows_affected();
            if rows > 0 {
                return Ok(PruneStep::Rows(rows));
            }
        }
        return Ok(PruneStep::Done);
    };
    for statement in retention::DELETE_CHILDREN {
        let rows = sqlx::query(statement)
            .bind(&session_id)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        if rows > 0 {
            return Ok(PruneStep::Rows(rows));
        }
    }
    sqlx::query(retention::DELETE_SESSION)
        .bind(&session_id)
        .execute(&mut *conn)
        .await?;
    Ok(PruneStep::Session)
}

pub(super) async fn sessions(
    pool: &PgPool,
    filter: ListSessions,
    limit: u32,
) -> sqlx::Result<Vec<SessionRow>> {
    let sql = format!(
        "select {SESSION_COLUMNS} from sessions
         where ($1::text is null or state = $1) and ($2::text is null or goal_id = $2)
           and ($3::text is null or agent_id = $3) and ($4::text is null or session_id > $4)
         order by session_id limit $5"
    );
    let rows = sqlx::query(&sql)
        .bind(filter.state.as_ref().map(text))
        .bind(filter.goal_id)
        .bind(filter.agent_id)
        .bind(filter.cursor)
        .bind(i64::from(limit))
        .fetch_all(pool)
        .await?;
    rows.into_iter().map(session_row).collect()
}

/// The open sessions with an active claim, each with when it was made.
pub(super) async fn held_sessions(pool: &PgPool) -> sqlx::Result<Vec<(SessionRow, i64)>> {
    let rows = sqlx::query(crate::store::HELD_SESSIONS)
        .fetch_all(pool)
        .await?;
    rows.into_iter()
        .map(|row| {
            let claimed_at = sqlx::Row::try_get(&row, "holder_claimed_at")?;
            Ok((session_row(row)?, claimed_at))
        })
        .collect()
}

/// A page of the session's turns, and whether more follow (404 for an
/// unknown session).
pub(super) async fn turns(
    pool: &PgPool,
    session_id: &str,
    page: ListTurns,
    limit: u32,
) -> Result<(Vec<TurnRow>, bool)> {
    decide::existing(load_session(pool, session_id).await?)?;
    let paging = TurnPage::new(&page, limit);
    let sql = if paging.backwards {
        "where t.session_id = $1 and t.seq < $3 order by t.seq desc limit $4"
    } else {
        "where t.session_id = $1 and t.seq > $2 and ($3::bigint is null or t.seq < $3)
         order by t.seq limit $4"
    };
    let sql = format!("{TURN_READBACK} {sql}");
    let rows = sqlx::query(&sql)
        .bind(session_id)
        .bind(page.after_seq.unwrap_or(0))
        .bind(page.before_seq)
        .bind(i64::from(paging.read_limit()))
        .fetch_all(pool)
        .await?;
    let turns = rows
        .into_iter()
        .map(turn_row)
        .collect::<sqlx::Result<Vec<_>>>()?;
    Ok(paging.finish(turns))
}
