//! `loopx mcp`: the host bridge built in, as an MCP server on stdio that an
//! agent CLI (Claude Code, Codex, any MCP host) starts for its own running
//! session (as the MCP bridge contract says). stdout carries only MCP messages;
//! logs go to stderr and never carry a message text or the host session id.
//! It exits 0 when stdin closes and releases nothing: an unanswered claim
//! stays claimed for the next run to take over. While it holds a delivered,
//! unanswered turn it says so every minute (`working`, naming its claim), so
//! that the broker releases the turn of a bridge that died, and never the
//! turn of one that lives.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use rmcp::ServiceExt;

use super::common::{Connection, Format, local_error};
use crate::model::BindRequest;

pub(crate) mod host;
mod lock;
mod permissions;
mod server;
mod stdio;

use host::{Host, Target};
use server::{Mode, Server};

/// `loopx mcp`'s flags.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["session_id", "goal_id"])))]
pub struct McpArgs {
    /// The LoopX Chat session to attach to (ses_…). Or give the bind flags
    /// (--goal-id, --agent-id, --executor-endpoint-id) to register and bind
    /// at start, reusing the open session.
    #[arg(long)]
    pub session_id: Option<String>,
    /// Bind: the goal the agent works on.
    #[arg(long, requires_all = ["agent_id", "executor_endpoint_id"])]
    pub goal_id: Option<String>,
    /// Bind: the registered LoopX agent.
    #[arg(long, requires = "goal_id")]
    pub agent_id: Option<String>,
    /// Bind: the label of the executor that runs the agent.
    #[arg(long, requires = "goal_id")]
    pub executor_endpoint_id: Option<String>,
    /// Which kind of host runs the agent session (e.g. claude-code, codex-cli).
    #[arg(long)]
    pub host_surface: String,
    /// The running host session's opaque id (never logged).
    #[arg(long, env = "CLAUDE_CODE_SESSION_ID", hide_env_values = true)]
    pub host_session_id: String,
    /// Tools only (wait_for_message, reply, release), for Codex and hosts
    /// without channels; by default a Claude Code channel with a reply tool.
    #[arg(long)]
    pub tools_only: bool,
    /// The server's name, as the host's MCP configuration calls it.
    #[arg(long, default_value = "loopx")]
    pub name: String,
    /// Taken as by every client command; stdout carries MCP's JSON-RPC
    /// messages whatever it says, and logs go to stderr as text.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// How often the bridge tells the broker that the agent works on the turn
    /// it holds (the broker releases a holder silent for its
    /// --holder-silence, default 5m).
    #[arg(long, env = "LOOPX_HEARTBEAT", default_value = "60s", value_parser = crate::serve::parse_duration, hide = true)]
    pub heartbeat: Duration,
    #[command(flatten)]
    pub connection: Connection,
}

/// Runs `loopx mcp` until stdin closes.
pub fn run(args: McpArgs) -> ExitCode {
    let (client, _) = match args.connection.client() {
        Ok(found) => found,
        Err(message) => return local_error(&message),
    };
    // One bridge per host identity, before any MCP traffic.
    let locks = args.connection.data_dir().join("mcp");
    let lock_file = lock::path(
        &locks,
        client.base_url(),
        &args.host_surface,
        &args.host_session_id,
    );
    let _lock = match lock::take(&lock_file, lock::WAIT_FOR_HOLDER) {
        Ok(lock) => lock,
        Err(message) => return local_error(&message),
    };
    init_logging();
    let target = match (&args.session_id, &args.goal_id) {
        (Some(session_id), _) => Target::Session(session_id.clone()),
        (None, Some(goal_id)) => Target::Bind(BindRequest {
            goal_id: goal_id.clone(),
            agent_id: args.agent_id.clone().unwrap_or_default(),
            host_surface: args.host_surface.clone(),
            host_session_id: args.host_session_id.clone(),
            executor_endpoint_id: args.executor_endpoint_id.clone().unwrap_or_default(),
            terminal: None,
            dry_run: false,
        }),
        (None, None) => unreachable!("clap requires one of them"),
    };
    let mode = if args.tools_only {
        Mode::ToolsOnly
    } else {
        Mode::Channel
    };
    let saves = crate::cli::attachments::default_root(&args.connection.data_dir());
    let host = Arc::new(
        Host::new(client, args.host_surface, args.host_session_id, target).saving_files_in(saves),
    );
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return local_error(&format!("cannot start the runtime: {e}")),
    };
    let heartbeat = args.heartbeat;
    let code = runtime.block_on(async move {
        tokio::spawn(host.clone().heartbeat(heartbeat));
        serve(Server::new(host, mode, args.name)).await
    });
    // The parked claim and stdin's blocking reader are not waited for.
    runtime.shutdown_timeout(Duration::from_millis(100));
    code
}

/// How long answers still being worked out get once stdin has closed: the
/// process exits within this (the contract's bound is 5 s).
const CLOSING_GRACE: Duration = Duration::from_secs(1);

async fn serve(server: Server) -> ExitCode {
    tracing::info!(broker = %server.broker_url(), "loopx mcp: serving MCP on stdio");
    let front = stdio::start();
    let mut stdin_closed = front.stdin_closed;
    server.bind_at_start();
    let host = server.host();
    let running = match server.serve(front.transport).await {
        Ok(running) => running,
        Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => {
            tracing::info!("stdin closed before initialize");
            let _ = tokio::time::timeout(CLOSING_GRACE, host.leave()).await;
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            tracing::error!("the MCP handshake failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    // rmcp waits up to 5 s for calls in flight once its input ends (a parked
    // wait_for_message among them): the client is gone, so they get a short
    // grace and the process exits.
    let waiting = running.waiting();
    tokio::pin!(waiting);
    let ended = tokio::select! {
        ended = &mut waiting => Some(ended),
        _ = stdin_closed.wait_for(|closed| *closed) => {
            tokio::time::timeout(CLOSING_GRACE, &mut waiting).await.ok()
        }
    };
    match ended {
        Some(Ok(reason)) => tracing::info!("loopx mcp: stdin closed ({reason:?}); exiting"),
        Some(Err(e)) => tracing::warn!("loopx mcp: the MCP service ended badly: {e}"),
        None => tracing::info!("loopx mcp: stdin closed with a call in flight; exiting"),
    }
    let _ = tokio::time::timeout(CLOSING_GRACE, host.leave()).await;
    ExitCode::SUCCESS
}

/// Logs to stderr (stdout is the MCP channel); `LOOPX_LOG` filters, default
/// `info`. rmcp stays at `warn`: its debug lines carry whole requests, tool
/// arguments (message texts) included.
fn init_logging() {
    let filter = std::env::var("LOOPX_LOG").unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(format!(
            "{filter},rmcp=warn"
        )))
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
}
