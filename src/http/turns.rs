//! Turns: complete a claimed turn, and the content-bearing readback.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use super::{AppJson, AppPath, AppQuery, AppState, replayed_header};
use crate::error::{ErrorBody, Result};
use crate::model::{CompleteRequest, ListTurns, Receipt, Turn, TurnList};

pub fn router() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/v1/sessions/{session_id}/turns", get(list))
        .route("/v1/sessions/{session_id}/turns/{turn_id}", get(read))
        .route(
            "/v1/sessions/{session_id}/turns/{turn_id}/complete",
            post(complete),
        )
}

/// Complete a claimed turn.
///
/// Records the host's response (a JSON object with a non-empty string
/// `message`, up to 1 MiB; other fields kept as given) and answers a receipt
/// once it is committed. Duplicate-safe: the same `completion_id` with the same
/// claim and response answers the same receipt with `replayed: true` and
/// `Idempotent-Replayed: true`; with another claim, turn or response, 422
/// `idempotency_key_reused`. Fenced by the claim, in this order after the
/// replay: 409 `already_completed` (another completion id), 409 `not_claimed`
/// (queued or cancelled), 409 `claim_mismatch` (held by another claim id,
/// including a released one). A late completion from a released claim never
/// overwrites anything.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/turns/{turn_id}/complete", operation_id = "completeTurn", tag = "turns",
    params(
        ("session_id" = String, Path, description = "The session id."),
        ("turn_id" = String, Path, description = "The claimed turn."),
    ),
    request_body = CompleteRequest,
    responses(
        (status = 200, description = "The completion receipt (`replayed: true` on a replay).", body = Receipt),
        (status = 400, description = "`invalid_request`.", body = ErrorBody),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 403, description = "`host_mismatch`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
        (status = 409, description = "`already_completed`, `not_claimed` or `claim_mismatch`.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`.", body = ErrorBody),
        (status = 422, description = "`idempotency_key_reused`.", body = ErrorBody),
    ))]
pub async fn complete(
    State(state): State<AppState>,
    AppPath((session_id, turn_id)): AppPath<(String, String)>,
    AppJson(completion): AppJson<CompleteRequest>,
) -> Result<Response> {
    let answer = state
        .broker
        .complete(&session_id, &turn_id, completion)
        .await?;
    Ok((replayed_header(answer.replayed), Json(answer.body)).into_response())
}

/// Read a turn.
///
/// The content-bearing readback: text, state, times and, once completed, the
/// response.
#[utoipa::path(get, path = "/v1/sessions/{session_id}/turns/{turn_id}", operation_id = "getTurn", tag = "turns",
    params(
        ("session_id" = String, Path, description = "The session id."),
        ("turn_id" = String, Path, description = "The turn id."),
    ),
    responses(
        (status = 200, description = "The turn.", body = Turn),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
    ))]
pub async fn read(
    State(state): State<AppState>,
    AppPath((session_id, turn_id)): AppPath<(String, String)>,
) -> Result<Json<Turn>> {
    Ok(Json(state.broker.turn(&session_id, &turn_id).await?))
}

/// List turns.
///
/// A page of the session's turns in `seq` order. `after_seq` pages forward;
/// `before_seq` alone pages back (the `limit` turns just before it, still in
/// `seq` order, `has_more` telling whether older ones exist); both together
/// bound a range.
#[utoipa::path(get, path = "/v1/sessions/{session_id}/turns", operation_id = "listTurns", tag = "turns",
    params(("session_id" = String, Path, description = "The session id."), ListTurns),
    responses(
        (status = 200, description = "A page of turns.", body = TurnList),
        (status = 400, description = "`invalid_request`.", body = ErrorBody),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
    ))]
pub async fn list(
    State(state): State<AppState>,
    AppPath(session_id): AppPath<String>,
    AppQuery(page): AppQuery<ListTurns>,
) -> Result<Json<TurnList>> {
    Ok(Json(state.broker.turns(&session_id, page).await?))
}
