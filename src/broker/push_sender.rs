//! Web Push's sending (WEB.md "Installable, and it tells you"): what the
//! person is told, and when. It follows the sessions' durable event logs
//! after their commits (the store's change feed names the session; the log
//! says what happened), so it never blocks a decision: a pending request
//! (tool, question, plan: `Urgency: high`), an answer (at most one a minute
//! per session), an agent stalled. Each goes to every subscription,
//! encrypted (RFC 8291 `aes128gcm`) and signed (VAPID, RFC 8292) by
//! `web-push-native`, sent with the broker's own HTTP client; 429 and 5xx
//! are retried with backoff, 404 and 410 remove the subscription. The
//! payload names only the session and the kind: the service worker reads
//! the text with its own credential, so no push service carries it.
//!
//! It reads nothing while no browser is subscribed (a plain read of the
//! SQLite store folds its journal first, which the hot path must not pay
//! for), and gathers the changes of a short while into one read per session.
//!
//! Its queue is in memory: a notification due when the broker stops is not
//! sent after a restart. PostgreSQL replicas each follow every change, so
//! each sends; a browser shows one notification per session and kind (its
//! tag), however many arrive.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use web_push_native::{Auth, WebPushBuilder};

use super::Broker;
use crate::decide::EventRow;
use crate::push::{PushSubscriptionRow, Vapid};
use crate::store::Change;
use crate::time::now_ms;

/// Sessions whose change waits to be looked at; more are dropped (logged).
const QUEUE: usize = 1024;
/// Changes gathered before the logs are read.
const GATHER: Duration = Duration::from_millis(200);
/// Deliveries in flight at once.
const IN_FLIGHT: usize = 16;
/// Attempts of one delivery (429, 5xx, no answer), 1 s apart and doubling.
const ATTEMPTS: u32 = 5;
/// Answers told per session, at most one this often.
const ANSWERS_EVERY_MS: i64 = 60_000;
/// Events read from a session's log at a time.
const PAGE: u32 = 64;
/// How long a message (its `TTL`) and its VAPID signature (`exp`) hold.
const VALID_FOR: Duration = Duration::from_secs(12 * 60 * 60);
/// The VAPID contact (RFC 8292 `sub`).
const CONTACT: &str = "mailto:loopx@localhost";

/// What the person is told: the payload's `kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushKind {
    NeedsYou,
    Answered,
    Stalled,
}

impl PushKind {
    fn word(self) -> &'static str {
        match self {
            PushKind::NeedsYou => "needs_you",
            PushKind::Answered => "answered",
            PushKind::Stalled => "stalled",
        }
    }

    /// The event of a session's log a person is told of, if any.
    pub fn of(event: &EventRow) -> Option<Self> {
        match (event.kind.as_str(), event.state.as_str()) {
            ("permission", "pending") => Some(PushKind::NeedsYou),
            ("turn", "completed") => Some(PushKind::Answered),
            ("agent", "stalled") => Some(PushKind::Stalled),
            _ => None,
        }
    }
}

/// What every delivery shares.
struct Sender {
    /// When the sender started: older events are not told.
    started: i64,
    http: reqwest::Client,
    vapid: Arc<Vapid>,
    in_flight: Arc<Semaphore>,
}

/// Where each session's log was read up to, and when it was last told of an answer.
#[derive(Default)]
struct Followed {
    read_up_to: HashMap<String, i64>,
    answered_at: HashMap<String, i64>,
}

impl Broker {
    /// Follows the sessions' logs and sends what they tell, until `shutdown`.
    pub fn spawn_push(
        self: &Arc<Self>,
        vapid: Arc<Vapid>,
        shutdown: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let (tx, rx) = mpsc::channel::<String>(QUEUE);
        let wanted = self.push_wanted.clone();
        self.store
            .feed()
            .subscribe(Arc::new(move |change: &Change| {
                if let Change::Session(changed) = change
                    && wanted.load(Ordering::Relaxed)
                    && tx.try_send(changed.session_id.clone()).is_err()
                {
                    tracing::warn!("push: the queue is full; a change goes untold");
                }
            }));
        let broker = self.clone();
        tokio::spawn(async move { broker.follow(rx, vapid, shutdown).await })
    }

