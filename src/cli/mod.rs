//! The `loopx` command line: `serve` runs the broker; `openapi` prints the
//! OpenAPI document; the other commands are the client side, one file per
//! command family, all talking to a broker through the one typed
//! [`crate::client::Client`]. Nothing here touches the store or the HTTP
//! routes directly.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::serve::{self, ServeArgs};

/// A delivered turn's files saved on the host, named for the agent.
pub mod attachments;
pub mod chat;
pub mod codex;
pub mod common;
pub mod health;
pub mod hook;
pub mod lark;
pub mod mcp;
pub mod wake;
pub mod worker_bridge;

/// LoopX attached session broker: lets people and bots talk to an
/// already-running agent session through one ordered, duplicate-safe queue.
#[derive(Debug, Parser)]
#[command(name = "loopx", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the broker: its store is the embedded SQLite file in the data dir,
    /// or, with --database-url, a PostgreSQL database that replicas share.
    ///
    /// Example: loopx serve --listen 127.0.0.1:7317
    Serve(ServeArgs),
    /// Remove the sessions closed more than N days ago, with all their turns,
    /// claims, events and Lark rows. On SQLite stop the broker first (a
    /// running broker prunes with `serve --retain-closed-days`).
    ///
    /// Example: loopx prune --older-than-days 90
    Prune(serve::PruneArgs),
    /// Print the OpenAPI 3.1 document (the same as openapi/openapi.json).
    ///
    /// Example: loopx openapi > openapi/openapi.json
    Openapi,
    /// Host-bridge commands: register and bind a running host session, then
    /// claim, complete and release its turns.
    ///
    /// Example: loopx worker-bridge attached-session-claim --session-id ses_01JD... --host-surface codex-cli --host-session-id "$CODEX_SESSION_ID" --claim-id claim-42 --wait-seconds 30 --format json
    WorkerBridge(worker_bridge::WorkerBridgeArgs),
    /// Chat commands: queue a message for a session and read a turn back.
    ///
    /// Example: loopx chat send --session-id ses_01JD... --text "Please summarise the failing test."
    Chat(chat::ChatArgs),
    /// The Lark connector: link, unlink or show a session's Lark chat.
    ///
    /// Example: loopx lark link --session-id ses_01JD... --chat-id oc_...
    Lark(lark::LarkArgs),
    /// Attach a running Claude Code or Codex session to its LoopX session:
    /// an MCP server on stdio, started by the agent CLI.
    ///
    /// By default a Claude Code channel: each message claimed from the
    /// session arrives as a channel event and the `reply` tool answers it.
    /// With --tools-only (Codex, any MCP host): `wait_for_message`, `reply`
    /// and `release` tools. stdout carries only MCP messages; logs go to stderr.
    ///
    /// Example: loopx mcp --session-id ses_01JD... --host-surface claude-code
    Mcp(mcp::McpArgs),
    /// Attach Claude Code or Codex through their hooks: people's messages
    /// reach the agent at the end of each of its turns (Stop), its tool
    /// approvals are asked on the Web page and in Lark (PermissionRequest),
    /// and the session shows whether the agent is there. Reads the agent's
    /// JSON on stdin; never fails the agent (exit 0, one line on stderr).
    /// `install` writes the entries into the agent's settings.
    ///
    /// Example: loopx hook install --agent claude-code --goal-id my-project --agent-id claude --executor-endpoint-id my-laptop
    Hook(hook::HookArgs),
    /// Run an agent CLI in a pass-through terminal that types queued
    /// messages into it while it is idle at its prompt (its LoopX hooks
    /// must be installed: `loopx hook install`). Everything else passes
    /// through untouched; loopx exits with the agent's exit status.
    ///
    /// Example: loopx run -- claude --continue
    Run(wake::run::RunArgs),
    /// Codex through its own app-server: `loopx codex bridge` joins plain
    /// `codex`'s shared server and delivers each thread's messages into it
    /// with no typing (the hooks start it; CODEX.md).
    ///
    /// Example: loopx codex bridge --goal-id my-project --agent-id codex --executor-endpoint-id my-laptop
    Codex(codex::CodexArgs),
    /// Check that a broker is up and its store answers (no token needed);
    /// exit 0 when healthy, 1 when not, 3 when nothing answers.
    ///
    /// Example: loopx health --broker-url http://127.0.0.1:7317
    Health(health::HealthArgs),
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => match logged_run(serve::run(args)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => fail(message),
        },
        Command::Prune(args) => match logged_run(serve::prune(args)) {
            Ok(pruned) => {
                println!(
                    "pruned {} closed sessions ({} rows)",
                    pruned.sessions, pruned.rows
                );
                ExitCode::SUCCESS
            }
            Err(message) => fail(message),
        },
        Command::Openapi => {
            print!("{}", crate::openapi::document_json());
            ExitCode::SUCCESS
        }
        Command::WorkerBridge(args) => worker_bridge::run(args),
        Command::Chat(args) => chat::run(args),
        Command::Lark(args) => lark::run(args),
        Command::Mcp(args) => mcp::run(args),
        Command::Hook(args) => hook::run(args),
        Command::Run(args) => wake::run::run(args),
        Command::Codex(args) => codex::run(args),
        Command::Health(args) => health::run(args),
    }
}

/// Runs a store-owning command (serve, prune) with logging and a runtime.
fn logged_run<T>(
    command: impl std::future::Future<Output = Result<T, String>>,
) -> Result<T, String> {
    init_logging();
    tokio::runtime::Runtime::new()
        .map_err(|e| format!("cannot start the runtime: {e}"))?
        .block_on(command)
}

fn fail(message: String) -> ExitCode {
    eprintln!("loopx: error: {message}");
    ExitCode::FAILURE
}

/// Logs to stderr; `LOOPX_LOG` (or `RUST_LOG`) filters, default `info`.
fn init_logging() {
    let filter = std::env::var("LOOPX_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        // Colours for a terminal only; a log file gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
