//! The long-connection side of a fake Lark, on loopback, as
//! `shared/spec/LARK.md` ("Long connection") says Lark behaves:
//!
//! - `POST /callback/ws/endpoint` (merged into [`crate::fake_lark::FakeLark`]'s
//!   server, so one base URL serves it and the REST API): checks the app id
//!   and secret and the `locale` header, answers an opaque
//!   `ws://…?device_id=…&service_id=…&ticket=…` URL and a ClientConfig, or a
//!   failure on demand (an HTTP status, code 1, bad credentials);
//! - a WebSocket server speaking `pbbp2.Frame`: its own prost messages (not
//!   the broker's), refused handshakes with `Handshake-Status`,
//!   `Handshake-Msg`, `Handshake-Autherrcode` on demand; answers pings with
//!   pongs (optionally carrying a ClientConfig), records them with their
//!   service id, delivers events (whole or in fragments) and records the
//!   acknowledgements; closes connections (also right after each opens) and
//!   sends garbage or floods of fragment sets on demand.
//!
//! Self-contained (it uses no other test module), so the `fake_lark_ws`
//! example runs it for Lark's official client to check it against.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use prost::Message as _;
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request as WsRequest};
use tokio_tungstenite::tungstenite::http;
use tokio_util::sync::CancellationToken;

/// `pbbp2.Header`, as Lark's SDKs declare it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PbHeader {
    #[prost(string, required, tag = "1")]
    pub key: String,
    #[prost(string, required, tag = "2")]
    pub value: String,
}

/// `pbbp2.Frame`, as Lark's SDKs declare it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PbFrame {
    #[prost(uint64, required, tag = "1")]
    pub seq_id: u64,
    #[prost(uint64, required, tag = "2")]
    pub log_id: u64,
    #[prost(int32, required, tag = "3")]
    pub service: i32,
    #[prost(int32, required, tag = "4")]
    pub method: i32,
    #[prost(message, repeated, tag = "5")]
    pub headers: Vec<PbHeader>,
    #[prost(string, optional, tag = "6")]
    pub payload_encoding: Option<String>,
    #[prost(string, optional, tag = "7")]
    pub payload_type: Option<String>,
    #[prost(bytes = "vec", optional, tag = "8")]
    pub payload: Option<Vec<u8>>,
    #[prost(string, optional, tag = "9")]
    pub log_id_new: Option<String>,
}

impl PbFrame {
    pub fn header(&self, key: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|h| h.key == key)
            .map(|h| h.value.as_str())
    }
}

fn pb_header(key: &str, value: &str) -> PbHeader {
    PbHeader {
        key: key.into(),
        value: value.into(),
    }
}

/// How the fake answers one bootstrap request instead of handing out an endpoint.
#[derive(Debug, Clone, Copy)]
pub enum Bootstrap {
    /// This HTTP status, with a JSON body without `code`.
    Http(u16),
    /// HTTP 200 with this `code` (1: busy; 1000040343: internal; others: fatal).
    Code(i64),
}

/// A refused WebSocket handshake.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub status: u16,
    pub auth_errcode: Option<String>,
}

/// One ping as the fake received it.
#[derive(Debug, Clone)]
pub struct Ping {
    pub at: Instant,
    pub service: i32,
    pub seq_id: u64,
    pub log_id: u64,
}

/// One acknowledgement as the fake received it.
#[derive(Debug, Clone)]
pub struct WsAck {
    pub at: Instant,
    pub connection: usize,
    pub message_id: String,
    pub frame: PbFrame,
    /// The payload's `code`.
    pub code: i64,
    /// The payload's `data`, base64-decoded and parsed (Null when absent).
    pub data: Value,
    pub payload: Value,
}

struct Connection {
    service_id: i32,
    opened: Instant,
    open: bool,
    pings: Vec<Ping>,
    outgoing: mpsc::UnboundedSender<Message>,
}

