//! The connection lifecycle: the accept loop, hyper's HTTP/1 connections with
//! a timer (head-read timeout, which also bounds idle keep-alive), the
//! request-body deadline handed to the body extractors, the connection cap
//! with its reserve, and the bounded graceful shutdown. It owns no routes and
//! never reads or writes a socket by hand: hyper does the HTTP.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::response::IntoResponse;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use crate::error::Error;
use crate::metrics::{ConnectionMetrics, Open};

const DEFAULT_HEADER_TIMEOUT_SECONDS: u64 = 60;
const DEFAULT_BODY_TIMEOUT_SECONDS: u64 = 60;
const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
const DEFAULT_CONNECTION_RESERVE: usize = 100;
const DEFAULT_SHUTDOWN_GRACE_SECONDS: u64 = 5;
/// What a refused client is told to wait before it retries.
const RETRY_AFTER_SECONDS: u32 = 1;
/// A connection answered from the reserve gets this long to send its head.
const RESERVE_HEAD_TIMEOUT: Duration = Duration::from_secs(2);

/// How connections are bounded: `loopx serve` flags, defaults in docs/operations.md.
#[derive(Debug, Clone, clap::Args)]
pub struct ConnectionLimits {
    /// Seconds a connection has to send a whole request head, counted from
    /// when it opens or its previous answer ends; then it is closed. This
    /// also closes idle keep-alive connections and connections that send
    /// nothing. Parked claims and event streams are answering, not reading,
    /// so it never cuts them.
    #[arg(long, env = "LOOPX_HEADER_TIMEOUT_SECONDS", default_value_t = DEFAULT_HEADER_TIMEOUT_SECONDS, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout_seconds: u64,
    /// Seconds a request body has to arrive in full, counted from its head;
    /// then `408 request_timeout` and the connection is closed.
    #[arg(long, env = "LOOPX_BODY_TIMEOUT_SECONDS", default_value_t = DEFAULT_BODY_TIMEOUT_SECONDS, value_parser = clap::value_parser!(u64).range(1..))]
    pub body_timeout_seconds: u64,
    /// Open connections served at most (parked claims and event streams
    /// included). Lowered at start if the file limit cannot hold them.
    #[arg(long, env = "LOOPX_MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_connections: usize,
    /// Connections past the cap that still get a fast `503 overloaded` with
    /// `Retry-After` before they are closed; beyond these, new connections are
    /// closed at once.
    #[arg(long, env = "LOOPX_CONNECTION_RESERVE", default_value_t = DEFAULT_CONNECTION_RESERVE)]
    pub connection_reserve: usize,
    /// On SIGTERM/SIGINT, seconds in-flight requests get to finish before
    /// their connections are closed and the broker exits.
    #[arg(long, env = "LOOPX_SHUTDOWN_GRACE_SECONDS", default_value_t = DEFAULT_SHUTDOWN_GRACE_SECONDS)]
    pub shutdown_grace_seconds: u64,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            header_timeout_seconds: DEFAULT_HEADER_TIMEOUT_SECONDS,
            body_timeout_seconds: DEFAULT_BODY_TIMEOUT_SECONDS,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            connection_reserve: DEFAULT_CONNECTION_RESERVE,
            shutdown_grace_seconds: DEFAULT_SHUTDOWN_GRACE_SECONDS,
        }
    }
}

/// When a request's body must have arrived; set on every request the server
/// hands to the router, read by the body extractors.
#[derive(Debug, Clone, Copy)]
pub struct BodyDeadline {
    pub at: tokio::time::Instant,
    pub after: Duration,
}

/// Serves `app` on `listener` until `shutdown` fires; then stops accepting,
/// lets in-flight requests finish for the grace period (parked claims answer
/// at once through the broker's own token), closes what is left and returns.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: CancellationToken,
    limits: ConnectionLimits,
    metrics: ConnectionMetrics,
) -> std::io::Result<()> {
    let served = Arc::new(Semaphore::new(limits.max_connections));
    let reserve = Arc::new(Semaphore::new(limits.connection_reserve));
    let connections = TaskTracker::new();
    let mut accept_log = RateLimitedLog::default();
    let limits = Arc::new(limits);
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    metrics.accept_errors.inc();
                    accept_log.warn(&error);
                    // Out of descriptors or memory: give the peers' closes a
                    // moment instead of spinning on the same error.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        if let Ok(permit) = served.clone().try_acquire_owned() {
            let (app, limits, shutdown) = (app.clone(), limits.clone(), shutdown.clone());
            let open = Open::new(&metrics.open);
            connections.spawn(async move {
                serve_connection(stream, app, &limits, shutdown).await;
                drop((permit, open));
            });
        } else if let Ok(permit) = reserve.clone().try_acquire_owned() {
            metrics.refused.with_label_values(&["cap"]).inc();
            connections.spawn(refuse_connection(stream, permit));
        } else {
            metrics.refused.with_label_values(&["reserve_full"]).inc();
            drop(stream);
        }
    }
    drop(listener);
    connections.close();
    connections.wait().await;
    Ok(())
}

/// One connection, served until the client is done, its head timeout fires,
/// or shutdown's grace period ends.
async fn serve_connection(
    stream: TcpStream,
    app: Router,
    limits: &ConnectionLimits,
    shutdown: CancellationToken,
) {
    let body_timeout = Duration::from_secs(limits.body_timeout_seconds);
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let mut request: Request = request.map(Body::new);
        request.extensions_mut().insert(BodyDeadline {
            at: tokio::time::Instant::now() + body_timeout,
            after: body_timeout,
        });
        // A clone of a `Router<()>` shares its routing table (an `Arc`): a
        // connection costs no copy of the routes.
        app.clone().oneshot(request)
    });
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(limits.header_timeout_seconds))
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => return,
        _ = shutdown.cancelled() => connection.as_mut().graceful_shutdown(),
    }
    // Idle connections close now; a request still being sent or answered
    // gets the grace period, then the connection is dropped (closed).
    let grace = Duration::from_secs(limits.shutdown_grace_seconds);
    let _ = tokio::time::timeout(grace, connection).await;
}

/// A connection past the cap: its request is answered `503 overloaded` with
/// `Retry-After`, then closed, so the client learns why at once.
async fn refuse_connection(stream: TcpStream, permit: OwnedSemaphorePermit) {
    let service = hyper::service::service_fn(|_: hyper::Request<Incoming>| async {
        Ok::<_, Infallible>(Error::overloaded(RETRY_AFTER_SECONDS).into_response())
    });
    let _ = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(RESERVE_HEAD_TIMEOUT)
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service)
        .await;
    drop(permit);
}

/// Accept errors come in bursts (a full descriptor table fails every accept):
/// one warning per interval, with how many were not logged.
#[derive(Default)]
struct RateLimitedLog {
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimitedLog {
    const INTERVAL: Duration = Duration::from_secs(10);

    fn warn(&mut self, error: &std::io::Error) {
        if self.last.is_some_and(|at| at.elapsed() < Self::INTERVAL) {
            self.suppressed += 1;
            return;
        }
        tracing::warn!(
            %error,
            not_logged_since_last = self.suppressed,
            "cannot accept a connection (counted in loopx_accept_errors_total)"
        );
        self.last = Some(Instant::now());
        self.suppressed = 0;
    }
}
