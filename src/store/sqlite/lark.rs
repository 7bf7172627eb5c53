//! The SQLite side of the Lark decisions ([`crate::decide::lark`]): the rows
//! a link, an unlink or an incoming event reads, on the writer's connection,
//! and the statements that write a link and an event's redelivery guard. It
//! decides nothing itself.

use rusqlite::Connection;

use super::journal::decided;
use super::{journal, load_permission, load_session, load_turn, sql};
use crate::decide::chat::{ChatRows, ChatSession};
use crate::decide::lark::{self, EventRows, LinkRows};
use crate::decide::lark::{LarkEvent, LarkIngest};
use crate::decide::pairing::{self, PairCodeRow, PairRows};
use crate::error::Result;
use crate::ids::Minter;
use crate::model::LarkLink;
use crate::store::{ASKED_IN_CHAT, CHAT, CHAT_SESSIONS, SENT_FOR, SESSION_LINK};
use crate::time::now_ms;

pub(super) fn link(
    conn: &Connection,
    session_id: String,
    chat_id: String,
    options: lark::LinkOptions,
) -> Result<LarkLink> {
    let rows = LinkRows {
        session: load_session(conn, &session_id)?,
        link: sql::query_as(SESSION_LINK)
            .bind(&session_id)
            .fetch_optional(conn)?,
        chat: sql::query_as(CHAT).bind(&chat_id).fetch_optional(conn)?,
    };
    let decision = lark::link(rows, chat_id, options, now_ms())?;
    decided(conn, decision)
}

pub(super) fn unlink(conn: &Connection, session_id: String) -> Result<LarkLink> {
    decided(conn, lark::unlink(load_session(conn, &session_id)?)?)
}

/// A chat's sessions, its row, the session the message replies to, and the
/// one that asked what it answers.
fn chat_rows(conn: &Connection, chat_id: &str, event: &LarkEvent) -> Result<ChatRows> {
    let links: Vec<(String, String)> =
        sql::query_as(CHAT_SESSIONS).bind(chat_id).fetch_all(conn)?;
    let mut sessions = Vec::with_capacity(links.len());
    for (session_id, approvers) in links {
        if let Some(session) = load_session(conn, &session_id)? {
            sessions.push(ChatSession { session, approvers });
        }
    }
    let mut replied = None;
    for message_id in &event.replies_to {
        replied = sql::query_scalar(SENT_FOR)
            .bind(message_id)
            .fetch_optional(conn)?;
        if replied.is_some() {
            break;
        }
    }
    let asked = match event.named_request() {
        Some(request_id) => sql::query_scalar(ASKED_IN_CHAT)
            .bind(chat_id)
            .bind(request_id)
            .fetch_optional(conn)?,
        None => None,
    };
    Ok(ChatRows {
        chat: sql::query_as(CHAT).bind(chat_id).fetch_optional(conn)?,
        sessions,
        replied,
        asked,
    })
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
    let chat = match &event.chat_id {
        Some(chat_id) => chat_rows(conn, chat_id, event)?,
        None => ChatRows::default(),
    };
    let Some(session_id) = chat.target().map(|t| t.session.session_id.clone()) else {
        return Ok(EventRows {
            pairing,
            chat,
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
        chat,
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
    let link = match &session {
        Some(session) => sql::query_as(SESSION_LINK)
            .bind(&session.session_id)
            .fetch_optional(conn)?,
        None => None,
    };
    Ok(PairRows {
        code,
        session,
        link,
        chat: sql::query_as(CHAT).bind(chat_id).fetch_optional(conn)?,
    })
}

/// A new pairing code for the session ([`pairing::new_code`]): when it expires.
pub(super) fn pair_code(conn: &Connection, session_id: &str, code_hash: String) -> Result<i64> {
    let session = load_session(conn, session_id)?;
    decided(conn, pairing::new_code(session, code_hash, now_ms())?)
}

/// Ends a download job ([`lark::fetched`]): its session, its turn, and
/// whether it is still pending.
pub(super) fn fetched(conn: &Connection, fetched: lark::Fetched) -> Result<bool> {
    let rows = lark::FetchedRows {
        session: load_session(conn, &fetched.session_id)?,
        turn: load_turn(conn, &fetched.session_id, &fetched.turn_id)?,
        pending: fetching(conn, &fetched.turn_id)?,
        held: attachment_bytes(conn, &fetched.session_id)?,
    };
    decided(conn, lark::fetched(rows, fetched, now_ms()))
}

/// The bytes the session's files hold, journaled turns' included (the
/// journal is folded first: only a message with files pays for it).
pub(super) fn attachment_bytes(conn: &Connection, session_id: &str) -> Result<u64> {
    journal::fold_all(conn)?;
    let held: i64 = sql::query_scalar(crate::store::SESSION_ATTACHMENT_BYTES)
        .bind(session_id)
        .fetch_one(conn)?;
    Ok(held.max(0) as u64)
}

/// Whether the turn's download job is pending.
pub(super) fn fetching(conn: &Connection, turn_id: &str) -> Result<bool> {
    let pending: i64 = sql::query_scalar(crate::store::FETCH_PENDING)
        .bind(turn_id)
        .fetch_one(conn)?;
    Ok(pending > 0)
}

pub(super) fn event(conn: &Connection, event: LarkEvent, minter: &Minter) -> Result<LarkIngest> {
    let rows = event_rows(conn, &event)?;
    decided(conn, lark::event(rows, event, minter, now_ms())?)
}
