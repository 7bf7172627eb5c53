//! `/v1/push`: the broker's VAPID key and the caller's push subscriptions
//! (WEB.md "Installable, and it tells you"). A subscription belongs to the
//! caller that made it, the owner or one device, and only that caller sees
//! or removes it; revoking a device removes its subscriptions.

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::routing::{delete, get, post};

use super::{AppJson, AppPath, AppState};
use crate::devices::Caller;
use crate::error::{ErrorBody, Result};
use crate::model::{NewPushSubscription, PushKey, PushSubscription, PushSubscriptionList};

pub fn router() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/v1/push/key", get(key))
        .route("/v1/push/subscriptions", post(subscribe).get(list))
        .route(
            "/v1/push/subscriptions/{subscription_id}",
            delete(unsubscribe),
        )
}

/// Read the push key.
///
/// The broker's VAPID public key (RFC 8292), made on first start and kept in
/// the data dir: what `PushManager.subscribe` takes as
/// `applicationServerKey`.
#[utoipa::path(get, path = "/v1/push/key", operation_id = "pushKey", tag = "push",
    responses(
        (status = 200, description = "The key.", body = PushKey),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
    ))]
pub async fn key(State(state): State<AppState>) -> Json<PushKey> {
    Json(PushKey {
        key: state.vapid.public_key(),
    })
}

/// Subscribe to push.
///
/// A browser's subscription as `PushManager.subscribe` gives it, tied to the
/// caller (the owner, or the device whose credential made the request). The
/// same endpoint again replaces its earlier subscription. The endpoint must
/// be `https` (plain `http` only on loopback) and at most 2048 bytes, the
/// keys a P-256 point and a 16-byte secret (400 otherwise); a caller holds at
/// most 10 (409 `too_many_subscriptions`).
#[utoipa::path(post, path = "/v1/push/subscriptions", operation_id = "subscribePush", tag = "push",
    request_body = NewPushSubscription,
    responses(
        (status = 201, description = "Subscribed.", body = PushSubscription),
        (status = 400, description = "`invalid_request`.", body = ErrorBody),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 409, description = "`too_many_subscriptions`.", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`.", body = ErrorBody),
    ))]
pub async fn subscribe(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    AppJson(subscription): AppJson<NewPushSubscription>,
) -> Result<(StatusCode, Json<PushSubscription>)> {
    let made = state.broker.subscribe(&caller, subscription).await?;
    Ok((StatusCode::CREATED, Json(made)))
}

/// List the caller's push subscriptions.
///
/// Oldest first, never with their keys.
#[utoipa::path(get, path = "/v1/push/subscriptions", operation_id = "listPushSubscriptions", tag = "push",
    responses(
        (status = 200, description = "The caller's subscriptions.", body = PushSubscriptionList),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
    ))]
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<PushSubscriptionList>> {
    Ok(Json(state.broker.push_subscriptions(&caller).await?))
}

/// Unsubscribe.
///
/// Removes one of the caller's subscriptions; 404 for one that is not the
/// caller's, or none.
#[utoipa::path(delete, path = "/v1/push/subscriptions/{subscription_id}", operation_id = "unsubscribePush", tag = "push",
    params(("subscription_id" = String, Path, description = "The subscription id.")),
    responses(
        (status = 204, description = "Removed."),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
    ))]
pub async fn unsubscribe(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    AppPath(subscription_id): AppPath<String>,
) -> Result<StatusCode> {
    state.broker.unsubscribe(&caller, &subscription_id).await?;
    Ok(StatusCode::NO_CONTENT)
}
