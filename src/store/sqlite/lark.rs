//! The SQLite side of the Lark decisions ([`crate::decide::lark`]): the rows
//! a link, an unlink or an incoming event reads, on the writer's connection,
//! and the statements that write a link and an event's redelivery guard. It
//! decides nothing itself.

use rusqlite::Connection;

use super::journal::decided;
use super::{journal, load_permission, load_session, sql};
use crate::decide::lark::{self, EventRows};
use crate::decide::lark::{LarkEvent, LarkIngest};
use crate::decide::pairing::{self, PairCodeRow, PairRows};
use crate::error::Result;
use crate::ids::Minter;
use crate::model::LarkLink;
use crate::time::now_ms;

pub(super) fn link(
    conn: &Connection,
    session_id: String,
    chat_id: String,
    approvers: Vec<String>,
) -> Result<LarkLink> {
    let session = load_session(conn, &session_id)?;
    let holder: Option<String> =
        sql::query_scalar("select session_id from lark_links where chat_id = ?")
            .bind(&chat_id)
            .fetch_optional(conn)?;
    let decision = lark::link(session, holder.as_deref(), chat_id, approvers, now_ms())?;
    decided(conn, decision)
}

pub(super) fn unlink(conn: &Connection, session_id: String) -> Result<LarkLink> {
    decided(conn, lark::unlink(load_session(conn, &session_id)?)?)
}

fn event_rows(conn: &Connection, event: &LarkEvent) -> Result<EventRows> {
    let seen: Option<i64> = sql::query_scalar(
        "select 1 from lark_events where app_id = ?1 and (event_id = ?2 or message_id = ?3)",
    )
    .bind(&event.app_id)
    .bind(&event.event_id)
    .bind(&event.message_id)
    .fetch_optional(conn)?;
    if seen.is_some() {
        return Ok(EventRows {
            seen: true,
            ..EventRows::default()
        });
    }
    let pairing = match (event.link_code(), &event.chat_id) {
        (Some(code), Some(chat_id)) => pair_rows(conn, chat_id, code)?,
        _ => PairRows::default(),
    };
    let linked: Option<(String, String)> = match &event.chat_id {
        Some(chat_id) => {
            sql::query_as("select session_id, approvers from lark_links where chat_id = ?")
                .bind(chat_id)
                .fetch_optional(conn)?
        }
        None => None,
    };
    let Some((session_id, approvers)) = linked else {
        return Ok(EventRows {
            pairing,
            ..EventRows::default()
        });
    };
    let request = match event.named_request() {
        Some(request_id) => load_permission(conn, &session_id, request_id)?,
        None => None,
    };
    Ok(EventRows {
        seen: false,
        earlier: journal::turn_by_client_message_id(conn, &session_id, &event.event_id)?,
        linked: load_session(conn, &session_id)?.map(|session| (session, approvers)),
        request,
        pairing,
    })
}

/// What a `/link <code>` from `chat_id` reads ([`PairRows`]).
fn pair_rows(conn: &Connection, chat_id: &str, code: &str) -> Result<PairRows> {
    let code: Option<PairCodeRow> = sql::query_as(
        "select code_hash, session_id, expires_at, used_at from lark_pair_codes where code_hash = ?",
    )
    .bind(pairing::code_hash(code))
    .fetch_optional(conn)?;
    let session = match &code {
        Some(code) => load_session(conn, &code.session_id)?,
        None => None,
    };
    let approvers = match &session {
        Some(session) => sql::query_scalar(
            "select approvers from lark_links where session_id = ? and chat_id = ?",
        )
        .bind(&session.session_id)
        .bind(chat_id)
        .fetch_optional(conn)?,
        None => None,
    };
    Ok(PairRows {
        code,
        session,
        holder: sql::query_scalar("select session_id from lark_links where chat_id = ?")
            .bind(chat_id)
            .fetch_optional(conn)?,
        approvers,
        chat: sql::query_as(
            "select chat_id, failed_codes, failed_since from lark_chats where chat_id = ?",
        )
        .bind(chat_id)
        .fetch_optional(conn)?,
    })
}

/// A new pairing code for the session ([`pairing::new_code`]): when it expires.
pub(super) fn pair_code(conn: &Connection, session_id: &str, code_hash: String) -> Result<i64> {
    let session = load_session(conn, session_id)?;
    decided(conn, pairing::new_code(session, code_hash, now_ms())?)
}

pub(super) fn event(conn: &Connection, event: LarkEvent, minter: &Minter) -> Result<LarkIngest> {
    let rows = event_rows(conn, &event)?;
    decided(conn, lark::event(rows, event, minter, now_ms())?)
}
