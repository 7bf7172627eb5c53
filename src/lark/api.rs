//! Calling Lark's open API under LARK.md's rules, for the reply dispatcher
//! and the download jobs alike: the tenant token, fetched and cached until
//! ten minutes before its expiry and refreshed once on a token error; what
//! an answer that is not a success means (a wait Lark asked for, a retry
//! with jittered exponential backoff, or a final refusal); and the backoff.

use std::time::{Duration, Instant};

use backon::BackoffBuilder;
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::LarkConfig;

/// Token codes: refresh the tenant token and retry once.
const TOKEN_CODES: [i64; 3] = [99991663, 99991671, 99991677];
/// Rate-limit codes (also HTTP 429).
const RATE_CODES: [i64; 2] = [99991400, 230020];
/// Final codes: recorded, never retried.
const FINAL_CODES: [i64; 5] = [230002, 230011, 230035, 230025, 230001];

/// Why a call did not go through.
#[derive(Debug)]
pub enum Failure {
    /// Lark asked us to wait: try again after this long. Not a failed attempt.
    Wait(Duration, String),
    /// Try again after this long.
    Retry(Duration, String),
    /// Never try again.
    Final(String),
}

/// A caller of Lark's API: its HTTP client, the connector's settings and
/// the cached tenant token.
pub struct Api {
    pub http: reqwest::Client,
    pub config: LarkConfig,
    token: Option<(String, Instant)>,
}

impl Api {
    /// A caller whose requests give up after `timeout`.
    pub fn new(config: LarkConfig, timeout: Duration) -> Self {
        Self {
            http: reqwest::Client::builder()
                .timeout(timeout)
                .build()
                .expect("the HTTP client builds"),
            config,
            token: None,
        }
    }

    /// The cached tenant token, fetched when missing or within 10 minutes of expiry.
    pub async fn token(&mut self) -> Result<String, Failure> {
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

    /// What an answer that is not a success means: `None` to refresh the
    /// token and call once more (a token code, the token not refreshed yet
    /// for this call; the cached one is forgotten); a wait for a rate limit
    /// (`reset`, Lark's `x-ogw-ratelimit-reset`, when it said); a final
    /// refusal for a final code or one of `also_final`; else a retry after
    /// the backoff for `failures` failed attempts so far.
    pub fn judge(
        &mut self,
        status: StatusCode,
        reset: Option<u64>,
        answer: &Value,
        failures: i64,
        also_final: &[i64],
        refreshed: bool,
    ) -> Option<Failure> {
        let code = answer.get("code").and_then(Value::as_i64);
        let msg = answer
            .get("msg")
            .and_then(Value::as_str)
            .unwrap_or_default();
        Some(match code {
            Some(code) if TOKEN_CODES.contains(&code) && !refreshed => {
                self.token = None;
                return None;
            }
            _ if status == StatusCode::TOO_MANY_REQUESTS
                || code.is_some_and(|c| RATE_CODES.contains(&c)) =>
            {
                let after = reset.map_or_else(|| self.backoff(failures), Duration::from_secs);
                Failure::Wait(after, format!("rate limited by Lark (code {code:?})"))
            }
            Some(code) if FINAL_CODES.contains(&code) || also_final.contains(&code) => {
                Failure::Final(format!("Lark refused it: code {code} ({msg})"))
            }
            Some(code) => self.retry(failures, format!("Lark answered code {code} ({msg})")),
            None => self.retry(
                failures,
                format!("Lark answered HTTP {status} without a code"),
            ),
        })
    }

    pub fn retry(&self, failures: i64, error: String) -> Failure {
        Failure::Retry(self.backoff(failures), error)
    }

    /// Jittered exponential backoff by the failed attempts so far.
    pub fn backoff(&self, failures: i64) -> Duration {
        backon::ExponentialBuilder::default()
            .with_min_delay(self.config.retry_base)
            .with_max_delay(self.config.retry_max)
            .with_jitter()
            .without_max_times()
            .build()
            .nth(failures.clamp(0, 30) as usize)
            .unwrap_or(self.config.retry_max)
    }
}

/// Sleeps until `next` (a job's due time, ms since the epoch; a minute
/// at most, as a safety net, and when none is due) or until `woken`; false
/// on shutdown. The outbox's and the download jobs' loops wait here.
pub async fn until_due(
    next: Option<i64>,
    woken: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
    shutdown: &tokio_util::sync::CancellationToken,
) -> bool {
    let wait = next.map_or(Duration::from_secs(60), |at| {
        Duration::from_millis((at - crate::time::now_ms()).clamp(0, 60_000) as u64)
    });
    tokio::select! {
        _ = woken => true,
        _ = tokio::time::sleep(wait) => true,
        _ = shutdown.cancelled() => false,
    }
}

/// Lark's `x-ogw-ratelimit-reset` (seconds), when an answer carries it.
pub fn reset(response: &reqwest::Response) -> Option<u64> {
    response
        .headers()
        .get("x-ogw-ratelimit-reset")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
}
