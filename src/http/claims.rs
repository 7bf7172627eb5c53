//! Claims: take the oldest queued turn (optionally parked, as long-poll or
//! Server-Sent Events) and release it.

use std::convert::Infallible;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures_util::stream::{self, BoxStream, StreamExt};

use super::{AppJson, AppPath, AppState, replayed_header};
use crate::broker::Answer;
use crate::error::{Error, ErrorBody, Result};
use crate::metrics::Open;
use crate::model::{
    ClaimAnswer, ClaimRequest, ReleaseRequest, Released, register, sse_event, sse_stream,
};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::Schema;
use utoipa::{PartialSchema, ToSchema};

pub fn router() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/v1/sessions/{session_id}/claims", post(claim))
        .route(
            "/v1/sessions/{session_id}/claims/{claim_id}/release",
            post(release),
        )
}

/// Claim the oldest queued turn.
///
/// Claims the oldest queued turn for `claim_id`. Duplicate-safe and durable: the
/// same `claim_id` again on this session answers the same turn whatever its
/// state now (`turn_state`), also after a restart, with `Idempotent-Replayed:
/// true`; a claim id whose turn was released is spent (409 `claim_released`);
/// one used on another session is 409 `claim_id_reused`. `attempt` counts the
/// claims the turn has had.
///
/// `wait_seconds` (capped at 1800) parks the request while the queue is empty,
/// spending no CPU, and wakes as soon as a turn is committed; on timeout (or
/// broker shutdown) it answers `claimed: false` and stores nothing. A session
/// closed while waiting answers 409 `session_closed`; a waiter beaten to the
/// turn by another claim answers 409 `claim_active`. Long-poll clients must set
/// their HTTP timeout above `wait_seconds`.
///
/// A turn from Lark that carries files (an image, a file, a post with
/// pictures) is in the queue from the moment Lark's event is committed, but
/// is handed out only once its files are downloaded and stored, or have
/// failed for good (each failure a line of its text): until then the queue
/// counts as empty for claims, and no turn behind it is handed out before
/// it. When its files are in, the session's event log has the turn `queued`
/// once more, and a parked claim wakes.
///
/// The two modes are one operation chosen by `Accept`, each media type with its
/// own schema. Without `text/event-stream` in `Accept` the answer is
/// `application/json`, a `ClaimAnswer` (a typed client that only speaks JSON,
/// e.g. openapi-fetch's `createClient<paths, "application/json">`, sees just
/// that type). With `Accept: text/event-stream` the answer is a Server-Sent
/// Events stream (`ClaimEventStream`): a comment every 15 s while parked, then
/// one `event: claim` whose data is the JSON answer (or one `event: error` with
/// the error body if the session closes while parked), then the stream ends.
/// Errors found before the stream starts are plain JSON errors. Order of checks: 404, 403 `host_mismatch`, a replay of
/// this claim id, 409 `claim_id_reused`, 409 `session_closed`, 409 `claim_active`.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/claims", operation_id = "claimTurn", tag = "turns",
    params(("session_id" = String, Path, description = "The session id.")),
    request_body = ClaimRequest,
    responses(
        (status = 200, description = "The claimed turn, or `claimed: false` after a wait.",
            content((ClaimAnswer = "application/json"), (ClaimEventStream = "text/event-stream"))),
        (status = 400, description = "`invalid_request`.", body = ErrorBody),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 403, description = "`host_mismatch`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
        (status = 409, description = "`claim_released`, `claim_id_reused`, `session_closed` or `claim_active` (with `active_claim_id` and `claimed_at`).", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`.", body = ErrorBody),
    ))]
pub async fn claim(
    State(state): State<AppState>,
    AppPath(session_id): AppPath<String>,
    headers: HeaderMap,
    AppJson(request): AppJson<ClaimRequest>,
) -> Result<Response> {
    // Decided now and the headers let go: their values share hyper's read
    // buffer, which a parked claim would otherwise pin (8 KiB per connection).
    let event_stream = wants_event_stream(&headers);
    drop(headers);
    if !event_stream {
        let answer = state.broker.claim(&session_id, request).await?;
        return Ok((replayed_header(answer.replayed), Json(answer.body)).into_response());
    }
    // Errors before the stream starts are plain JSON errors: try once without waiting.
    let wait_seconds = request.wait_seconds;
    let first = state
        .broker
        .claim(
            &session_id,
            ClaimRequest {
                wait_seconds: 0,
                ..request.clone()
            },
        )
        .await?;
    let replayed = first.replayed;
    let events: BoxStream<'static, Result<Event, Infallible>> = match first.body {
        ClaimAnswer::NotClaimed(_) if wait_seconds > 0 => {
            let broker = state.broker.clone();
            let open = Open::new(&broker.metrics().sse_streams);
            stream::once(async move {
                let answer = broker.claim(&session_id, request).await;
                drop(open);
                Ok(claim_event(answer))
            })
            .boxed()
        }
        _ => stream::once(async move { Ok(claim_event(Ok(first))) }).boxed(),
    };
    let sse = Sse::new(events).keep_alive(KeepAlive::new().interval(state.keep_alive));
    Ok((
        [(
            HeaderName::from_static("x-accel-buffering"),
            HeaderValue::from_static("no"),
        )],
        replayed_header(replayed),
        sse,
    )
        .into_response())
}

fn wants_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/event-stream"))
}

fn claim_event(answer: Result<Answer<ClaimAnswer>, Error>) -> Event {
    let (name, data) = match answer {
        Ok(answer) => ("claim", serde_json::to_string(&answer.body)),
        Err(error) => ("error", serde_json::to_string(&error.body())),
    };
    Event::default().event(name).data(data.unwrap_or_default())
}

/// Release a claim.
///
/// Returns a claimed, uncompleted turn to the head of the queue (same `seq`,
/// its attempt counted: the next claim is attempt + 1), so a host that cannot
/// answer never strands it. By the host (`host_surface` and
/// `host_session_id`, else 403 `host_mismatch`), or by the owner with
/// `{"by": "owner"}` and no host identity, so the owner can always free a
/// session whose agent is gone (find the claim id in a `claim_active`
/// refusal). Anything else (both, neither, half a host identity) is 400
/// `invalid_request`. The released claim id is spent: a late completion from
/// it is refused (409 `not_claimed` or `claim_mismatch`). Idempotent:
/// releasing a released claim answers the same. 409 `already_completed` for a
/// completed turn; 404 for a claim id unknown on this session.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/claims/{claim_id}/release", operation_id = "releaseClaim", tag = "turns",
    params(
        ("session_id" = String, Path, description = "The session id."),
        ("claim_id" = String, Path, description = "The claim to release."),
    ),
    request_body = ReleaseRequest,
    responses(
        (status = 200, description = "Released.", body = Released),
        (status = 400, description = "`invalid_request`.", body = ErrorBody),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 403, description = "`host_mismatch`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
        (status = 409, description = "`already_completed`.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`.", body = ErrorBody),
    ))]
pub async fn release(
    State(state): State<AppState>,
    AppPath((session_id, claim_id)): AppPath<(String, String)>,
    AppJson(by): AppJson<ReleaseRequest>,
) -> Result<Json<Released>> {
    Ok(Json(
        state.broker.release(&session_id, &claim_id, by).await?,
    ))
}

/// The `text/event-stream` answer of a claim.
pub struct ClaimEventStream;

impl PartialSchema for ClaimEventStream {
    fn schema() -> RefOr<Schema> {
        sse_stream(
            "A claim answered as Server-Sent Events: a comment line every 15 s while the \
             claim is parked, then exactly one event, then the stream ends.",
            vec![
                sse_event::<ClaimAnswer>(
                    "claim",
                    false,
                    "The claim's answer, as the JSON mode answers it.",
                ),
                sse_event::<ErrorBody>(
                    "error",
                    false,
                    "The session closed while the claim was parked.",
                ),
            ],
        )
    }
}

impl ToSchema for ClaimEventStream {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        register::<ClaimAnswer>(schemas);
        register::<ErrorBody>(schemas);
    }
}
