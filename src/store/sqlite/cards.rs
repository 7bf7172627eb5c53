//! The SQLite side of permission cards: the rows a click decision
//! ([`crate::decide::lark::click`]) reads, on the writer's connection, and
//! the card's own outbox columns (its message id, its final form's update);
//! what an answer given in Lark writes on the card is `apply.rs`'s.
//! It decides nothing itself.

use rusqlite::Connection;

use super::journal::decided;
use super::{load_permission, load_session, sql};
use crate::decide::lark::{self, ClickRows, Clicked, LarkClick};
use crate::error::Result;
use crate::time::now_ms;

fn click_rows(conn: &Connection, click: &LarkClick) -> Result<ClickRows> {
    let seen: Option<i64> =
        sql::query_scalar("select 1 from lark_events where app_id = ?1 and event_id = ?2")
            .bind(&click.app_id)
            .bind(&click.event_id)
            .fetch_optional(conn)?;
    if seen.is_some() {
        return Ok(ClickRows {
            seen: true,
            ..ClickRows::default()
        });
    }
    let card: Option<(String, Option<String>)> = sql::query_as(
        "select chat_id, answered_by from lark_permission_messages where session_id = ? and request_id = ?",
    )
    .bind(&click.session_id)
    .bind(&click.request_id)
    .fetch_optional(conn)?;
    Ok(ClickRows {
        seen: false,
        session: load_session(conn, &click.session_id)?,
        link: sql::query_as("select chat_id, approvers from lark_links where session_id = ?")
            .bind(&click.session_id)
            .fetch_optional(conn)?,
        request: load_permission(conn, &click.session_id, &click.request_id)?,
        card_chat: card.as_ref().map(|(chat, _)| chat.clone()),
        answered_by: card.and_then(|(_, by)| by),
    })
}

pub(super) fn click(conn: &Connection, click: LarkClick) -> Result<Clicked> {
    let rows = click_rows(conn, &click)?;
    decided(conn, lark::click(rows, click, now_ms())?)
}

pub(super) fn sent(
    conn: &Connection,
    session_id: &str,
    request_id: &str,
    message_id: &str,
) -> Result<()> {
    sql::query(
        "update lark_permission_messages set message_id = ? where session_id = ? and request_id = ?",
    )
    .bind(message_id)
    .bind(session_id)
    .bind(request_id)
    .execute(conn)?;
    Ok(())
}

/// Cards whose request was settled after they were sent, and not updated yet.
pub(super) const DUE_CARD_UPDATES: &str = "select m.session_id, m.request_id, m.chat_id, \
         m.message_id, m.answered_by, m.update_attempts, m.update_failures \
     from lark_permission_messages m join permission_requests p \
         on p.session_id = m.session_id and p.request_id = m.request_id \
     where m.update_state = 'pending' and m.message_id is not null \
         and m.update_next_at <= ?1 and p.state <> 'pending' \
     order by m.update_next_at limit ?2";

/// Records an update attempt: `?1`..`?5` state, attempts, failures, error,
/// next attempt; the keys after.
pub(super) const RECORD_CARD_UPDATE: &str = "update lark_permission_messages \
     set update_state = ?1, update_attempts = ?2, update_failures = ?3, update_error = ?4, \
         update_next_at = ?5 \
     where session_id = ?6 and request_id = ?7";