struct Inner {
    ws_port: u16,
    client_config: Value,
    /// Sent as every pong's payload while set.
    pong_config: Option<Value>,
    /// Pings go unanswered while set (a dead path to Lark).
    silent: bool,
    /// Every connection is closed right after its handshake while set.
    close_on_open: bool,
    bootstrap_failures: VecDeque<Bootstrap>,
    refusals: VecDeque<Refusal>,
    bootstraps: usize,
    /// Endpoints handed out, whose tickets a handshake must present.
    tickets: Vec<(String, i32)>,
    connections: Vec<Connection>,
    acks: Vec<WsAck>,
    next_id: u64,
    app_id: String,
    app_secret: String,
}

/// The fake's long-connection side.
#[derive(Clone)]
pub struct FakeWs {
    inner: Arc<Mutex<Inner>>,
    changed: Arc<Notify>,
    shutdown: CancellationToken,
}

impl FakeWs {
    /// Listens for WebSockets on a port of its own; [`FakeWs::router`] is the
    /// bootstrap route to serve on the REST base URL.
    pub async fn start(app_id: &str, app_secret: &str) -> FakeWs {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ws_port = listener.local_addr().unwrap().port();
        let fake = FakeWs {
            inner: Arc::new(Mutex::new(Inner {
                ws_port,
                client_config: json!({"ReconnectCount": -1, "ReconnectInterval": 1, "ReconnectNonce": 0, "PingInterval": 1}),
                pong_config: None,
                silent: false,
                close_on_open: false,
                bootstrap_failures: VecDeque::new(),
                refusals: VecDeque::new(),
                bootstraps: 0,
                tickets: Vec::new(),
                connections: Vec::new(),
                acks: Vec::new(),
                next_id: 1,
                app_id: app_id.into(),
                app_secret: app_secret.into(),
            })),
            changed: Arc::new(Notify::new()),
            shutdown: CancellationToken::new(),
        };
        let accepting = fake.clone();
        tokio::spawn(async move {
            loop {
                let stream = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => stream,
                        Err(_) => continue,
                    },
                    _ = accepting.shutdown.cancelled() => return,
                };
                tokio::spawn(accepting.clone().serve_connection(stream));
            }
        });
        fake
    }

    pub fn router(&self) -> Router {
        Router::new()
            .route("/callback/ws/endpoint", post(endpoint))
            .with_state(self.clone())
    }

    /// The ClientConfig the bootstrap answers (seconds).
    pub fn set_client_config(&self, config: Value) {
        self.inner.lock().unwrap().client_config = config;
    }

    /// A ClientConfig every pong carries from now on (`None`: empty pongs).
    pub fn set_pong_config(&self, config: Option<Value>) {
        self.inner.lock().unwrap().pong_config = config;
    }

    /// Leaves pings unanswered (or answers them again).
    pub fn set_silent(&self, silent: bool) {
        self.inner.lock().unwrap().silent = silent;
    }

    /// Closes every connection right after its handshake (or no longer).
    pub fn set_close_on_open(&self, close: bool) {
        self.inner.lock().unwrap().close_on_open = close;
    }

    /// The next bootstrap requests fail like this, one each, in order.
    pub fn fail_bootstraps(&self, failures: impl IntoIterator<Item = Bootstrap>) {
        self.inner
            .lock()
            .unwrap()
            .bootstrap_failures
            .extend(failures);
    }

    /// The next handshakes are refused like this, one each, in order.
    pub fn refuse_handshakes(&self, refusals: impl IntoIterator<Item = Refusal>) {
        self.inner.lock().unwrap().refusals.extend(refusals);
    }

    pub fn bootstraps(&self) -> usize {
        self.inner.lock().unwrap().bootstraps
    }

    /// Connections opened so far (open or not).
    pub fn connections(&self) -> usize {
        self.inner.lock().unwrap().connections.len()
    }

    pub fn open_connections(&self) -> usize {
        let inner = self.inner.lock().unwrap();
        inner.connections.iter().filter(|c| c.open).count()
    }

    /// The pings received on connection `index` (0-based, in opening order).
    pub fn pings(&self, index: usize) -> Vec<Ping> {
        self.inner.lock().unwrap().connections[index].pings.clone()
    }

    /// The service id handed out with connection `index`'s endpoint.
    pub fn service_id(&self, index: usize) -> i32 {
        self.inner.lock().unwrap().connections[index].service_id
    }

    pub fn opened_at(&self, index: usize) -> Instant {
        self.inner.lock().unwrap().connections[index].opened
    }

    /// Every endpoint ticket handed out (they must never reach a log).
    pub fn tickets(&self) -> Vec<String> {
        let inner = self.inner.lock().unwrap();
        inner.tickets.iter().map(|(t, _)| t.clone()).collect()
    }

    pub fn acks(&self) -> Vec<WsAck> {
        self.inner.lock().unwrap().acks.clone()
    }

    pub fn acks_for(&self, message_id: &str) -> Vec<WsAck> {
        self.acks()
            .into_iter()
            .filter(|a| a.message_id == message_id)
            .collect()
    }

    /// Waits until `check` holds on the fake (panics after `within`).
    pub async fn wait_for(&self, what: &str, within: Duration, check: impl Fn(&FakeWs) -> bool) {
        let deadline = Instant::now() + within;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if check(self) {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "{what}: not within {within:?}");
            let _ = tokio::time::timeout(left.min(Duration::from_millis(100)), changed).await;
        }
    }

    /// Waits until `count` connections were opened and the last is open.
    pub async fn wait_connected(&self, count: usize, within: Duration) {
        self.wait_for(&format!("{count} connections"), within, |f| {
            let inner = f.inner.lock().unwrap();
            inner.connections.len() >= count && inner.connections.last().is_some_and(|c| c.open)
        })
        .await;
    }

    /// Sends raw bytes as a binary message on the newest open connection.
    pub fn send_raw(&self, bytes: Vec<u8>) {
        self.send(Message::Binary(bytes.into()));
    }

    /// Sends a frame on the newest open connection.
    pub fn send_frame(&self, frame: &PbFrame) {
        self.send_raw(frame.encode_to_vec());
    }

    fn send(&self, message: Message) {
        let inner = self.inner.lock().unwrap();
        let connection = inner
            .connections
            .iter()
            .rev()
            .find(|c| c.open)
            .expect("an open connection");
        let _ = connection.outgoing.send(message);
    }

    /// Closes every open connection from Lark's side (a close frame).
    pub fn close_all(&self) {
        let inner = self.inner.lock().unwrap();
        for connection in inner.connections.iter().filter(|c| c.open) {
            let _ = connection.outgoing.send(Message::Close(None));
        }
    }

    /// The data frames that deliver `payload` as `fragments` pieces (each
    /// non-empty), as Lark splits a large event: same `message_id`, `sum`,
    /// `seq` 0.. in order.
    pub fn event_frames(
        &self,
        payload: &[u8],
        fragments: usize,
        kind: &str,
    ) -> (String, Vec<PbFrame>) {
        let (service, first_id) = {
            let mut inner = self.inner.lock().unwrap();
            let service = inner
                .connections
                .iter()
                .rev()
                .find(|c| c.open)
                .map_or(0, |c| c.service_id);
            let id = inner.next_id;
            inner.next_id += fragments as u64;
            (service, id)
        };
        let message_id = format!("msg_{}", ulid::Ulid::new());
        let size = payload.len().div_ceil(fragments).max(1);
        let frames = payload
            .chunks(size)
            .enumerate()
            .map(|(seq, chunk)| PbFrame {
                seq_id: first_id + seq as u64,
                log_id: 7_000_000 + first_id + seq as u64,
                service,
                method: 1,
                headers: vec![
                    pb_header("type", kind),
                    pb_header("message_id", &message_id),
                    pb_header("sum", &fragments.to_string()),
                    pb_header("seq", &seq.to_string()),
                    pb_header("trace_id", &format!("trace-{}", first_id + seq as u64)),
                    pb_header("timestamp", &now_ms().to_string()),
                ],
                payload: Some(chunk.to_vec()),
                ..PbFrame::default()
            })
            .collect::<Vec<_>>();
        assert_eq!(
            frames.len(),
            fragments,
            "the payload splits into {fragments}"
        );
        (message_id, frames)
    }

    /// Sends `count` one-byte data frames on the newest open connection,
    /// each the first of a set of `sum` under its own `message_id`: sets
    /// that never complete, for a client to bound.
    pub fn send_fragment_flood(&self, count: usize, sum: usize) {
        let (_, frames) = self.event_frames(b"x", 1, "event");
        let mut frame = frames.into_iter().next().expect("one frame");
        for i in 0..count {
            let message_id = format!("msg_flood_{i}");
            for header in &mut frame.headers {
                match header.key.as_str() {
                    "message_id" => header.value.clone_from(&message_id),
                    "sum" => header.value = sum.to_string(),
                    _ => {}
                }
            }
            self.send_frame(&frame);
        }
    }

    /// Delivers an event (in `fragments` frames) and answers its message id.
    pub fn send_event(&self, event: &Value, fragments: usize) -> String {
        let (message_id, frames) =
            self.event_frames(event.to_string().as_bytes(), fragments, "event");
        for frame in &frames {
            self.send_frame(frame);
        }
        message_id
    }

    /// Delivers an event and waits for its acknowledgement.
    pub async fn deliver(&self, event: &Value, fragments: usize) -> WsAck {
        let message_id = self.send_event(event, fragments);
        self.wait_ack(&message_id, Duration::from_secs(10)).await
    }

    pub async fn wait_ack(&self, message_id: &str, within: Duration) -> WsAck {
        self.wait_for(&format!("the ack of {message_id}"), within, |f| {
            !f.acks_for(message_id).is_empty()
        })
        .await;
        self.acks_for(message_id).remove(0)
    }

    pub fn stop(&self) {
        self.shutdown.cancel();
        self.close_all();
    }

    /// One WebSocket connection, from the handshake on.
    // tungstenite's handshake callback answers its refusal as a whole response.
    #[allow(clippy::result_large_err)]
    async fn serve_connection(self, stream: tokio::net::TcpStream) {
        let mut service_id = 0;
        let refusal = self.inner.lock().unwrap().refusals.pop_front();
        let inner = self.inner.clone();
        let callback = |request: &WsRequest, response| {
            if let Some(refusal) = refusal {
                return Err(refused(&refusal));
            }
            let query: Vec<(String, String)> =
                url::form_urlencoded::parse(request.uri().query().unwrap_or_default().as_bytes())
                    .into_owned()
                    .collect();
            let get = |k: &str| {
                query
                    .iter()
                    .find(|(key, _)| key == k)
                    .map(|(_, v)| v.clone())
            };
            let known = inner
                .lock()
                .unwrap()
                .tickets
                .iter()
                .find(|(ticket, _)| Some(ticket) == get("ticket").as_ref())
                .map(|(_, service)| *service);
            match known {
                Some(service) if get("service_id") == Some(service.to_string()) => {
                    service_id = service;
                    Ok(response)
                }
                _ => Err(refused(&Refusal {
                    status: 403,
                    auth_errcode: None,
                })),
            }
        };
        let Ok(socket) = tokio_tungstenite::accept_hdr_async(stream, callback).await else {
            return;
        };
        let (mut sink, mut source) = socket.split();
        let (outgoing, mut queue) = mpsc::unbounded_channel();
        if self.inner.lock().unwrap().close_on_open {
            let _ = outgoing.send(Message::Close(None));
        }
        let index = {
            let mut inner = self.inner.lock().unwrap();
            inner.connections.push(Connection {
                service_id,
                opened: Instant::now(),
                open: true,
                pings: Vec::new(),
                outgoing,
            });
            inner.connections.len() - 1
        };
        self.changed.notify_waiters();
        loop {
            tokio::select! {
                message = queue.recv() => {
                    let Some(message) = message else { break };
                    let close = matches!(message, Message::Close(_));
                    if sink.send(message).await.is_err() || close {
                        break;
                    }
                }
                message = source.next() => match message {
                    Some(Ok(Message::Binary(bytes))) => {
                        if let Some(pong) = self.received(index, &bytes) {
                            let _ = sink.send(Message::Binary(pong.encode_to_vec().into())).await;
                        }
                    }
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(_)) => {}
                },
            }
        }
        self.inner.lock().unwrap().connections[index].open = false;
        self.changed.notify_waiters();
    }

    /// Records a frame from the client; answers a ping's pong.
    fn received(&self, index: usize, bytes: &[u8]) -> Option<PbFrame> {
        let frame = PbFrame::decode(bytes).expect("the client sends pbbp2 frames");
        let mut inner = self.inner.lock().unwrap();
        let answer = match (frame.method, frame.header("type")) {
            (0, Some("ping")) => {
                inner.connections[index].pings.push(Ping {
                    at: Instant::now(),
                    service: frame.service,
                    seq_id: frame.seq_id,
                    log_id: frame.log_id,
                });
                (!inner.silent).then(|| PbFrame {
                    headers: vec![pb_header("type", "pong")],
                    payload: inner
                        .pong_config
                        .as_ref()
                        .map(|c| c.to_string().into_bytes()),
                    ..frame.clone()
                })
            }
            (1, _) => {
                let payload: Value =
                    serde_json::from_slice(frame.payload.as_deref().unwrap_or_default())
                        .expect("an ack's payload is JSON");
                let data = payload["data"]
                    .as_str()
                    .and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok())
                    .and_then(|d| serde_json::from_slice(&d).ok())
                    .unwrap_or(Value::Null);
                inner.acks.push(WsAck {
                    at: Instant::now(),
                    connection: index,
                    message_id: frame.header("message_id").unwrap_or_default().to_owned(),
                    code: payload["code"].as_i64().unwrap_or(-1),
                    data,
                    payload,
                    frame,
                });
                None
            }
            _ => None,
        };
        drop(inner);
        self.changed.notify_waiters();
        answer
    }
}

