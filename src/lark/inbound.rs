//! The one ingestion path of Lark events: a schema 2.0 envelope, decoded
//! from a verified webhook request ([`super::webhook`]) or from a long
//! connection's data frame ([`super::long_connection`]), is routed here on
//! its `header.event_type` and taken by the broker (de-duplication by event
//! id, the linked chat, the enqueue, approvers' answers by text or by a
//! click on a permission card), which commits before anything is
//! acknowledged. What [`take`] answers is the JSON the acknowledgement
//! carries: the webhook's 200 body, the long connection's base64 `data`
//! (for a click, the callback answer: a toast and the card's new form). It never verifies (that is the webhook's) and never logs a
//! message's text.

use serde::Deserialize;
use serde_json::{Value, json};

use super::card::{self, ButtonValue};
use super::{LarkConfig, resources};
use crate::broker::{Broker, fit_text};
use crate::decide::chat;
use crate::decide::lark::{Clicked, LarkClick, LarkEvent, LarkIngest};
use crate::error::Result;
use crate::permission::lark_command;

/// A text message sent to the bot (or in a chat it is in).
pub const MESSAGE_RECEIVE: &str = "im.message.receive_v1";
/// A click on a card's button (a permission card's Allow / Deny).
pub const CARD_ACTION: &str = "card.action.trigger";

/// A schema 2.0 event, as Lark sends it by either transport.
#[derive(Deserialize)]
pub struct Envelope {
    pub header: EnvelopeHeader,
    #[serde(default)]
    pub event: Value,
}

#[derive(Deserialize)]
pub struct EnvelopeHeader {
    pub event_id: String,
    #[serde(default)]
    pub event_type: String,
    /// The verification token (checked by the webhook only).
    #[serde(default)]
    pub token: String,
    #[serde(default)]
    pub app_id: String,
}

/// Takes one decoded event for the app `app_id` and answers the JSON to
/// acknowledge it with, once what it changed is committed; `Err` (the store
/// failed, the queue is full) is acknowledged as a failure, so Lark redelivers.
/// Each event type Lark may send has its arm here; every other type is
/// recorded as seen and acknowledged.
pub async fn take(broker: &Broker, config: &LarkConfig, envelope: Envelope) -> Result<Value> {
    let app_id = config.app_id.as_str();
    let event = match envelope.header.event_type.as_str() {
        MESSAGE_RECEIVE => message_event(app_id, envelope),
        CARD_ACTION => match click_of(app_id, &envelope) {
            Some(click) => return clicked(broker, click).await,
            None => bare_event(app_id, envelope.header.event_id),
        },
        _ => bare_event(app_id, envelope.header.event_id),
    };
    match broker.lark_event(event).await? {
        // Per-message lines are for debugging; an unlinked chat is what an
        // operator looks for when linking one.
        LarkIngest::Enqueued { .. } => tracing::debug!("lark message enqueued"),
        LarkIngest::Duplicate => tracing::debug!("lark redelivery acknowledged, not enqueued"),
        LarkIngest::Unlinked => tracing::info!("lark message from an unlinked chat, not enqueued"),
        LarkIngest::Unsupported => tracing::debug!("lark event not enqueued: not a text message"),
        LarkIngest::Answered { .. } => tracing::debug!("lark permission answer taken"),
        LarkIngest::Ignored => tracing::debug!("lark permission answer ignored"),
        LarkIngest::Command(_) => tracing::debug!("lark command answered"),
    }
    Ok(json!({}))
}

/// A `card.action.trigger` read: the button's value (the session, the
/// request, the answer, what it chooses, with its form's values when it
/// submits one), who clicked and where. `None` for a click on
/// anything else.
fn click_of(app_id: &str, envelope: &Envelope) -> Option<LarkClick> {
    let event = &envelope.event;
    let value: ButtonValue = serde_json::from_value(event["action"]["value"].clone()).ok()?;
    let text = |v: &Value| v.as_str().map(str::to_owned);
    let choice = value.choice(&event["action"]["form_value"]);
    Some(LarkClick {
        app_id: app_id.to_owned(),
        event_id: envelope.header.event_id.clone(),
        session_id: value.session_id,
        request_id: value.request_id,
        behavior: value.behavior,
        choice,
        operator: text(&event["operator"]["open_id"]),
        chat_id: text(&event["context"]["open_chat_id"]),
    })
}

