//! `/v1/devices`: devices signed in with a one-time link (WEB.md "Signing in
//! a phone"). The owner makes a link (`POST /v1/devices/links`), the device
//! trades its code for a credential of its own (`POST /v1/devices`, the one
//! `/v1` route that takes no bearer), and the owner lists and revokes
//! devices. A device credential is refused here (403 `owner_only`), however
//! good it is elsewhere.

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::routing::{delete, post};

use super::{AppJson, AppPath, AppState};
use crate::devices::{self, Caller};
use crate::error::{ErrorBody, Result};
use crate::model::{DeviceLink, DeviceList, SignIn, SignedIn};

pub fn router() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/v1/devices", post(sign_in).get(list))
        .route("/v1/devices/links", post(make_link))
        .route("/v1/devices/{device_id}", delete(revoke))
}

/// Only the owner token may make links and manage devices.
fn owner(caller: &Caller) -> Result<()> {
    match caller {
        Caller::Owner => Ok(()),
        Caller::Device(_) => Err(devices::owner_only()),
    }
}

/// Make a sign-in link.
///
/// A one-time code that signs in one device: open `<base>/#link=<code>` on
/// it (`loopx web link` prints the link and its QR code). Good once, for 10
/// minutes; only its hash is stored, so it is shown this once. At most 20
/// links are open at once (429 `too_many_attempts`). Owner token only (403
/// `owner_only` for a device). The request takes no body.
#[utoipa::path(post, path = "/v1/devices/links", operation_id = "makeDeviceLink", tag = "devices",
    responses(
        (status = 201, description = "A new sign-in code.", body = DeviceLink),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 403, description = "`owner_only`: a device credential.", body = ErrorBody),
        (status = 429, description = "`too_many_attempts`: 20 links are open.", body = ErrorBody),
    ))]
pub async fn make_link(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<(StatusCode, Json<DeviceLink>)> {
    owner(&caller)?;
    Ok((
        StatusCode::CREATED,
        Json(state.broker.mint_device_link().await?),
    ))
}

/// Sign a device in.
///
/// Trades a sign-in link's code for a device credential of its own (no
/// bearer needed): a bearer token that works on every `/v1` route but the
/// devices' and the links', shown this once and stored only as a hash. A
/// wrong, used or expired code gets the one refusal, 401 `unauthorized`,
/// without saying which. After 10 wrong codes within 10 minutes every
/// sign-in is refused (429 `too_many_attempts`, with `Retry-After`) until
/// the 10 minutes are over. At most 50 devices are signed in (409
/// `too_many_devices`; the link stays good).
#[utoipa::path(post, path = "/v1/devices", operation_id = "signInDevice", tag = "devices",
    security(()),
    request_body = SignIn,
    responses(
        (status = 201, description = "Signed in: the device's credential.", body = SignedIn),
        (status = 400, description = "`invalid_request`: a bad name.", body = ErrorBody),
        (status = 401, description = "`unauthorized`: the code is wrong, used or expired.", body = ErrorBody),
        (status = 409, description = "`too_many_devices`.", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`.", body = ErrorBody),
        (status = 429, description = "`too_many_attempts`: too many wrong codes lately.", body = ErrorBody),
    ))]
pub async fn sign_in(
    State(state): State<AppState>,
    AppJson(sign_in): AppJson<SignIn>,
) -> Result<(StatusCode, Json<SignedIn>)> {
    let signed_in = state.broker.sign_in_device(sign_in).await?;
    Ok((StatusCode::CREATED, Json(signed_in)))
}

/// List the devices.
///
/// The devices signed in, oldest first: name, when signed in, when last
/// seen (to the minute); never a credential. Owner token only.
#[utoipa::path(get, path = "/v1/devices", operation_id = "listDevices", tag = "devices",
    responses(
        (status = 200, description = "The devices.", body = DeviceList),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 403, description = "`owner_only`: a device credential.", body = ErrorBody),
    ))]
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<DeviceList>> {
    owner(&caller)?;
    Ok(Json(state.broker.devices().await?))
}

/// Revoke a device.
///
/// Its credential is gone: its next request is 401. Owner token only (403
/// `owner_only` for a device, before any lookup); 404 for no such device.
#[utoipa::path(delete, path = "/v1/devices/{device_id}", operation_id = "revokeDevice", tag = "devices",
    params(("device_id" = String, Path, description = "The device id.")),
    responses(
        (status = 204, description = "Revoked."),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 403, description = "`owner_only`: a device credential.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
    ))]
pub async fn revoke(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    AppPath(device_id): AppPath<String>,
) -> Result<StatusCode> {
    owner(&caller)?;
    state.broker.revoke_device(&device_id).await?;
    Ok(StatusCode::NO_CONTENT)
}
