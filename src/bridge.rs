//! `loopx worker-bridge …` and `loopx chat …`: the host-bridge and chat
//! commands, thin HTTP clients of a running broker through [`Client`].
//!
//! Every command prints either exactly the broker's JSON answer (`--format
//! json`, for scripts) or a short summary for people (`--format text`), and
//! exits 0 on success, 1 when the broker refused, 2 on a usage or local input
//! error (checked before any request is sent) and 3 when the broker is
//! unreachable. These commands never start, resume or fake an agent runtime.

use std::future::Future;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use reqwest::StatusCode;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::client::{Client, ClientError, DEFAULT_BROKER_URL, Reply};
use crate::config::{self, TokenSource};
use crate::model::{
    BindRequest, ClaimAnswer, ClaimRequest, CompleteRequest, EnqueueRequest, ListSessions, Origin,
    RegisterAgentThread, ReleaseRequest, Session, SessionState, Turn,
};

/// Exit code: the broker refused (or answered something this client does not understand).
const EXIT_REFUSED: u8 = 1;
/// Exit code: a usage or local input error; nothing was sent.
const EXIT_LOCAL: u8 = 2;
/// Exit code: no HTTP answer from the broker.
const EXIT_UNREACHABLE: u8 = 3;

/// How a command prints its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// A short summary for people.
    Text,
    /// Exactly the broker's JSON answer, one document on stdout.
    Json,
}

/// Where the broker is and how to prove the owner: shared by every client command.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Broker connection")]
pub struct ClientOptions {
    /// `text` for people; `json` prints exactly the broker's JSON answer
    /// (also its error body on a refusal), one document on stdout.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// The broker's base URL.
    #[arg(long, env = "LOOPX_BROKER_URL", default_value = DEFAULT_BROKER_URL, value_parser = parse_broker_url)]
    pub broker_url: String,
    /// Read the owner token from this file (LOOPX_TOKEN wins over it).
    #[arg(long, env = "LOOPX_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// The broker's data dir, whose owner.token is used when neither
    /// LOOPX_TOKEN nor --token-file is given
    /// [default: $XDG_DATA_HOME/loopx, else ~/.local/share/loopx].
    #[arg(long, env = "LOOPX_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
}

/// An http(s) URL, so that a typo is a usage error (2), not an unreachable broker (3).
fn parse_broker_url(value: &str) -> Result<String, String> {
    let url = url::Url::parse(value).map_err(|e| format!("not a URL: {e}"))?;
    match url.scheme() {
        "http" | "https" if url.host().is_some() => Ok(value.trim_end_matches('/').to_owned()),
        "http" | "https" => Err("the URL has no host".into()),
        other => Err(format!("the scheme must be http or https, not {other}")),
    }
}

// ---------------------------------------------------------------------------
// worker-bridge
// ---------------------------------------------------------------------------

/// The host side: register and bind a running host session, then claim,
/// complete and release its turns.
#[derive(Debug, Args)]
pub struct WorkerBridgeArgs {
    #[command(subcommand)]
    pub command: WorkerBridgeCommand,
}

