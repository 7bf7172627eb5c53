//! The PostgreSQL side of permission cards: the rows a click decision
//! ([`crate::decide::lark::click`]) reads, after locking the session's row,
//! and the card's own outbox columns (its message id; its final form's
//! update, taken and leased like replies); what an answer given in Lark
//! writes on the card is `apply.rs`'s. It decides nothing itself.

use sqlx::postgres::{PgConnection, PgPool};

use super::apply::decided;
use super::permissions::load_permission;
use super::rows::{text, unstorable};
use super::{Step, lock_session};
use crate::decide::lark::{self, ClickRows, Clicked, LarkClick};
use crate::store::{CardUpdateJob, ReplyUpdate};
use crate::time::now_ms;

/// How long a dispatcher holds the card updates it took before another may.
const LEASE_MS: i64 = 30_000;

async fn click_rows(conn: &mut PgConnection, click: &LarkClick) -> sqlx::Result<ClickRows> {
    if unstorable(&click.event_id) || unstorable(&click.request_id) {
        return Ok(ClickRows::default());
    }
    let seen: Option<i32> =
        sqlx::query_scalar("select 1 from lark_events where app_id = $1 and event_id = $2")
            .bind(&click.app_id)
            .bind(&click.event_id)
            .fetch_optional(&mut *conn)
            .await?;
    if seen.is_some() {
        return Ok(ClickRows {
            seen: true,
            ..ClickRows::default()
        });
    }
    let session = lock_session(conn, &click.session_id).await?;
    if session.is_none() {
        return Ok(ClickRows::default());
    }
    let link = sqlx::query_as("select chat_id, approvers from lark_links where session_id = $1")
        .bind(&click.session_id)
        .fetch_optional(&mut *conn)
        .await?;
    let card: Option<(String, Option<String>)> = sqlx::query_as(
        "select chat_id, answered_by from lark_permission_messages where session_id = $1 and request_id = $2",
    )
    .bind(&click.session_id)
    .bind(&click.request_id)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(ClickRows {
        seen: false,
        request: load_permission(&mut *conn, &click.session_id, &click.request_id).await?,
        session,
        link,
        card_chat: card.as_ref().map(|(chat, _)| chat.clone()),
        answered_by: card.and_then(|(_, by)| by),
    })
}

pub(super) async fn click(conn: &mut PgConnection, click: &LarkClick) -> Step<Clicked> {
    let rows = click_rows(conn, click).await?;
    decided(conn, lark::click(rows, click.clone(), now_ms())?).await
}

pub(super) async fn sent(
    conn: &mut PgConnection,
    session_id: &str,
    request_id: &str,
    message_id: &str,
) -> sqlx::Result<()> {
    sqlx::query(
        "update lark_permission_messages set message_id = $1
         where session_id = $2 and request_id = $3",
    )
    .bind(message_id)
    .bind(session_id)
    .bind(request_id)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Takes and leases the cards whose request was settled after they were
/// sent and that are not updated yet (`$1` now, `$2` limit, `$3` lease).
const LEASE_CARD_UPDATES: &str = "with due as (
         select m.session_id, m.request_id from lark_permission_messages m
         join permission_requests p
             on p.session_id = m.session_id and p.request_id = m.request_id
         where m.update_state = 'pending' and m.message_id is not null
             and m.update_next_at <= $1 and p.state <> 'pending'
         order by m.update_next_at limit $2
         for update of m skip locked
     )
     update lark_permission_messages m set update_next_at = $1 + $3
     from due where m.session_id = due.session_id and m.request_id = due.request_id
     returning m.session_id, m.request_id, m.chat_id, m.message_id, m.answered_by,
               m.update_attempts, m.update_failures";

pub(super) async fn due(
    pool: &PgPool,
    now_ms: i64,
    limit: u32,
) -> sqlx::Result<Vec<CardUpdateJob>> {
    sqlx::query_as(LEASE_CARD_UPDATES)
        .bind(now_ms)
        .bind(i64::from(limit))
        .bind(LEASE_MS)
        .fetch_all(pool)
        .await
}

/// Records an update attempt (it replaces the lease).
pub(super) async fn record(
    conn: &mut PgConnection,
    job: CardUpdateJob,
    update: ReplyUpdate,
) -> sqlx::Result<()> {
    let error = update.error.map(|e| e.replace('\0', "\u{fffd}"));
    sqlx::query(
        "update lark_permission_messages
         set update_state = $1, update_attempts = $2, update_failures = $3, update_error = $4,
             update_next_at = $5
         where session_id = $6 and request_id = $7",
    )
    .bind(text(&update.state))
    .bind(update.attempts)
    .bind(update.failures)
    .bind(error)
    .bind(update.next_attempt_at)
    .bind(&job.session_id)
    .bind(&job.request_id)
    .execute(&mut *conn)
    .await?;
    Ok(())
}
