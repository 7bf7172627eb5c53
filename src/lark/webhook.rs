//! Lark's event subscription webhook, less its route (`http::lark_events`):
//! verifies a request (decryption, `X-Lark-Signature` and its freshness, the
//! verification token, the app id) and decodes its schema 2.0 [`Envelope`],
//! which then takes the one ingestion path ([`super::inbound`]) that the long
//! connection's events take too. Verification is the webhook's alone. It
//! knows nothing of the HTTP state or the broker; every failure is the same
//! 401, and only a log line says why.

use axum::http::HeaderMap;
use serde_json::Value;

use super::LarkConfig;
use super::crypto;
use super::inbound::Envelope;
use crate::error::{Error, ErrorCode, Result};

/// A verified webhook request.
pub enum Inbound {
    /// The `url_verification` challenge, to echo back.
    Challenge(Value),
    /// A verified event's envelope (it may hold nothing to enqueue).
    Event(Envelope),
}

/// Verifies one webhook request's raw body and headers and reads it; `Err`
/// is the 401 to answer.
pub fn verify(config: &LarkConfig, headers: &HeaderMap, body: &[u8]) -> Result<Inbound> {
    let payload = verified_payload(config, headers, body)?;
    // The challenge's token is checked here, signed or not.
    if payload.get("type").and_then(Value::as_str) == Some("url_verification") {
        let token = payload
            .get("token")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !crypto::secret_eq(token, &config.verification_token) {
            return Err(unauthorized("wrong verification token on the challenge"));
        }
        let challenge = payload.get("challenge").cloned().unwrap_or(Value::Null);
        return Ok(Inbound::Challenge(challenge));
    }
    let envelope: Envelope =
        serde_json::from_value(payload).map_err(|_| unauthorized("not a schema 2.0 event"))?;
    if !crypto::secret_eq(&envelope.header.token, &config.verification_token) {
        return Err(unauthorized("wrong verification token"));
    }
    if envelope.header.app_id != config.app_id {
        return Err(unauthorized("an event for another app"));
    }
    Ok(Inbound::Event(envelope))
}

fn unauthorized(why: &'static str) -> Error {
    tracing::warn!("lark webhook refused: {why}");
    Error::new(
        ErrorCode::Unauthorized,
        "The Lark event could not be verified.",
    )
}

/// The event's JSON, after the decryption, signature and freshness checks.
/// The `url_verification` challenge is the one request checked by decryption
/// (and, in [`verify`], its token) alone: Lark's official SDKs skip its
/// signature, so the console's URL check may send it unsigned.
fn verified_payload(config: &LarkConfig, headers: &HeaderMap, body: &[u8]) -> Result<Value> {
    let payload = decrypted_payload(config, body)?;
    let is_challenge = payload.get("type").and_then(Value::as_str) == Some("url_verification");
    if let Some(key) = &config.encrypt_key
        && !is_challenge
    {
        check_signature(config, key, headers, body)?;
    }
    Ok(payload)
}

/// `X-Lark-Signature` over the raw bytes, and a timestamp within the window.
fn check_signature(config: &LarkConfig, key: &str, headers: &HeaderMap, body: &[u8]) -> Result<()> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let (Some(timestamp), Some(nonce), Some(signature)) = (
        header("x-lark-request-timestamp"),
        header("x-lark-request-nonce"),
        header("x-lark-signature"),
    ) else {
        return Err(unauthorized("missing signature"));
    };
    if !crypto::signature_matches(timestamp, nonce, key, body, signature) {
        return Err(unauthorized("wrong signature"));
    }
    let sent: i64 = timestamp
        .parse()
        .map_err(|_| unauthorized("bad timestamp"))?;
    let age = (crate::time::now_ms() / 1000 - sent).unsigned_abs();
    if age > config.freshness.as_secs() {
        return Err(unauthorized("stale timestamp"));
    }
    Ok(())
}

/// The body as JSON, decrypted when an encrypt key is configured (and then
/// required to be encrypted).
fn decrypted_payload(config: &LarkConfig, body: &[u8]) -> Result<Value> {
    let value: Value = serde_json::from_slice(body).map_err(|_| unauthorized("not JSON"))?;
    match (
        value.get("encrypt").and_then(Value::as_str),
        &config.encrypt_key,
    ) {
        (Some(encrypted), Some(key)) => {
            let plain =
                crypto::decrypt(key, encrypted).ok_or_else(|| unauthorized("does not decrypt"))?;
            serde_json::from_slice(&plain).map_err(|_| unauthorized("decrypted body is not JSON"))
        }
        (Some(_), None) => Err(unauthorized(
            "encrypted body while no encrypt key is configured",
        )),
        (None, Some(_)) => Err(unauthorized(
            "plain body while an encrypt key is configured",
        )),
        (None, None) => Ok(value),
    }
}
