//! `POST /v1/agent-threads`: register an exact host session.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;

use super::{AppJson, AppState, replayed_header};
use crate::error::{ErrorBody, Result};
use crate::model::{RegisterAgentThread, Registered};

pub fn router() -> axum::Router<AppState> {
    axum::Router::new().route("/v1/agent-threads", post(register))
}

/// Register an agent thread.
///
/// Records that the exact (goal, agent, host surface, host session) exists: the
/// prerequisite of every bind. 201 on first registration, 200 when the exact
/// tuple is already registered. The answer never carries the host session id.
#[utoipa::path(post, path = "/v1/agent-threads", operation_id = "registerAgentThread", tag = "sessions",
    request_body = RegisterAgentThread,
    responses(
        (status = 201, description = "Registered.", body = Registered),
        (status = 200, description = "Already registered (`Idempotent-Replayed: true`).", body = Registered),
        (status = 400, description = "`invalid_request`.", body = ErrorBody),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`.", body = ErrorBody),
    ))]
pub async fn register(
    State(state): State<AppState>,
    AppJson(thread): AppJson<RegisterAgentThread>,
) -> Result<Response> {
    let answer = state.broker.register(thread).await?;
    let status = if answer.replayed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, replayed_header(answer.replayed), Json(answer.body)).into_response())
}
