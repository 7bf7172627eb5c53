//! Codex's app-server protocol as a client speaks it (CODEX.md "Talking to
//! it"): JSON-RPC 2.0 without the `"jsonrpc"` member, one message per text
//! frame of a WebSocket over the server's unix socket. Answers are matched
//! to their calls by id; the server's notifications and requests come out
//! of [`connect`]'s receiver, in order.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;

/// How long a call waits for its answer.
const CALL_WITHIN: Duration = Duration::from_secs(30);

/// What the server sends unasked.
#[derive(Debug)]
pub enum Incoming {
    Notification {
        method: String,
        params: Value,
    },
    /// A request the server waits on (an approval, a question).
    Request {
        id: Value,
        method: String,
        params: Value,
    },
}

type Waiting = Arc<std::sync::Mutex<HashMap<i64, oneshot::Sender<Result<Value, String>>>>>;

/// One connection to the server.
#[derive(Clone)]
pub struct Rpc {
    out: mpsc::UnboundedSender<Message>,
    waiting: Waiting,
    next: Arc<AtomicI64>,
}

/// Connects to the server's unix socket; the receiver ends when the
/// connection does.
pub async fn connect(
    socket: &std::path::Path,
) -> Result<(Rpc, mpsc::UnboundedReceiver<Incoming>), String> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| format!("cannot reach Codex's server at {}: {e}", socket.display()))?;
    let (ws, _) = tokio_tungstenite::client_async("ws://localhost/", stream)
        .await
        .map_err(|e| format!("Codex's server refused the WebSocket upgrade: {e}"))?;
    let (mut sink, mut source) = ws.split();
    let (out, mut outgoing) = mpsc::unbounded_channel::<Message>();
    let (incoming, received) = mpsc::unbounded_channel();
    let waiting: Waiting = Arc::default();
    tokio::spawn(async move {
        while let Some(message) = outgoing.recv().await {
            if sink.send(message).await.is_err() {
                break;
            }
        }
    });
    let answers = waiting.clone();
    tokio::spawn(async move {
        while let Some(Ok(frame)) = source.next().await {
            let Message::Text(text) = frame else {
                if matches!(frame, Message::Close(_)) {
                    break;
                }
                continue;
            };
            let Ok(message) = serde_json::from_str::<Value>(&text) else {
                continue;
            };
            if let Some(taken) = take(&message) {
                let _ = incoming.send(taken);
            } else if let Some(id) = message.get("id").and_then(Value::as_i64) {
                let answer = match message.get("error") {
                    Some(error) => Err(error.to_string()),
                    None => Ok(message.get("result").cloned().unwrap_or(Value::Null)),
                };
                let sender = answers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id);
                if let Some(sender) = sender {
                    let _ = sender.send(answer);
                }
            }
        }
        // Every call still waiting fails: the connection is gone.
        answers.lock().unwrap_or_else(|e| e.into_inner()).clear();
    });
    Ok((
        Rpc {
            out,
            waiting,
            next: Arc::new(AtomicI64::new(1)),
        },
        received,
    ))
}

/// A notification or a request of the server's (a message with a method).
fn take(message: &Value) -> Option<Incoming> {
    let method = message.get("method")?.as_str()?.to_owned();
    let params = message.get("params").cloned().unwrap_or(Value::Null);
    Some(match message.get("id") {
        Some(id) => Incoming::Request {
            id: id.clone(),
            method,
            params,
        },
        None => Incoming::Notification { method, params },
    })
}

impl Rpc {
    /// Calls `method` and waits for its answer (the error's JSON as text).
    pub async fn call(&self, method: &str, params: Value) -> Result<Value, String> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (sender, answer) = oneshot::channel();
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, sender);
        let message = json!({"id": id, "method": method, "params": params});
        self.out
            .send(Message::Text(message.to_string().into()))
            .map_err(|_| "the connection to Codex's server is closed".to_owned())?;
        match tokio::time::timeout(CALL_WITHIN, answer).await {
            Ok(Ok(answer)) => answer.map_err(|e| format!("{method}: {e}")),
            Ok(Err(_)) => Err("the connection to Codex's server is closed".to_owned()),
            Err(_) => Err(format!("{method}: no answer within 30 s")),
        }
    }

    /// Sends a notification (no answer).
    pub fn notify(&self, method: &str, params: Value) -> Result<(), String> {
        let message = json!({"method": method, "params": params});
        self.out
            .send(Message::Text(message.to_string().into()))
            .map_err(|_| "the connection to Codex's server is closed".to_owned())
    }

    /// The handshake: `initialize`, then `initialized`.
    pub async fn initialize(&self) -> Result<(), String> {
        self.call(
            "initialize",
            json!({
                "clientInfo": {"name": "loopx", "version": env!("CARGO_PKG_VERSION")},
                "capabilities": {"experimentalApi": true},
            }),
        )
        .await?;
        self.notify("initialized", json!({}))
    }
}
