//! `loopx worker-bridge …`: the host-bridge commands (register, bind, claim,
//! complete, release, close, list), thin clients of a running broker.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use reqwest::StatusCode;
use serde_json::{Map, Value};

use super::common::{ClientOptions, Ctx, Format, local_error, with_client};
use crate::client::ClientError;
use crate::model::{
    AgentState, BindRequest, ClaimAnswer, ClaimRequest, CloseRequest, CompleteRequest,
    ListSessions, ListTurns, RegisterAgentThread, ReleaseRequest, Session, SessionState,
};
use crate::model::{Delivery, HostIdentity, wire};

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
    /// Save the claimed turn's files into DIR/<session>/<turn>/ (folders
    /// 0700, files 0600, safe names); the text output names each.
    #[arg(long, value_name = "DIR")]
    pub save_attachments: Option<std::path::PathBuf>,
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
    /// Release the active claim first (a turn delivered to an agent that
    /// will not answer): it is cancelled with the queued turns.
    #[arg(long)]
    pub release_active_claim: bool,
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
pub fn run(args: WorkerBridgeArgs) -> ExitCode {
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
        terminal: None,
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
    let saved = match (&answer.body, &a.save_attachments) {
        (ClaimAnswer::Claimed(c), Some(dir)) => {
            crate::cli::attachments::save(
                &ctx.client,
                dir,
                &c.session_id,
                &c.turn.turn_id,
                &c.turn.attachments,
            )
            .await
        }
        _ => Vec::new(),
    };
    if ctx.format != Format::Text {
        let lines = crate::cli::attachments::describe(&saved);
        if !lines.is_empty() {
            eprintln!("{lines}");
        }
    }
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
            format!(
                "{head}:\n{}",
                crate::cli::attachments::with_files(&t.text, &saved)
            )
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
    let host = ReleaseRequest::host(a.host.host_surface, a.host.host_session_id);
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
    let request = CloseRequest {
        release_active_claim: a.release_active_claim,
    };
    let answer = ctx.client.close_with(&a.session_id, &request).await?;
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
    let presence = match ctx.format {
        Format::Json => Vec::new(),
        Format::Text => presence_cells(&ctx, &answer.body.sessions).await?,
    };
    ctx.print(&answer.reply, || {
        let page = &answer.body;
        let mut text = if page.sessions.is_empty() {
            "no sessions".to_owned()
        } else {
            session_table(&page.sessions, &presence)
        };
        if let Some(cursor) = &page.next_cursor {
            text.push_str(&format!("\nmore: --cursor {cursor}"));
        }
        text
    });
    Ok(())
}

/// Each session's presence as the list shows it: the agent's state, and for
/// an open session whose agent is away and that never got a message, that
/// it is empty (a leftover, such as a health check's bind), so the live one
/// stands out.
async fn presence_cells(ctx: &Ctx, sessions: &[Session]) -> Result<Vec<String>, ClientError> {
    let first = ListTurns {
        limit: Some(1),
        ..ListTurns::default()
    };
    let mut cells = Vec::with_capacity(sessions.len());
    for s in sessions {
        let state = wire(&s.agent.state);
        let leftover = s.state == SessionState::Open && s.agent.state == AgentState::Away;
        let empty = leftover
            && ctx
                .client
                .turns(&s.session_id, &first)
                .await?
                .body
                .turns
                .is_empty();
        cells.push(match empty {
            true => format!("{state}, empty"),
            false => format!("{state} since {}", s.agent.since),
        });
    }
    Ok(cells)
}

fn session_table(sessions: &[Session], presence: &[String]) -> String {
    let header = [
        "SESSION",
        "STATE",
        "GOAL",
        "AGENT",
        "EXECUTOR",
        "SURFACE",
        "PRESENCE",
        "A MESSAGE",
        "CREATED",
    ]
    .map(str::to_owned);
    let rows: Vec<[String; 9]> = sessions
        .iter()
        .zip(presence)
        .map(|(s, presence)| {
            [
                s.session_id.clone(),
                wire(&s.state),
                s.goal_id.clone(),
                s.agent_id.clone(),
                s.executor_endpoint_id.clone(),
                s.host_surface.clone(),
                presence.clone(),
                match s.agent.delivery {
                    _ if s.state != SessionState::Open => "-".to_owned(),
                    Delivery::TypedNow => "typed in now".to_owned(),
                    Delivery::EndOfTurn => "at the turn's end".to_owned(),
                    Delivery::Later => "when it is back".to_owned(),
                },
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
        Some(Value::String(_)) => match crate::decide::turn::answer_text(response.get("message")) {
            Ok(_) => Ok(response),
            Err(_) => Err(format!(
                "the response file {shown} has an empty \"message\" (blank: only whitespace); it must be a non-empty string"
            )),
        },
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

fn binding(s: &Session) -> String {
    format!(
        "goal {}, agent {}, executor {}, host surface {}",
        s.goal_id, s.agent_id, s.executor_endpoint_id, s.host_surface
    )
}
