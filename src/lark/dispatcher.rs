//! The reply dispatcher: one per broker, it sends the outbox's pending
//! messages: replies with Lark's reply API, permission-request cards with
//! its send-message API (`POST /open-apis/im/v1/messages?receive_id_type=chat_id`:
//! they answer no message; same envelope and codes), the broker's answers to
//! a chat's commands (a card replying to the command), and a settled request's
//! card in its final form with the update API (`PATCH
//! /open-apis/im/v1/messages/{message_id}`). Woken by a completion or
//! a request (never polling fast), it honours Lark's rate limits, retries
//! network errors and 5xx with jittered exponential backoff, refreshes the
//! tenant token ahead of expiry and once on a token error, and records final
//! errors instead of retrying forever. The Lark `uuid` comes from the turn or
//! the request, so a retried send never doubles a message. It never logs a
//! message's text.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::api::{self, Api, Failure};
use super::{LarkConfig, card, markdown};
use crate::decide::pairing::SessionName;
use crate::metrics::Metrics;
use crate::model::ReplyState;
use crate::store::{CardUpdateJob, Outbound, ReplyJob, ReplyUpdate, Store};
use crate::time::now_ms;

/// Lark's limit on a card (30 KB), less room for the rest of the request
/// body: the card's own JSON, the uuid, msg_type.
const CARD_BYTES: usize = 30 * 1024 - 1024;
/// Final codes of a card's update, besides those: too old (14 days),
/// recalled, deleted.
const CARD_FINAL_CODES: [i64; 3] = [230031, 230011, 230110];

pub struct Dispatcher {
    store: Arc<dyn Store>,
    api: Api,
    wake: Arc<Notify>,
    shutdown: CancellationToken,
    metrics: Arc<Metrics>,
    per_chat: DefaultKeyedRateLimiter<String>,
    per_app: DefaultDirectRateLimiter,
}

impl Dispatcher {
    pub fn new(
        store: Arc<dyn Store>,
        config: LarkConfig,
        wake: Arc<Notify>,
        shutdown: CancellationToken,
        metrics: Arc<Metrics>,
    ) -> Self {
        let quota = |n| Quota::per_second(NonZeroU32::new(n).expect("a positive quota"));
        Self {
            store,
            api: Api::new(config, Duration::from_secs(10)),
            wake,
            shutdown,
            metrics,
            per_chat: RateLimiter::keyed(quota(5)),
            per_app: RateLimiter::direct(quota(50)),
        }
    }

    /// Sends due replies until shutdown.
    pub async fn run(mut self) {
        let wake = self.wake.clone();
        loop {
            let woken = wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let due: Vec<ReplyJob> = self
                .store
                .due_replies(now_ms(), 32)
                .await
                .unwrap_or_default();
            let cards: Vec<CardUpdateJob> = self
                .store
                .due_card_updates(now_ms(), 32)
                .await
                .unwrap_or_default();
            let busy = !due.is_empty() || !cards.is_empty();
            let shutdown = self.shutdown.clone();
            for job in due {
                // A hanging Lark never holds up a shutdown: the reply stays
                // pending and goes out, with the same uuid, after the restart.
                tokio::select! {
                    _ = self.send(job) => {}
                    _ = shutdown.cancelled() => return,
                }
            }
            for job in cards {
                tokio::select! {
                    _ = self.update_card(job) => {}
                    _ = shutdown.cancelled() => return,
                }
            }
            if busy {
                continue;
            }
            // Sleep until the next retry falls due.
            let next = self.store.next_reply_due().await.ok().flatten();
            if !api::until_due(next, woken, &self.shutdown).await {
                return;
            }
        }
    }

    /// Sends a reply's remaining parts in order; records what happened.
    async fn send(&mut self, job: ReplyJob) {
        let parts = match job.outbound {
            Outbound::Reply { .. } => {
                markdown::split(&markdown::escape_html(&job.text), CARD_BYTES)
            }
            // One card, far below Lark's limit.
            Outbound::Permission { .. } | Outbound::Note { .. } => vec![job.text.clone()],
        };
        let mut update = ReplyUpdate {
            parts_sent: job.parts_sent,
            state: ReplyState::Pending,
            attempts: job.attempts,
            failures: job.failures,
            error: None,
            next_attempt_at: now_ms(),
        };
        while (update.parts_sent as usize) < parts.len() {
            let index = update.parts_sent as usize;
            update.attempts += 1;
            let (url, body) = request(&self.api.config.base_url, &job, index, &parts[index]);
            let sent = self
                .call(
                    reqwest::Method::POST,
                    &url,
                    &body,
                    &job.chat_id,
                    job.failures,
                )
                .await;
            match sent {
                Ok(data) => {
                    update.parts_sent += 1;
                    self.sent_card(&job, &data).await;
                    self.sent(&job, &data).await;
                }
                Err(failure) => {
                    self.failed(failure, &mut update, "lark reply");
                    return self.record(&job, update).await;
                }
            }
        }
        self.metrics.lark_replies.with_label_values(&["sent"]).inc();
        update.state = ReplyState::Sent;
        update.error = None;
        self.record(&job, update).await;
    }

