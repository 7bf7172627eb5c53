//! The Lark (Feishu) connector: events from linked chats arrive over a long
//! connection the broker opens to Lark (no public address needed) or through
//! a verified webhook, and take one ingestion path that enqueues them; a
//! durable, idempotent reply path (an outbox written with the completion,
//! sent by one background dispatcher) answers. The wire is Lark's: its event
//! envelope (schema 2.0), its message APIs and its long connection's frames.

pub mod api;
pub mod card;
pub mod crypto;
pub mod dispatcher;
pub mod fragments;
pub mod frame;
pub mod inbound;
pub mod long_connection;
pub mod markdown;
pub mod resources;
pub mod webhook;

use std::time::Duration;

/// Lark's Open Platform, China region.
pub const DEFAULT_BASE_URL: &str = "https://open.feishu.cn";

/// How events reach the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EventMode {
    /// The broker opens a WebSocket to Lark: outbound HTTPS only, no public
    /// address (the app's subscription mode: long connection).
    LongConnection,
    /// Lark posts to `/v1/connectors/lark/events`: the broker must be
    /// reachable from Lark, and needs the verification token.
    Webhook,
}

/// The connector's configuration. Secrets never print in `Debug`.
#[derive(Clone)]
pub struct LarkConfig {
    pub app_id: String,
    pub app_secret: String,
    pub events: EventMode,
    /// The webhook's; unused by the long connection.
    pub verification_token: String,
    /// When set, events arrive encrypted and signed.
    pub encrypt_key: Option<String>,
    /// `https://open.feishu.cn`, `https://open.larksuite.com`, or a fake in tests.
    pub base_url: String,
    /// The first retry delay of a failed reply (doubling up to `retry_max`).
    pub retry_base: Duration,
    pub retry_max: Duration,
    /// Replies that keep failing on the network are given up after this many attempts.
    pub max_attempts: u32,
    /// Events whose timestamp is further than this from now are refused (replays).
    pub freshness: Duration,
    /// The long connection's settings until Lark sends its own (LARK.md's
    /// defaults; shorter in tests).
    pub long_connection: ClientConfig,
    /// The longest backoff between reconnects that keep failing (it starts
    /// at 1 s, whatever Lark pushes; a random extra of up to as much again
    /// comes on top).
    pub reconnect_max: Duration,
}

impl LarkConfig {
    /// A webhook connector.
    pub fn new(
        app_id: String,
        app_secret: String,
        verification_token: String,
        encrypt_key: Option<String>,
        base_url: String,
    ) -> Self {
        Self {
            app_id,
            app_secret,
            events: EventMode::Webhook,
            verification_token,
            encrypt_key: encrypt_key.filter(|k| !k.is_empty()),
            base_url: base_url.trim_end_matches('/').to_owned(),
            retry_base: Duration::from_secs(1),
            retry_max: Duration::from_secs(300),
            max_attempts: 12,
            freshness: Duration::from_secs(300),
            long_connection: ClientConfig::default(),
            reconnect_max: Duration::from_secs(60),
        }
    }

    /// A connector that receives its events over the long connection: app id
    /// and secret are all it needs.
    pub fn long_connection(app_id: String, app_secret: String, base_url: String) -> Self {
        Self {
            events: EventMode::LongConnection,
            ..Self::new(app_id, app_secret, String::new(), None, base_url)
        }
    }
}

impl std::fmt::Debug for LarkConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LarkConfig")
            .field("app_id", &self.app_id)
            .field("app_secret", &"<redacted>")
            .field("events", &self.events)
            .field("verification_token", &"<redacted>")
            .field(
                "encrypt_key",
                &self.encrypt_key.as_ref().map(|_| "<redacted>"),
            )
            .field("base_url", &self.base_url)
            .finish()
    }
}

/// The long connection's settings (LARK.md's defaults until Lark sends its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientConfig {
    pub ping_interval: Duration,
    pub reconnect_interval: Duration,
    /// The first reconnect waits a random delay up to this.
    pub reconnect_nonce: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            ping_interval: Duration::from_secs(120),
            reconnect_interval: Duration::from_secs(120),
            reconnect_nonce: Duration::from_secs(30),
        }
    }
}
