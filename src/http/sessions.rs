//! Sessions: bind, list, read, enqueue and close.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use super::{AppJson, AppPath, AppQuery, AppState, OptionalJson, replayed_header};
use crate::broker::BindAnswer;
use crate::error::{ErrorBody, Result};
use crate::model::{
    AgentNotification, BindPreview, BindRequest, CloseRequest, EnqueueRequest, Enqueued,
    ListSessions, ReportAgentState, Session, SessionList,
};

pub fn router() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/v1/sessions", post(bind).get(list))
        .route("/v1/sessions/{session_id}", get(read))
        .route("/v1/sessions/{session_id}/messages", post(enqueue))
        .route("/v1/sessions/{session_id}/close", post(close))
        .route("/v1/sessions/{session_id}/agent-state", post(agent_state))
        .route(
            "/v1/sessions/{session_id}/notifications",
            post(notification),
        )
}

/// Say the agent waits at its terminal (by the host).
///
/// The agent's own notification (Claude Code's `idle_prompt`: it waits for
/// input; `permission_prompt`: it asks to use a tool) becomes `event:
/// notification` with `{"state": kind}` on the session's event stream; its
/// text is never sent or stored. The host counts as heard from (presence).
/// 200 with the session projection. Order of checks: 404, 403
/// `host_mismatch`, 409 `session_closed`.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/notifications", operation_id = "notifyAgentWaiting", tag = "sessions",
    params(("session_id" = String, Path, description = "The session id.")),
    request_body = AgentNotification,
    responses(
        (status = 200, description = "Announced; the session.", body = Session),
        (status = 400, description = "`invalid_request`.", body = ErrorBody),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 403, description = "`host_mismatch`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
        (status = 409, description = "`session_closed`.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`.", body = ErrorBody),
    ))]
pub async fn notification(
    State(state): State<AppState>,
    AppPath(session_id): AppPath<String>,
    AppJson(notice): AppJson<AgentNotification>,
) -> Result<Json<Session>> {
    Ok(Json(state.broker.notify(&session_id, notice).await?))
}

/// Report the agent's state (by the host).
///
/// Presence: `working` while the agent runs a turn, `waiting` while it is
/// idle and attached, `away` when its session ended. The projection's `agent`
/// shows the last report and since when (`away` once no host has been heard
/// from for 10 minutes: a claim parked by the host counts as heard from, a
/// claim that takes a turn as `working`). Each change is announced on the
/// event stream as `event: agent`, the `away` of 10 silent minutes too (by
/// the broker, once); a report that changes nothing is not. 200
/// with the session projection. Order of checks: 404, 403 `host_mismatch`,
/// 409 `session_closed`.
///
/// One conversation: with `working`, `prompt` records what the person at
/// the agent's terminal submitted as a turn of `origin: "terminal"` (its
/// UserPromptSubmit hook), in its place by `seq` among the Web and Lark
/// turns; `answer` (the agent's last message, its Stop hook) completes it.
/// Such a turn is recorded `claimed` with no claim: it is never queued,
/// never claimable, and never delays a queued message. One still open when
/// the next prompt comes (the person interrupted the agent), or answered
/// blank, is cancelled `unanswered`; a close cancels it `session_closed`.
/// A `prompt` is 1 byte to 64 KiB, as a message's text; a session's
/// terminal may report 10 prompts at once and then 30 a minute (per broker
/// replica): beyond that, 429 `too_many_prompts` with `Retry-After`, and
/// nothing of the report is recorded (after 404, 403 and 409).
///
/// Stalled: a `working` agent with no report that names a state for the
/// broker's `--stall-after` (`LOOPX_STALL_AFTER`, default 10 minutes) is
/// announced `stalled` once (`event: agent`, the projection, the list); its
/// next report clears it. A waker's `typing_in` alone does not (it says
/// only that the process lives). A working agent does not go `away` by
/// silence; `stalled` is never reported by a host (400).
///
/// Time alone never releases a claimed turn: an agent may work on one for an
/// hour. The broker releases a claim only when its holder is gone: the host
/// reported `away` after the claim was made (a hook's `session-end`), or the
/// holder said `working` with its `claim_id` (a `loopx mcp` bridge does every
/// minute while it holds a turn) and has been silent since for the broker's
/// `--holder-silence` (`LOOPX_HOLDER_SILENCE`, default 5 minutes). The turn
/// goes back to the head of the queue with its attempt counted (`event: turn`
/// `released`), and a late completion from that claim is fenced (409
/// `claim_mismatch`). A claim whose holder never names it is released only by
/// its host, by an `away` report, or by the owner.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/agent-state", operation_id = "reportAgentState", tag = "sessions",
    params(("session_id" = String, Path, description = "The session id.")),
    request_body = ReportAgentState,
    responses(
        (status = 200, description = "The session, its `agent` as reported.", body = Session),
        (status = 400, description = "`invalid_request`.", body = ErrorBody),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 403, description = "`host_mismatch`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
        (status = 409, description = "`session_closed`.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`.", body = ErrorBody),
        (status = 429, description = "`too_many_prompts`: a `prompt` over the session's 10 at once and 30 a minute; nothing recorded.", body = ErrorBody,
            headers(("Retry-After" = String, description = "Seconds until a prompt fits again."))),
    ))]
