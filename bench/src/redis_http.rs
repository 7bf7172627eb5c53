//! The peer of issue 17: what a user would build instead of the broker, an
//! axum HTTP service over Redis Streams (`loopx-bench redis-http-server`, its
//! own process, as the broker is). The broker's three requests, JSON in and
//! out: enqueue (`XADD`), claim (`XREADGROUP`, parked with `BLOCK` when
//! `wait_seconds` > 0) and complete (`XACK`). Commands that answer at once
//! share one multiplexed connection: redis-rs pipelines every task's
//! commands over it, the crate's own answer to pooling. A `BLOCK` holds its
//! connection until it answers (every command behind it would wait), so
//! each parked claim takes a connection of its own from an idle list,
//! opened when the list is empty and put back once answered.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisResult, Value as Reply};
use serde_json::{Value, json};

use crate::floor::FloorServer;
use crate::loopx::http_client;
use crate::peers::{first_entry, read_group};
use crate::queue::Queue;
use crate::sys::Result;

/// The longest a claim may park.
const MAX_WAIT_SECONDS: u64 = 600;

struct Peer {
    client: redis::Client,
    /// Every command that does not block.
    shared: MultiplexedConnection,
    /// Connections for parked claims, between two of them.
    idle: Mutex<Vec<MultiplexedConnection>>,
}

type Shared = Arc<Peer>;
type Answer = std::result::Result<(StatusCode, Json<Value>), (StatusCode, Json<Value>)>;

/// Runs the peer server until killed.
pub async fn serve(listen: SocketAddr, redis_url: &str) -> Result<()> {
    let client = redis::Client::open(redis_url)?;
    let shared = connect(&client).await?;
    let peer = Arc::new(Peer {
        client,
        shared,
        idle: Mutex::default(),
    });
    let app = Router::new()
        .route("/streams/{stream}/messages", post(enqueue))
        .route("/streams/{stream}/claims", post(claim))
        .route("/streams/{stream}/entries/{id}/complete", post(complete))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(peer);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    axum::serve(listener, app.into_make_service()).await?;
    Ok(())
}

/// A connection without a response timeout (a `BLOCK` waits as long as asked).
async fn connect(client: &redis::Client) -> RedisResult<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new().set_response_timeout(None);
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

impl Peer {
    async fn checkout(&self) -> RedisResult<MultiplexedConnection> {
        let idle = self.idle.lock().map(|mut idle| idle.pop()).ok().flatten();
        match idle {
            Some(conn) => Ok(conn),
            None => connect(&self.client).await,
        }
    }

    fn checkin(&self, conn: MultiplexedConnection) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(conn);
        }
    }
}

fn refuse(status: StatusCode, error: &str, message: String) -> (StatusCode, Json<Value>) {
    (status, Json(json!({"error": error, "message": message})))
}

fn unavailable(e: redis::RedisError) -> (StatusCode, Json<Value>) {
    refuse(
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
        e.to_string(),
    )
}

async fn enqueue(
    State(peer): State<Shared>,
    Path(stream): Path<String>,
    Json(body): Json<Value>,
) -> Answer {
    let Some(text) = body["text"].as_str() else {
        let message = "text (a string) is required".into();
        return Err(refuse(StatusCode::BAD_REQUEST, "invalid_request", message));
    };
    let id: String = redis::cmd("XADD")
        .arg(&stream)
        .arg("*")
        .arg("text")
        .arg(text)
        .query_async(&mut peer.shared.clone())
        .await
        .map_err(unavailable)?;
    Ok((StatusCode::CREATED, Json(json!({"id": id}))))
}