#[derive(Debug, Subcommand)]
pub enum WorkerBridgeCommand {
    /// Register an exact (goal, agent, host surface, host session): the
    /// prerequisite of attached-session-bind.
    ///
    /// Registering the same tuple again is harmless and says so. The host
    /// session id stays in the broker's local store.
    #[command(
        after_help = "Example:\n  loopx worker-bridge bind-agent-thread --goal-id g-1 --agent-id agent-7 \\\n      --host-surface codex-cli --host-session-id \"$CODEX_SESSION_ID\""
    )]
    BindAgentThread(BindAgentThreadArgs),
    /// Bind a LoopX Chat session to a registered host session (a dry run
    /// unless --execute).
    ///
    /// Without --execute nothing is written: the command says whether a bind
    /// would create a new session or reuse the open one. With --execute it
    /// binds, and says whether the session is new or the open one reused.
    #[command(
        after_help = "Example:\n  loopx worker-bridge attached-session-bind --goal-id g-1 --agent-id agent-7 \\\n      --host-surface codex-cli --host-session-id \"$CODEX_SESSION_ID\" \\\n      --executor-endpoint-id exec-laptop --execute"
    )]
    AttachedSessionBind(AttachedSessionBindArgs),
    /// Claim the oldest queued turn of a session, optionally waiting for one.
    ///
    /// With --wait-seconds N the claim parks up to N seconds (capped at 1800)
    /// and wakes as soon as a message is queued; when nothing comes it ends
    /// with claimed=false, which is success (exit 0). Repeating a claim id
    /// answers the same turn again (a replay), never a second turn.
    #[command(
        after_help = "Example:\n  loopx worker-bridge attached-session-claim --session-id ses_01JD... \\\n      --host-surface codex-cli --host-session-id \"$CODEX_SESSION_ID\" \\\n      --claim-id claim-42 --wait-seconds 30 --format json"
    )]
    AttachedSessionClaim(AttachedSessionClaimArgs),
    /// Complete a claimed turn with the response in a JSON file.
    ///
    /// The file must hold a JSON object with a non-empty string "message"
    /// (other fields are kept as given); it is checked before anything is
    /// sent. Retrying with the same completion id is safe: the broker answers
    /// the same receipt, and the command says it was a replay.
    #[command(
        after_help = "Example:\n  echo '{\"message\": \"The fixture is stale.\"}' > response.json\n  loopx worker-bridge attached-session-complete --session-id ses_01JD... \\\n      --turn-id turn_01JD... --host-surface codex-cli \\\n      --host-session-id \"$CODEX_SESSION_ID\" --claim-id claim-42 \\\n      --completion-id done-turn_01JD... --response-json response.json"
    )]
    AttachedSessionComplete(AttachedSessionCompleteArgs),
    /// Give a claimed turn back to the head of the queue (same seq), for a
    /// host that cannot answer it.
    ///
    /// The claim id is spent afterwards; claim again with a new one.
    #[command(
        after_help = "Example:\n  loopx worker-bridge attached-session-release --session-id ses_01JD... \\\n      --host-surface codex-cli --host-session-id \"$CODEX_SESSION_ID\" --claim-id claim-42"
    )]
    AttachedSessionRelease(AttachedSessionReleaseArgs),
    /// Close a session: its queued turns are cancelled.
    ///
    /// A session with an active claim cannot be closed: complete or release
    /// the claimed turn first. Closing a closed session is harmless.
    #[command(
        after_help = "Example:\n  loopx worker-bridge attached-session-close --session-id ses_01JD..."
    )]
    AttachedSessionClose(AttachedSessionCloseArgs),
    /// List sessions (content-free projections), oldest first.
    #[command(
        after_help = "Example:\n  loopx worker-bridge attached-session-list --state open --goal-id g-1"
    )]
    AttachedSessionList(AttachedSessionListArgs),
}

/// The exact host identity of a binding: the host's writeback authority.
#[derive(Debug, Clone, Args)]
pub struct HostIdentity {
    /// Which kind of host runs the agent session (e.g. codex-cli, claude-code, vscode).
    #[arg(long)]
    pub host_surface: String,
    /// The running host session's opaque id (stays in the local store).
    #[arg(long)]
    pub host_session_id: String,
}

#[derive(Debug, Clone, Args)]
pub struct BindAgentThreadArgs {
    /// The goal the agent works on.
    #[arg(long)]
    pub goal_id: String,
    /// The registered LoopX agent.
    #[arg(long)]
    pub agent_id: String,
    #[command(flatten)]
    pub host: HostIdentity,
    #[command(flatten)]
    pub options: ClientOptions,
}

#[derive(Debug, Clone, Args)]
pub struct AttachedSessionBindArgs {
    /// The goal the agent works on.
    #[arg(long)]
    pub goal_id: String,
    /// The registered LoopX agent.
    #[arg(long)]
    pub agent_id: String,
    #[command(flatten)]
    pub host: HostIdentity,
    /// The label of the executor that runs the agent (must differ from --agent-id).
    #[arg(long)]
    pub executor_endpoint_id: String,
    /// Bind for real; without it this is a dry run that writes nothing.
    #[arg(long)]
    pub execute: bool,
    #[command(flatten)]
    pub options: ClientOptions,
}

