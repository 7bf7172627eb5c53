//! The integration suite: real brokers on real TCP ports with real SQLite
//! files, driven through the project's own client (and, where the process
//! itself is under test, the real `loopx` binary).

mod support;

mod attachments;
mod attachments_streaming;
mod auth_and_errors;
mod changes;
mod claims;
mod cli;
mod completions;
mod connections;
mod continued;
mod devices;
mod durability;
mod events;
mod fake_lark;
mod fake_lark_ws;
mod holders;
mod hooks;
mod hooks_doctor;
mod journal;
mod lark;
mod lark_attachments;
mod lark_cards;
mod lark_pairing;
mod lark_permissions;
mod lark_prompts;
mod lark_sessions;
mod lark_ws;
mod metrics;
mod openapi_drift;
mod owner_close;
mod permissions;
mod presence;
mod prompts;
mod push;
mod replicas;
mod retention;
mod sessions;
mod terminal;
mod wake;
