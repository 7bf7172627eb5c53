//! Permission requests: the host records its agent CLI's tool-approval
//! dialogs, the owner (or a Lark approver) answers once, the host waits
//! parked for the answer.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use super::{AppJson, AppPath, AppQuery, AppState, replayed_header};
use crate::error::{ErrorBody, Result};
use crate::model::{
    AnswerPermission, AnsweredVia, CreatePermissionRequest, ListPermissions, PermissionList,
    PermissionRequest, RelayedPermission, WaitPermission, WithdrawPermission,
};

pub fn router() -> axum::Router<AppState> {
    axum::Router::new()
        .route(
            "/v1/sessions/{session_id}/permission-requests",
            post(create).get(list),
        )
        .route(
            "/v1/sessions/{session_id}/permission-requests/{request_id}",
            get(read),
        )
        .route(
            "/v1/sessions/{session_id}/permission-requests/{request_id}/answer",
            post(answer),
        )
        .route(
            "/v1/sessions/{session_id}/permission-requests/{request_id}/wait",
            post(wait),
        )
        .route(
            "/v1/sessions/{session_id}/permission-requests/{request_id}/relayed",
            post(relayed),
        )
        .route(
            "/v1/sessions/{session_id}/permission-requests/{request_id}/withdraw",
            post(withdraw),
        )
}

/// Withdraw an unanswered request (by the host).
///
/// Nobody answered in time: the agent asks at its terminal instead, so no
/// card stays open; or (`answered_at_terminal: true`) the person answered at
/// the agent's terminal first, recorded as `answered_via: "terminal"`, so
/// the cards say so and a late answer from the phone is refused. A pending
/// request becomes `expired` (announced as
/// `event: permission`); 200 with the request. Again: 200 with
/// `Idempotent-Replayed: true` (also for a request its session's close
/// expired). Order of checks: 404 (session, then request), 403
/// `host_mismatch`, then 409 `permission_already_answered` with the request's
/// `state` inside `error` when it was answered first (the host uses that
/// answer after all).
#[utoipa::path(post, path = "/v1/sessions/{session_id}/permission-requests/{request_id}/withdraw", operation_id = "withdrawPermissionRequest", tag = "permissions",
    params(
        ("session_id" = String, Path, description = "The session id."),
        ("request_id" = String, Path, description = "The request id."),
    ),
    request_body = WithdrawPermission,
    responses(
        (status = 200, description = "The request, expired (`Idempotent-Replayed: true` when it already was).", body = PermissionRequest),
        (status = 400, description = "`invalid_request`.", body = ErrorBody),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 403, description = "`host_mismatch`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
        (status = 409, description = "`permission_already_answered`, with `state`.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`.", body = ErrorBody),
    ))]
pub async fn withdraw(
    State(state): State<AppState>,
    AppPath((session_id, request_id)): AppPath<(String, String)>,
    AppJson(host): AppJson<WithdrawPermission>,
) -> Result<Response> {
    let answer = state
        .broker
        .withdraw_permission(&session_id, &request_id, host)
        .await?;
    Ok((replayed_header(answer.replayed), Json(answer.body)).into_response())
}

/// Record a permission request (by the host).
///
/// The host bridge relays what its agent CLI stops to ask (HOOKS.md "Every
/// blocking prompt"): a tool's use (`kind: "tool"`, with the agent's "always
/// allow" `suggestions`, at most 8), its questions (`question`: 1 to 4
/// `questions` of 1 to 8 `options` each) or its plan (`plan`: Markdown, up
/// to 64 KiB). Each kind takes its own fields only (400 otherwise); all of
/// them are content, like message text. The request is recorded `pending` on the session,
/// shown on the Web page and sent to a linked Lark chat, and announced on the
/// event stream as `event: permission`. `request_id` is unique per session:
/// the same `request_id` with the same body again answers 200 with
/// `Idempotent-Replayed: true` (also once the session is closed); with another
/// body, 422 `idempotency_key_reused`. `description` and `input_preview` (up
/// to 64 KiB each) are content, kept like message text: never logged, never
/// in projections or metrics. Order of checks: 404, 403 `host_mismatch`, a
/// replay, 422 `idempotency_key_reused`, 409 `session_closed`.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/permission-requests", operation_id = "createPermissionRequest", tag = "permissions",
    params(("session_id" = String, Path, description = "The session id.")),
    request_body = CreatePermissionRequest,
    responses(
        (status = 201, description = "Recorded, pending.", body = PermissionRequest),
        (status = 200, description = "The same request again (`Idempotent-Replayed: true`).", body = PermissionRequest),
        (status = 400, description = "`invalid_request`.", body = ErrorBody),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 403, description = "`host_mismatch`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
        (status = 409, description = "`session_closed`.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`.", body = ErrorBody),
        (status = 422, description = "`idempotency_key_reused`.", body = ErrorBody),
    ))]