#[derive(Debug, Clone, Args)]
pub struct AttachedSessionClaimArgs {
    /// The LoopX Chat session (ses_…).
    #[arg(long)]
    pub session_id: String,
    #[command(flatten)]
    pub host: HostIdentity,
    /// A host-chosen id for this claim; repeating it answers the same turn.
    #[arg(long)]
    pub claim_id: String,
    /// Wait up to this many seconds for a turn (capped at 1800 by the broker).
    #[arg(long, default_value_t = 0)]
    pub wait_seconds: u64,
    #[command(flatten)]
    pub options: ClientOptions,
}

#[derive(Debug, Clone, Args)]
pub struct AttachedSessionCompleteArgs {
    /// The LoopX Chat session (ses_…).
    #[arg(long)]
    pub session_id: String,
    /// The claimed turn (turn_…).
    #[arg(long)]
    pub turn_id: String,
    #[command(flatten)]
    pub host: HostIdentity,
    /// The claim that holds the turn.
    #[arg(long)]
    pub claim_id: String,
    /// A host-chosen id for this completion; keep it stable across retries.
    #[arg(long)]
    pub completion_id: String,
    /// An owner-local JSON file: an object with at least a non-empty string "message".
    #[arg(long, value_name = "FILE")]
    pub response_json: PathBuf,
    #[command(flatten)]
    pub options: ClientOptions,
}

#[derive(Debug, Clone, Args)]
pub struct AttachedSessionReleaseArgs {
    /// The LoopX Chat session (ses_…).
    #[arg(long)]
    pub session_id: String,
    #[command(flatten)]
    pub host: HostIdentity,
    /// The claim to release.
    #[arg(long)]
    pub claim_id: String,
    #[command(flatten)]
    pub options: ClientOptions,
}

#[derive(Debug, Clone, Args)]
pub struct AttachedSessionCloseArgs {
    /// The LoopX Chat session (ses_…).
    #[arg(long)]
    pub session_id: String,
    #[command(flatten)]
    pub options: ClientOptions,
}

/// A session state to filter on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StateFilter {
    Open,
    Closed,
}

#[derive(Debug, Clone, Args)]
pub struct AttachedSessionListArgs {
    /// Only sessions in this state.
    #[arg(long, value_enum)]
    pub state: Option<StateFilter>,
    /// Only sessions of this goal.
    #[arg(long)]
    pub goal_id: Option<String>,
    /// Only sessions of this agent.
    #[arg(long)]
    pub agent_id: Option<String>,
    /// Page size, 1 to 500 [broker default: 100].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=500))]
    pub limit: Option<u32>,
    /// The next_cursor of the previous page.
    #[arg(long)]
    pub cursor: Option<String>,
    #[command(flatten)]
    pub options: ClientOptions,
}

/// Runs one `loopx worker-bridge` command.
pub fn run_worker_bridge(args: WorkerBridgeArgs) -> ExitCode {
    use WorkerBridgeCommand::*;
    match args.command {
        BindAgentThread(a) => with_client(a.options.clone(), |c| bind_agent_thread(c, a)),
        AttachedSessionBind(a) => with_client(a.options.clone(), |c| bind(c, a)),
        AttachedSessionClaim(a) => with_client(a.options.clone(), |c| claim(c, a)),
        AttachedSessionComplete(a) => {
            // The response file is local input: check it before finding the
            // token or sending anything.
            match read_response(&a.response_json) {
                Ok(response) => with_client(a.options.clone(), |c| complete(c, a, response)),
                Err(message) => local_error(&message),
            }
        }
        AttachedSessionRelease(a) => with_client(a.options.clone(), |c| release(c, a)),
        AttachedSessionClose(a) => with_client(a.options.clone(), |c| close(c, a)),
        AttachedSessionList(a) => with_client(a.options.clone(), |c| list(c, a)),
    }
}

