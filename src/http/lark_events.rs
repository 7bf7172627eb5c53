//! `POST /v1/connectors/lark/events`: the route of Lark's event subscription
//! webhook. Authenticated by Lark's signature and verification token, checked
//! by [`crate::lark::webhook`] (never the owner token); answers 200 only after
//! the event is committed, and 401 for anything it cannot verify, storing
//! nothing.

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::json;

use super::{AppState, RawBody};
use crate::error::{Error, ErrorBody, ErrorCode, Result};
use crate::lark::webhook::{self, Inbound};
use crate::lark::{EventMode, inbound};

pub fn router() -> axum::Router<AppState> {
    axum::Router::new().route("/v1/connectors/lark/events", post(events))
}

/// Receive a Lark event.
///
/// Lark's event subscription webhook (schema 2.0). Answers the
/// `url_verification` challenge; decrypts `{"encrypt": …}` bodies (AES-256-CBC);
/// verifies `X-Lark-Signature` over the raw bytes (required when an encrypt key
/// is configured, except on the challenge, which Lark's SDKs verify by
/// decryption and token alone) and refuses timestamps more than 5 minutes from now; checks
/// the verification token in constant time. `im.message.receive_v1` text
/// messages (mentions resolved to `@name`) from a linked chat are enqueued with
/// `origin: "lark"` and `client_message_id` = the event id, and the 200 comes
/// only after the commit. Redeliveries are deduplicated durably by
/// `(app_id, event_id)`, with `message_id` as a second guard. Unlinked chats and
/// non-text messages are acknowledged and not enqueued. Anything unverified is
/// 401 and stores nothing; with the connector not configured, or receiving
/// its events over the long connection instead, 404. Texts over 64 KiB are
/// truncated with a visible note.
///
/// Permission answers: a text that is `yes <id>` or `no <id>` once its
/// @mentions are removed (the verb in any case, the id exactly as the request's
/// message showed it, blanks around and between ignored; nothing else may
/// follow) is an answer to the linked session's permission request `<id>`,
/// never a turn. From a sender whose open id is on the link's `approvers` it
/// answers the request (`answered_via: "lark"`); the same answer again changes
/// nothing, and another answer to an answered or expired request is ignored.
/// From anyone else, or naming an unknown request, it is acknowledged and
/// ignored, and nothing about it is said in the chat. One exception keeps
/// ordinary chat working: a `yes`/`no` followed by a word that names no request
/// of the session and is not of Claude Code's request-id form (five lowercase
/// letters, no `l`), such as `yes please`, is an ordinary message.
///
/// Card clicks (this route is also the app's callback URL): a permission
/// request in a linked session goes to its chat as an interactive card with
/// Allow / Deny buttons. A `card.action.trigger` callback for one of them
/// from an approver of the link, in the linked chat, answers the request
/// (`answered_via: "lark"`, the first answer wins) and the 200 body is Lark's
/// callback answer: `{"toast": {"type", "content"}, "card": {"type": "raw",
/// "data": <the card in its final form, no buttons>}}`. From anyone else:
/// only a `warning` toast, nothing changes. On a request answered or expired
/// before: an `info` toast and the final card. The same click again (its
/// event id): `{}`, nothing changes.
#[utoipa::path(post, path = "/v1/connectors/lark/events", operation_id = "larkEvents", tag = "lark",
    security(()),
    request_body(content = Object, description = "Lark's event body, as Lark sends it (plain or `{\"encrypt\"}`).", content_type = "application/json"),
    responses(
        (status = 200, description = "Acknowledged (committed): `{}`, a card click's callback answer (toast and card), or the challenge answer `{\"challenge\"}`.", body = Object),
        (status = 401, description = "`unauthorized`: the event failed verification.", body = ErrorBody),
        (status = 404, description = "`not_found`: the connector is not configured, or receives events over the long connection.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 429, description = "`queue_full`: Lark will redeliver.", body = ErrorBody),
    ))]
pub async fn events(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Result<Response> {
    let Some(config) = state
        .lark
        .clone()
        .filter(|c| c.events == EventMode::Webhook)
    else {
        return Err(Error::new(
            ErrorCode::NotFound,
            "The Lark webhook is off: the connector is not configured, or receives its events over the long connection.",
        ));
    };
    let envelope = match webhook::verify(&config, &headers, &body)? {
        Inbound::Challenge(challenge) => {
            return Ok(Json(json!({ "challenge": challenge })).into_response());
        }
        Inbound::Event(envelope) => envelope,
    };
    let answer = inbound::take(&state.broker, &config, envelope).await?;
    Ok(Json(answer).into_response())
}