fn refused(refusal: &Refusal) -> ErrorResponse {
    let mut response = http::Response::builder()
        .status(refusal.status)
        .header("Handshake-Status", refusal.status.to_string())
        .header("Handshake-Msg", "refused by the fake");
    if let Some(code) = &refusal.auth_errcode {
        response = response.header("Handshake-Autherrcode", code);
    }
    response.body(None).unwrap()
}

/// `POST /callback/ws/endpoint`.
async fn endpoint(State(fake): State<FakeWs>, headers: HeaderMap, body: Bytes) -> Response {
    let answer = |status: u16, body: Value| {
        (
            StatusCode::from_u16(status).unwrap(),
            [(header::CONTENT_TYPE, "application/json; charset=utf-8")],
            body.to_string(),
        )
            .into_response()
    };
    let mut inner = fake.inner.lock().unwrap();
    inner.bootstraps += 1;
    let failure = inner.bootstrap_failures.pop_front();
    drop(inner);
    fake.changed.notify_waiters();
    let mut inner = fake.inner.lock().unwrap();
    match failure {
        Some(Bootstrap::Http(status)) => return answer(status, json!({"msg": "gateway error"})),
        Some(Bootstrap::Code(code)) => {
            return answer(200, json!({"code": code, "msg": "refused by the fake"}));
        }
        None => {}
    }
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if headers.get("locale").and_then(|v| v.to_str().ok()) != Some("zh") {
        return answer(
            200,
            json!({"code": 1000040345, "msg": "missing locale header"}),
        );
    }
    if request["AppID"] != inner.app_id.as_str()
        || request["AppSecret"] != inner.app_secret.as_str()
    {
        return answer(200, json!({"code": 10014, "msg": "app secret invalid"}));
    }
    let service_id = 20_000 + inner.tickets.len() as i32;
    let ticket = format!("tk{}", ulid::Ulid::new());
    inner.tickets.push((ticket.clone(), service_id));
    let url = format!(
        "ws://127.0.0.1:{}/ws/v2?fpid=493&aid=552564&device_id=7{}&access_key=ak{}&service_id={service_id}&ticket={ticket}",
        inner.ws_port,
        inner.tickets.len(),
        ulid::Ulid::new(),
    );
    answer(
        200,
        json!({"code": 0, "msg": "ok", "data": {"URL": url, "ClientConfig": inner.client_config}}),
    )
}

fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}
