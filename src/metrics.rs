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
        let requests = IntCounterVec::new(
            Opts::new(
                "http_requests_total",
                "HTTP requests by matched route, method and status.",
            ),
            &["route", "method", "status"],
        )
        .expect("valid metric");
        let turns = IntCounterVec::new(
            Opts::new(
                "turns_total",
                "Turn transitions: enqueued, claimed, completed, cancelled.",
            ),
            &["event"],
        )
        .expect("valid metric");
        let queued = IntGauge::new("queued_turns", "Turns queued now, over all sessions.")
            .expect("valid metric");
        let oldest_queued_age_seconds = prometheus::Gauge::new(
            "oldest_queued_age_seconds",
            "Age of the oldest queued turn, over all sessions (0 when none).",
        )
        .expect("valid metric");
        let parked_claims = IntGauge::new("parked_claims", "Claims parked waiting for a turn.")
            .expect("valid metric");
        let sse_streams =
            IntGauge::new("sse_streams", "Open Server-Sent Events streams.").expect("valid metric");
        let claim_wake_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "claim_wake_seconds",
                "From a parked claim's wake-up signal to its answer.",
            )
            .buckets(vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
            ]),
        )
        .expect("valid metric");
        let lark_replies = IntCounterVec::new(
            Opts::new(
                "lark_replies_total",
                "Lark replies, permission-request cards and their updates by outcome.",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        let connections = ConnectionMetrics::new();
        let permission_requests = IntCounterVec::new(
            Opts::new(
                "permission_requests_total",
                "Permission requests by outcome: created, allowed, denied, expired.",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        let lark_connected = IntGauge::new(
            "lark_connected",
            "1 while the long connection to Lark is open, else 0.",
        )
        .expect("valid metric");
        let lark_reconnects = prometheus::IntCounter::new(
            "lark_reconnects_total",
            "Long connections to Lark lost or refused, each followed by a retry.",
        )
        .expect("valid metric");
        for collector in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(turns.clone()),
            Box::new(queued.clone()),
            Box::new(oldest_queued_age_seconds.clone()),
            Box::new(parked_claims.clone()),
            Box::new(sse_streams.clone()),
            Box::new(claim_wake_seconds.clone()),
            Box::new(lark_replies.clone()),
            Box::new(connections.open.clone()),
            Box::new(connections.refused.clone()),
            Box::new(connections.accept_errors.clone()),
            Box::new(permission_requests.clone()),
            Box::new(lark_connected.clone()),
            Box::new(lark_reconnects.clone()),
        ] {
            registry
                .register(collector)
                .expect("metric names are unique");
        }
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