async fn bind_agent_thread(ctx: Ctx, a: BindAgentThreadArgs) -> Result<(), ClientError> {
    let thread = RegisterAgentThread {
        goal_id: a.goal_id,
        agent_id: a.agent_id,
        host_surface: a.host.host_surface,
        host_session_id: a.host.host_session_id,
    };
    let answer = ctx.client.register(&thread).await?;
    let r = &answer.body;
    let what = if answer.reply.status == StatusCode::CREATED {
        "registered agent thread"
    } else {
        "agent thread already registered"
    };
    ctx.print(&answer.reply, || {
        format!(
            "{what}: goal {}, agent {}, host surface {}",
            r.goal_id, r.agent_id, r.host_surface
        )
    });
    Ok(())
}

async fn bind(ctx: Ctx, a: AttachedSessionBindArgs) -> Result<(), ClientError> {
    let request = BindRequest {
        goal_id: a.goal_id,
        agent_id: a.agent_id,
        host_surface: a.host.host_surface,
        host_session_id: a.host.host_session_id,
        executor_endpoint_id: a.executor_endpoint_id,
        dry_run: !a.execute,
    };
    if !a.execute {
        let answer = ctx.client.preview_bind(&request).await?;
        let preview = &answer.body;
        let described = format!(
            "goal {}, agent {}, executor {}, host surface {}",
            preview.session.goal_id,
            preview.session.agent_id,
            preview.session.executor_endpoint_id,
            preview.session.host_surface
        );
        ctx.print(&answer.reply, || {
            let would = match (&preview.session.session_id, preview.would_create) {
                (Some(id), false) => format!("would reuse open session {id} ({described})"),
                _ => format!("would create a new session ({described})"),
            };
            format!("{would}\ndry run: nothing was written; add --execute to bind")
        });
        return Ok(());
    }
    let answer = ctx.client.bind(&request).await?;
    let s = &answer.body;
    let what = if answer.reply.status == StatusCode::CREATED {
        "created new session"
    } else {
        "reused open session"
    };
    ctx.print(&answer.reply, || {
        format!("{what} {} ({})", s.session_id, binding(s))
    });
    Ok(())
}

async fn claim(ctx: Ctx, a: AttachedSessionClaimArgs) -> Result<(), ClientError> {
    if a.wait_seconds > 0 && ctx.format == Format::Text && std::io::stderr().is_terminal() {
        eprintln!(
            "waiting up to {} s for a turn on {}…",
            a.wait_seconds.min(1800),
            a.session_id
        );
    }
    let request = ClaimRequest {
        host_surface: a.host.host_surface,
        host_session_id: a.host.host_session_id,
        claim_id: a.claim_id,
        wait_seconds: a.wait_seconds,
    };
    let answer = ctx.client.claim(&a.session_id, &request).await?;
    ctx.print(&answer.reply, || match &answer.body {
        ClaimAnswer::Claimed(c) => {
            let t = &c.turn;
            let head = if answer.reply.replayed {
                format!(
                    "replayed claim {}: turn {} (seq {}, attempt {}, now {}) from {}",
                    c.claim_id,
                    t.turn_id,
                    t.seq,
                    t.attempt,
                    wire(&c.turn_state),
                    wire(&t.origin)
                )
            } else {
                format!(
                    "claimed turn {} (seq {}, attempt {}) from {}",
                    t.turn_id,
                    t.seq,
                    t.attempt,
                    wire(&t.origin)
                )
            };
            format!("{head}:\n{}", t.text)
        }
        ClaimAnswer::NotClaimed(n) => format!(
            "no turn queued after {:.1} s (claimed=false)",
            n.waited_ms as f64 / 1000.0
        ),
    });
    Ok(())
}

async fn complete(
    ctx: Ctx,
    a: AttachedSessionCompleteArgs,
    response: Map<String, Value>,
) -> Result<(), ClientError> {
    let request = CompleteRequest {
        host_surface: a.host.host_surface,
        host_session_id: a.host.host_session_id,
        claim_id: a.claim_id,
        completion_id: a.completion_id,
        response,
    };
    let answer = ctx
        .client
        .complete(&a.session_id, &a.turn_id, &request)
        .await?;
    let r = &answer.body;
    ctx.print(&answer.reply, || {
        if r.replayed || answer.reply.replayed {
            format!(
                "completed turn {} (replay: completion {} was already recorded at {}; nothing changed)",
                r.turn_id, r.completion_id, r.completed_at
            )
        } else {
            format!(
                "completed turn {} (completion {} at {})",
                r.turn_id, r.completion_id, r.completed_at
            )
        }
    });
    Ok(())
}