pub async fn agent_state(
    State(state): State<AppState>,
    AppPath(session_id): AppPath<String>,
    AppJson(report): AppJson<ReportAgentState>,
) -> Result<Json<Session>> {
    Ok(Json(state.broker.report_agent(&session_id, report).await?))
}

/// Bind an attached session.
///
/// Binds a LoopX Chat session to a registered host session; it never starts,
/// resumes or replaces an agent runtime. Nothing is inferred or auto-registered:
/// the exact tuple must be registered (else 403 `not_registered`), and
/// `executor_endpoint_id` must differ from `agent_id` (else 400
/// `identity_conflated`). Binding the same tuple with the same executor
/// endpoint while the session is open answers 200 with that session; another
/// executor endpoint is 409 `session_exists`. After close, a bind makes a new
/// session. `dry_run: true` validates everything, writes nothing, and answers
/// 200 with a `BindPreview`.
#[utoipa::path(post, path = "/v1/sessions", operation_id = "bindSession", tag = "sessions",
    request_body = BindRequest,
    responses(
        (status = 201, description = "Bound: a new session.", body = Session),
        (status = 200, description = "The open session of this exact binding (`Idempotent-Replayed: true`), or with `dry_run`, the preview.", body = BindOrPreview),
        (status = 400, description = "`invalid_request` or `identity_conflated`.", body = ErrorBody),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 403, description = "`not_registered`.", body = ErrorBody),
        (status = 409, description = "`session_exists`.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`.", body = ErrorBody),
    ))]
pub async fn bind(
    State(state): State<AppState>,
    AppJson(request): AppJson<BindRequest>,
) -> Result<Response> {
    Ok(match state.broker.bind(request).await? {
        BindAnswer::Created(session) => (StatusCode::CREATED, Json(session)).into_response(),
        BindAnswer::Existing(session) => (replayed_header(true), Json(session)).into_response(),
        BindAnswer::Preview(preview) => Json(preview).into_response(),
    })
}

/// The 200 answer of a bind: the existing session, or a dry run's preview.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub(crate) enum BindOrPreview {
    Session(Session),
    Preview(BindPreview),
}

/// List sessions.
///
/// Content-free projections, oldest first, filtered by `state`, `goal_id` and
/// `agent_id`. Pass `next_cursor` back as `cursor` for the next page. No host
/// session id, message text, claim or completion id appears here.
#[utoipa::path(get, path = "/v1/sessions", operation_id = "listSessions", tag = "sessions",
    params(ListSessions),
    responses(
        (status = 200, description = "A page of sessions.", body = SessionList),
        (status = 400, description = "`invalid_request`.", body = ErrorBody),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
    ))]
pub async fn list(
    State(state): State<AppState>,
    AppQuery(filter): AppQuery<ListSessions>,
) -> Result<Json<SessionList>> {
    Ok(Json(state.broker.sessions(filter).await?))
}

