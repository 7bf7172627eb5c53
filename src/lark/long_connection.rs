//! Lark's long connection (LARK.md, "Long connection"): the broker asks Lark
//! for an endpoint (`POST {base}/callback/ws/endpoint` with the app id and
//! secret), opens the WebSocket it names and receives the app's events over
//! it, so it needs outbound HTTPS only. It pings at Lark's interval with the
//! endpoint's service id and reconnects when pongs stop; applies the
//! ClientConfig Lark sends with the endpoint and with pongs; reassembles
//! fragmented events (bounded, dropped after 10 s); hands each whole event to
//! the one ingestion path ([`super::inbound`]) in arrival order and
//! acknowledges it only after the commit (code 500 when the store failed, so
//! Lark redelivers). It reconnects forever (the pushed interval, a random
//! delay before the first try) unless Lark refuses the app for good, which
//! stops the connector alone. Its state is one INFO line per change, two
//! metrics and [`ConnectorStatus`]; it never logs the secret, the endpoint
//! URL (it carries Lark's ticket) or a message's text.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use prost::Message as _;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_util::sync::CancellationToken;

pub use super::ClientConfig;
use super::LarkConfig;
use super::frame::{CONTROL, DATA, Frame};
use super::inbound::{self, Envelope};
use crate::broker::Broker;
use crate::metrics::Metrics;
use crate::model::{LarkConnectionState, LarkConnector, LarkEvents};
use crate::time::{now_ms, rfc3339};

/// Bootstrap codes that mean "try again" (busy, internal error).
const RETRY_CODES: [i64; 2] = [1, 1000040343];
/// The app asked the wrong region's Open Platform.
const WRONG_DOMAIN: i64 = 1000040351;
/// Handshake status 514 with this auth code: over 50 connections per app.
const OVER_CONNECTION_LIMIT: &str = "1000040350";
/// Pongs missing for this many ping intervals: the connection is dead.
const PONG_INTERVALS: u32 = 3;
/// An incomplete fragment set is dropped after this long.
const FRAGMENT_TTL: Duration = Duration::from_secs(10);
/// The largest event (as the webhook's body limit) and the most fragment
/// bytes held at once, over all sets.
const MAX_EVENT_BYTES: usize = crate::broker::MAX_BODY_BYTES;
const MAX_BUFFERED_BYTES: usize = 4 * MAX_EVENT_BYTES;
/// The most fragments one event may come in.
const MAX_FRAGMENTS: usize = 256;

/// A ClientConfig as Lark sends it (seconds). `ReconnectCount` is not
/// honoured: an owner-local broker reconnects for as long as it runs.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
struct PushedConfig {
    ping_interval: Option<i64>,
    reconnect_interval: Option<i64>,
    reconnect_nonce: Option<i64>,
}

impl ClientConfig {
    fn apply(&mut self, pushed: &PushedConfig) {
        let secs = |s: i64| Duration::from_secs(s as u64);
        if let Some(s) = pushed.ping_interval.filter(|s| *s > 0) {
            self.ping_interval = secs(s);
        }
        if let Some(s) = pushed.reconnect_interval.filter(|s| *s >= 0) {
            self.reconnect_interval = secs(s);
        }
        if let Some(s) = pushed.reconnect_nonce.filter(|s| *s >= 0) {
            self.reconnect_nonce = secs(s);
        }
    }
}

/// What the connector is doing, for `GET /v1/connectors/lark` and `/metrics`.
pub struct ConnectorStatus {
    inner: Mutex<StatusInner>,
    connected: prometheus::IntGauge,
    reconnects: prometheus::IntCounter,
}

struct StatusInner {
    /// `None` until the first state is entered (and logged).
    state: Option<LarkConnectionState>,
    reason: Option<String>,
    since_ms: i64,
}

impl ConnectorStatus {
    pub fn new(metrics: &Metrics) -> Self {
        Self {
            inner: Mutex::new(StatusInner {
                state: None,
                reason: None,
                since_ms: now_ms(),
            }),
            connected: metrics.lark_connected.clone(),
            reconnects: metrics.lark_reconnects.clone(),
        }
    }

    /// The connector as the API shows it.
    pub fn snapshot(&self) -> LarkConnector {
        let inner = self
            .inner
            .lock()
            .expect("the status lock is never poisoned");
        LarkConnector {
            events: LarkEvents::LongConnection,
            state: Some(inner.state.unwrap_or(LarkConnectionState::Connecting)),
            reason: inner.reason.clone(),
            since: Some(rfc3339(inner.since_ms)),
            reconnects: self.reconnects.get(),
        }
    }