    async fn follow(
        self: Arc<Self>,
        mut rx: mpsc::Receiver<String>,
        vapid: Arc<Vapid>,
        shutdown: CancellationToken,
    ) {
        let sender = Sender {
            started: now_ms(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .expect("a plain HTTP client builds"),
            vapid,
            in_flight: Arc::new(Semaphore::new(IN_FLIGHT)),
        };
        let mut followed = Followed::default();
        match self.store.all_push_subscriptions().await {
            Ok(rows) => self.push_wanted.store(!rows.is_empty(), Ordering::Relaxed),
            Err(e) => tracing::warn!(error = %e, "push: reading the subscriptions failed"),
        }
        loop {
            let first = tokio::select! {
                _ = shutdown.cancelled() => return,
                next = rx.recv() => match next { Some(id) => id, None => return },
            };
            tokio::time::sleep(GATHER).await;
            let mut sessions = vec![first];
            while let Ok(id) = rx.try_recv() {
                if !sessions.contains(&id) {
                    sessions.push(id);
                }
            }
            for session_id in sessions {
                self.tell(&session_id, &sender, &mut followed).await;
            }
        }
    }

    /// Sends what the session's log tells to every subscription.
    async fn tell(self: &Arc<Self>, session_id: &str, sender: &Sender, followed: &mut Followed) {
        let kinds = match self.untold(session_id, sender.started, followed).await {
            Ok(kinds) => kinds,
            Err(e) => {
                tracing::warn!(error = %e, "push: reading a session's log failed");
                return;
            }
        };
        if kinds.is_empty() {
            return;
        }
        let subscriptions = match self.store.all_push_subscriptions().await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, "push: reading the subscriptions failed");
                return;
            }
        };
        if subscriptions.is_empty() {
            self.push_wanted.store(false, Ordering::Relaxed);
        }
        for kind in kinds {
            for subscription in &subscriptions {
                let permit = sender
                    .in_flight
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("never closed");
                let job = Delivery {
                    broker: self.clone(),
                    http: sender.http.clone(),
                    vapid: sender.vapid.clone(),
                    subscription: subscription.clone(),
                    session_id: session_id.to_owned(),
                    kind,
                };
                tokio::spawn(async move {
                    job.send().await;
                    drop(permit);
                });
            }
        }
    }

    /// What the session's log tells since it was last read (since the
    /// sender started, the first time), answers at most once a minute.
    async fn untold(
        &self,
        session_id: &str,
        started: i64,
        followed: &mut Followed,
    ) -> crate::error::Result<Vec<PushKind>> {
        let after = match followed.read_up_to.get(session_id) {
            Some(&after) => after,
            None => (self.store.last_event_no(session_id).await? - i64::from(PAGE)).max(0),
        };
        let events = self.store.events(session_id, after, PAGE).await?;
        let mut kinds = Vec::new();
        for event in &events {
            let Some(kind) = PushKind::of(event).filter(|_| event.at >= started) else {
                continue;
            };
            if kind == PushKind::Answered {
                let last = followed.answered_at.get(session_id).copied();
                if last.is_some_and(|at| event.at - at < ANSWERS_EVERY_MS) {
                    continue;
                }
                followed.answered_at.insert(session_id.to_owned(), event.at);
            }
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        if let Some(last) = events.last() {
            followed
                .read_up_to
                .insert(session_id.to_owned(), last.event_no);
        }
        Ok(kinds)
    }
}

/// One notification to one subscription.
struct Delivery {
    broker: Arc<Broker>,
    http: reqwest::Client,
    vapid: Arc<Vapid>,
    subscription: PushSubscriptionRow,
    session_id: String,
    kind: PushKind,
}

impl Delivery {
    async fn send(self) {
        let mut wait = Duration::from_secs(1);
        for attempt in 1..=ATTEMPTS {
            match self.attempt().await {
                Outcome::Sent => return,
                Outcome::Gone => {
                    let sub = &self.subscription;
                    let removed = self
                        .broker
                        .store
                        .unsubscribe(sub.subscription_id.clone(), sub.device_id.clone())
                        .await;
                    if let Err(e) = removed {
                        tracing::warn!(error = %e, "push: removing a gone subscription failed");
                    }
                    return;
                }
                Outcome::Refused(status) => {
                    tracing::warn!(status, "push: the push service refused a message");
                    return;
                }
                Outcome::Retry(after) if attempt < ATTEMPTS => {
                    tokio::time::sleep(after.unwrap_or(wait).min(Duration::from_secs(60))).await;
                    wait *= 2;
                }
                Outcome::Retry(_) => {}
            }
        }
        tracing::warn!("push: a message was not delivered after {ATTEMPTS} attempts");
    }