async fn claim(
    State(peer): State<Shared>,
    Path(stream): Path<String>,
    Json(body): Json<Value>,
) -> Answer {
    let wait = body["wait_seconds"].as_u64().unwrap_or(0);
    let reply: Reply = if wait == 0 {
        read_group(&stream, None)
            .query_async(&mut peer.shared.clone())
            .await
            .map_err(unavailable)?
    } else {
        let mut conn = peer.checkout().await.map_err(unavailable)?;
        let block = wait.min(MAX_WAIT_SECONDS) * 1000;
        let reply = read_group(&stream, Some(block))
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        peer.checkin(conn);
        reply
    };
    let answer = match first_entry(reply) {
        Some((id, fields)) => json!({
            "claimed": true,
            "id": String::from_utf8_lossy(&id),
            "text": field(&fields, "text"),
        }),
        None => json!({"claimed": false}),
    };
    Ok((StatusCode::OK, Json(answer)))
}

/// A field of a stream entry (`[name, value, ...]`).
fn field(fields: &Reply, name: &str) -> Option<String> {
    let Reply::Array(items) = fields else {
        return None;
    };
    items.chunks(2).find_map(|pair| match pair {
        [Reply::BulkString(k), Reply::BulkString(v)] if k == name.as_bytes() => {
            Some(String::from_utf8_lossy(v).into_owned())
        }
        _ => None,
    })
}

/// Acknowledges a claimed entry; the body (the response) is parsed and, as
/// a queue keeps no results, not stored.
async fn complete(
    State(peer): State<Shared>,
    Path((stream, id)): Path<(String, String)>,
    Json(_response): Json<Value>,
) -> Answer {
    let acked: i64 = redis::cmd("XACK")
        .arg(&stream)
        .arg("g")
        .arg(&id)
        .query_async(&mut peer.shared.clone())
        .await
        .map_err(unavailable)?;
    if acked == 0 {
        let message = format!("{id} is not a pending entry of {stream}");
        return Err(refuse(StatusCode::NOT_FOUND, "not_claimed", message));
    }
    Ok((StatusCode::OK, Json(json!({"completed": true}))))
}

/// The peer server as a [`Queue`]: lane `i` is stream `{prefix}:{i}`.
pub struct RedisHttpQueue {
    http: reqwest::Client,
    base: String,
    prefix: String,
    /// `wait_seconds` of a parked claim.
    wait_seconds: u64,
}

impl RedisHttpQueue {
    pub fn new(server: &FloorServer, prefix: &str, wait_seconds: u64) -> Result<Self> {
        Ok(Self {
            http: http_client()?,
            base: server.base.clone(),
            prefix: prefix.to_owned(),
            wait_seconds,
        })
    }

    async fn post(&self, path: String, body: Value, ok: StatusCode) -> Result<Value> {
        let response = self
            .http
            .post(format!("{}/streams/{path}", self.base))
            .json(&body)
            .send()
            .await?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if status != ok {
            return Err(format!("the axum-over-Redis peer answered {status}: {body}").into());
        }
        Ok(body)
    }
}

impl Queue for RedisHttpQueue {
    type Conn = ();
    /// The entry id.
    type Token = String;

    async fn connect(&self, _listen: Option<usize>) -> Result<()> {
        Ok(())
    }

    async fn enqueue(&self, _: &mut (), lane: usize) -> Result<()> {
        let path = format!("{}:{lane}/messages", self.prefix);
        self.post(path, json!({"text": "hello"}), StatusCode::CREATED)
            .await?;
        Ok(())
    }

    async fn claim(&self, _: &mut (), lane: usize, wait: bool) -> Result<Option<String>> {
        let wait_seconds = if wait { self.wait_seconds } else { 0 };
        let path = format!("{}:{lane}/claims", self.prefix);
        let answer = self
            .post(path, json!({"wait_seconds": wait_seconds}), StatusCode::OK)
            .await?;
        if answer["claimed"] != json!(true) {
            return Ok(None);
        }
        let id = answer["id"].as_str().ok_or("no entry id")?;
        Ok(Some(id.to_owned()))
    }

    async fn complete(&self, _: &mut (), lane: usize, id: String) -> Result<()> {
        let path = format!("{}:{lane}/entries/{id}/complete", self.prefix);
        let body = json!({"response": {"message": "ok"}});
        self.post(path, body, StatusCode::OK).await?;
        Ok(())
    }
}
