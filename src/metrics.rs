//! Prometheus metrics: requests by route and status, turn counts, queue depth
//! and age, parked claims, open SSE streams, claim wake latency and Lark
//! replies, permission requests by outcome, the long connection to Lark. No label ever carries an id chosen by a client: routes are the
//! matched templates.

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    /// `route` (the matched template), `method`, `status`.
    pub requests: IntCounterVec,
    /// `event`: enqueued, claimed, completed, cancelled.
    pub turns: IntCounterVec,
    pub queued: IntGauge,
    pub oldest_queued_age_seconds: prometheus::Gauge,
    pub parked_claims: IntGauge,
    pub sse_streams: IntGauge,
    /// From a parked claim's wake-up to its answer.
    pub claim_wake_seconds: Histogram,
    /// `outcome`: sent, retried, failed.
    pub lark_replies: IntCounterVec,
    /// What the server loop counts about connections.
    pub connections: ConnectionMetrics,
    /// `outcome`: created, allowed, denied, expired.
    pub permission_requests: IntCounterVec,
    /// 1 while the long connection to Lark is open.
    pub lark_connected: IntGauge,
    /// Long connections to Lark lost or refused (each is retried).
    pub lark_reconnects: prometheus::IntCounter,
}

/// Connections: open now, refused at the cap, and failed accepts. Cheap to
/// clone (the counters are shared), so the server loop holds its own copy.
#[derive(Clone)]
pub struct ConnectionMetrics {
    pub open: IntGauge,
    /// `reason`: `cap` (answered 503 from the reserve), `reserve_full` (closed at once).
    pub refused: IntCounterVec,
    pub accept_errors: prometheus::IntCounter,
}

impl ConnectionMetrics {
    fn new() -> Self {
        Self {
            open: IntGauge::new("connections", "Open HTTP connections.").expect("valid metric"),
            refused: IntCounterVec::new(
                Opts::new(
                    "connections_refused_total",
                    "Connections refused past the cap: `cap` answered 503 from the reserve, `reserve_full` closed at once.",
                ),
                &["reason"],
            )
            .expect("valid metric"),
            accept_errors: prometheus::IntCounter::new(
                "accept_errors_total",
                "Failed accepts on the listening socket (e.g. out of file descriptors).",
            )
            .expect("valid metric"),
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let registry = Registry::new_custom(Some("loopx".into()), None).expect("a valid prefix");
        let requests = counters(
            &registry,
            "http_requests_total",
            "HTTP requests by matched route, method and status.",
            &["route", "method", "status"],
        );
        let turns = counters(
            &registry,
            "turns_total",
            "Turn transitions: enqueued, claimed, completed, cancelled.",
            &["event"],
        );
        let queued = gauge(
            &registry,
            "queued_turns",
            "Turns queued now, over all sessions.",
        );
        let oldest_queued_age_seconds = prometheus::Gauge::new(
            "oldest_queued_age_seconds",
            "Age of the oldest queued turn, over all sessions (0 when none).",
        );
        let oldest_queued_age_seconds = registered(&registry, oldest_queued_age_seconds);
        let parked_claims = gauge(
            &registry,
            "parked_claims",
            "Claims parked waiting for a turn.",
        );
        let sse_streams = gauge(&registry, "sse_streams", "Open Server-Sent Events streams.");
        let claim_wake_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "claim_wake_seconds",
                "From a parked claim's wake-up signal to its answer.",
            )
            .buckets(vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
            ]),
        );
        let claim_wake_seconds = registered(&registry, claim_wake_seconds);
        let lark_replies = counters(
            &registry,
            "lark_replies_total",
            "Lark replies, permission-request cards and their updates by outcome.",
            &["outcome"],
        );
        let connections = ConnectionMetrics::new();
        registered(&registry, Ok(connections.open.clone()));
        registered(&registry, Ok(connections.refused.clone()));
        registered(&registry, Ok(connections.accept_errors.clone()));
        let permission_requests = counters(
            &registry,
            "permission_requests_total",
            "Permission requests by outcome: created, allowed, denied, expired.",
            &["outcome"],
        );
        let lark_connected = gauge(
            &registry,
            "lark_connected",
            "1 while the long connection to Lark is open, else 0.",
        );
        let lark_reconnects = prometheus::IntCounter::new(
            "lark_reconnects_total",
            "Long connections to Lark lost or refused, each followed by a retry.",
        );
        let lark_reconnects = registered(&registry, lark_reconnects);
        Self {
            registry,
            requests,
            turns,
            queued,
            oldest_queued_age_seconds,
            parked_claims,
            sse_streams,
            claim_wake_seconds,
            lark_replies,
            connections,
            permission_requests,
            lark_connected,
            lark_reconnects,
        }
    }
}

/// `metric`, registered in `registry`.
fn registered<C>(registry: &Registry, metric: prometheus::Result<C>) -> C
where
    C: prometheus::core::Collector + Clone + 'static,
{
    let metric = metric.expect("valid metric");
    registry
        .register(Box::new(metric.clone()))
        .expect("metric names are unique");
    metric
}

/// A registered counter per value of `labels`.
fn counters(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    registered(registry, IntCounterVec::new(Opts::new(name, help), labels))
}

/// A registered gauge.
fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    registered(registry, IntGauge::new(name, help))
}

impl Metrics {
    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buffer);
        String::from_utf8(buffer).unwrap_or_default()
    }

    pub fn turn(&self, event: &str, count: u64) {
        self.turns.with_label_values(&[event]).inc_by(count);
    }

    pub fn permission(&self, outcome: &str, count: u64) {
        self.permission_requests
            .with_label_values(&[outcome])
            .inc_by(count);
    }
}

/// Counts one open thing (a parked claim, an SSE stream) while it lives.
pub struct Open(IntGauge);

impl Open {
    pub fn new(gauge: &IntGauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.dec();
    }
}
