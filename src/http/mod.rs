//! The HTTP face of the broker: `router(state)` builds the app, `serve` runs
//! it until the shutdown token fires. Handlers live one file per resource and
//! hand their work to the [`Broker`]; this module owns what every route shares:
//! the owner-token check, the JSON extractors whose rejections are the
//! contract's errors, the fallbacks, and the request log.

pub(crate) mod agent_threads;
pub mod attachments;
pub(crate) mod changes;
pub(crate) mod claims;
pub(crate) mod devices;
pub(crate) mod events;
pub(crate) mod lark_connector;
pub(crate) mod lark_events;
pub(crate) mod lark_links;
pub(crate) mod permissions;
pub(crate) mod push;
pub mod server;
pub(crate) mod sessions;
pub(crate) mod turns;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use subtle::ConstantTimeEq;
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use tracing::Level;

use crate::broker::Broker;
use crate::devices::Caller;
use crate::error::{Error, ErrorCode, Result};
use crate::model::Health;

pub use crate::broker::MAX_BODY_BYTES;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    pub broker: Arc<Broker>,
    pub owner_token: Arc<OwnerToken>,
    /// The comment interval on parked SSE claims (15 s; shorter in tests).
    pub keep_alive: Duration,
    /// The Lark connector's configuration; `None` turns the webhook off (404).
    pub lark: Option<Arc<crate::lark::LarkConfig>>,
    /// The long connection's state, when the connector uses it.
    pub lark_connector: Option<Arc<crate::lark::long_connection::ConnectorStatus>>,
    /// This API's OpenAPI document (`/openapi.json`), given by whoever wires
    /// the app: the document is generated from these routes, so they cannot
    /// name its generator.
    pub openapi: fn() -> String,
    /// Where uploads stream to, and how many run at once.
    pub uploads: Arc<attachments::Uploads>,
    /// The broker's VAPID key (Web Push).
    pub vapid: Arc<crate::push::Vapid>,
}

/// The owner token; never printed.
pub struct OwnerToken(String);

impl OwnerToken {
    pub fn new(token: String) -> Self {
        Self(token)
    }

    /// Constant-time comparison with a presented bearer token.
    pub fn admits(&self, presented: &str) -> bool {
        self.0.as_bytes().ct_eq(presented.as_bytes()).into()
    }
}

impl std::fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OwnerToken(<redacted>)")
    }
}

/// The whole application.
pub fn router(state: AppState) -> Router {
    let v1 = Router::new()
        .merge(agent_threads::router())
        .merge(sessions::router())
        .merge(changes::router())
        .merge(claims::router())
        .merge(devices::router())
        .merge(push::router())
        .merge(events::router())
        .merge(lark_links::router())
        .merge(permissions::router())
        .merge(lark_events::router())
        .merge(lark_connector::router())
        .merge(turns::router())
        .merge(attachments::router());
    Router::new()
        .merge(v1)
        .merge(crate::web::router())
        .route("/healthz", get(healthz))
        .route("/openapi.json", get(openapi_json))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), require_owner))
        .layer(middleware::from_fn_with_state(state.clone(), count_request))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|request: &Request| {
                    // The matched route, never the raw path: no client value in logs.
                    let route = request
                        .extensions()
                        .get::<MatchedPath>()
                        .map_or("unmatched", MatchedPath::as_str);
                    tracing::debug_span!("request", method = %request.method(), route)
                })
                // A line per request is for debugging: under a steady load the
                // default `info` level would write gigabytes a day.
                .on_response(
                    DefaultOnResponse::new()
                        .level(Level::DEBUG)
                        .latency_unit(tower_http::LatencyUnit::Micros),
                ),
        )
        .with_state(state)
}

pub use server::{ConnectionLimits, serve};

/// Every `/v1` route needs the owner token or a device credential
/// ([`crate::devices`]); `/healthz` and `/openapi.json` do not. Who called
/// is left in the request's extensions ([`Caller`]) for the routes only the
/// owner may use.
async fn require_owner(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    // The Lark webhook is authenticated by Lark's signature instead, and a
    // device signs in with its link's code.
    let path = request.uri().path();
    let exempt = path == "/v1/connectors/lark/events"
        || (path == "/v1/devices" && request.method() == axum::http::Method::POST);
    if path.starts_with("/v1") && !exempt {
        let presented = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token);
        let caller = match presented {
            Some(token) if state.owner_token.admits(token) => Some(Caller::Owner),
            Some(token) if token.starts_with(crate::devices::TOKEN_PREFIX) => {
                match state.broker.device_for(token).await {
                    Ok(device) => device.map(|d| Caller::Device(d.device_id)),
                    Err(e) => return e.into_response(),
                }
            }
            _ => None,
        };
        let Some(caller) = caller else {
            return Error::new(
                ErrorCode::Unauthorized,
                "A valid owner token is required (or a signed-in device's own credential): \
                 send `Authorization: Bearer <token>`.",
            )
            .into_response();
        };
        request.extensions_mut().insert(caller);
    }
    next.run(request).await
}

/// The token of an `Authorization: Bearer <token>` value; the scheme name is
/// case-insensitive (RFC 9110 §11.1).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start_matches(' '))
}

/// Counts every answer by matched route (never the raw path), method and status.
async fn count_request(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_owned();
    let method = request.method().clone();
    let response = next.run(request).await;
    state
        .broker
        .metrics()
        .requests
        .with_label_values(&[route.as_str(), method.as_str(), response.status().as_str()])
        .inc();
    response
}

