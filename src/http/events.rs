//! `GET /v1/sessions/{session_id}/events`: the session's durable event log as
//! Server-Sent Events.

use std::convert::Infallible;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::StreamExt;

use super::{AppPath, AppState};
use crate::error::{Error, ErrorBody, Result};
use crate::model::{
    AgentEventData, NotificationEventData, PermissionEventData, SessionEventData, TurnEventData,
    register, sse_event, sse_stream,
};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::Schema;
use utoipa::{PartialSchema, ToSchema};

pub fn router() -> axum::Router<AppState> {
    axum::Router::new().route("/v1/sessions/{session_id}/events", get(events))
}

/// Stream a session's events.
///
/// Every change to the session, in order, from a durable log written in the
/// same transaction as the change: `event: turn` with data `{"turn_id", "seq",
/// "state"}` (state `queued`, `claimed`, `completed`, `released` or
/// `cancelled`), `event: permission` with `{"request_id", "state"}`, `event:
/// agent` with `{"state", "since"}` when the agent's presence changes
/// (`working`, `waiting`, `away`), `event: notification` with `{"state"}`
/// when the agent waits at its terminal (`idle_prompt`, `permission_prompt`),
/// and `event: session` with `{"state": "closed"}`. Each event
/// carries `id:`, the per-session event number 1, 2, 3, …; reconnecting with
/// `Last-Event-ID: n` replays exactly the events after n, nothing twice, also
/// across a broker restart. Without `Last-Event-ID` the stream starts from now;
/// `Last-Event-ID: 0` replays the whole log. Events are content-free: read the
/// turn for its text. A comment line every 15 s keeps proxies open. The stream
/// ends after the session's `closed` event (at once for a closed session whose
/// log the client has seen) and when the broker shuts down.
/// A client that reads slowly is served from the log at its own pace: the
/// broker holds at most one small page of events per stream.
#[utoipa::path(get, path = "/v1/sessions/{session_id}/events", operation_id = "streamSessionEvents", tag = "sessions",
    params(
        ("session_id" = String, Path, description = "The session id."),
        ("Last-Event-ID" = Option<i64>, Header, description = "Resume after this event number (0: from the first event)."),
    ),
    responses(
        (status = 200, description = "The event stream.", content_type = "text/event-stream", body = SessionEventStream),
        (status = 400, description = "`invalid_request` (a Last-Event-ID that is not a number).", body = ErrorBody),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
    ))]
pub async fn events(
    State(state): State<AppState>,
    AppPath(session_id): AppPath<String>,
    headers: HeaderMap,
) -> Result<Response> {
    let last_event_id = match headers.get("last-event-id") {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse::<i64>().ok())
                .filter(|n| *n >= 0)
                .ok_or_else(|| {
                    Error::invalid("`Last-Event-ID` must be an event number, 0 or more.")
                })?,
        ),
    };
    let start = state
        .broker
        .events_start(&session_id, last_event_id)
        .await?;
    let stream = state.broker.events(session_id, start).map(|event| {
        Ok::<_, Infallible>(
            Event::default()
                .id(event.id.to_string())
                .event(event.name)
                .data(event.data.to_string()),
        )
    });
    Ok((
        [(
            HeaderName::from_static("x-accel-buffering"),
            HeaderValue::from_static("no"),
        )],
        Sse::new(stream).keep_alive(KeepAlive::new().interval(state.keep_alive)),
    )
        .into_response())
}

/// The `text/event-stream` answer of a session's event stream.
pub struct SessionEventStream;

impl PartialSchema for SessionEventStream {
    fn schema() -> RefOr<Schema> {
        sse_stream(
            "The session's event log as Server-Sent Events, in order; a comment line every \
             15 s keeps proxies open.",
            vec![
                sse_event::<TurnEventData>(
                    "turn",
                    true,
                    "A turn was queued, claimed, completed, released or cancelled.",
                ),
                sse_event::<PermissionEventData>(
                    "permission",
                    true,
                    "A permission request was made, answered or expired.",
                ),
                sse_event::<AgentEventData>(
                    "agent",
                    true,
                    "The session's agent presence changed (working, waiting, away).",
                ),
                sse_event::<NotificationEventData>(
                    "notification",
                    true,
                    "The agent waits for someone at its terminal (its text is not stored).",
                ),
                sse_event::<SessionEventData>(
                    "session",
                    true,
                    "The session closed; the stream then ends.",
                ),
            ],
        )
    }
}

impl ToSchema for SessionEventStream {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        register::<TurnEventData>(schemas);
        register::<PermissionEventData>(schemas);
        register::<AgentEventData>(schemas);
        register::<NotificationEventData>(schemas);
        register::<SessionEventData>(schemas);
    }
}