    /// Enters `state`, with one log line when it changed.
    fn set(&self, state: LarkConnectionState, reason: Option<String>) {
        let mut inner = self
            .inner
            .lock()
            .expect("the status lock is never poisoned");
        if inner.state == Some(state) && inner.reason == reason {
            return;
        }
        let why = reason.as_deref().unwrap_or_default();
        match state {
            LarkConnectionState::Connecting => tracing::info!("lark long connection: connecting"),
            LarkConnectionState::Connected => tracing::info!("lark long connection: connected"),
            LarkConnectionState::Retrying => {
                tracing::info!("lark long connection: retrying: {why}")
            }
            LarkConnectionState::Fatal => tracing::error!(
                "lark long connection: stopped for good (the rest of the broker serves on; fix the Lark settings and restart): {why}"
            ),
            LarkConnectionState::Stopped => tracing::info!("lark long connection: closed"),
        }
        self.connected
            .set(i64::from(state == LarkConnectionState::Connected));
        *inner = StatusInner {
            state: Some(state),
            reason,
            since_ms: now_ms(),
        };
    }
}

/// Why a connection ended.
enum End {
    /// Try again (the reason, for the log and the status).
    Retry(String),
    /// Lark refused the app for good.
    Fatal(String),
    Shutdown,
}

/// The connector: one at a time, for the broker's life.
pub struct LongConnection {
    config: LarkConfig,
    broker: Arc<Broker>,
    status: Arc<ConnectorStatus>,
    http: reqwest::Client,
    shutdown: CancellationToken,
    /// How long a shutdown waits for an event being committed, to acknowledge it.
    drain: Duration,
}

/// An endpoint Lark handed out.
struct Endpoint {
    url: String,
    service_id: i32,
}

impl LongConnection {
    pub fn new(
        config: LarkConfig,
        broker: Arc<Broker>,
        status: Arc<ConnectorStatus>,
        shutdown: CancellationToken,
        drain: Duration,
    ) -> Self {
        Self {
            config,
            broker,
            status,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("the HTTP client builds"),
            shutdown,
            drain,
        }
    }

