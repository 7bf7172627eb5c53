//! The reply dispatcher: one per broker, it sends the outbox's pending
//! messages: replies with Lark's reply API, permission-request messages with
//! its send-message API (`POST /open-apis/im/v1/messages?receive_id_type=chat_id`:
//! they answer no message; same envelope and codes). Woken by a completion or
//! a request (never polling fast), it honours Lark's rate limits, retries
//! network errors and 5xx with jittered exponential backoff, refreshes the
//! tenant token ahead of expiry and once on a token error, and records final
//! errors instead of retrying forever. The Lark `uuid` comes from the turn or
//! the request, so a retried send never doubles a message. It never logs a
//! message's text.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::BackoffBuilder;
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{LarkConfig, markdown};
use crate::metrics::Metrics;
use crate::model::ReplyState;
use crate::store::{Outbound, ReplyJob, ReplyUpdate, Store};
use crate::time::now_ms;

/// Lark's limit on a text message's request body (150 KB), less room for the
/// rest of the body (uuid, msg_type, the part note).
const PART_BYTES: usize = 150 * 1024 - 512;
/// Lark's limit on a card (30 KB), less room for the rest of the request
/// body: the card's own JSON, the uuid, msg_type.
const CARD_BYTES: usize = 30 * 1024 - 1024;
/// Token codes: refresh the tenant token and retry once.
const TOKEN_CODES: [i64; 3] = [99991663, 99991671, 99991677];
/// Rate-limit codes (also HTTP 429).
const RATE_CODES: [i64; 2] = [99991400, 230020];
/// Final codes: recorded on the turn, never retried.
const FINAL_CODES: [i64; 5] = [230002, 230011, 230035, 230025, 230001];

/// Why a send did not go through.
enum Failure {
    /// Lark asked us to wait: try again after this long. Not a failed attempt.
    Wait(Duration, String),
    /// Try again after this long.
    Retry(Duration, String),
    /// Never try again.
    Final(String),
}

pub struct Dispatcher {
    store: Arc<dyn Store>,
    config: LarkConfig,
    http: reqwest::Client,
    wake: Arc<Notify>,
    shutdown: CancellationToken,
    metrics: Arc<Metrics>,
    token: Option<(String, Instant)>,
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
            config,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("the HTTP client builds"),
            wake,
            shutdown,
            metrics,
            token: None,
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
            let busy = !due.is_empty();
            let shutdown = self.shutdown.clone();
            for job in due {
                // A hanging Lark never holds up a shutdown: the reply stays
                // pending and goes out, with the same uuid, after the restart.
                tokio::select! {
                    _ = self.send(job) => {}
                    _ = shutdown.cancelled() => return,
                }
            }
            if busy {
                continue;
            }
            // Sleep until the next retry falls due (or a minute, as a safety net).
            let next = self.store.next_reply_due().await.ok().flatten();
            let wait = next.map_or(Duration::from_secs(60), |at| {
                Duration::from_millis((at - now_ms()).clamp(0, 60_000) as u64)
            });
            tokio::select! {
                _ = woken => {}
                _ = tokio::time::sleep(wait) => {}
                _ = self.shutdown.cancelled() => return,
            }
        }
    }

    /// Sends a reply's remaining parts in order; records what happened.
    async fn send(&mut self, job: ReplyJob) {
        let parts = match job.outbound {
            Outbound::Reply { .. } => {
                markdown::split(&markdown::escape_html(&job.text), CARD_BYTES)
            }
            Outbound::Permission { .. } => split(&job.text, PART_BYTES),
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
            match self.send_part(&job, index, &parts[index]).await {
                Ok(()) => update.parts_sent += 1,
                Err(Failure::Wait(after, error)) => {
                    self.metrics
                        .lark_replies
                        .with_label_values(&["retried"])
                        .inc();
                    update.error = Some(error);
                    update.next_attempt_at = now_ms() + after.as_millis() as i64;
                    return self.record(&job, update).await;
                }
                Err(Failure::Retry(after, error))
                    if update.failures + 1 < i64::from(self.config.max_attempts) =>
                {
                    update.failures += 1;
                    self.metrics
                        .lark_replies
                        .with_label_values(&["retried"])
                        .inc();
                    tracing::warn!(attempts = update.attempts, %error, "lark reply will be retried");
                    update.error = Some(error);
                    update.next_attempt_at = now_ms() + after.as_millis() as i64;
                    return self.record(&job, update).await;
                }
                Err(Failure::Retry(_, error)) | Err(Failure::Final(error)) => {
                    self.metrics
                        .lark_replies
                        .with_label_values(&["failed"])
                        .inc();
                    tracing::warn!(attempts = update.attempts, %error, "lark reply failed for good");
                    update.state = ReplyState::Failed;
                    update.error = Some(error);
                    return self.record(&job, update).await;
                }
            }
        }
        self.metrics.lark_replies.with_label_values(&["sent"]).inc();
        update.state = ReplyState::Sent;
        update.error = None;
        self.record(&job, update).await;
    }

    async fn record(&self, job: &ReplyJob, update: ReplyUpdate) {
        if let Err(e) = self.store.record_reply(job.outbound.clone(), update).await {
            // The reply stays due; it is sent again with the same uuid.
            tracing::error!(error = %e.message, "could not record a lark reply's progress");
        }
    }

    async fn send_part(&mut self, job: &ReplyJob, index: usize, text: &str) -> Result<(), Failure> {
        self.per_app.until_ready().await;
        self.per_chat.until_key_ready(&job.chat_id).await;
        let mut refreshed = false;
        loop {
            let token = self.token().await?;
            let (url, body) = request(&self.config.base_url, job, index, text);
            let response = self
                .http
                .post(&url)
                .bearer_auth(&token)
                .json(&body)
                .send()
                .await
                .map_err(|e| self.retry(job, format!("network error: {}", e.without_url())))?;
            let status = response.status();
            let reset = response
                .headers()
                .get("x-ogw-ratelimit-reset")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok());
            let answer: Value = response.json().await.unwrap_or(Value::Null);
            let code = answer.get("code").and_then(Value::as_i64);
            let msg = answer
                .get("msg")
                .and_then(Value::as_str)
                .unwrap_or_default();
            match code {
                Some(0) => return Ok(()),
                Some(code) if TOKEN_CODES.contains(&code) && !refreshed => {
                    refreshed = true;
                    self.token = None;
                }
                _ if status.as_u16() == 429 || code.is_some_and(|c| RATE_CODES.contains(&c)) => {
                    let after = reset.map_or_else(|| self.backoff(job), Duration::from_secs);
                    return Err(Failure::Wait(
                        after,
                        format!("rate limited by Lark (code {code:?})"),
                    ));
                }
                Some(code) if FINAL_CODES.contains(&code) => {
                    return Err(Failure::Final(format!(
                        "Lark refused the reply: code {code} ({msg})"
                    )));
                }
                Some(code) => {
                    return Err(self.retry(job, format!("Lark answered code {code} ({msg})")));
                }
                None => {
                    return Err(
                        self.retry(job, format!("Lark answered HTTP {status} without a code"))
                    );
                }
            }
        }
    }

    /// The cached tenant token, fetched when missing or within 10 minutes of expiry.
    async fn token(&mut self) -> Result<String, Failure> {
        if let Some((token, expires)) = &self.token
            && Instant::now() + Duration::from_secs(600) < *expires
        {
            return Ok(token.clone());
        }
        let url = format!(
            "{}/open-apis/auth/v3/tenant_access_token/internal",
            self.config.base_url
        );
        let retry = |error: String| Failure::Retry(self.config.retry_base, error);
        let answer: Value = self
            .http
            .post(&url)
            .json(&json!({"app_id": self.config.app_id, "app_secret": self.config.app_secret}))
            .send()
            .await
            .map_err(|e| retry(format!("token request failed: {}", e.without_url())))?
            .json()
            .await
            .map_err(|_| retry("token answer is not JSON".into()))?;
        let code = answer.get("code").and_then(Value::as_i64);
        let token = answer.get("tenant_access_token").and_then(Value::as_str);
        let (Some(0), Some(token)) = (code, token) else {
            return Err(retry(format!(
                "Lark refused the tenant token: code {code:?}"
            )));
        };
        let expire = answer.get("expire").and_then(Value::as_u64).unwrap_or(7200);
        self.token = Some((
            token.to_owned(),
            Instant::now() + Duration::from_secs(expire),
        ));
        Ok(token.to_owned())
    }

    fn retry(&self, job: &ReplyJob, error: String) -> Failure {
        Failure::Retry(self.backoff(job), error)
    }

    /// Jittered exponential backoff by the reply's attempt count.
    fn backoff(&self, job: &ReplyJob) -> Duration {
        backon::ExponentialBuilder::default()
            .with_min_delay(self.config.retry_base)
            .with_max_delay(self.config.retry_max)
            .with_jitter()
            .without_max_times()
            .build()
            .nth(job.failures.clamp(0, 30) as usize)
            .unwrap_or(self.config.retry_max)
    }
}

