//! Lark's long connection (LARK.md, "Long connection"): the broker asks Lark
//! for an endpoint (`POST {base}/callback/ws/endpoint` with the app id and
//! secret), opens the WebSocket it names and receives the app's events over
//! it, so it needs outbound HTTPS only. It pings at Lark's interval with the
//! endpoint's service id and reconnects when pongs stop; applies the
//! ClientConfig Lark sends with the endpoint and with pongs, every number
//! bounded first; reassembles fragmented events ([`super::fragments`],
//! bounded in sets and memory, dropped after 10 s); hands each whole event to
//! the one ingestion path ([`super::inbound`]) in arrival order and
//! acknowledges it only after the commit (code 500 when the store failed, so
//! Lark redelivers). It reconnects forever (Lark's schedule, under a backoff
//! from 1 s that grows while tries keep failing) unless Lark refuses the app
//! for good, which stops the connector alone; its loop runs in a watched
//! task, so a failure is told and restarted. Its state is an INFO line per
//! change (repeats summarised), two metrics and [`ConnectorStatus`]; it never
//! logs the secret, the endpoint URL (it carries Lark's ticket) or a
//! message's text.

use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use backon::BackoffBuilder;
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
use super::fragments::{Fragments, MAX_EVENT_BYTES};
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

/// A ClientConfig as Lark sends it (seconds). Any JSON number is read (a
/// number out of every range must not make the whole answer unreadable);
/// [`ClientConfig::apply`] bounds it. `ReconnectCount` is not honoured: an
/// owner-local broker reconnects for as long as it runs.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
struct PushedConfig {
    ping_interval: Option<serde_json::Value>,
    reconnect_interval: Option<serde_json::Value>,
    reconnect_nonce: Option<serde_json::Value>,
}

/// The ping interval Lark may set: 1 s to 10 min (LARK.md says 120 s).
const PING_INTERVAL_SECS: RangeInclusive<f64> = 1.0..=600.0;
/// The reconnect interval Lark may set: 1 s to 10 min. The backoff may
/// wait longer, never shorter.
const RECONNECT_INTERVAL_SECS: RangeInclusive<f64> = 1.0..=600.0;
/// The most random delay Lark may ask before a first reconnect: 0 to 60 s.
const RECONNECT_NONCE_SECS: RangeInclusive<f64> = 0.0..=60.0;