async fn release(ctx: Ctx, a: AttachedSessionReleaseArgs) -> Result<(), ClientError> {
    let host = ReleaseRequest {
        host_surface: a.host.host_surface,
        host_session_id: a.host.host_session_id,
    };
    let answer = ctx
        .client
        .release(&a.session_id, &a.claim_id, &host)
        .await?;
    ctx.print(&answer.reply, || {
        format!(
            "released turn {}: it is back at the head of the queue; claim {} is spent",
            answer.body.turn_id, a.claim_id
        )
    });
    Ok(())
}

async fn close(ctx: Ctx, a: AttachedSessionCloseArgs) -> Result<(), ClientError> {
    let answer = ctx.client.close(&a.session_id).await?;
    let s = &answer.body;
    ctx.print(&answer.reply, || {
        format!(
            "closed session {} at {}; its queued turns, if any, are cancelled",
            s.session_id,
            s.closed_at.as_deref().unwrap_or("?")
        )
    });
    Ok(())
}

async fn list(ctx: Ctx, a: AttachedSessionListArgs) -> Result<(), ClientError> {
    let filter = ListSessions {
        state: a.state.map(|s| match s {
            StateFilter::Open => SessionState::Open,
            StateFilter::Closed => SessionState::Closed,
        }),
        goal_id: a.goal_id,
        agent_id: a.agent_id,
        limit: a.limit,
        cursor: a.cursor,
    };
    let answer = ctx.client.sessions(&filter).await?;
    ctx.print(&answer.reply, || {
        let page = &answer.body;
        let mut text = if page.sessions.is_empty() {
            "no sessions".to_owned()
        } else {
            session_table(&page.sessions)
        };
        if let Some(cursor) = &page.next_cursor {
            text.push_str(&format!("\nmore: --cursor {cursor}"));
        }
        text
    });
    Ok(())
}

fn session_table(sessions: &[Session]) -> String {
    let header = [
        "SESSION", "STATE", "GOAL", "AGENT", "EXECUTOR", "SURFACE", "CREATED",
    ]
    .map(str::to_owned);
    let rows: Vec<[String; 7]> = sessions
        .iter()
        .map(|s| {
            [
                s.session_id.clone(),
                wire(&s.state),
                s.goal_id.clone(),
                s.agent_id.clone(),
                s.executor_endpoint_id.clone(),
                s.host_surface.clone(),
                s.created_at.clone(),
            ]
        })
        .collect();
    let mut widths = header.clone().map(|h| h.chars().count());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    std::iter::once(&header)
        .chain(&rows)
        .map(|row| {
            let cells: Vec<String> = row
                .iter()
                .zip(widths)
                .map(|(cell, width)| format!("{cell:width$}"))
                .collect();
            cells.join("  ").trim_end().to_owned()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

// ---------------------------------------------------------------------------
// chat
// ---------------------------------------------------------------------------

/// The people side: queue a message for a session and read a turn back.
#[derive(Debug, Args)]
pub struct ChatArgs {
    #[command(subcommand)]
    pub command: ChatCommand,
}

#[derive(Debug, Subcommand)]
pub enum ChatCommand {
    /// Queue a message for the agent behind a session.
    ///
    /// Web and connector messages share the session's one ordered queue. With
    /// --client-message-id the send is idempotent for the life of the
    /// session: repeating it answers the same turn.
    #[command(
        after_help = "Example:\n  loopx chat send --session-id ses_01JD... --text \"Please summarise the failing test.\""
    )]
    Send(ChatSendArgs),
    /// Show one turn: its message, its state and, once completed, the response.
    #[command(
        after_help = "Example:\n  loopx chat show --session-id ses_01JD... --turn-id turn_01JD..."
    )]
    Show(ChatShowArgs),
}

/// Where a message comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OriginArg {
    Web,
    Lark,
}

