//! Row access outside the turn decisions: a session or turn read (or a
//! session's row locked) by id, and the steps of retention. It decides
//! nothing.

use sqlx::postgres::PgConnection;

use super::Step;
use super::rows::{SESSION_COLUMNS, TURN_READBACK, session_row, turn_row, unstorable};
use crate::decide::{SessionRow, TurnRow};
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
        .as_ref()
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
        .as_ref()
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
    .as_ref()
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