    /// Connects and reconnects until shutdown or a fatal refusal.
    pub async fn run(self) {
        let mut settings = self.config.long_connection;
        // Failures since the last connection: the first retry waits a random
        // delay (so many clients do not return at once), later ones the interval.
        let mut failures = 0u32;
        loop {
            self.status.set(LarkConnectionState::Connecting, None);
            let end = self.connect_and_serve(&mut settings, &mut failures).await;
            let reason = match end {
                End::Shutdown => {
                    self.status.set(LarkConnectionState::Stopped, None);
                    return;
                }
                End::Fatal(reason) => {
                    self.status.set(LarkConnectionState::Fatal, Some(reason));
                    return;
                }
                End::Retry(reason) => reason,
            };
            self.status.reconnects.inc();
            let delay = if failures == 0 {
                jitter(settings.reconnect_nonce)
            } else {
                settings.reconnect_interval
            };
            failures += 1;
            self.status.set(
                LarkConnectionState::Retrying,
                Some(format!("{reason}; next try in {} s", delay.as_secs())),
            );
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = self.shutdown.cancelled() => {
                    self.status.set(LarkConnectionState::Stopped, None);
                    return;
                }
            }
        }
    }

    async fn connect_and_serve(&self, settings: &mut ClientConfig, failures: &mut u32) -> End {
        let endpoint = tokio::select! {
            endpoint = self.bootstrap(settings) => endpoint,
            _ = self.shutdown.cancelled() => return End::Shutdown,
        };
        let endpoint = match endpoint {
            Ok(endpoint) => endpoint,
            Err(end) => return end,
        };
        let socket = tokio::select! {
            socket = connect(&endpoint.url) => socket,
            _ = self.shutdown.cancelled() => return End::Shutdown,
        };
        let socket = match socket {
            Ok(socket) => socket,
            Err(end) => return end,
        };
        *failures = 0;
        self.status.set(LarkConnectionState::Connected, None);
        self.serve(socket, endpoint.service_id, settings).await
    }

    /// `POST {base}/callback/ws/endpoint`: the WebSocket URL, its service id,
    /// and Lark's ClientConfig (applied).
    async fn bootstrap(&self, settings: &mut ClientConfig) -> Result<Endpoint, End> {
        #[derive(Deserialize)]
        struct Answer {
            code: Option<i64>,
            #[serde(default)]
            msg: String,
            data: Option<Data>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Data {
            #[serde(rename = "URL")]
            url: String,
            client_config: Option<PushedConfig>,
        }
        let url = format!("{}/callback/ws/endpoint", self.config.base_url);
        let response = self
            .http
            .post(url)
            .header("locale", "zh")
            .json(&json!({"AppID": self.config.app_id, "AppSecret": self.config.app_secret}))
            .send()
            .await
            .map_err(|e| {
                End::Retry(format!(
                    "cannot reach Lark's endpoint API: {}",
                    e.without_url()
                ))
            })?;
        let status = response.status();
        if status != reqwest::StatusCode::OK {
            return Err(End::Retry(format!(
                "Lark's endpoint API answered HTTP {status}"
            )));
        }
        let answer: Answer = response
            .json()
            .await
            .map_err(|_| End::Retry("Lark's endpoint answer is not JSON".into()))?;
        let msg: String = answer.msg.chars().take(200).collect();
        match answer.code {
            Some(0) => {}
            Some(code) if RETRY_CODES.contains(&code) => {
                return Err(End::Retry(format!("Lark is busy (code {code}: {msg})")));
            }
            Some(WRONG_DOMAIN) => {
                return Err(End::Fatal(format!(
                    "Lark refused the app: code {WRONG_DOMAIN} ({msg}): the app belongs to the other Lark region; check --lark-base-url (https://open.feishu.cn or https://open.larksuite.com)"
                )));
            }
            Some(code) => {
                return Err(End::Fatal(format!(
                    "Lark refused the app: code {code} ({msg}); check --lark-app-id and --lark-app-secret, and that it is a self-built app"
                )));
            }
            None => return Err(End::Retry("Lark's endpoint answer has no code".into())),
        }
        let data = answer
            .data
            .ok_or_else(|| End::Retry("Lark's endpoint answer has no data".into()))?;
        if let Some(pushed) = &data.client_config {
            settings.apply(pushed);
        }
        let service_id = url::Url::parse(&data.url)
            .ok()
            .and_then(|url| {
                url.query_pairs()
                    .find(|(k, _)| k == "service_id")
                    .and_then(|(_, v)| v.parse::<i32>().ok())
            })
            .ok_or_else(|| End::Retry("Lark's endpoint URL has no service_id".into()))?;
        Ok(Endpoint {
            url: data.url,
            service_id,
        })
    }

    /// Serves one open connection until it ends.
    async fn serve(&self, mut socket: Socket, service_id: i32, settings: &mut ClientConfig) -> End {
        let (work, queue) = mpsc::channel::<Work>(256);
        let (acks, mut acked) = mpsc::channel::<Frame>(64);
        tokio::spawn(ingest(
            self.broker.clone(),
            self.config.app_id.clone(),
            queue,
            acks,
            self.shutdown.clone(),
        ));
        let mut fragments = Fragments::default();
        // The first ping goes out at once.
        let mut next_ping = Instant::now();
        let mut last_pong = Instant::now();
        let end = loop {
            let expiry = fragments.next_expiry();
            tokio::select! {
                _ = self.shutdown.cancelled() => break End::Shutdown,
                _ = tokio::time::sleep_until(next_ping) => {
                    let silent = last_pong.elapsed();
                    if silent > settings.ping_interval * PONG_INTERVALS {
                        break End::Retry(format!("no pong from Lark for {} s", silent.as_secs()));
                    }
                    if let Err(e) = send(&mut socket, &Frame::ping(service_id)).await {
                        break End::Retry(format!("a ping failed: {e}"));
                    }
                    next_ping = Instant::now() + settings.ping_interval;
                }
                Some(ack) = acked.recv() => {
                    if let Err(e) = send(&mut socket, &ack).await {
                        break End::Retry(format!("an acknowledgement failed: {e}"));
                    }
                }
                _ = sleep_until_some(expiry) => fragments.expire(Instant::now()),
                message = socket.next() => match message {
                    None | Some(Ok(Message::Close(_))) => break End::Retry("Lark closed the connection".into()),
                    Some(Err(e)) => break End::Retry(format!("the connection failed: {e}")),
                    Some(Ok(Message::Binary(bytes))) => {
                        let Some(control) = self.on_frame(&bytes, &mut fragments, &work).await else {
                            continue;
                        };
                        last_pong = Instant::now();
                        if let Some(pushed) = control {
                            let before = settings.ping_interval;
                            settings.apply(&pushed);
                            if settings.ping_interval != before {
                                next_ping = next_ping.min(Instant::now() + settings.ping_interval);
                            }
                        }
                    }
                    // WebSocket-level pings are answered by tungstenite.
                    Some(Ok(_)) => {}
                },
            }
        };
        drop(work);
        if let End::Shutdown = end {
            // The event being committed is acknowledged; queued ones are left
            // unacknowledged (Lark redelivers them).
            let drain = async {
                while let Some(ack) = acked.recv().await {
                    let _ = send(&mut socket, &ack).await;
                }
            };
            let _ = tokio::time::timeout(self.drain, drain).await;
            let _ = tokio::time::timeout(Duration::from_secs(1), socket.close(None)).await;
        }
        end
    }

    /// Reads one binary message. `Some` for a pong (with the ClientConfig it
    /// carried); data frames go to the ingest queue, whole; anything else is
    /// dropped with a log line.
    async fn on_frame(
        &self,
        bytes: &[u8],
        fragments: &mut Fragments,
        work: &mpsc::Sender<Work>,
    ) -> Option<Option<PushedConfig>> {
        let received = Instant::now();
        let mut frame = match Frame::decode_checked(bytes) {
            Ok(frame) => frame,
            Err(why) => {
                tracing::warn!("lark long connection: a frame dropped: {why}");
                return None;
            }
        };
        match (frame.method, frame.header("type")) {
            (CONTROL, Some("pong")) => {
                let payload = frame.payload.unwrap_or_default();
                if payload.is_empty() {
                    return Some(None);
                }
                match serde_json::from_slice::<PushedConfig>(&payload) {
                    Ok(pushed) => Some(Some(pushed)),
                    Err(_) => {
                        tracing::warn!("lark long connection: a pong's ClientConfig is not JSON");
                        Some(None)
                    }
                }
            }
            (CONTROL, _) => None,
            (DATA, Some("event" | "card")) => {
                let payload = match fragments.add(&frame, received) {
                    Ok(Some(payload)) => payload,
                    Ok(None) => return None,
                    Err(why) => {
                        tracing::warn!("lark long connection: a data frame dropped: {why}");
                        return None;
                    }
                };
                frame.payload = None;
                let _ = work
                    .send(Work {
                        frame,
                        payload,
                        received,
                    })
                    .await;
                None
            }
            (method, kind) => {
                tracing::warn!(
                    method,
                    kind = kind.unwrap_or("none"),
                    "lark long connection: a frame of unknown kind dropped"
                );
                None
            }
        }
    }
}

