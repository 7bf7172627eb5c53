//! The PostgreSQL side of the Lark decisions ([`crate::decide::lark`]): the
//! rows a link, an unlink or an incoming event reads, after locking the
//! session's row, and the statements that write a link and an event's
//! redelivery guard, in the caller's transaction. It decides nothing itself.

use sqlx::postgres::PgConnection;

use super::apply::decided;
use super::decisions::earlier_turn;
use super::permissions::load_permission;
use super::{Step, load_session, lock_session, unstorable};
use crate::decide::chat::{ChatRows, ChatSession};
use crate::decide::lark::{self, EventRows, LinkRow, LinkRows};
use crate::decide::lark::{LarkEvent, LarkIngest};
use crate::decide::pairing::{self, ChatRow, PairCodeRow, PairRows};
use crate::ids::Minter;
use crate::model::LarkLink;
use crate::store::{ASKED_IN_CHAT, CHAT, CHAT_SESSIONS, SENT_FOR, SESSION_LINK};
use crate::time::now_ms;

pub(super) async fn link(
    conn: &mut PgConnection,
    session_id: &str,
    chat_id: &str,
    options: &lark::LinkOptions,
) -> Step<LarkLink> {
    let session = lock_session(conn, session_id).await?;
    let rows = LinkRows {
        session,
        link: session_link(conn, session_id).await?,
        chat: chat_row(conn, chat_id).await?,
    };
    let decision = lark::link(rows, chat_id.to_owned(), options.clone(), now_ms())?;
    decided(conn, decision).await
}

pub(super) async fn unlink(conn: &mut PgConnection, session_id: &str) -> Step<LarkLink> {
    let session = lock_session(conn, session_id).await?;
    decided(conn, lark::unlink(session)?).await
}

async fn session_link(conn: &mut PgConnection, session_id: &str) -> sqlx::Result<Option<LinkRow>> {
    let link: Option<(String, String, i64, i64)> = sqlx::query_as(SESSION_LINK)
        .bind(session_id)
        .fetch_optional(&mut *conn)
        .await?;
    Ok(
        link.map(|(chat_id, approvers, linked_at, terminal_turns)| LinkRow {
            chat_id,
            approvers,
            linked_at,
            terminal_turns: terminal_turns == 1,
        }),
    )
}

async fn chat_row(conn: &mut PgConnection, chat_id: &str) -> sqlx::Result<Option<ChatRow>> {
    let chat: Option<(String, i64, i64, Option<String>)> = sqlx::query_as(CHAT)
        .bind(chat_id)
        .fetch_optional(&mut *conn)
        .await?;
    Ok(chat.map(
        |(chat_id, failed_codes, failed_since, current_session_id)| ChatRow {
            chat_id,
            failed_codes,
            failed_since,
            current_session_id,
        },
    ))
}

/// The chat's sessions as linked now, each read (not locked).
async fn chat_sessions(conn: &mut PgConnection, chat_id: &str) -> sqlx::Result<Vec<ChatSession>> {
    let links: Vec<(String, String)> = sqlx::query_as(CHAT_SESSIONS)
        .bind(chat_id)
        .fetch_all(&mut *conn)
        .await?;
    let mut sessions = Vec::with_capacity(links.len());
    for (session_id, approvers) in links {
        if let Some(session) = load_session(&mut *conn, &session_id).await? {
            sessions.push(ChatSession { session, approvers });
        }
    }
    Ok(sessions)
}

/// What a message in `chat_id` reads ([`ChatRows`]), its target session
/// locked. The chat's list is read again once the row is locked: a close,
/// an unlink or a relink committed in between (on any replica) is then
/// seen, and the target chosen again.
async fn chat_rows(
    conn: &mut PgConnection,
    chat_id: &str,
    event: &LarkEvent,
) -> sqlx::Result<ChatRows> {
    let mut replied = None;
    for message_id in event.replies_to.iter().filter(|id| !unstorable(id)) {
        replied = sqlx::query_scalar(SENT_FOR)
            .bind(message_id)
            .fetch_optional(&mut *conn)
            .await?;
        if replied.is_some() {
            break;
        }
    }
    let asked = match event.named_request().filter(|id| !unstorable(id)) {
        Some(request_id) => {
            sqlx::query_scalar(ASKED_IN_CHAT)
                .bind(chat_id)
                .bind(request_id)
                .fetch_optional(&mut *conn)
                .await?
        }
        None => None,
    };
    let mut rows = ChatRows {
        chat: chat_row(conn, chat_id).await?,
        sessions: chat_sessions(conn, chat_id).await?,
        replied,
        asked,
    };
    loop {
        let Some(target) = rows.target().map(|t| t.session.session_id.clone()) else {
            return Ok(rows);
        };
        let locked = lock_session(conn, &target).await?;
        rows.sessions = chat_sessions(conn, chat_id).await?;
        let still = rows.target().map(|t| t.session.session_id.clone());
        if still.as_deref() == Some(target.as_str()) {
            // The locked row is the one the decision takes.
            if let (Some(locked), Some(slot)) = (
                locked,
                rows.sessions
                    .iter_mut()
                    .find(|s| s.session.session_id == target),
            ) {
                slot.session = locked;
            }
            return Ok(rows);
        }
    }
}

