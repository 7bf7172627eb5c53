//! `loopx hook`: Claude Code and Codex attached through their hooks
//! (as the hooks contract says). The agent runs `loopx hook <event>` at
//! fixed points of its session with a JSON document on stdin; the host
//! session is that document's `session_id`, so `loopx mcp` and `loopx hook`
//! in one Claude Code session are one host. `stop` answers the turn it
//! delivered and delivers the next one, `permission-request` asks the Web
//! page and Lark, the rest report presence.
//!
//! It never fails the agent: bad stdin, a broker down, any refusal ends with
//! exit 0, nothing on stdout and one line on stderr. stdout carries nothing
//! but the contract's JSON (Codex discards outputs with keys it does not
//! know). No message text, preview or host id is ever written to stderr.

use std::io::Read;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand, ValueEnum};
use serde_json::Value;

use super::common::Connection;
use super::mcp::host::{Host, Problem, Target};
use crate::client::Client;
use crate::model::{
    AgentNotification, AgentState, BindRequest, NotificationKind, ReportAgentState,
};

mod approval;
mod changes;
mod codex_trust;
mod doctor;
mod failures;
mod install;
mod turns;
pub mod worktree;

/// Each broker request's timeout (a parked wait gets its wait on top).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// `session-end` finishes within this, reading stdin included (Codex gives
/// it 1 s, Claude Code 1.5 s).
const SESSION_END_BUDGET: Duration = Duration::from_millis(900);
/// The longest any other event waits for its stdin to end (the agents write
/// it at once and close it; one that never closes must not hold the agent).
const STDIN_BUDGET: Duration = REQUEST_TIMEOUT;
/// The most stdin a hook reads.
const MAX_STDIN: u64 = 16 * 1024 * 1024;

/// `loopx hook`'s subcommands: one per hook event, and `install`.
#[derive(Debug, Args)]
pub struct HookArgs {
    #[command(subcommand)]
    pub command: HookCommand,
}

#[derive(Debug, Subcommand)]
pub enum HookCommand {
    /// SessionStart: the agent is there (presence `waiting`).
    SessionStart(HookOptions),
    /// UserPromptSubmit: the agent works on a prompt (presence `working`).
    UserPromptSubmit(HookOptions),
    /// PreToolUse: the tool the agent runs now, by name only.
    PreToolUse(HookOptions),
    /// PostToolUse: the tool ended.
    PostToolUse(HookOptions),
    /// Stop: answers the turn the last stop delivered with the agent's last
    /// message, then delivers the oldest queued message by blocking.
    Stop(HookOptions),
    /// PermissionRequest: the approval asked on the Web page and in Lark;
    /// the verdict printed, or nothing (the agent asks at its terminal).
    PermissionRequest(HookOptions),
    /// Notification (Claude Code): an idle or permission prompt becomes a
    /// session event; an idle prompt keeps the agent `waiting`.
    Notification(HookOptions),
    /// SessionEnd: hands back an unanswered delivered turn; presence `away`.
    SessionEnd(HookOptions),
    /// Writes the hook entries into Claude Code's or Codex's settings.
    Install(install::InstallArgs),
    /// Checks the installed hooks (binary, broker, token, session) and shows
    /// their refusals since the last hook that worked; exit 1 on a problem.
    Doctor(doctor::DoctorArgs),
    /// The tmux waker the hooks start in a tmux pane (not run by hand).
    #[command(hide = true)]
    TmuxWaker(crate::cli::wake::tmux::WakerArgs),
}

/// Which agent runs the hook: its input shape and its default host surface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Agent {
    ClaudeCode,
    Codex,
}

impl Agent {
    /// The `--agent` value.
    pub fn flag(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "claude-code",
            Agent::Codex => "codex",
        }
    }

    pub fn host_surface(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "claude-code",
            Agent::Codex => "codex-cli",
        }
    }
}

/// Where the hook attaches: a session, or the bind flags (register and bind
/// the first time, reusing the open session).
#[derive(Debug, Clone, Args)]
pub struct Binding {
    /// The LoopX Chat session to attach to (ses_…); or the bind flags.
    #[arg(long, env = "LOOPX_SESSION_ID")]
    pub session_id: Option<String>,
    /// Bind: the goal the agent works on.
    #[arg(long, requires_all = ["agent_id", "executor_endpoint_id"], conflicts_with = "session_id")]
    pub goal_id: Option<String>,
    /// Bind: the registered LoopX agent.
    #[arg(long, requires = "goal_id")]
    pub agent_id: Option<String>,
    /// Bind: the label of the executor that runs the agent.
    #[arg(long, requires = "goal_id")]
    pub executor_endpoint_id: Option<String>,
    /// The host surface [default: claude-code, or codex-cli for Codex].
    #[arg(long)]
    pub host_surface: Option<String>,
    /// stop: seconds to wait parked for a message when none is queued (at
    /// most 1800, default 0); permission-request: for the answer (default 120).
    #[arg(long)]
    pub wait_seconds: Option<u64>,
}