/// Read a session.
///
/// The content-free projection of one session.
#[utoipa::path(get, path = "/v1/sessions/{session_id}", operation_id = "getSession", tag = "sessions",
    params(("session_id" = String, Path, description = "The session id (`ses_…`).")),
    responses(
        (status = 200, description = "The session.", body = Session),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
    ))]
pub async fn read(
    State(state): State<AppState>,
    AppPath(session_id): AppPath<String>,
) -> Result<Json<Session>> {
    Ok(Json(state.broker.session(&session_id).await?))
}

/// Enqueue a message.
///
/// Appends a Web or Lark message to the session's one ordered queue; `seq` is
/// 1, 2, 3, … in commit order. A 201 means the turn is committed.
/// `client_message_id` makes the enqueue idempotent for the life of the
/// session: the same id with the same body answers 200 with the same turn,
/// `duplicate: true` and `Idempotent-Replayed: true` (the `state` is the turn's
/// state now); with another body, 422 `idempotency_key_reused`. `text` is 1
/// byte to 64 KiB (400 beyond). `lark` is only allowed with `origin: "lark"`;
/// `origin: "terminal"` is refused (400): a turn typed at the agent's
/// terminal is recorded by its host (`agent-state`'s `prompt`), never queued.
/// Conflicts, in this order: 409 `session_closed` (also for a replay), 422
/// `idempotency_key_reused`, 409 `live_steering_unavailable` (never silently
/// queued instead), 429 `queue_full` (10,000 queued turns).
#[utoipa::path(post, path = "/v1/sessions/{session_id}/messages", operation_id = "enqueueMessage", tag = "turns",
    params(("session_id" = String, Path, description = "The session id.")),
    request_body = EnqueueRequest,
    responses(
        (status = 201, description = "Queued.", body = Enqueued),
        (status = 200, description = "A replay of the same `client_message_id` and body.", body = Enqueued),
        (status = 400, description = "`invalid_request`.", body = ErrorBody),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
        (status = 409, description = "`session_closed` or `live_steering_unavailable`.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`.", body = ErrorBody),
        (status = 422, description = "`idempotency_key_reused`.", body = ErrorBody),
        (status = 429, description = "`queue_full`.", body = ErrorBody),
    ))]
pub async fn enqueue(
    State(state): State<AppState>,
    AppPath(session_id): AppPath<String>,
    AppJson(message): AppJson<EnqueueRequest>,
) -> Result<Response> {
    let answer = state.broker.enqueue(&session_id, message).await?;
    let status = if answer.replayed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, replayed_header(answer.replayed), Json(answer.body)).into_response())
}

/// Close a session.
///
/// Queued turns become `cancelled` (`cancel_reason: "session_closed"`); claims
/// parked on the session answer 409 `session_closed`; enqueue and claim then
/// answer 409 `session_closed`, and reads still work. A session with an active
/// claim cannot be closed: 409 `claim_active` with `active_claim_id` and
/// `claimed_at` (complete or release it first; the owner can release it with
/// `{"by": "owner"}`). Or close in one step with `{"release_active_claim":
/// true}`: the active claim is released (its turn back in the queue, its
/// attempt counted, a late completion from its host fenced with 409
/// `claim_mismatch` or `not_claimed`) and its turn cancelled with the queued
/// ones, in one transaction. Closing a closed session answers the same
/// projection. Takes an empty body, `{}`, or `{"release_active_claim": true}`.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/close", operation_id = "closeSession", tag = "sessions",
    params(("session_id" = String, Path, description = "The session id.")),
    request_body(content = CloseRequest, description = "Optional: empty, `{}`, or `{\"release_active_claim\": true}`.", content_type = "application/json"),
    responses(
        (status = 200, description = "The closed session.", body = Session),
        (status = 400, description = "`invalid_request`.", body = ErrorBody),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
        (status = 409, description = "`claim_active`, with `active_claim_id` and `claimed_at`.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`.", body = ErrorBody),
    ))]
pub async fn close(
    State(state): State<AppState>,
    AppPath(session_id): AppPath<String>,
    OptionalJson(request): OptionalJson<CloseRequest>,
) -> Result<Json<Session>> {
    Ok(Json(state.broker.close(&session_id, request).await?))
}