async fn event_rows(conn: &mut PgConnection, event: &LarkEvent) -> sqlx::Result<EventRows> {
    // The same event reaching two replicas at once: both find it unseen, and
    // the second one's guard insert waits for the first transaction, fails
    // once it commits, and the decision taken again finds it seen.
    let seen: Option<i32> = sqlx::query_scalar(
        "select 1 from lark_events where app_id = $1 and (event_id = $2 or message_id = $3)",
    )
    .bind(&event.app_id)
    .bind(&event.event_id)
    .bind(&event.message_id)
    .fetch_optional(&mut *conn)
    .await?;
    if seen.is_some() {
        return Ok(EventRows {
            seen: true,
            ..EventRows::default()
        });
    }
    let pairing = match (event.link_code(), &event.chat_id) {
        (Some(code), Some(chat_id)) => pair_rows(conn, chat_id, code).await?,
        _ => PairRows::default(),
    };
    let chat = match &event.chat_id {
        Some(chat_id) => chat_rows(conn, chat_id, event).await?,
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
        Some(request_id) => load_permission(&mut *conn, &session_id, request_id).await?,
        None => None,
    };
    Ok(EventRows {
        seen: false,
        earlier: earlier_turn(conn, &session_id, &event.event_id).await?,
        chat,
        request,
        pairing,
    })
}

/// What a `/link <code>` from `chat_id` reads ([`PairRows`]): the code is
/// read again once its session's row is locked, so the same code sent
/// twice at once (to two replicas) is spent once.
async fn pair_rows(conn: &mut PgConnection, chat_id: &str, code: &str) -> sqlx::Result<PairRows> {
    let select = "select code_hash, session_id, expires_at, used_at from lark_pair_codes \
         where code_hash = $1";
    let hash = pairing::code_hash(code);
    let found: Option<(String, String, i64, Option<i64>)> = sqlx::query_as(select)
        .bind(&hash)
        .fetch_optional(&mut *conn)
        .await?;
    let chat = chat_row(conn, chat_id).await?;
    let Some((_, session_id, ..)) = found else {
        return Ok(PairRows {
            chat,
            ..PairRows::default()
        });
    };
    let session = lock_session(conn, &session_id).await?;
    let code = sqlx::query_as(select)
        .bind(&hash)
        .fetch_optional(&mut *conn)
        .await?
        .map(|(code_hash, session_id, expires_at, used_at)| PairCodeRow {
            code_hash,
            session_id,
            expires_at,
            used_at,
        });
    Ok(PairRows {
        code,
        session,
        link: session_link(conn, &session_id).await?,
        chat,
    })
}

/// A new pairing code for the session ([`pairing::new_code`]).
pub(super) async fn pair_code(
    conn: &mut PgConnection,
    session_id: &str,
    code_hash: &str,
) -> Step<i64> {
    let session = lock_session(conn, session_id).await?;
    decided(
        conn,
        pairing::new_code(session, code_hash.to_owned(), now_ms())?,
    )
    .await
}

/// The bytes the session's files hold (read under the session's lock).
pub(super) async fn attachment_bytes(
    conn: &mut PgConnection,
    session_id: &str,
) -> sqlx::Result<u64> {
    let held: i64 = sqlx::query_scalar(crate::store::SESSION_ATTACHMENT_BYTES)
        .bind(session_id)
        .fetch_one(&mut *conn)
        .await?;
    Ok(held.max(0) as u64)
}

/// Ends a download job ([`lark::fetched`]): the session (locked), its
/// turn, and whether the job is still pending.
pub(super) async fn fetched(conn: &mut PgConnection, fetched: &lark::Fetched) -> Step<bool> {
    let session = lock_session(conn, &fetched.session_id).await?;
    let turn = super::load_turn(&mut *conn, &fetched.session_id, &fetched.turn_id).await?;
    let pending: i64 = sqlx::query_scalar(crate::store::FETCH_PENDING)
        .bind(&fetched.turn_id)
        .fetch_one(&mut *conn)
        .await?;
    let rows = lark::FetchedRows {
        session,
        turn,
        pending: pending > 0,
        held: attachment_bytes(conn, &fetched.session_id).await?,
    };
    decided(conn, lark::fetched(rows, fetched.clone(), now_ms())).await
}

pub(super) async fn event(
    conn: &mut PgConnection,
    event: &LarkEvent,
    minter: &Minter,
) -> Step<LarkIngest> {
    let rows = event_rows(conn, event).await?;
    decided(conn, lark::event(rows, event.clone(), minter, now_ms())?).await
}
