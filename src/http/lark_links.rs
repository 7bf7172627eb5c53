//! `/v1/sessions/{session_id}/lark-link`: which Lark chat feeds a session,
//! and the one-time codes that link a chat from Lark (`/link <code>`).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{post, put};

use super::{AppJson, AppPath, AppState};
use crate::error::{ErrorBody, Result};
use crate::model::{LarkLink, LarkLinkRequest, LarkPairCode};

pub fn router() -> axum::Router<AppState> {
    axum::Router::new()
        .route(
            "/v1/sessions/{session_id}/lark-link",
            put(link).get(status).delete(unlink),
        )
        .route("/v1/sessions/{session_id}/lark-link/codes", post(pair_code))
}

/// Make a pairing code.
///
/// A one-time code that links a Lark chat to this session: send
/// `/link <code>` (the answer's `command`) to the bot in the chat, a direct
/// chat with the bot or a group it is in. The chat is then linked to the
/// session, and the sender becomes one of the link's approvers; the bot
/// answers with a card naming the session (goal · agent). A code is good for
/// one link within 10 minutes; only its hash is stored, so it is shown this
/// once. A wrong, used or expired code changes nothing, and the bot says so
/// without saying which; a chat that sends 10 wrong codes within 10 minutes
/// is not heard on `/link` until then. The request takes no body.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/lark-link/codes", operation_id = "makeLarkPairCode", tag = "lark",
    params(("session_id" = String, Path, description = "The session id.")),
    responses(
        (status = 201, description = "A new code.", body = LarkPairCode),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
        (status = 409, description = "`session_closed`.", body = ErrorBody),
    ))]
pub async fn pair_code(
    State(state): State<AppState>,
    AppPath(session_id): AppPath<String>,
) -> Result<(StatusCode, Json<LarkPairCode>)> {
    let code = state.broker.lark_pair_code(&session_id).await?;
    Ok((StatusCode::CREATED, Json(code)))
}

/// Link a Lark chat.
///
/// The session joins the chat's sessions and becomes the chat's current one:
/// plain messages from the chat go to it from now on, until `/use N` (or
/// another link) picks another. A chat holds several open sessions (this
/// replaces the earlier contract of one open session per chat: no
/// `chat_linked` any more), numbered in the order they were linked; a
/// message that replies to a session's answer or card goes to that session
/// whichever is current. A session has at most one chat: linking it to
/// another chat moves it, linking the same chat again keeps its place.
/// Closing the session removes the link, and the chat is told once.
///
/// `approvers` lists the Lark open ids (`ou_…`, at most 50, each at most 64
/// bytes) who may answer the session's permission requests from the chat with
/// `yes <id>` / `no <id>`. Every link replaces the list, also when it links the
/// same chat again (send the whole list each time; absent means empty); without
/// approvers nobody on Lark can answer, the Web page and the API still can. A
/// bad open id, or more than 50, is 400 `invalid_request` and changes nothing.
#[utoipa::path(put, path = "/v1/sessions/{session_id}/lark-link", operation_id = "linkLarkChat", tag = "lark",
    params(("session_id" = String, Path, description = "The session id.")),
    request_body = LarkLinkRequest,
    responses(
        (status = 200, description = "Linked.", body = LarkLink),
        (status = 400, description = "`invalid_request`.", body = ErrorBody),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
        (status = 409, description = "`session_closed`.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`.", body = ErrorBody),
    ))]
pub async fn link(
    State(state): State<AppState>,
    AppPath(session_id): AppPath<String>,
    AppJson(link): AppJson<LarkLinkRequest>,
) -> Result<Json<LarkLink>> {
    Ok(Json(state.broker.lark_link(&session_id, link).await?))
}

/// Read a session's Lark link.
///
/// The linked chat and its approvers, or `chat_id: null` and no approvers.
#[utoipa::path(get, path = "/v1/sessions/{session_id}/lark-link", operation_id = "getLarkLink", tag = "lark",
    params(("session_id" = String, Path, description = "The session id.")),
    responses(
        (status = 200, description = "The link.", body = LarkLink),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
    ))]
pub async fn status(
    State(state): State<AppState>,
    AppPath(session_id): AppPath<String>,
) -> Result<Json<LarkLink>> {
    Ok(Json(state.broker.lark_link_status(&session_id).await?))
}

/// Unlink the Lark chat.
///
/// Messages from the chat are acknowledged and no longer enqueued. Idempotent.
#[utoipa::path(delete, path = "/v1/sessions/{session_id}/lark-link", operation_id = "unlinkLarkChat", tag = "lark",
    params(("session_id" = String, Path, description = "The session id.")),
    responses(
        (status = 200, description = "Unlinked (`chat_id: null`).", body = LarkLink),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
    ))]
pub async fn unlink(
    State(state): State<AppState>,
    AppPath(session_id): AppPath<String>,
) -> Result<Json<LarkLink>> {
    Ok(Json(state.broker.lark_unlink(&session_id).await?))
}