/// A whole event to take, with the frame to acknowledge.
struct Work {
    frame: Frame,
    payload: Vec<u8>,
    received: Instant,
}

/// Takes the connection's events one at a time, in order, and hands each
/// acknowledgement to the connection once its event is committed. Stops at
/// shutdown before taking the next one.
async fn ingest(
    broker: Arc<Broker>,
    app_id: String,
    mut queue: mpsc::Receiver<Work>,
    acks: mpsc::Sender<Frame>,
    shutdown: CancellationToken,
) {
    while let Some(work) = queue.recv().await {
        if shutdown.is_cancelled() {
            return;
        }
        let (code, answer) = match serde_json::from_slice::<Envelope>(&work.payload) {
            Ok(envelope) => match inbound::take(&broker, &app_id, envelope).await {
                Ok(answer) => (200, answer),
                Err(error) => {
                    tracing::warn!(error = %error.message, "lark event not taken; answered 500, Lark will redeliver it");
                    (500, json!({}))
                }
            },
            Err(_) => {
                tracing::warn!(
                    "lark long connection: a data frame that is not a schema 2.0 event, acknowledged and dropped"
                );
                (200, json!({}))
            }
        };
        let ack = work
            .frame
            .ack(code, &answer, work.received.elapsed().as_millis());
        if acks.send(ack).await.is_err() {
            // The connection is gone: Lark redelivers, and the redelivery is
            // acknowledged as a duplicate.
            tracing::debug!(
                "lark long connection: an acknowledgement was lost with its connection"
            );
        }
    }
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens the WebSocket; a refused handshake is read from Lark's headers.
async fn connect(url: &str) -> Result<Socket, End> {
    let config = tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(MAX_EVENT_BYTES + 64 * 1024))
        .max_frame_size(Some(MAX_EVENT_BYTES + 64 * 1024));
    match tokio_tungstenite::connect_async_with_config(url, Some(config), false).await {
        Ok((socket, _)) => Ok(socket),
        Err(tungstenite::Error::Http(response)) => {
            Err(refused(response.status().as_u16(), response.headers()))
        }
        Err(e) => Err(End::Retry(format!("cannot open the WebSocket: {e}"))),
    }
}