    async fn attempt(&self) -> Outcome {
        let Some(request) = self.request() else {
            return Outcome::Refused(0);
        };
        let response = match request.send().await {
            Ok(response) => response,
            Err(_) => return Outcome::Retry(None),
        };
        let status = response.status().as_u16();
        match status {
            200..=299 => Outcome::Sent,
            404 | 410 => Outcome::Gone,
            429 | 500..=599 => Outcome::Retry(
                response
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok())
                    .map(Duration::from_secs),
            ),
            _ => Outcome::Refused(status),
        }
    }

    /// The encrypted, signed request; `None` for a subscription whose keys
    /// no longer read (they were checked when it was made).
    fn request(&self) -> Option<reqwest::RequestBuilder> {
        use base64::Engine;
        let decode = |v: &str| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(v.trim_end_matches('='))
                .ok()
        };
        let sub = &self.subscription;
        let public =
            web_push_native::p256::PublicKey::from_sec1_bytes(&decode(&sub.p256dh)?).ok()?;
        let auth = decode(&sub.auth)?;
        let endpoint: axum::http::Uri = sub.endpoint.parse().ok()?;
        let payload = serde_json::json!({"session_id": self.session_id, "kind": self.kind.word()});
        let built = WebPushBuilder::new(endpoint, public, Auth::clone_from_slice(auth.get(..16)?))
            .with_valid_duration(VALID_FOR)
            .build(payload.to_string())
            .ok()?;
        let (parts, body) = built.into_parts();
        let mut request = self.http.post(&sub.endpoint).body(body);
        for (name, value) in &parts.headers {
            request = request.header(name.as_str(), value.as_bytes());
        }
        let urgency = if self.kind == PushKind::NeedsYou {
            "high"
        } else {
            "normal"
        };
        Some(request.header("Urgency", urgency).header(
            reqwest::header::AUTHORIZATION,
            vapid(&self.vapid, &sub.endpoint)?,
        ))
    }
}

/// The VAPID `Authorization` (RFC 8292): a JWT signed with the broker's
/// key whose `aud` is the endpoint's origin, port included (the crate's own
/// signer leaves a port out, which a push service on another port refuses).
fn vapid(key: &Vapid, endpoint: &str) -> Option<String> {
    use web_push_native::jwt_simple::prelude::*;
    let origin = url::Url::parse(endpoint)
        .ok()?
        .origin()
        .ascii_serialization();
    let claims = Claims::create(VALID_FOR.into())
        .with_audience(origin)
        .with_subject(CONTACT);
    let token = key.key_pair().sign(claims).ok()?;
    Some(format!("vapid t={token}, k={}", key.public_key()))
}

enum Outcome {
    Sent,
    Gone,
    Refused(u16),
    Retry(Option<Duration>),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: &str, state: &str) -> EventRow {
        EventRow {
            event_no: 1,
            kind: kind.into(),
            turn_id: None,
            seq: None,
            request_id: None,
            state: state.into(),
            at: 0,
        }
    }

    #[test]
    fn what_a_person_is_told_of() {
        assert_eq!(
            PushKind::of(&event("permission", "pending")),
            Some(PushKind::NeedsYou)
        );
        assert_eq!(
            PushKind::of(&event("turn", "completed")),
            Some(PushKind::Answered)
        );
        assert_eq!(
            PushKind::of(&event("agent", "stalled")),
            Some(PushKind::Stalled)
        );
        for (kind, state) in [
            ("permission", "allowed"),
            ("turn", "queued"),
            ("agent", "working"),
            ("session", "closed"),
        ] {
            assert_eq!(PushKind::of(&event(kind, state)), None, "{kind} {state}");
        }
    }

    #[test]
    fn the_vapid_audience_is_the_endpoints_origin_with_its_port() {
        use web_push_native::jwt_simple::prelude::*;
        let key = Vapid::generate();
        for (endpoint, aud) in [
            ("http://127.0.0.1:9/push/x", "http://127.0.0.1:9"),
            (
                "https://fcm.googleapis.com/fcm/send/abc",
                "https://fcm.googleapis.com",
            ),
            ("https://push.example.net:443/x", "https://push.example.net"),
        ] {
            let header = vapid(&key, endpoint).unwrap();
            let token = header
                .strip_prefix("vapid t=")
                .unwrap()
                .split(',')
                .next()
                .unwrap();
            let claims = key
                .key_pair()
                .public_key()
                .verify_token::<NoCustomClaims>(token, None)
                .unwrap();
            assert_eq!(claims.audiences.unwrap().into_string().unwrap(), aud);
            assert_eq!(claims.subject.as_deref(), Some(CONTACT));
            assert!(header.ends_with(&format!("k={}", key.public_key())));
        }
    }
}