/// Takes a click and answers Lark's callback: a toast, and the card in its
/// final form when the request is settled. A repeated click answers `{}`.
async fn clicked(broker: &Broker, click: LarkClick) -> Result<Value> {
    Ok(match broker.lark_click(click).await? {
        Clicked::Duplicate => {
            tracing::debug!("lark card click redelivered, nothing changed");
            json!({})
        }
        Clicked::Unknown => card::callback(card::unknown_toast(), None),
        Clicked::Refused => {
            tracing::debug!("lark card click by someone not an approver, nothing changed");
            card::callback(card::refused_toast(), None)
        }
        Clicked::Answered { row, name, by, .. } => {
            tracing::debug!("lark card click answered a permission request");
            card::callback(
                card::answered_toast(row.state),
                Some(card::settled(&row, &name, by.as_deref())),
            )
        }
        Clicked::Incomplete(missing) => card::callback(card::incomplete_toast(&missing), None),
        Clicked::Unfit(message) => card::callback(card::unfit_toast(&message), None),
        Clicked::Settled { row, name, by } => card::callback(
            card::settled_toast(&row),
            Some(card::settled(&row, &name, by.as_deref())),
        ),
    })
}

/// An event that holds nothing to enqueue: recorded as seen, acknowledged.
fn bare_event(app_id: &str, event_id: String) -> LarkEvent {
    LarkEvent {
        app_id: app_id.to_owned(),
        event_id,
        message_id: None,
        chat_id: None,
        text: None,
        sender: None,
        command: None,
        chat_command: None,
        replies_to: Vec::new(),
        files: Vec::new(),
    }
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
    /// The message this one replies to, and its thread's root (absent for
    /// a message that replies to none).
    #[serde(default)]
    parent_id: Option<String>,
    #[serde(default)]
    root_id: Option<String>,
}

#[derive(Deserialize)]
struct Mention {
    key: String,
    #[serde(default)]
    name: String,
}

/// An `im.message.receive_v1` event read: its text (a text message's, or
/// what an image, file or post says), chat, message id, sender and
/// permission command, and the files it names (to download once the event
/// is committed).
fn message_event(app_id: &str, envelope: Envelope) -> LarkEvent {
    let mut event = bare_event(app_id, envelope.header.event_id);
    let Ok(message) = serde_json::from_value::<Message>(envelope.event["message"].clone()) else {
        return event;
    };
    if let Some((text, files)) = resources::read(&message.message_type, &message.content) {
        event.text = Some(fit_text(text));
        event.files = files;
    }
    event.message_id = Some(message.message_id);
    event.chat_id = Some(message.chat_id);
    event.replies_to = [message.parent_id, message.root_id]
        .into_iter()
        .flatten()
        .filter(|id| !id.is_empty())
        .collect();
    event.replies_to.dedup();
    // Only people answer: an app's messages carry no approver's open id.
    let sender = &envelope.event["sender"];
    if sender["sender_type"].as_str() == Some("user") {
        event.sender = sender["sender_id"]["open_id"].as_str().map(str::to_owned);
    }
    if message.message_type == "text" {
        let bare = raw_text(&message.content)
            .map(|raw| with_mentions(&raw, &message.mentions, |_| String::new()));
        event.command = bare.as_deref().and_then(lark_command);
        event.chat_command = bare.as_deref().and_then(chat::parse);
        // `//text` reaches the agent as `/text`, its mentions removed.
        event.text = match bare.as_deref().and_then(chat::unescaped) {
            Some(text) => Some(fit_text(text)),
            None => text_of(&message.content, &message.mentions),
        };
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
    Some(fit_text(text))
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
        let text = fit_text("é".repeat(40_000));
        assert!(text.len() <= crate::broker::MAX_TEXT_BYTES);
        assert!(text.ends_with("longer than 64 KiB]"));
    }
}
