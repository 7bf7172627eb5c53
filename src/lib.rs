//! LoopX attached session broker: an HTTP service that lets the people and
//! bots around an already-running agent session talk to it through one
//! ordered, duplicate-safe queue per session. It never starts or fakes an
//! agent runtime.
//!
//! The map of the house:

/// Attachments' rules: the limits, safe file names, image sniffing, the
/// type a file is served as, and a turn's stored list.
pub mod attachments;
/// The broker core: validation, limits, parked claims and the hand-off of
/// an enqueue to a parked claim; every wake-up from the store's change feed.
/// The store takes the decisions.
pub mod broker;
/// The `loopx` command line: `serve`, and the client side (worker-bridge,
/// chat, lark, mcp), one file per command family.
pub mod cli;
/// The typed HTTP client, shared by the CLI and the tests.
pub mod client;
/// The data dir and the owner token, for `serve` and the clients alike.
pub mod config;
/// The contract's stateful rules, once for every store: rows in, writes or
/// a refusal out (turns, sessions, permission requests, Lark links and
/// events), every session event numbered there. It owns the rows, outcomes
/// and writes it decides over, and imports nothing from the store.
pub mod decide;
/// Devices signed in with a one-time link: codes, credentials, names, the
/// wrong-code throttle, who a request comes from.
pub mod devices;
/// The one error type and its JSON body.
pub mod error;
/// Parked claims an enqueue hands its turn to, in one commit.
pub mod handoff;
/// The HTTP routes, extractors, auth and fallbacks.
pub mod http;
/// Client-chosen identifier rules and minted ids.
pub mod ids;
/// The Lark connector: webhook verification and event reading (its route is
/// in `http`), and the durable reply path.
pub mod lark;
/// Prometheus metrics, content-free.
pub mod metrics;
/// The wire types of the contract.
pub mod model;
/// The generated OpenAPI document.
pub mod openapi;
/// Permission requests apart from their decisions: the stored row, a Lark
/// chat's approvers, `yes <id>` / `no <id>` and the request's chat message.
pub mod permission;
/// Web Push apart from the store: the VAPID key, a subscription's rules.
pub mod push;
/// `loopx serve` and `loopx prune`; [`serve::App`] is the one wiring of a
/// broker, which the integration tests run too.
pub mod serve;
/// Durable state behind a trait, the seam beneath the decisions: SQLite
/// (embedded) or PostgreSQL (replicas), and the feed of what changed.
pub mod store;
/// Timestamps as stored and as shown.
pub mod time;
/// Per-session wake-up signals for parked claims, permission waits and
/// event streams.
pub mod wakeup;
/// The embedded Web chat page.
pub mod web;