/// A refused handshake: 403, or 514 over the connection limit, are fatal.
fn refused(http_status: u16, headers: &tungstenite::http::HeaderMap) -> End {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .chars()
            .take(200)
            .collect::<String>()
    };
    let (status, msg, auth) = (
        header("Handshake-Status"),
        header("Handshake-Msg"),
        header("Handshake-Autherrcode"),
    );
    match (status.as_str(), auth.as_str()) {
        ("403", _) => End::Fatal(format!("Lark refused the connection: 403 ({msg})")),
        ("514", OVER_CONNECTION_LIMIT) => End::Fatal(format!(
            "Lark refused the connection: over its limit of 50 connections per app ({msg}); stop other clients of this app"
        )),
        ("", _) => End::Retry(format!(
            "Lark refused the WebSocket handshake: HTTP {http_status}"
        )),
        (status, _) => End::Retry(format!(
            "Lark refused the WebSocket handshake: status {status} ({msg})"
        )),
    }
}

async fn send(socket: &mut Socket, frame: &Frame) -> Result<(), tungstenite::Error> {
    socket
        .send(Message::Binary(frame.encode_to_vec().into()))
        .await
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A random delay in `[0, up_to)`.
fn jitter(up_to: Duration) -> Duration {
    let mut bytes = [0u8; 4];
    if up_to.is_zero() || getrandom::fill(&mut bytes).is_err() {
        return Duration::ZERO;
    }
    up_to.mul_f64(f64::from(u32::from_le_bytes(bytes)) / (f64::from(u32::MAX) + 1.0))
}

/// Fragment sets being reassembled, by `message_id`.
#[derive(Default)]
struct Fragments {
    sets: HashMap<String, Partial>,
    /// Bytes held over all sets.
    bytes: usize,
}

struct Partial {
    parts: Vec<Option<Vec<u8>>>,
    bytes: usize,
    started: Instant,
}

impl Fragments {
    /// Adds a data frame's payload: the whole payload once every fragment of
    /// its set arrived (at once when `sum` is 1), `None` while some are
    /// missing, `Err` when it is refused (its set is dropped).
    fn add(&mut self, frame: &Frame, now: Instant) -> Result<Option<Vec<u8>>, &'static str> {
        let number = |key| frame.header(key).map(|v| v.trim().parse::<usize>());
        let sum = match number("sum") {
            None => 1,
            Some(Ok(sum)) if (1..=MAX_FRAGMENTS).contains(&sum) => sum,
            Some(_) => return Err("a bad fragment count"),
        };
        let seq = match number("seq") {
            None => 0,
            Some(Ok(seq)) if seq < sum => seq,
            Some(_) => return Err("a bad fragment index"),
        };
        let payload = frame.payload.clone().unwrap_or_default();
        if sum == 1 {
            return Ok(Some(payload));
        }
        let Some(message_id) = frame.header("message_id").filter(|id| !id.is_empty()) else {
            return Err("a fragment without a message_id");
        };
        let set = self
            .sets
            .entry(message_id.to_owned())
            .or_insert_with(|| Partial {
                parts: vec![None; sum],
                bytes: 0,
                started: now,
            });
        if set.parts.len() != sum {
            self.drop_set(message_id);
            return Err("fragments of one message disagree on their count");
        }
        let replaced = set.parts[seq].as_ref().map_or(0, Vec::len);
        let grown = payload.len().saturating_sub(replaced);
        if set.bytes + grown > MAX_EVENT_BYTES || self.bytes + grown > MAX_BUFFERED_BYTES {
            self.drop_set(message_id);
            return Err("a fragmented event over the size limit");
        }
        set.bytes = set.bytes + payload.len() - replaced;
        self.bytes = self.bytes + payload.len() - replaced;
        set.parts[seq] = Some(payload);
        if set.parts.iter().any(Option::is_none) {
            return Ok(None);
        }
        let set = self.sets.remove(message_id).expect("the set is there");
        self.bytes -= set.bytes;
        Ok(Some(set.parts.into_iter().flatten().flatten().collect()))
    }

    fn drop_set(&mut self, message_id: &str) {
        if let Some(set) = self.sets.remove(message_id) {
            self.bytes -= set.bytes;
        }
    }

    /// When the oldest incomplete set expires.
    fn next_expiry(&self) -> Option<Instant> {
        self.sets.values().map(|s| s.started + FRAGMENT_TTL).min()
    }

    fn expire(&mut self, now: Instant) {
        let before = self.sets.len();
        self.sets.retain(|_, set| now < set.started + FRAGMENT_TTL);
        self.bytes = self.sets.values().map(|s| s.bytes).sum();
        let dropped = before - self.sets.len();
        if dropped > 0 {
            tracing::warn!(
                dropped,
                "lark long connection: incomplete fragmented events dropped after 10 s"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lark::frame::header;

    fn fragment(message_id: &str, sum: usize, seq: usize, payload: &[u8]) -> Frame {
        Frame {
            method: DATA,
            headers: vec![
                header("type", "event"),
                header("message_id", message_id),
                header("sum", &sum.to_string()),
                header("seq", &seq.to_string()),
            ],
            payload: Some(payload.to_vec()),
            ..Frame::default()
        }
    }

    #[test]
    fn fragments_join_in_seq_order_whatever_order_they_arrive_in() {
        let mut fragments = Fragments::default();
        let now = Instant::now();
        assert_eq!(fragments.add(&fragment("m", 3, 2, b"c"), now), Ok(None));
        assert_eq!(fragments.add(&fragment("m", 3, 0, b"a"), now), Ok(None));
        assert_eq!(
            fragments.add(&fragment("n", 1, 0, b"whole"), now),
            Ok(Some(b"whole".to_vec()))
        );
        assert_eq!(
            fragments.add(&fragment("m", 3, 1, b"b"), now),
            Ok(Some(b"abc".to_vec()))
        );
        assert_eq!((fragments.sets.len(), fragments.bytes), (0, 0));
    }

    #[test]
    fn incomplete_sets_expire_and_oversized_or_bad_ones_are_refused() {
        let mut fragments = Fragments::default();
        let now = Instant::now();
        assert_eq!(fragments.add(&fragment("m", 2, 0, b"a"), now), Ok(None));
        assert_eq!(fragments.next_expiry(), Some(now + FRAGMENT_TTL));
        fragments.expire(now + FRAGMENT_TTL);
        assert_eq!((fragments.sets.len(), fragments.bytes), (0, 0));
        assert!(fragments.add(&fragment("m", 2, 2, b"a"), now).is_err());
        assert!(fragments.add(&fragment("m", 0, 0, b"a"), now).is_err());
        let big = vec![b'x'; MAX_EVENT_BYTES / 2 + 1];
        assert_eq!(fragments.add(&fragment("big", 3, 0, &big), now), Ok(None));
        assert!(fragments.add(&fragment("big", 3, 1, &big), now).is_err());
        assert_eq!((fragments.sets.len(), fragments.bytes), (0, 0));
    }

    /// `wss://` goes through the rustls (ring) stack already in the tree:
    /// building its client config must not panic for want of a provider.
    #[tokio::test]
    async fn a_wss_endpoint_goes_through_rustls() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            drop(socket);
        });
        let end = connect(&format!("wss://localhost:{port}/ws?service_id=1")).await;
        assert!(matches!(end, Err(End::Retry(_))));
    }

    #[test]
    fn a_pushed_client_config_applies_what_it_sets() {
        let mut settings = ClientConfig::default();
        let pushed: PushedConfig =
            serde_json::from_str(r#"{"PingInterval":5,"ReconnectNonce":0,"ReconnectCount":-1}"#)
                .unwrap();
        settings.apply(&pushed);
        assert_eq!(settings.ping_interval, Duration::from_secs(5));
        assert_eq!(settings.reconnect_nonce, Duration::ZERO);
        assert_eq!(settings.reconnect_interval, Duration::from_secs(120));
        assert!(jitter(Duration::from_secs(2)) < Duration::from_secs(2));
    }
}