pub async fn create(
    State(state): State<AppState>,
    AppPath(session_id): AppPath<String>,
    AppJson(request): AppJson<CreatePermissionRequest>,
) -> Result<Response> {
    let answer = state.broker.create_permission(&session_id, request).await?;
    let status = if answer.replayed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, replayed_header(answer.replayed), Json(answer.body)).into_response())
}

/// List permission requests.
///
/// The session's permission requests, pending first, then newest first (at
/// most 200: every pending one, then the latest answered ones). `state`
/// filters; `?state=pending` is what a restarted host bridge waits for again.
#[utoipa::path(get, path = "/v1/sessions/{session_id}/permission-requests", operation_id = "listPermissionRequests", tag = "permissions",
    params(("session_id" = String, Path, description = "The session id."), ListPermissions),
    responses(
        (status = 200, description = "The requests.", body = PermissionList),
        (status = 400, description = "`invalid_request`.", body = ErrorBody),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
    ))]
pub async fn list(
    State(state): State<AppState>,
    AppPath(session_id): AppPath<String>,
    AppQuery(filter): AppQuery<ListPermissions>,
) -> Result<Json<PermissionList>> {
    Ok(Json(state.broker.permissions(&session_id, filter).await?))
}

/// Read a permission request.
#[utoipa::path(get, path = "/v1/sessions/{session_id}/permission-requests/{request_id}", operation_id = "getPermissionRequest", tag = "permissions",
    params(
        ("session_id" = String, Path, description = "The session id."),
        ("request_id" = String, Path, description = "The request id."),
    ),
    responses(
        (status = 200, description = "The request.", body = PermissionRequest),
        (status = 400, description = "`invalid_request`.", body = ErrorBody),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
    ))]
pub async fn read(
    State(state): State<AppState>,
    AppPath((session_id, request_id)): AppPath<(String, String)>,
) -> Result<Json<PermissionRequest>> {
    Ok(Json(
        state.broker.permission(&session_id, &request_id).await?,
    ))
}

/// Answer a permission request (the owner).
///
/// `allow` or `deny`; recorded with `answered_via: "owner"`. What the request
/// asks decides what else the answer carries (HOOKS.md "Every blocking
/// prompt"): a `question` is allowed only with `answers`, one for each of its
/// questions (the chosen labels joined with ", ", or the person's own words);
/// a `tool` request may be allowed with `suggestion`, the index of one of its
/// "always allow" `suggestions`; a `plan` is allowed with `mode`
/// (`accept_edits` or `default`, the default) or denied with `message`, the
/// feedback the agent reads; any denial may carry `message`. An answer that
/// does not fit the request is 422 `invalid_request` and changes nothing.
/// The first answer wins and is final: the same answer again answers 200
/// with `Idempotent-Replayed: true`; another answer to an answered request,
/// or any answer to an expired one (its session closed, its host withdrew it,
/// or the person answered at the agent's terminal first: `answered_via:
/// "terminal"`), is 409 `permission_already_answered` with the request's
/// `state` inside `error`. Unknown session or request: 404. Order: 404, 422,
/// 409.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/permission-requests/{request_id}/answer", operation_id = "answerPermissionRequest", tag = "permissions",
    params(
        ("session_id" = String, Path, description = "The session id."),
        ("request_id" = String, Path, description = "The request id."),
    ),
    request_body = AnswerPermission,
    responses(
        (status = 200, description = "The answered request (`Idempotent-Replayed: true` on the same answer again).", body = PermissionRequest),
        (status = 400, description = "`invalid_request`.", body = ErrorBody),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
        (status = 409, description = "`permission_already_answered`, with `state`.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`.", body = ErrorBody),
        (status = 422, description = "`invalid_request`: the answer does not fit the request (a question without an answer for each question, a suggestion it does not offer, a mode for anything but a plan).", body = ErrorBody),
    ))]
