//! The PostgreSQL side of the Lark decisions ([`crate::decide::lark`]): the
//! rows a link, an unlink or an incoming event reads, after locking the
//! session's row, and the statements that write a link and an event's
//! redelivery guard, in the caller's transaction. It decides nothing itself.

use sqlx::postgres::PgConnection;

use super::apply::decided;
use super::decisions::earlier_turn;
use super::permissions::load_permission;
use super::{Step, lock_session};
use crate::decide::SessionRow;
use crate::decide::lark::{self, EventRows};
use crate::decide::lark::{LarkEvent, LarkIngest};
use crate::decide::pairing::{self, ChatRow, PairCodeRow, PairRows};
use crate::ids::Minter;
use crate::model::LarkLink;
use crate::time::now_ms;

pub(super) async fn link(
    conn: &mut PgConnection,
    session_id: &str,
    chat_id: &str,
    approvers: &[String],
) -> Step<LarkLink> {
    let session = lock_session(conn, session_id).await?;
    let holder: Option<String> =
        sqlx::query_scalar("select session_id from lark_links where chat_id = $1")
            .bind(chat_id)
            .fetch_optional(&mut *conn)
            .await?;
    let decision = lark::link(
        session,
        holder.as_deref(),
        chat_id.to_owned(),
        approvers.to_vec(),
        now_ms(),
    )?;
    decided(conn, decision).await
}

pub(super) async fn unlink(conn: &mut PgConnection, session_id: &str) -> Step<LarkLink> {
    let session = lock_session(conn, session_id).await?;
    decided(conn, lark::unlink(session)?).await
}

/// The session `chat_id` is linked to, locked, with the link's approvers as
/// stored. The link is read again once the row is locked: a close, an unlink
/// or a relink committed in between (on any replica) is then seen.
async fn linked_session(
    conn: &mut PgConnection,
    chat_id: &str,
) -> sqlx::Result<Option<(SessionRow, String)>> {
    let link = "select session_id, approvers from lark_links where chat_id = $1";
    let mut linked: Option<(String, String)> = sqlx::query_as(link)
        .bind(chat_id)
        .fetch_optional(&mut *conn)
        .await?;
    loop {
        let Some((candidate, _)) = linked else {
            return Ok(None);
        };
        let session = lock_session(conn, &candidate).await?;
        linked = sqlx::query_as(link)
            .bind(chat_id)
            .fetch_optional(&mut *conn)
            .await?;
        if let Some((session_id, approvers)) = &linked
            && *session_id == candidate
        {
            return Ok(session.map(|session| (session, approvers.clone())));
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
    let linked = match &event.chat_id {
        Some(chat_id) => linked_session(conn, chat_id).await?,
        None => None,
    };
    let Some((session, approvers)) = linked else {
        return Ok(EventRows {
            pairing,
            ..EventRows::default()
        });
    };
    let session_id = session.session_id.clone();
    let request = match event.named_request() {
        Some(request_id) => load_permission(&mut *conn, &session_id, request_id).await?,
        None => None,
    };
    Ok(EventRows {
        seen: false,
        earlier: earlier_turn(conn, &session_id, &event.event_id).await?,
        linked: Some((session, approvers)),
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
    let Some((_, session_id, ..)) = found else {
        return chat_rows(conn, chat_id, PairRows::default()).await;
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
    let approvers = sqlx::query_scalar(
        "select approvers from lark_links where session_id = $1 and chat_id = $2",
    )
    .bind(&session_id)
    .bind(chat_id)
    .fetch_optional(&mut *conn)
    .await?;
    let rows = PairRows {
        code,
        session,
        approvers,
        ..PairRows::default()
    };
    chat_rows(conn, chat_id, rows).await
}

/// The chat's side of [`PairRows`]: who holds it, its wrong codes.
async fn chat_rows(
    conn: &mut PgConnection,
    chat_id: &str,
    rows: PairRows,
) -> sqlx::Result<PairRows> {
    let holder = sqlx::query_scalar("select session_id from lark_links where chat_id = $1")
        .bind(chat_id)
        .fetch_optional(&mut *conn)
        .await?;
    let chat: Option<(String, i64, i64)> = sqlx::query_as(
        "select chat_id, failed_codes, failed_since from lark_chats where chat_id = $1",
    )
    .bind(chat_id)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(PairRows {
        holder,
        chat: chat.map(|(chat_id, failed_codes, failed_since)| ChatRow {
            chat_id,
            failed_codes,
            failed_since,
        }),
        ..rows
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

pub(super) async fn event(
    conn: &mut PgConnection,
    event: &LarkEvent,
    minter: &Minter,
) -> Step<LarkIngest> {
    let rows = event_rows(conn, event).await?;
    decided(conn, lark::event(rows, event.clone(), minter, now_ms())?).await
}