#[derive(Debug, Clone, Args)]
pub struct ChatSendArgs {
    /// The LoopX Chat session (ses_…).
    #[arg(long)]
    pub session_id: String,
    /// The message, 1 byte to 64 KiB.
    #[arg(long)]
    pub text: String,
    /// Where the message comes from.
    #[arg(long, value_enum, default_value_t = OriginArg::Web)]
    pub origin: OriginArg,
    /// Makes the send idempotent: the same id answers the same turn.
    #[arg(long)]
    pub client_message_id: Option<String>,
    #[command(flatten)]
    pub options: ClientOptions,
}

#[derive(Debug, Clone, Args)]
pub struct ChatShowArgs {
    /// The LoopX Chat session (ses_…).
    #[arg(long)]
    pub session_id: String,
    /// The turn (turn_…).
    #[arg(long)]
    pub turn_id: String,
    #[command(flatten)]
    pub options: ClientOptions,
}

/// Runs one `loopx chat` command.
pub fn run_chat(args: ChatArgs) -> ExitCode {
    match args.command {
        ChatCommand::Send(a) => with_client(a.options.clone(), |c| send(c, a)),
        ChatCommand::Show(a) => with_client(a.options.clone(), |c| show(c, a)),
    }
}

async fn send(ctx: Ctx, a: ChatSendArgs) -> Result<(), ClientError> {
    let message = EnqueueRequest {
        origin: match a.origin {
            OriginArg::Web => Origin::Web,
            OriginArg::Lark => Origin::Lark,
        },
        text: a.text,
        client_message_id: a.client_message_id,
        ingress: Default::default(),
        lark: None,
    };
    let answer = ctx.client.enqueue(&a.session_id, &message).await?;
    let e = &answer.body;
    ctx.print(&answer.reply, || {
        if e.duplicate {
            format!(
                "already queued as turn {} (seq {}, now {}): the client message id was sent before",
                e.turn_id,
                e.seq,
                wire(&e.state)
            )
        } else {
            format!(
                "queued turn {} (seq {}) in session {}",
                e.turn_id, e.seq, a.session_id
            )
        }
    });
    Ok(())
}

async fn show(ctx: Ctx, a: ChatShowArgs) -> Result<(), ClientError> {
    let answer = ctx.client.turn(&a.session_id, &a.turn_id).await?;
    ctx.print(&answer.reply, || turn_text(&answer.body));
    Ok(())
}

fn turn_text(t: &Turn) -> String {
    let mut lines = vec![format!(
        "turn {} (seq {}) from {}: {}",
        t.turn_id,
        t.seq,
        wire(&t.origin),
        wire(&t.state)
    )];
    let mut times = vec![format!("enqueued {}", t.enqueued_at)];
    if let Some(at) = &t.claimed_at {
        times.push(format!("claimed {at}"));
    }
    if let Some(at) = &t.completed_at {
        times.push(format!("completed {at}"));
    }
    if let Some(reason) = &t.cancel_reason {
        times.push(format!("cancelled: {}", wire(reason)));
    }
    lines.push(times.join(", "));
    lines.push(format!("message:\n{}", t.text));
    if let Some(reply) = &t.reply {
        let error = reply
            .error
            .as_deref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        lines.push(format!(
            "reply to {}: {} after {} attempt(s){error}",
            reply.channel,
            wire(&reply.state),
            reply.attempts
        ));
    }
    if let Some(response) = &t.response {
        let message = response.get("message").and_then(Value::as_str);
        lines.push(format!("response:\n{}", message.unwrap_or("(no message)")));
        let others = response.as_object().map_or(0, |o| o.len()) - usize::from(message.is_some());
        if others > 0 {
            lines.push(format!(
                "(+{others} more response field(s); --format json shows them)"
            ));
        }
    }
    lines.join("\n")
}

// ---------------------------------------------------------------------------
// loopx lark
// ---------------------------------------------------------------------------

/// The Lark connector: which Lark chat feeds which session.
#[derive(Debug, Args)]
pub struct LarkArgs {
    #[command(subcommand)]
    pub command: LarkCommand,
}

