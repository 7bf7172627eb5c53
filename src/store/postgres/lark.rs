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
use crate::decide::Writes;
use crate::decide::lark::{self, EventRows};
use crate::decide::lark::{LarkEvent, LarkIngest};
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
    let linked = match &event.chat_id {
        Some(chat_id) => linked_session(conn, chat_id).await?,
        None => None,
    };
    let Some((session, approvers)) = linked else {
        return Ok(EventRows::default());
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
    })
}

pub(super) async fn event(
    conn: &mut PgConnection,
    event: &LarkEvent,
    minter: &Minter,
) -> Step<LarkIngest> {
    let rows = event_rows(conn, event).await?;
    decided(conn, lark::event(rows, event.clone(), minter, now_ms())?).await
}

/// Writes a decision's Lark event guard and link change, if any.
pub(super) async fn apply(conn: &mut PgConnection, writes: &Writes) -> sqlx::Result<()> {
    if let Some(e) = &writes.lark_event {
        sqlx::query(
            "insert into lark_events (app_id, event_id, message_id, received_at)
             values ($1, $2, $3, $4)",
        )
        .bind(&e.app_id)
        .bind(&e.event_id)
        .bind(&e.message_id)
        .bind(e.at)
        .execute(&mut *conn)
        .await?;
    }
    let Some(change) = &writes.link else {
        return Ok(());
    };
    sqlx::query("delete from lark_links where session_id = $1")
        .bind(&change.session_id)
        .execute(&mut *conn)
        .await?;
    if let Some(link) = &change.link {
        // The same chat linked to another session at this very moment: this
        // insert waits for that transaction, fails if it committed, and the
        // decision taken again answers chat_linked.
        sqlx::query(
            "insert into lark_links (chat_id, session_id, linked_at, approvers)
             values ($1, $2, $3, $4)",
        )
        .bind(&link.chat_id)
        .bind(&change.session_id)
        .bind(link.at)
        .bind(&link.approvers)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}