    /// What a failed attempt does to `update`: a wait Lark asked for, a
    /// retry with backoff while the give-up budget lasts, else failed for good.
    fn failed(&self, failure: Failure, update: &mut ReplyUpdate, what: &str) {
        let outcome = |label: &str| self.metrics.lark_replies.with_label_values(&[label]).inc();
        match failure {
            Failure::Wait(after, error) => {
                outcome("retried");
                update.error = Some(error);
                update.next_attempt_at = now_ms() + after.as_millis() as i64;
            }
            Failure::Retry(after, error)
                if update.failures + 1 < i64::from(self.api.config.max_attempts) =>
            {
                update.failures += 1;
                outcome("retried");
                tracing::warn!(attempts = update.attempts, %error, "{what} will be retried");
                update.error = Some(error);
                update.next_attempt_at = now_ms() + after.as_millis() as i64;
            }
            Failure::Retry(_, error) | Failure::Final(error) => {
                outcome("failed");
                tracing::warn!(attempts = update.attempts, %error, "{what} failed for good");
                update.state = ReplyState::Failed;
                update.error = Some(error);
            }
        }
    }

    /// A permission card went out: its message id is kept, for its update.
    /// (A text stored before the cards has nothing to update.)
    async fn sent_card(&self, job: &ReplyJob, data: &Value) {
        let Outbound::Permission {
            session_id,
            request_id,
        } = &job.outbound
        else {
            return;
        };
        if !is_card(&job.text) {
            return;
        }
        let Some(message_id) = data.get("message_id").and_then(Value::as_str) else {
            tracing::warn!("lark sent a permission card without a message id: it cannot follow");
            return;
        };
        let recorded = self
            .store
            .lark_card_sent(
                session_id.clone(),
                request_id.clone(),
                message_id.to_owned(),
            )
            .await;
        if let Err(e) = recorded {
            tracing::error!(error = %e.message, "could not record a permission card's message id");
        }
    }

    /// A message went out for a session: remembered, so a reply to it finds
    /// the session.
    async fn sent(&self, job: &ReplyJob, data: &Value) {
        let (Some(session_id), Some(message_id)) = (
            &job.session_id,
            data.get("message_id").and_then(Value::as_str),
        ) else {
            return;
        };
        let recorded = self
            .store
            .lark_message_sent(
                message_id.to_owned(),
                session_id.clone(),
                job.chat_id.clone(),
            )
            .await;
        if let Err(e) = recorded {
            tracing::error!(error = %e.message, "could not record a sent lark message");
        }
    }

    /// Shows a settled request's card in its final form (one PATCH, retried
    /// like a reply); records what happened.
    async fn update_card(&mut self, job: CardUpdateJob) {
        let mut update = ReplyUpdate {
            parts_sent: 0,
            state: ReplyState::Sent,
            attempts: job.update_attempts + 1,
            failures: job.update_failures,
            error: None,
            next_attempt_at: now_ms(),
        };
        let read = async {
            let row = self
                .store
                .permission(&job.session_id, &job.request_id)
                .await?;
            let session = self.store.session(&job.session_id).await?;
            let session = session.ok_or_else(|| crate::error::Error::not_found("session"))?;
            Ok::<_, crate::error::Error>((row, SessionName::of(&session)))
        };
        let patched = match read.await {
            Ok((row, name)) => {
                let content = card::settled(&row, &name, job.answered_by.as_deref()).to_string();
                let url = format!(
                    "{}/open-apis/im/v1/messages/{}",
                    self.api.config.base_url, job.message_id
                );
                let body = json!({ "content": content });
                self.call(
                    reqwest::Method::PATCH,
                    &url,
                    &body,
                    &job.chat_id,
                    job.update_failures,
                )
                .await
            }
            Err(e) => Err(Failure::Retry(
                self.api.backoff(job.update_failures),
                format!("could not read the request: {}", e.message),
            )),
        };
        match patched {
            Ok(_) => self.metrics.lark_replies.with_label_values(&["sent"]).inc(),
            Err(failure) => {
                update.state = ReplyState::Pending;
                self.failed(failure, &mut update, "lark card update");
            }
        }
        if let Err(e) = self.store.record_card_update(job, update).await {
            tracing::error!(error = %e.message, "could not record a lark card update");
        }
    }

    async fn record(&self, job: &ReplyJob, update: ReplyUpdate) {
        if let Err(e) = self.store.record_reply(job.outbound.clone(), update).await {
            // The reply stays due; it is sent again with the same uuid.
            tracing::error!(error = %e.message, "could not record a lark reply's progress");
        }
    }