#[derive(Debug, Subcommand)]
pub enum LarkCommand {
    /// Link a Lark chat to an open session: its messages join the session's queue.
    #[command(
        after_help = "Example:\n  loopx lark link --session-id ses_01JD... --chat-id oc_5ce6d572455d361153b7xx51da133945"
    )]
    Link(LarkLinkArgs),
    /// Unlink the session's Lark chat: its messages are no longer enqueued.
    #[command(after_help = "Example:\n  loopx lark unlink --session-id ses_01JD...")]
    Unlink(LarkSessionArgs),
    /// Show which Lark chat feeds a session.
    #[command(after_help = "Example:\n  loopx lark status --session-id ses_01JD...")]
    Status(LarkSessionArgs),
}

#[derive(Debug, Clone, Args)]
pub struct LarkLinkArgs {
    /// The LoopX Chat session (ses_…).
    #[arg(long)]
    pub session_id: String,
    /// The Lark chat (oc_…), as in the event's `message.chat_id`.
    #[arg(long)]
    pub chat_id: String,
    #[command(flatten)]
    pub options: ClientOptions,
}

#[derive(Debug, Clone, Args)]
pub struct LarkSessionArgs {
    /// The LoopX Chat session (ses_…).
    #[arg(long)]
    pub session_id: String,
    #[command(flatten)]
    pub options: ClientOptions,
}

/// Runs one `loopx lark` command.
pub fn run_lark(args: LarkArgs) -> ExitCode {
    match args.command {
        LarkCommand::Link(a) => with_client(a.options.clone(), |ctx| async move {
            let answer = ctx.client.lark_link(&a.session_id, &a.chat_id).await?;
            ctx.print(&answer.reply, || link_text(&answer.body));
            Ok(())
        }),
        LarkCommand::Unlink(a) => with_client(a.options.clone(), |ctx| async move {
            let answer = ctx.client.lark_unlink(&a.session_id).await?;
            ctx.print(&answer.reply, || link_text(&answer.body));
            Ok(())
        }),
        LarkCommand::Status(a) => with_client(a.options.clone(), |ctx| async move {
            let answer = ctx.client.lark_link_status(&a.session_id).await?;
            ctx.print(&answer.reply, || link_text(&answer.body));
            Ok(())
        }),
    }
}

fn link_text(link: &crate::model::LarkLink) -> String {
    match &link.chat_id {
        Some(chat_id) => format!("session {} is fed by Lark chat {chat_id}", link.session_id),
        None => format!("session {} has no Lark chat linked", link.session_id),
    }
}

// ---------------------------------------------------------------------------
// Running a command: token, runtime, output and exit codes
// ---------------------------------------------------------------------------

/// What a running command has: the client and how to print.
struct Ctx {
    client: Client,
    format: Format,
}

impl Ctx {
    /// Prints an answer: the raw body in json format, `text()` otherwise.
    fn print(&self, reply: &Reply, text: impl FnOnce() -> String) {
        match self.format {
            Format::Json => stdout_line(&reply.text),
            Format::Text => stdout_line(&text()),
        }
    }
}

// ---------------------------------------------------------------------------
// health
// ---------------------------------------------------------------------------

/// Asks a broker whether its store answers (`GET /healthz`, no token needed):
/// the container image's `HEALTHCHECK`, and a quick check for people.
#[derive(Debug, Args)]
pub struct HealthArgs {
    /// The broker's base URL.
    #[arg(long, env = "LOOPX_BROKER_URL", default_value = DEFAULT_BROKER_URL, value_parser = parse_broker_url)]
    pub broker_url: String,
}

/// Exit 0 when the broker answers healthy, 1 when it answers otherwise
/// (`503 store_unavailable`), 3 when nothing answers.
pub fn run_health(args: HealthArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return local_error(&format!("cannot start the runtime: {e}")),
    };
    let client = Client::new(&args.broker_url, None);
    match runtime.block_on(client.healthz()) {
        Ok(_) => {
            stdout_line(&format!("ok: the broker at {} is healthy", args.broker_url));
            ExitCode::SUCCESS
        }
        Err(error) => client_error(error, Format::Text, None),
    }
}

