//! Lark's event subscription webhook, less its route (`http::lark_events`):
//! verifies a request (decryption, `X-Lark-Signature` and its freshness, the
//! verification token, the app id) and reads an event into a [`LarkEvent`].
//! It knows nothing of the HTTP state or the broker; every failure is the
//! same 401, and only a log line says why.

use axum::http::HeaderMap;
use serde::Deserialize;
use serde_json::Value;

use super::LarkConfig;
use super::crypto;
use crate::broker::MAX_TEXT_BYTES;
use crate::error::{Error, ErrorCode, Result};
use crate::permission::lark_command;
use crate::store::LarkEvent;

/// A verified webhook request.
pub enum Inbound {
    /// The `url_verification` challenge, to echo back.
    Challenge(Value),
    /// An event, read (it may hold nothing to enqueue).
    Event(LarkEvent),
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
    Ok(Inbound::Event(to_event(config, envelope)))
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

#[derive(Deserialize)]
struct Envelope {
    header: Header,
    #[serde(default)]
    event: Value,
}

#[derive(Deserialize)]
struct Header {
    event_id: String,
    #[serde(default)]
    event_type: String,
    token: String,
    app_id: String,
}

#[derive(Deserialize)]
struct Message {
    message_id: String,
    chat_id: String,
    message_type: String,
    #[serde(default)]
    content: String,
    #[serde(default)]
    mentions: Vec<Mention>,
}

#[derive(Deserialize)]
struct Mention {
    key: String,
    #[serde(default)]
    name: String,
}

fn to_event(config: &LarkConfig, envelope: Envelope) -> LarkEvent {
    let mut event = LarkEvent {
        app_id: config.app_id.clone(),
        event_id: envelope.header.event_id,
        message_id: None,
        chat_id: None,
        text: None,
        sender: None,
        command: None,
    };
    if envelope.header.event_type != "im.message.receive_v1" {
        return event;
    }
    let Ok(message) = serde_json::from_value::<Message>(envelope.event["message"].clone()) else {
        return event;
    };
    event.message_id = Some(message.message_id);
    event.chat_id = Some(message.chat_id);
    // Only people answer: an app's messages carry no approver's open id.
    let sender = &envelope.event["sender"];
    if sender["sender_type"].as_str() == Some("user") {
        event.sender = sender["sender_id"]["open_id"].as_str().map(str::to_owned);
    }
    if message.message_type == "text" {
        event.command = raw_text(&message.content).and_then(|raw| {
            lark_command(&with_mentions(&raw, &message.mentions, |_| String::new()))
        });
        event.text = text_of(&message.content, &message.mentions);
    }
    event
}

/// A `text` message's text as Lark sent it (`@_user_N` placeholders in).
fn raw_text(content: &str) -> Option<String> {
    let content: Value = serde_json::from_str(content).ok()?;
    Some(content.get("text")?.as_str()?.to_owned())
}

/// The text with each mention's placeholder replaced by `with(name)`, longest
/// keys first, so `@_user_1` never eats into `@_user_10`.
fn with_mentions(text: &str, mentions: &[Mention], with: impl Fn(&str) -> String) -> String {
    let mut mentions: Vec<&Mention> = mentions.iter().collect();
    mentions.sort_by_key(|m| std::cmp::Reverse(m.key.len()));
    let mut text = text.to_owned();
    for mention in mentions {
        text = text.replace(&mention.key, &with(&mention.name));
    }
    text
}

/// The text of a `text` message, `@_user_N` placeholders resolved to `@name`,
/// truncated to the broker's limit with a visible note.
fn text_of(content: &str, mentions: &[Mention]) -> Option<String> {
    let text = with_mentions(&raw_text(content)?, mentions, |name| format!("@{name}"));
    let text = text.trim().to_owned();
    if text.is_empty() {
        return None;
    }
    Some(truncate(text, MAX_TEXT_BYTES))
}

fn truncate(text: String, limit: usize) -> String {
    const NOTE: &str = "\n[truncated by LoopX: the message was longer than 64 KiB]";
    if text.len() <= limit {
        return text;
    }
    let mut end = limit - NOTE.len();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{NOTE}", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mentions_resolve_by_key_longest_first() {
        let mentions = vec![
            Mention {
                key: "@_user_1".into(),
                name: "Tom".into(),
            },
            Mention {
                key: "@_user_10".into(),
                name: "Ann".into(),
            },
        ];
        let text = text_of(r#"{"text":"@_user_1 hi @_user_10"}"#, &mentions).unwrap();
        assert_eq!(text, "@Tom hi @Ann");
        assert_eq!(text_of(r#"{"text":"  "}"#, &[]), None);
        assert_eq!(text_of("not json", &[]), None);
    }

    #[test]
    fn a_command_is_read_with_its_mentions_removed() {
        let mentions = [Mention {
            key: "@_user_1".into(),
            name: "LoopX Bot".into(),
        }];
        let raw = raw_text(r#"{"text":"@_user_1  Yes abcde "}"#).unwrap();
        let command = lark_command(&with_mentions(&raw, &mentions, |_| String::new())).unwrap();
        assert_eq!(command.request_id, "abcde");
        // Resolved to `@LoopX Bot`, the same text would not parse.
        assert_eq!(
            text_of(r#"{"text":"@_user_1  Yes abcde "}"#, &mentions).unwrap(),
            "@LoopX Bot  Yes abcde"
        );
    }

    #[test]
    fn long_texts_are_truncated_with_a_note_on_a_char_boundary() {
        let text = truncate("é".repeat(40_000), MAX_TEXT_BYTES);
        assert!(text.len() <= MAX_TEXT_BYTES);
        assert!(text.ends_with("longer than 64 KiB]"));
    }
}