/// The URL and body that send part `index` of a job: a reply to the turn's
/// Lark message (a card rendering the answer's Markdown), or a new text
/// message in the chat for a permission request.
fn request(base_url: &str, job: &ReplyJob, index: usize, text: &str) -> (String, Value) {
    match &job.outbound {
        Outbound::Reply {
            turn_id,
            message_id,
        } => (
            format!("{base_url}/open-apis/im/v1/messages/{message_id}/reply"),
            json!({
                "content": markdown::card(text).to_string(),
                "msg_type": "interactive",
                "reply_in_thread": false,
                // Deterministic: the same turn and part always send the same uuid.
                "uuid": format!("lx-{turn_id}-{index}"),
            }),
        ),
        Outbound::Permission {
            session_id,
            request_id,
        } => (
            format!("{base_url}/open-apis/im/v1/messages?receive_id_type=chat_id"),
            json!({
                "receive_id": job.chat_id,
                "content": json!({ "text": text }).to_string(),
                "msg_type": "text",
                "uuid": permission_uuid(session_id, request_id, index),
            }),
        ),
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

/// Splits an answer into parts that each take at most `limit` bytes of the
/// reply body, on char boundaries, numbering them ("(1/3)") when there is
/// more than one.
fn split(text: &str, limit: usize) -> Vec<String> {
    let mut parts = Vec::new();
    let (mut start, mut size) = (0, 0);
    for (at, c) in text.char_indices() {
        if size + markdown::body_bytes(c) > limit {
            parts.push(text[start..at].to_owned());
            (start, size) = (at, 0);
        }
        size += markdown::body_bytes(c);
    }
    parts.push(text[start..].to_owned());
    markdown::number(&mut parts, "\n");
    parts
}

#[cfg(test)]
mod tests {
    use super::{permission_uuid, split};

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
    fn long_answers_split_in_order_on_char_boundaries() {
        assert_eq!(split("short", 10), vec!["short".to_owned()]);
        // Quotes take 4 body bytes each.
        assert_eq!(split(r#""""""#, 8).len(), 2);
        let parts = split(&"é".repeat(10), 7);
        assert_eq!(parts.len(), 4);
        assert!(parts[0].starts_with("ééé") && parts[0].ends_with("(1/4)"));
        let joined: String = parts
            .iter()
            .map(|p| p.split('\n').next().unwrap())
            .collect();
        assert_eq!(joined, "é".repeat(10));
    }
}