/// Finds the token, runs `command` on a current-thread runtime and turns its
/// outcome into the exit code.
fn with_client<F, Fut>(options: ClientOptions, command: F) -> ExitCode
where
    F: FnOnce(Ctx) -> Fut,
    Fut: Future<Output = Result<(), ClientError>>,
{
    let data_dir = options
        .data_dir
        .clone()
        .unwrap_or_else(config::default_data_dir);
    let (token, source) = match config::owner_token(options.token_file.as_deref(), &data_dir, false)
    {
        Ok(found) => found,
        Err(reason) => {
            return local_error(&format!(
                "no owner token: LOOPX_TOKEN is not set and {reason}; set LOOPX_TOKEN, pass --token-file FILE, or point --data-dir at the broker's data dir (where `loopx serve` keeps owner.token)"
            ));
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return local_error(&format!("cannot start the runtime: {e}")),
    };
    let ctx = Ctx {
        client: Client::new(&options.broker_url, Some(token)),
        format: options.format,
    };
    match runtime.block_on(command(ctx)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => client_error(error, options.format, Some(&source)),
    }
}

/// Reports a failed call: the refusal's code on stderr (and, in json format,
/// the broker's error body on stdout for scripts).
/// `source` says where the owner token came from, for commands that sent one.
fn client_error(error: ClientError, format: Format, source: Option<&TokenSource>) -> ExitCode {
    match error {
        ClientError::Unreachable { url, reason } => {
            eprintln!("loopx: the broker at {url} is unreachable: {reason}");
            eprintln!("loopx: is `loopx serve` running there? (--broker-url / LOOPX_BROKER_URL)");
            ExitCode::from(EXIT_UNREACHABLE)
        }
        ClientError::Refused { reply, error } => {
            if format == Format::Json {
                stdout_line(&reply.text);
            }
            let detail = &error.error;
            let code = detail.code_str();
            eprintln!("loopx: {code}: {}", detail.message);
            if let (Some(claim_id), Some(at)) = (&detail.active_claim_id, &detail.claimed_at) {
                eprintln!("loopx: the active claim is {claim_id}, claimed at {at}");
            }
            if code == "unauthorized"
                && let Some(source) = source
            {
                eprintln!(
                    "loopx: the owner token came from {source}; it must be the broker's owner token"
                );
            }
            ExitCode::from(EXIT_REFUSED)
        }
        ClientError::Unexpected { reply, reason } => {
            eprintln!(
                "loopx: unexpected answer ({}) from the broker: {reason}; is --broker-url a LoopX broker?",
                reply.status
            );
            ExitCode::from(EXIT_REFUSED)
        }
    }
}

fn local_error(message: &str) -> ExitCode {
    eprintln!("loopx: {message}");
    ExitCode::from(EXIT_LOCAL)
}

/// The response file of a completion: an object with a non-empty string
/// `message`, as the broker will demand, checked before anything is sent.
fn read_response(path: &Path) -> Result<Map<String, Value>, String> {
    let shown = path.display();
    let bytes =
        std::fs::read(path).map_err(|e| format!("cannot read the response file {shown}: {e}"))?;
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("the response file {shown} is not valid JSON: {e}"))?;
    let Value::Object(response) = value else {
        return Err(format!(
            "the response file {shown} must hold a JSON object with a non-empty string \"message\", not {}",
            kind(&value)
        ));
    };
    match response.get("message") {
        Some(Value::String(m)) if !m.is_empty() => Ok(response),
        Some(Value::String(_)) => Err(format!(
            "the response file {shown} has an empty \"message\"; it must be a non-empty string"
        )),
        Some(other) => Err(format!(
            "the response file {shown} has a \"message\" that is {}, not a non-empty string",
            kind(other)
        )),
        None => Err(format!(
            "the response file {shown} has no \"message\" field; it must be a non-empty string"
        )),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A value's wire spelling (`web`, `claimed`, …).
fn wire(value: &impl Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

/// One line on stdout; a closed pipe (`| head`) is not worth a panic.
fn stdout_line(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    if !text.ends_with('\n') {
        let _ = out.write_all(b"\n");
    }
    let _ = out.flush();
}

fn binding(s: &Session) -> String {
    format!(
        "goal {}, agent {}, executor {}, host surface {}",
        s.goal_id, s.agent_id, s.executor_endpoint_id, s.host_surface
    )
}