/// Prometheus metrics.
///
/// Requests by route and status, turns enqueued / claimed / completed /
/// cancelled, queued depth and oldest-queued age (totals, not per session),
/// parked claims, open SSE streams, the claim wake-latency histogram and Lark
/// replies by outcome. No label carries an id chosen by a client. No token needed.
#[utoipa::path(get, path = "/metrics", operation_id = "metrics", tag = "operations",
    responses(
        (status = 200, description = "Prometheus text exposition.", content_type = "text/plain", body = String),
        (status = 503, description = "`store_unavailable`.", body = crate::error::ErrorBody),
    ))]
pub async fn metrics(State(state): State<AppState>) -> Result<Response> {
    let text = state.broker.render_metrics().await?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

/// Store health, without data.
#[utoipa::path(get, path = "/healthz", operation_id = "healthz", tag = "operations",
    responses(
        (status = 200, description = "The store answers.", body = Health),
        (status = 503, description = "`store_unavailable`.", body = crate::error::ErrorBody),
    ))]
pub async fn healthz(State(state): State<AppState>) -> Result<Json<Health>> {
    state.broker.store().ping().await?;
    Ok(Json(Health {
        status: "ok".into(),
    }))
}

/// This OpenAPI 3.1 document.
#[utoipa::path(get, path = "/openapi.json", operation_id = "openapi", tag = "operations",
    responses((status = 200, description = "The OpenAPI document.", content_type = "application/json", body = Object)))]
pub async fn openapi_json(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        (state.openapi)(),
    )
        .into_response()
}

async fn not_found() -> Error {
    Error::new(ErrorCode::NotFound, "No such route.")
}

async fn method_not_allowed() -> Error {
    Error::new(
        ErrorCode::MethodNotAllowed,
        "This route does not take this method.",
    )
}

/// `Idempotent-Replayed: true` on an answer that replays an earlier request.
pub(crate) fn replayed_header(replayed: bool) -> Option<[(HeaderName, HeaderValue); 1]> {
    replayed.then_some([(
        HeaderName::from_static("idempotent-replayed"),
        HeaderValue::from_static("true"),
    )])
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|mime| {
            let mime = mime.trim().to_ascii_lowercase();
            mime == "application/json"
                || (mime.starts_with("application/") && mime.ends_with("+json"))
        })
        .unwrap_or(false)
}

/// The body, read with the 2 MiB limit (413 beyond it) and within the
/// server's body deadline (408 past it).
async fn read_bytes<S: Send + Sync>(request: Request, state: &S) -> Result<Bytes> {
    let deadline = request.extensions().get::<server::BodyDeadline>().copied();
    let read = within_body_deadline(deadline, Bytes::from_request(request, state)).await?;
    read.map_err(|rejection| {
        if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            Error::new(
                ErrorCode::PayloadTooLarge,
                format!("The request body is over {MAX_BODY_BYTES} bytes."),
            )
        } else {
            Error::invalid("The request body could not be read.")
        }
    })
}

/// Reads a body within the server's body deadline, if the request has one
/// (408 `request_timeout` past it).
pub(crate) async fn within_body_deadline<T>(
    deadline: Option<server::BodyDeadline>,
    reading: impl std::future::Future<Output = T>,
) -> Result<T> {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline.at, reading)
            .await
            .map_err(|_| {
                Error::new(
                    ErrorCode::RequestTimeout,
                    format!(
                        "The request body did not arrive within {} s.",
                        deadline.after.as_secs()
                    ),
                )
            }),
        None => Ok(reading.await),
    }
}

async fn read_body<S: Send + Sync>(request: Request, state: &S) -> Result<(HeaderMap, Bytes)> {
    let headers = request.headers().clone();
    Ok((headers, read_bytes(request, state).await?))
}

fn parse<T: DeserializeOwned>(headers: &HeaderMap, bytes: &[u8]) -> Result<T> {
    if !is_json(headers) {
        return Err(Error::new(
            ErrorCode::UnsupportedMediaType,
            "The request body must be `application/json`.",
        ));
    }
    serde_json::from_slice(bytes).map_err(|e| Error::invalid(format!("Invalid JSON body: {e}.")))
}

/// A JSON body whose every rejection (size 413, type 415, shape 400) is the
/// contract's error, in the contract's order.
pub struct AppJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for AppJson<T> {
    type Rejection = Error;

    async fn from_request(request: Request, state: &S) -> Result<Self> {
        let (headers, bytes) = read_body(request, state).await?;
        parse(&headers, &bytes).map(AppJson)
    }
}

/// The raw body bytes (the Lark webhook verifies a signature over them), read
/// with the same limits and errors as every JSON body.
pub struct RawBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = Error;

    async fn from_request(request: Request, state: &S) -> Result<Self> {
        read_bytes(request, state).await.map(RawBody)
    }
}

/// An optional JSON body: empty means `T::default()`; otherwise as
/// [`AppJson`].
pub struct OptionalJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Default> FromRequest<S> for OptionalJson<T> {
    type Rejection = Error;

    async fn from_request(request: Request, state: &S) -> Result<Self> {
        let (headers, bytes) = read_body(request, state).await?;
        if bytes.is_empty() {
            return Ok(OptionalJson(T::default()));
        }
        parse(&headers, &bytes).map(OptionalJson)
    }
}

/// Path parameters; a rejection is 400 `invalid_request`.
pub struct AppPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for AppPath<T> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| AppPath(p.0))
            .map_err(|e| Error::invalid(format!("Invalid path: {}.", e.body_text())))
    }
}

/// Query parameters (unknown ones rejected); a rejection is 400 `invalid_request`.
pub struct AppQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for AppQuery<T> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| AppQuery(q.0))
            .map_err(|e| Error::invalid(format!("Invalid query: {}.", e.body_text())))
    }
}