pub async fn answer(
    State(state): State<AppState>,
    AppPath((session_id, request_id)): AppPath<(String, String)>,
    AppJson(answer): AppJson<AnswerPermission>,
) -> Result<Response> {
    let answer = state
        .broker
        .answer_permission(&session_id, &request_id, answer, AnsweredVia::Owner)
        .await?;
    Ok((replayed_header(answer.replayed), Json(answer.body)).into_response())
}

/// Record that the answer reached the agent (by the host).
///
/// The host that made the request says it relayed the answer to its agent:
/// `relayed_at` is set once (200 with the request); again: 200 with
/// `Idempotent-Replayed: true` and the first `relayed_at`. A host that
/// restarts relays every answered request whose `relayed_at` is null, so an
/// answer given while it was away still reaches the agent, once. In this
/// order: 404, 403 `host_mismatch`, 404 for an unknown request, 409
/// `permission_not_answered` (with `state`) for a pending or expired request.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/permission-requests/{request_id}/relayed", operation_id = "relayedPermissionRequest", tag = "permissions",
    params(
        ("session_id" = String, Path, description = "The session id."),
        ("request_id" = String, Path, description = "The request id."),
    ),
    request_body = RelayedPermission,
    responses(
        (status = 200, description = "The request, with `relayed_at` (`Idempotent-Replayed: true` when it was set before).", body = PermissionRequest),
        (status = 400, description = "`invalid_request`.", body = ErrorBody),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 403, description = "`host_mismatch`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
        (status = 409, description = "`permission_not_answered`, with `state`.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`.", body = ErrorBody),
    ))]
pub async fn relayed(
    State(state): State<AppState>,
    AppPath((session_id, request_id)): AppPath<(String, String)>,
    AppJson(relayed): AppJson<RelayedPermission>,
) -> Result<Response> {
    let answer = state
        .broker
        .relayed_permission(&session_id, &request_id, relayed)
        .await?;
    Ok((replayed_header(answer.replayed), Json(answer.body)).into_response())
}

/// Wait for the answer (by the host).
///
/// Parks, spending no CPU, until the request is answered or expires (then 200
/// with it: its `state` says which), or until `wait_seconds` (capped at 1800)
/// pass or the broker shuts down (then 200 with the request still `pending`:
/// wait again). Long-poll clients must set their HTTP timeout above
/// `wait_seconds`. Order of checks: 404, 403 `host_mismatch`.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/permission-requests/{request_id}/wait", operation_id = "waitPermissionRequest", tag = "permissions",
    params(
        ("session_id" = String, Path, description = "The session id."),
        ("request_id" = String, Path, description = "The request id."),
    ),
    request_body = WaitPermission,
    responses(
        (status = 200, description = "The request: answered, expired, or still pending at the deadline.", body = PermissionRequest),
        (status = 400, description = "`invalid_request`.", body = ErrorBody),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 403, description = "`host_mismatch`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`.", body = ErrorBody),
    ))]
pub async fn wait(
    State(state): State<AppState>,
    AppPath((session_id, request_id)): AppPath<(String, String)>,
    AppJson(wait): AppJson<WaitPermission>,
) -> Result<Json<PermissionRequest>> {
    Ok(Json(
        state
            .broker
            .wait_permission(&session_id, &request_id, wait)
            .await?,
    ))
}