impl ClientConfig {
    /// Applies what Lark pushed, each number brought into its range first:
    /// this is the one place Lark's numbers enter the connector's timing, so
    /// none can overflow a deadline or spin the reconnect loop.
    fn apply(&mut self, pushed: &PushedConfig) {
        let bounded = |value: &Option<serde_json::Value>, range: RangeInclusive<f64>| {
            let secs = value.as_ref()?.as_f64()?;
            Some(Duration::from_secs(
                secs.clamp(*range.start(), *range.end()) as u64,
            ))
        };
        if let Some(ping) = bounded(&pushed.ping_interval, PING_INTERVAL_SECS) {
            self.ping_interval = ping;
        }
        if let Some(interval) = bounded(&pushed.reconnect_interval, RECONNECT_INTERVAL_SECS) {
            self.reconnect_interval = interval;
        }
        if let Some(nonce) = bounded(&pushed.reconnect_nonce, RECONNECT_NONCE_SECS) {
            self.reconnect_nonce = nonce;
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
    repeats: Repeats,
}

impl ConnectorStatus {
    pub fn new(metrics: &Metrics) -> Self {
        Self {
            inner: Mutex::new(StatusInner {
                state: None,
                reason: None,
                since_ms: now_ms(),
                repeats: Repeats::default(),
            }),
            connected: metrics.lark_connected.clone(),
            reconnects: metrics.lark_reconnects.clone(),
        }
    }

    /// The connector as the API shows it.
    pub fn snapshot(&self) -> LarkConnector {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        LarkConnector {
            events: LarkEvents::LongConnection,
            state: Some(inner.state.unwrap_or(LarkConnectionState::Connecting)),
            reason: inner.reason.clone(),
            since: Some(rfc3339(inner.since_ms)),
            reconnects: self.reconnects.get(),
        }
    }

    /// Enters `state`, with a log line when it changed (see [`Repeats`]).
    fn set(&self, state: LarkConnectionState, reason: Option<String>) {
        self.enter(state, reason, String::new());
    }

    /// Enters `retrying` for `reason`, the next try after `delay`.
    fn retrying(&self, reason: String, delay: Duration) {
        let next = format!("; next try in {} s", delay.as_secs());
        self.enter(LarkConnectionState::Retrying, Some(reason), next);
    }

    /// The status reason is `reason` and `detail`; repeats are told apart by
    /// state and `reason` alone, so a changing delay does not defeat the summary.
    fn enter(&self, state: LarkConnectionState, reason: Option<String>, detail: String) {
        // A panic elsewhere while the lock was held must not silence the status.
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let why = reason.clone().unwrap_or_default();
        let shown = reason.map(|reason| reason + &detail);
        if inner.state == Some(state) && inner.reason == shown {
            return;
        }
        let left_out = inner
            .repeats
            .admit(&format!("{state:?} {why}"), Instant::now());
        log_state(state, &format!("{why}{detail}"), left_out);
        self.connected
            .set(i64::from(state == LarkConnectionState::Connected));
        inner.state = Some(state);
        inner.reason = shown;
        inner.since_ms = now_ms();
    }
}

/// The log line of a new state; `None` (a repeat within the minute) logs
/// nothing, but a fatal or final state is always told.
fn log_state(state: LarkConnectionState, why: &str, left_out: Option<u64>) {
    match (state, left_out) {
        (LarkConnectionState::Fatal, _) => tracing::error!(
            "lark long connection: stopped for good (the rest of the broker serves on; fix the Lark settings and restart): {why}"
        ),
        (LarkConnectionState::Stopped, _) => tracing::info!("lark long connection: closed"),
        (_, None) => {}
        (LarkConnectionState::Connecting, Some(n)) => {
            tracing::info!("lark long connection: connecting{}", more(n))
        }
        (LarkConnectionState::Connected, Some(n)) => {
            tracing::info!("lark long connection: connected{}", more(n))
        }
        (LarkConnectionState::Retrying, Some(n)) => {
            tracing::info!("lark long connection: retrying: {why}{}", more(n))
        }
    }
}

/// How long a log line's repeats are left out before one is logged again.
const REPEAT_WINDOW: Duration = Duration::from_secs(60);
/// The most kinds of lines remembered (a hostile Lark's varied reasons
/// must not grow the memory).
const REPEAT_KINDS: usize = 64;

/// Summarises repeated log lines: the first of a kind is logged, then at
/// most one a minute, saying how many like it were left out.
#[derive(Default)]
struct Repeats {
    /// By kind: when one was last logged, and how many were left out since.
    last: HashMap<String, (Instant, u64)>,
}

impl Repeats {
    /// `Some(left out since the last one)` when a line of `kind` is to be
    /// logged now, `None` when it is left out.
    fn admit(&mut self, kind: &str, now: Instant) -> Option<u64> {
        if self.last.len() >= REPEAT_KINDS {
            self.last
                .retain(|_, (at, _)| now.duration_since(*at) < REPEAT_WINDOW);
            if self.last.len() >= REPEAT_KINDS {
                self.last.clear();
            }
        }
        match self.last.get_mut(kind) {
            Some((at, left_out)) if now.duration_since(*at) < REPEAT_WINDOW => {
                *left_out += 1;
                None
            }
            Some(entry) => Some(std::mem::replace(entry, (now, 0)).1),
            None => {
                self.last.insert(kind.to_owned(), (now, 0));
                Some(0)
            }
        }
    }

    /// Logs a warning of `kind` unless it is a repeat within the minute.
    fn warn(&mut self, kind: &str) {
        if let Some(left_out) = self.admit(kind, Instant::now()) {
            tracing::warn!("lark long connection: {kind}{}", more(left_out));
        }
    }
}

/// The tail of a summarised line.
fn more(left_out: u64) -> String {
    match left_out {
        0 => String::new(),
        n => format!(" ({n} more like this)"),
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

    /// Connects and reconnects until shutdown or a fatal refusal. The loop
    /// runs in a task of its own, watched: should it end any other way (a
    /// panic), the status says so and it is started again after a backoff.
    pub async fn run(self) {
        let this = Arc::new(self);
        let (status, shutdown) = (this.status.clone(), this.shutdown.clone());
        let backoff = Backoff::new(this.config.reconnect_max);
        supervise(&status, &shutdown, backoff, move || {
            this.clone().reconnect_forever()
        })
        .await;
    }

    async fn reconnect_forever(self: Arc<Self>) {
        let mut settings = self.config.long_connection;
        let mut backoff = Backoff::new(self.config.reconnect_max);
        // Lark's schedule: after a connection, a random delay (so many
        // clients do not return at once), then its interval. The backoff
        // is the floor under it, whatever Lark pushed.
        let mut first_retry = true;
        loop {
            self.status.set(LarkConnectionState::Connecting, None);
            let (end, up) = self.connect_and_serve(&mut settings).await;
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
            if let Some(up) = up {
                first_retry = true;
                backoff.settled(up);
            }
            let lark = if first_retry {
                jitter(settings.reconnect_nonce)
            } else {
                settings.reconnect_interval
            };
            first_retry = false;
            let delay = lark.max(backoff.next());
            self.status.retrying(reason, delay);
            if !sleep_unless_shutdown(delay, &self.shutdown).await {
                self.status.set(LarkConnectionState::Stopped, None);
                return;
            }
        }
    }

    /// One connection, and how long it was up when it got that far.
    async fn connect_and_serve(&self, settings: &mut ClientConfig) -> (End, Option<Duration>) {
        let endpoint = tokio::select! {
            endpoint = self.bootstrap(settings) => endpoint,
            _ = self.shutdown.cancelled() => return (End::Shutdown, None),
        };
        let endpoint = match endpoint {
            Ok(endpoint) => endpoint,
            Err(end) => return (end, None),
        };
        let socket = tokio::select! {
            socket = connect(&endpoint.url) => socket,
            _ = self.shutdown.cancelled() => return (End::Shutdown, None),
        };
        let socket = match socket {
            Ok(socket) => socket,
            Err(end) => return (end, None),
        };
        let opened = Instant::now();
        self.status.set(LarkConnectionState::Connected, None);
        let end = self.serve(socket, endpoint.service_id, settings).await;
        (end, Some(opened.elapsed()))
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
            self.config.clone(),
            queue,
            acks,
            self.shutdown.clone(),
        ));
        let mut reader = Reader::default();
        // The first ping goes out at once.
        let mut next_ping = Instant::now();
        let mut last_pong = Instant::now();
        let end = loop {
            let expiry = reader.fragments.next_expiry();
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
                ack = acked.recv() => match ack {
                    Some(ack) => if let Err(e) = send(&mut socket, &ack).await {
                        break End::Retry(format!("an acknowledgement failed: {e}"));
                    },
                    // The ingest task ends at shutdown, or when it failed:
                    // events would go unacknowledged on a live connection.
                    None if self.shutdown.is_cancelled() => break End::Shutdown,
                    None => break End::Retry("the event intake failed".into()),
                },
                _ = sleep_until_some(expiry) => reader.expire(Instant::now()),
                message = socket.next() => match message {
                    None | Some(Ok(Message::Close(_))) => break End::Retry("Lark closed the connection".into()),
                    Some(Err(e)) => break End::Retry(format!("the connection failed: {e}")),
                    Some(Ok(Message::Binary(bytes))) => {
                        let Some(pushed) = reader.frame(&bytes, &work).await else {
                            continue;
                        };
                        last_pong = Instant::now();
                        if let Some(pushed) = pushed {
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
}

/// What one connection reads: its fragment sets, and its warnings about
/// frames it drops, summarised (a flood of bad frames logs a line a minute).
#[derive(Default)]
struct Reader {
    fragments: Fragments,
    repeats: Repeats,
}

impl Reader {
    /// Reads one binary message. `Some` for a pong (with the ClientConfig it
    /// carried); data frames go to the ingest queue, whole; anything else is
    /// dropped with a log line.
    async fn frame(
        &mut self,
        bytes: &[u8],
        work: &mpsc::Sender<Work>,
    ) -> Option<Option<PushedConfig>> {
        let received = Instant::now();
        let mut frame = match Frame::decode_checked(bytes) {
            Ok(frame) => frame,
            Err(why) => {
                self.repeats.warn(&format!("a frame dropped: {why}"));
                return None;
            }
        };
        match (frame.method, frame.header("type")) {
            (CONTROL, Some("pong")) => Some(self.pong(frame.payload.unwrap_or_default())),
            (CONTROL, _) => None,
            (DATA, Some("event" | "card")) => {
                let payload = self.fragments.add(&frame, received);
                let evicted = self.fragments.take_evicted();
                if evicted > 0 {
                    self.repeats
                        .warn("incomplete fragmented events dropped to make room for newer ones");
                }
                let payload = match payload {
                    Ok(Some(payload)) => payload,
                    Ok(None) => return None,
                    Err(why) => {
                        self.repeats.warn(&format!("a data frame dropped: {why}"));
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
            (method, _) => {
                // The kind is Lark's text: not part of what tells repeats apart.
                self.repeats.warn(&format!(
                    "a frame of unknown kind dropped (method {method})"
                ));
                None
            }
        }
    }

    /// A pong's ClientConfig, when it carries one.
    fn pong(&mut self, payload: Vec<u8>) -> Option<PushedConfig> {
        if payload.is_empty() {
            return None;
        }
        let pushed = serde_json::from_slice::<PushedConfig>(&payload);
        if pushed.is_err() {
            self.repeats.warn("a pong's ClientConfig is not JSON");
        }
        pushed.ok()
    }

    fn expire(&mut self, now: Instant) {
        if self.fragments.expire(now) > 0 {
            self.repeats
                .warn("incomplete fragmented events dropped after 10 s");
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
    config: LarkConfig,
    mut queue: mpsc::Receiver<Work>,
    acks: mpsc::Sender<Frame>,
    shutdown: CancellationToken,
) {
    while let Some(work) = queue.recv().await {
        if shutdown.is_cancelled() {
            return;
        }
        let (code, answer) = match serde_json::from_slice::<Envelope>(&work.payload) {
            Ok(envelope) => match inbound::take(&broker, &config, envelope).await {
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

/// Runs the task `start` makes until it ends as it should (shutdown, a
/// fatal refusal: it said so in the status); a task that ends otherwise (a
/// panic) is told in the status and metrics (not connected, the panic as
/// the reason) and started again after `backoff`.
async fn supervise<F, Fut>(
    status: &ConnectorStatus,
    shutdown: &CancellationToken,
    mut backoff: Backoff,
    mut start: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    loop {
        let started = Instant::now();
        let failure = match tokio::spawn(start()).await {
            Ok(()) => return,
            Err(error) => failure(error),
        };
        status.reconnects.inc();
        backoff.settled(started.elapsed());
        let delay = backoff.next();
        status.retrying(
            format!("the connector failed ({failure}), restarted"),
            delay,
        );
        if !sleep_unless_shutdown(delay, shutdown).await {
            status.set(LarkConnectionState::Stopped, None);
            return;
        }
    }
}

/// What a task's failure says: its panic message (cut), or that it was cancelled.
fn failure(error: tokio::task::JoinError) -> String {
    if !error.is_panic() {
        return "cancelled".into();
    }
    let panic = error.into_panic();
    let message = match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(text), _) => text.to_string(),
        (_, Some(text)) => text.clone(),
        _ => "a panic".into(),
    };
    format!(
        "panicked: {}",
        message.chars().take(200).collect::<String>()
    )
}

/// Sleeps `delay`; `false` when shutdown came first.
async fn sleep_unless_shutdown(delay: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(delay) => true,
        _ = shutdown.cancelled() => false,
    }
}

/// The floor of a reconnect's delay, and the first.
const RECONNECT_MIN: Duration = Duration::from_secs(1);
/// A connection up this long was a success: the backoff starts over.
const STABLE_AFTER: Duration = Duration::from_secs(60);

/// The reconnect backoff (backon's): 1 s, doubling while tries keep
/// failing up to `max`, each with a random extra of up to as much again.
struct Backoff {
    max: Duration,
    delays: backon::ExponentialBackoff,
}

impl Backoff {
    fn new(max: Duration) -> Self {
        let max = max.max(RECONNECT_MIN);
        Self {
            max,
            delays: Self::delays(max),
        }
    }

    fn delays(max: Duration) -> backon::ExponentialBackoff {
        backon::ExponentialBuilder::default()
            .with_min_delay(RECONNECT_MIN)
            .with_max_delay(max)
            .with_jitter()
            .without_max_times()
            .build()
    }

    fn next(&mut self) -> Duration {
        self.delays.next().unwrap_or(self.max)
    }

    /// A connection (or task) that was up `up`: long enough, and the
    /// backoff starts over.
    fn settled(&mut self, up: Duration) {
        if up >= STABLE_AFTER {
            self.delays = Self::delays(self.max);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Lark's numbers, however large, small or odd, come out in range.
    #[test]
    fn a_pushed_client_config_is_bounded_before_use() {
        let mut settings = ClientConfig::default();
        let huge = r#"{"PingInterval":9223372036854775807,"ReconnectInterval":1e300,"ReconnectNonce":18446744073709551615}"#;
        settings.apply(&serde_json::from_str(huge).unwrap());
        let minutes = |m: u64| Duration::from_secs(60 * m);
        assert_eq!(
            (
                settings.ping_interval,
                settings.reconnect_interval,
                settings.reconnect_nonce
            ),
            (minutes(10), minutes(10), minutes(1))
        );
        let zero = r#"{"PingInterval":0,"ReconnectInterval":-5,"ReconnectNonce":-1}"#;
        settings.apply(&serde_json::from_str(zero).unwrap());
        assert_eq!(
            (
                settings.ping_interval,
                settings.reconnect_interval,
                settings.reconnect_nonce
            ),
            (
                Duration::from_secs(1),
                Duration::from_secs(1),
                Duration::ZERO
            )
        );
        let odd = r#"{"PingInterval":"soon","ReconnectInterval":null}"#;
        settings.apply(&serde_json::from_str(odd).unwrap());
        assert_eq!(settings.ping_interval, Duration::from_secs(1), "ignored");
        // What a bounded interval does to the connector's deadlines.
        let _ = Instant::now() + settings.ping_interval * PONG_INTERVALS;
    }

    #[test]
    fn reconnects_back_off_from_a_second_up_to_the_cap_and_start_over_after_a_stable_connection() {
        let mut backoff = Backoff::new(Duration::from_secs(8));
        let delays: Vec<Duration> = (0..6).map(|_| backoff.next()).collect();
        let secs = |s: u64| Duration::from_secs(s);
        for (delay, floor) in delays.iter().zip([1, 2, 4, 8, 8, 8]) {
            assert!(
                *delay >= secs(floor) && *delay < secs(2 * floor),
                "{delays:?}"
            );
        }
        backoff.settled(STABLE_AFTER - Duration::from_secs(1));
        assert!(backoff.next() >= secs(8));
        backoff.settled(STABLE_AFTER);
        assert!(backoff.next() < secs(2));
        assert!(Backoff::new(Duration::ZERO).next() >= RECONNECT_MIN);
    }

    #[test]
    fn repeated_lines_are_logged_once_a_minute_with_how_many_were_left_out() {
        let mut repeats = Repeats::default();
        let now = Instant::now();
        assert_eq!(repeats.admit("closed", now), Some(0));
        assert_eq!(repeats.admit("other", now), Some(0));
        for s in 1..=59 {
            assert_eq!(repeats.admit("closed", now + Duration::from_secs(s)), None);
        }
        assert_eq!(repeats.admit("closed", now + REPEAT_WINDOW), Some(59));
        assert_eq!(more(59), " (59 more like this)");
        // Many kinds do not grow it without bound.
        for kind in 0..10 * REPEAT_KINDS {
            repeats.admit(&kind.to_string(), now + REPEAT_WINDOW);
        }
        assert!(repeats.last.len() <= REPEAT_KINDS);
    }

    /// A connector task that panics is told (not connected, metric 0, the
    /// reason) and started again; one that ends as it should is not.
    #[tokio::test]
    async fn a_connector_task_that_fails_is_told_and_restarted() {
        let metrics = Metrics::default();
        let status = Arc::new(ConnectorStatus::new(&metrics));
        let shutdown = CancellationToken::new();
        let starts = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (task_status, task_starts) = (status.clone(), starts.clone());
        let supervised = tokio::spawn({
            let shutdown = shutdown.clone();
            async move {
                let backoff = Backoff::new(Duration::from_secs(1));
                supervise(&task_status.clone(), &shutdown, backoff, move || {
                    let (status, starts) = (task_status.clone(), task_starts.clone());
                    async move {
                        status.set(LarkConnectionState::Connected, None);
                        match starts.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
                            0 => panic!("overflow when adding duration to instant"),
                            _ => status.set(LarkConnectionState::Fatal, Some("refused".into())),
                        }
                    }
                })
                .await
            }
        });
        let deadline = Instant::now() + Duration::from_secs(5);
        let told = loop {
            let now = status.snapshot();
            if now.state == Some(LarkConnectionState::Retrying) {
                break now;
            }
            assert!(Instant::now() < deadline, "not told: {now:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let reason = told.reason.unwrap_or_default();
        assert!(reason.contains("panicked: overflow"), "{reason}");
        assert_eq!((metrics.lark_connected.get(), told.reconnects), (0, 1));
        // Restarted after the backoff; a fatal end is final.
        tokio::time::timeout(Duration::from_secs(10), supervised)
            .await
            .expect("the supervisor ends after the fatal end")
            .unwrap();
        assert_eq!(starts.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(status.snapshot().state, Some(LarkConnectionState::Fatal));
        assert!(!shutdown.is_cancelled());
    }
}