    /// One call to Lark's API (a send, a reply, an update) at the rate limits,
    /// refreshing the token once on a token error: the answer's `data`, or why
    /// not. `failures` paces the backoff.
    async fn call(
        &mut self,
        method: reqwest::Method,
        url: &str,
        body: &Value,
        chat_id: &str,
        failures: i64,
    ) -> Result<Value, Failure> {
        self.per_app.until_ready().await;
        self.per_chat.until_key_ready(&chat_id.to_owned()).await;
        let patch = method == reqwest::Method::PATCH;
        let mut refreshed = false;
        loop {
            let token = self.api.token().await?;
            let response = self
                .api
                .http
                .request(method.clone(), url)
                .bearer_auth(&token)
                .json(body)
                .send()
                .await
                .map_err(|e| {
                    self.api
                        .retry(failures, format!("network error: {}", e.without_url()))
                })?;
            let status = response.status();
            let reset = api::reset(&response);
            let answer: Value = response.json().await.unwrap_or(Value::Null);
            if answer.get("code").and_then(Value::as_i64) == Some(0) {
                return Ok(answer.get("data").cloned().unwrap_or(Value::Null));
            }
            let also_final: &[i64] = if patch { &CARD_FINAL_CODES } else { &[] };
            match self
                .api
                .judge(status, reset, &answer, failures, also_final, refreshed)
            {
                None => refreshed = true,
                Some(failure) => return Err(failure),
            }
        }
    }
}

/// The URL and body that send part `index` of a job: a reply to the turn's
/// Lark message (a card rendering the answer's Markdown), or a new card in
/// the chat for a permission request.
fn request(base_url: &str, job: &ReplyJob, index: usize, text: &str) -> (String, Value) {
    match &job.outbound {
        Outbound::Reply {
            turn_id,
            message_id,
        } => (
            format!("{base_url}/open-apis/im/v1/messages/{message_id}/reply"),
            json!({
                "content": markdown::card(text, job.title.as_deref()).to_string(),
                "msg_type": "interactive",
                "reply_in_thread": false,
                // Deterministic: the same turn and part always send the same uuid.
                "uuid": format!("lx-{turn_id}-{index}"),
            }),
        ),
        Outbound::Note {
            message_id,
            reply: true,
        } => (
            format!("{base_url}/open-apis/im/v1/messages/{message_id}/reply"),
            json!({
                "content": text,
                "msg_type": "interactive",
                "reply_in_thread": false,
                "uuid": note_uuid(message_id),
            }),
        ),
        // A note of the broker's own (a close): a new card in the chat.
        Outbound::Note {
            message_id,
            reply: false,
        } => (
            format!("{base_url}/open-apis/im/v1/messages?receive_id_type=chat_id"),
            json!({
                "receive_id": job.chat_id,
                "content": text,
                "msg_type": "interactive",
                "uuid": note_uuid(message_id),
            }),
        ),
        Outbound::Permission {
            session_id,
            request_id,
        } => {
            // A card (`lark::card::open`); a text written before cards, as text.
            let (content, msg_type) = match is_card(text) {
                true => (text.to_owned(), "interactive"),
                false => (json!({ "text": text }).to_string(), "text"),
            };
            (
                format!("{base_url}/open-apis/im/v1/messages?receive_id_type=chat_id"),
                json!({
                    "receive_id": job.chat_id,
                    "content": content,
                    "msg_type": msg_type,
                    "uuid": permission_uuid(session_id, request_id, index),
                }),
            )
        }
    }
}

/// A permission request's Lark `uuid` (at most 50 characters): a digest of
/// the session and request ids, which together may be far longer.
fn permission_uuid(session_id: &str, request_id: &str, index: usize) -> String {
    let mut hasher = Sha256::new();
    hasher.update(session_id.as_bytes());
    hasher.update([0]);
    hasher.update(request_id.as_bytes());
    let digest = hex::encode(hasher.finalize());
    format!("lxp-{}-{index}", &digest[..32])
}

/// A note's Lark `uuid`: a digest of the message it answers (once each).
fn note_uuid(message_id: &str) -> String {
    format!(
        "lxn-{}",
        &hex::encode(Sha256::digest(message_id.as_bytes()))[..32]
    )
}

/// Whether a permission message is a card's JSON (else a text stored before
/// the cards).
fn is_card(text: &str) -> bool {
    serde_json::from_str::<Value>(text).is_ok_and(|v| v.is_object())
}

#[cfg(test)]
mod tests {
    use super::{is_card, permission_uuid};

    #[test]
    fn permission_uuids_fit_larks_limit_and_differ_per_request_and_part() {
        let long = "r".repeat(256);
        let uuid = permission_uuid(&"s".repeat(256), &long, 12);
        assert!(uuid.chars().count() <= 50, "{uuid}");
        assert_eq!(uuid, permission_uuid(&"s".repeat(256), &long, 12));
        assert_ne!(
            permission_uuid("ses_1", "abcde", 0),
            permission_uuid("ses_1", "abcdf", 0)
        );
        assert_ne!(
            permission_uuid("ses_1", "abcde", 0),
            permission_uuid("ses_1", "abcde", 1)
        );
        // The separator keeps ("ab", "c") and ("a", "bc") apart.
        assert_ne!(permission_uuid("ab", "c", 0), permission_uuid("a", "bc", 0));
    }

    #[test]
    fn permission_messages_are_cards_unless_stored_as_text_before() {
        assert!(is_card(r#"{"schema":"2.0"}"#));
        assert!(!is_card("The agent asks to use Bash"));
        assert!(!is_card("42"));
    }
}