/// The flags of every hook event.
#[derive(Debug, Clone, Args)]
pub struct HookOptions {
    /// The agent running the hook.
    #[arg(long, value_enum)]
    pub agent: Agent,
    #[command(flatten)]
    pub binding: Binding,
    #[command(flatten)]
    pub connection: Connection,
}

/// One hook run: the agent, its stdin, the host bridge to the broker.
pub struct Hook {
    pub agent: Agent,
    pub connection: Connection,
    pub input: Value,
    pub host: Host,
    pub client: Client,
    pub host_surface: String,
    pub host_session_id: String,
    pub wait_seconds: Option<u64>,
    /// Where its agent sits, read once ([`Hook::seat`]).
    seat: std::sync::OnceLock<crate::cli::wake::Seat>,
}

/// Why a hook did nothing, in one line (never a message text or a host id).
pub type Failure = String;

impl From<Problem> for Failure {
    fn from(problem: Problem) -> Self {
        problem.log_line()
    }
}

/// Runs `loopx hook …`.
pub fn run(args: HookArgs) -> ExitCode {
    let (event, options) = match args.command {
        HookCommand::Install(args) => return install::run(args),
        HookCommand::Doctor(args) => return doctor::run(args),
        HookCommand::TmuxWaker(args) => return crate::cli::wake::tmux::run_waker(args),
        HookCommand::SessionStart(o) => ("session-start", o),
        HookCommand::UserPromptSubmit(o) => ("user-prompt-submit", o),
        HookCommand::PreToolUse(o) => ("pre-tool-use", o),
        HookCommand::PostToolUse(o) => ("post-tool-use", o),
        HookCommand::Stop(o) => ("stop", o),
        HookCommand::PermissionRequest(o) => ("permission-request", o),
        HookCommand::Notification(o) => ("notification", o),
        HookCommand::SessionEnd(o) => ("session-end", o),
    };
    let agent = options.agent.flag();
    let data_dir = options.connection.data_dir();
    let started = Instant::now();
    let stdin_budget = match event {
        "session-end" => SESSION_END_BUDGET,
        _ => STDIN_BUDGET,
    };
    let input = read_stdin(event, stdin_budget);
    let cwd = input.as_ref().ok().and_then(|input| input.get("cwd"));
    let project = failures::project_of(cwd.and_then(Value::as_str));
    match input.and_then(|input| run_event(event, options, input, started)) {
        Ok(Done { output, unwoken }) => {
            failures::clear(&data_dir, &project);
            // Kept for `doctor`: under Codex's shared app-server no idle
            // Codex is ever typed into, though every hook works.
            if let Some(why) = unwoken.filter(|why| why.starts_with(UNDER_APP_SERVER)) {
                failures::record(&data_dir, &project, agent, event, &why);
            }
            if let Some(output) = output {
                println!("{output}");
            }
        }
        Err(why) => {
            eprintln!("loopx hook {event}: {why}");
            failures::record(&data_dir, &project, agent, event, &why);
        }
    }
    ExitCode::SUCCESS
}

/// What an event that did its work leaves.
struct Done {
    /// The JSON for stdout, if any.
    output: Option<String>,
    /// Why the idle agent cannot be typed into, when it cannot.
    unwoken: Option<Failure>,
}

/// How `wake`'s refusal under Codex's shared app-server begins (`doctor`
/// knows it by that).
pub const UNDER_APP_SERVER: &str = "Codex runs this hook in its shared app-server";

