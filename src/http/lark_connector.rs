//! `GET /v1/connectors/lark`: how the Lark connector receives events and, over
//! the long connection, whether it is connected.

use axum::Json;
use axum::extract::State;
use axum::routing::get;

use super::AppState;
use crate::error::{ErrorBody, Result};
use crate::lark::EventMode;
use crate::model::{LarkConnector, LarkEvents};

pub fn router() -> axum::Router<AppState> {
    axum::Router::new().route("/v1/connectors/lark", get(status))
}

/// Read the Lark connector's state.
///
/// `events` is `off` (not configured), `webhook` or `long_connection`. Over
/// the long connection, `state` is `connecting`, `connected`, `retrying`
/// (with the `reason`: a lost or refused connection, or a connector that
/// failed and is restarted; it is tried again for as long as the broker
/// runs, backing off from 1 s to about 2 min while tries keep failing),
/// `fatal` (Lark refused the app for good, e.g. bad credentials, the wrong
/// region or a 403: the connector stopped, the rest of the broker serves on;
/// `reason` says what to fix) or `stopped` (shutting down), `since` when it
/// got there; with the webhook both are null. `reconnects` counts the
/// connections lost or refused since the broker started.
#[utoipa::path(get, path = "/v1/connectors/lark", operation_id = "getLarkConnector", tag = "lark",
    responses(
        (status = 200, description = "The connector's state.", body = LarkConnector),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
    ))]
pub async fn status(State(state): State<AppState>) -> Result<Json<LarkConnector>> {
    let events = match state.lark.as_ref().map(|lark| lark.events) {
        None => LarkEvents::Off,
        Some(EventMode::Webhook) => LarkEvents::Webhook,
        Some(EventMode::LongConnection) => LarkEvents::LongConnection,
    };
    Ok(Json(match &state.lark_connector {
        Some(status) => status.snapshot(),
        None => LarkConnector {
            events,
            state: None,
            reason: None,
            since: None,
            reconnects: 0,
        },
    }))
}