/// Runs the event on the agent's document.
fn run_event(
    event: &str,
    options: HookOptions,
    input: Value,
    started: Instant,
) -> Result<Done, Failure> {
    let hook = Hook::new(options, input)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(async {
        // What the agent changed is reported before its turn is answered,
        // so that the turn's files are that turn's: an extra, never a failure.
        let changed = match event {
            "stop" => changes::at_stop(&hook).await,
            "user-prompt-submit" => changes::new_turn(&hook),
            _ => Ok(()),
        };
        if let Err(why) = changed {
            eprintln!("loopx hook {event}: {why}");
        }
        let output = match event {
            "stop" => turns::stop(&hook).await,
            "session-end" => {
                let left = SESSION_END_BUDGET.saturating_sub(started.elapsed());
                tokio::time::timeout(left, turns::session_end(&hook))
                    .await
                    .unwrap_or_else(|_| Err("the broker did not answer within 1 s".into()))
            }
            "permission-request" => approval::permission_request(&hook).await,
            "session-start" => hook.report(AgentState::Waiting).await.map(|_| None),
            "user-prompt-submit" => turns::prompt_submitted(&hook).await,
            "pre-tool-use" => {
                let tool = hook.field("tool_name").unwrap_or_default().to_owned();
                hook.report_tool(tool).await?;
                approval::question_before_use(&hook).await
            }
            "post-tool-use" => {
                hook.report_tool(String::new()).await?;
                if let Err(why) = changes::after_tool(&hook).await {
                    eprintln!("loopx hook {event}: {why}");
                }
                Ok(None)
            }
            _ => notification(&hook).await,
        }?;
        if matches!(
            event,
            "post-tool-use" | "stop" | "user-prompt-submit" | "session-end"
        ) && let Err(why) = approval::moved_on(&hook, event).await
        {
            eprintln!("loopx hook {event}: {why}");
        }
        let mut unwoken = None;
        if matches!(event, "session-start" | "user-prompt-submit" | "stop")
            && let Err(why) = hook.wake().await
        {
            // The event did its work: typing into the idle agent is extra.
            eprintln!("loopx hook {event}: {why}");
            unwoken = Some(why);
        }
        Ok(Done { output, unwoken })
    })
}

/// The agent's JSON document: an object with a non-empty `session_id`, of
/// the event this command handles, read to its end within `budget`. The
/// reader is a thread of its own, left blocked when the budget runs out (the
/// process exits after the event anyway).
fn read_stdin(event: &str, budget: Duration) -> Result<Value, Failure> {
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let read = std::io::stdin()
            .take(MAX_STDIN)
            .read_to_string(&mut text)
            .map(|_| text);
        let _ = sender.send(read);
    });
    let text = match receiver.recv_timeout(budget) {
        Ok(read) => read.map_err(|e| format!("cannot read stdin: {e}"))?,
        Err(_) => {
            return Err(format!(
                "stdin did not end within {} ms",
                budget.as_millis()
            ));
        }
    };
    let input: Value = serde_json::from_str(&text)
        .map_err(|_| "stdin is not the agent's JSON document".to_owned())?;
    let named = input.get("hook_event_name").and_then(Value::as_str);
    let expected: String = event.split('-').map(capitalized).collect();
    match named {
        Some(name) if name != expected => Err(format!("stdin is a {name} event, not {expected}")),
        _ if !input.is_object() => Err("stdin is not a JSON object".into()),
        _ => Ok(input),
    }
}

fn capitalized(word: &str) -> String {
    let mut chars = word.chars();
    chars.next().map_or_else(String::new, |first| {
        first.to_ascii_uppercase().to_string() + chars.as_str()
    })
}

impl Hook {
    fn new(options: HookOptions, input: Value) -> Result<Self, Failure> {
        let host_session_id = input
            .get("session_id")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty())
            .ok_or("stdin has no session_id")?
            .to_owned();
        let connection = options.connection;
        let (client, _) = connection.client()?;
        let client = client.with_timeout(REQUEST_TIMEOUT);
        let binding = options.binding;
        let seat = std::sync::OnceLock::new();
        let host_surface = binding
            .host_surface
            .unwrap_or_else(|| options.agent.host_surface().to_owned());
        let target = match (binding.session_id, binding.goal_id) {
            (Some(session_id), _) => Target::Session(session_id),
            (None, Some(goal_id)) => Target::Bind(BindRequest {
                goal_id,
                agent_id: binding.agent_id.unwrap_or_default(),
                host_surface: host_surface.clone(),
                host_session_id: host_session_id.clone(),
                executor_endpoint_id: binding.executor_endpoint_id.unwrap_or_default(),
                terminal: seat.get_or_init(crate::cli::wake::Seat::here).terminal(),
                dry_run: false,
            }),
            (None, None) => {
                return Err(
                    "no session: give --session-id (or LOOPX_SESSION_ID) or the bind \
                     flags --goal-id, --agent-id, --executor-endpoint-id"
                        .into(),
                );
            }
        };
        Ok(Hook {
            agent: options.agent,
            connection,
            host: Host::new(
                client.clone(),
                host_surface.clone(),
                host_session_id.clone(),
                target,
            ),
            input,
            client,
            host_surface,
            host_session_id,
            wait_seconds: binding.wait_seconds,
            seat,
        })
    }

    /// A string field of the agent's document.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.input.get(name).and_then(Value::as_str)
    }

    /// Where the idle agent can be typed into: under `loopx run`, tells it
    /// the session; in a tmux pane, makes sure a waker runs for it.
    pub async fn wake(&self) -> Result<(), Failure> {
        use crate::cli::wake::{HostIdentity, run, tmux};
        if self.seat().under_app_server {
            // Codex's shared server: the bridge joins it and delivers
            // without typing (CODEX.md); it needs the bind labels.
            return match self.host.target() {
                Target::Bind(bind) => crate::cli::codex::ensure(
                    &crate::cli::codex::default_socket(),
                    bind,
                    &self.connection,
                ),
                Target::Session(_) => Err(format!(
                    "{UNDER_APP_SERVER}, which cannot tell which terminal the agent is in: \
                     with --session-id nothing is delivered into an idle Codex; install the \
                     hooks with the bind flags (the Codex bridge then delivers into it), or \
                     run it with --no-daemon (`loopx run -- codex --no-daemon`)"
                )),
            };
        }
        let session_id = self.host.session_id().await?;
        let agent = self.seat().agent.clone();
        let transcript = self.field("transcript_path").filter(|p| !p.is_empty());
        if let Some(path) = transcript.filter(|_| self.seat().typed_in()) {
            let dir = crate::cli::wake::records_dir(&self.connection.data_dir());
            crate::cli::wake::transcript::tell(&dir, &session_id, path)
                .map_err(|e| format!("cannot leave the transcript's path for the waker: {e}"))?;
        }
        run::tell(&run::Told {
            session_id: session_id.clone(),
            host_surface: self.host_surface.clone(),
            host_session_id: self.host_session_id.clone(),
            agent: agent.clone(),
        })?;
        let host = HostIdentity {
            host_surface: self.host_surface.clone(),
            host_session_id: self.host_session_id.clone(),
        };
        tmux::ensure(&session_id, &host, agent.as_ref(), &self.connection)
    }

    /// Whether a Codex bridge delivers this agent's messages (its hooks run
    /// in Codex's shared server, which a bridge joined): then, as where a
    /// waker types, no hook hands a message over.
    pub fn bridged(&self) -> bool {
        self.seat().under_app_server
            && crate::cli::codex::runs(
                &self.connection.data_dir(),
                &crate::cli::codex::default_socket(),
            )
    }

    /// Where the agent running this hook sits (read off `/proc` once).
    pub fn seat(&self) -> &crate::cli::wake::Seat {
        self.seat.get_or_init(crate::cli::wake::Seat::here)
    }

    /// Reports the agent's presence.
    pub async fn report(&self, state: AgentState) -> Result<(), Failure> {
        self.send_report(self.report_of(state)).await
    }

    /// Reports the tool the agent runs (an empty name: none any more); the
    /// broker keeps the name only, and writes a change at most every 2 s.
    pub async fn report_tool(&self, tool: String) -> Result<(), Failure> {
        let report = ReportAgentState {
            tool: Some(tool),
            ..self.report_of(AgentState::Working)
        };
        self.send_report(report).await
    }

    /// A report of `state` and nothing else.
    pub fn report_of(&self, state: AgentState) -> ReportAgentState {
        ReportAgentState::of(&self.host_surface, &self.host_session_id, Some(state))
    }

    pub async fn send_report(&self, report: ReportAgentState) -> Result<(), Failure> {
        let session_id = self.host.session_id().await?;
        self.client
            .report_agent(&session_id, &report)
            .await
            .map_err(Problem::from)?;
        Ok(())
    }
}

/// Claude Code's `idle_prompt` and `permission_prompt`: the agent waits at
/// its terminal, a session event (an idle prompt also: presence `waiting`).
/// The notification's text is neither sent nor logged.
async fn notification(hook: &Hook) -> Result<Option<String>, Failure> {
    let kind = match hook.field("notification_type") {
        Some("idle_prompt") => NotificationKind::IdlePrompt,
        Some("permission_prompt") => NotificationKind::PermissionPrompt,
        _ => return Ok(None),
    };
    let session_id = hook.host.session_id().await?;
    let notice = AgentNotification {
        host_surface: hook.host_surface.clone(),
        host_session_id: hook.host_session_id.clone(),
        kind,
    };
    hook.client
        .notify(&session_id, &notice)
        .await
        .map_err(Problem::from)?;
    if kind == NotificationKind::IdlePrompt {
        hook.report(AgentState::Waiting).await?;
    }
    Ok(None)
}
