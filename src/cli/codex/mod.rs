//! `loopx codex bridge`: Codex through its own app-server (CODEX.md). Plain
//! `codex` runs its threads in one shared background server, which any
//! local client may join; the bridge joins it, binds one LoopX session per
//! loaded thread (host surface `codex-cli`, host session id = the thread id,
//! as the hooks bind it), and delivers the session's messages as the host:
//! into an idle thread with `turn/start` (the TUI shows the prompt and the
//! answer; nothing is typed into any terminal), after the running turn
//! otherwise, each answered with the turn's final agent message. An
//! interrupted turn settles its message as `interrupted`.
//!
//! The hooks start it (one per server: a lock in the data dir) where they
//! run inside that server; it ends when the server does.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::cli::common::Connection;
use crate::cli::wake::text;
use crate::client::{Client, ClientError};
use crate::model::{
    AgentState, BindRequest, ClaimAnswer, ClaimRequest, Claimed, CompleteRequest,
    RegisterAgentThread, ReleaseRequest, ReportAgentState, TurnState,
};

pub mod rpc;

/// How a bridge's claim ids begin: the hooks leave such a claim to it.
pub const CLAIM_PREFIX: &str = "codex-";
/// How long a claim parks for a message at a time.
const PARK_SECONDS: u64 = 20;
/// How often the bridge looks for threads loaded since.
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// How often the bridge tells the broker it delivers into the idle agent.
const SAY_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, Args)]
pub struct CodexArgs {
    #[command(subcommand)]
    pub command: CodexCommand,
}

#[derive(Debug, Subcommand)]
pub enum CodexCommand {
    /// Join Codex's shared server (plain `codex`) and deliver each loaded
    /// thread's LoopX messages into it, no typing. The hooks start it; it
    /// runs until the server ends. One per server: a second exits at once.
    Bridge(BridgeArgs),
}

#[derive(Debug, Clone, Args)]
pub struct BridgeArgs {
    /// Codex's server socket [default: $CODEX_HOME/app-server-control/app-server-control.sock,
    /// CODEX_HOME defaulting to ~/.codex].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// The goal each thread's session is bound to.
    #[arg(long)]
    pub goal_id: String,
    /// The registered LoopX agent.
    #[arg(long)]
    pub agent_id: String,
    /// The label of the executor that runs Codex.
    #[arg(long)]
    pub executor_endpoint_id: String,
    #[command(flatten)]
    pub connection: Connection,
}

pub fn run(args: CodexArgs) -> ExitCode {
    let CodexCommand::Bridge(args) = args.command;
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("loopx codex bridge: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(bridge(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            eprintln!("loopx codex bridge: {why}");
            ExitCode::FAILURE
        }
    }
}

/// Codex's server socket, where plain `codex` puts it.
pub fn default_socket() -> PathBuf {
    let home = std::env::var_os("CODEX_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".codex")))
        .unwrap_or_else(|| PathBuf::from(".codex"));
    home.join("app-server-control")
        .join("app-server-control.sock")
}

/// The lock a bridge of `socket` holds while it runs.
fn lock_path(data_dir: &Path, socket: &Path) -> PathBuf {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(socket.as_os_str().as_encoded_bytes());
    data_dir
        .join("codex-bridges")
        .join(format!("{}.lock", hex::encode(&digest[..8])))
}

/// Whether a bridge of `socket` runs (its lock is held).
pub fn runs(data_dir: &Path, socket: &Path) -> bool {
    std::fs::File::open(lock_path(data_dir, socket)).is_ok_and(|f| {
        rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockShared).is_err()
    })
}

/// Makes sure a bridge runs for Codex's server at `socket`: started
/// detached, with the bind labels and the broker of the hook that asks.
pub fn ensure(socket: &Path, bind: &BindRequest, connection: &Connection) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    let data_dir = connection.data_dir();
    if runs(&data_dir, socket) {
        return Ok(());
    }
    if !socket.exists() {
        return Err(format!(
            "Codex's server socket {} is not there: start plain `codex` (its shared server)",
            socket.display()
        ));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    std::process::Command::new(exe)
        .args(["codex", "bridge", "--socket"])
        .arg(socket)
        .args(["--goal-id", &bind.goal_id])
        .args(["--agent-id", &bind.agent_id])
        .args(["--executor-endpoint-id", &bind.executor_endpoint_id])
        .args(["--broker-url", &connection.broker_url])
        .arg("--data-dir")
        .arg(&data_dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .map(|_| ())
        .map_err(|e| format!("cannot start the Codex bridge: {e}"))
}

/// What the server says of one thread, for its task.
#[derive(Debug)]
enum Event {
    /// The thread went idle, or started work.
    Idle(bool),
    /// The agent's message of a turn.
    Said { turn: String, text: String },
    /// A turn ended: `completed`, `interrupted` or `failed`.
    Ended { turn: String, status: String },
}

async fn bridge(args: BridgeArgs) -> Result<(), String> {
    use std::io::Write;
    let socket = args.socket.clone().unwrap_or_else(default_socket);
    let data_dir = args.connection.data_dir();
    let lock = lock_path(&data_dir, &socket);
    if let Some(dir) = lock.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let mut held = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock)
        .map_err(|e| format!("cannot open {}: {e}", lock.display()))?;
    if rustix::fs::flock(&held, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
        return Ok(()); // Another bridge serves this server.
    }
    let _ = held.set_len(0);
    let _ = writeln!(held, "{}", std::process::id());
    let (client, _) = args.connection.client()?;
    let (rpc, mut incoming) = rpc::connect(&socket).await?;
    rpc.initialize().await?;
    let mut threads: HashMap<String, mpsc::UnboundedSender<Event>> = HashMap::new();
    let mut look = tokio::time::interval(LOOK_EVERY);
    loop {
        tokio::select! {
            _ = look.tick() => {
                let loaded = rpc.call("thread/loaded/list", json!({})).await?;
                for id in loaded["data"].as_array().into_iter().flatten().filter_map(Value::as_str) {
                    if threads.contains_key(id) {
                        continue;
                    }
                    let (events, received) = mpsc::unbounded_channel();
                    threads.insert(id.to_owned(), events);
                    let thread = Thread {
                        rpc: rpc.clone(),
                        client: client.clone().with_timeout(Duration::from_secs(PARK_SECONDS + 10)),
                        thread_id: id.to_owned(),
                        args: args.clone(),
                        records: crate::cli::wake::records_dir(&data_dir),
                        events: received,
                        idle: true,
                    };
                    tokio::spawn(async move {
                        if let Err(why) = thread.run().await {
                            eprintln!("loopx codex bridge: a thread: {why}");
                        }
                    });
                }
            }
            message = incoming.recv() => {
                let Some(message) = message else {
                    return Ok(()); // The server is gone.
                };
                if let rpc::Incoming::Notification { method, params } = message
                    && let Some((thread, event)) = event_of(&method, &params)
                    && let Some(events) = threads.get(&thread)
                {
                    let _ = events.send(event);
                }
                // Approvals and questions are the terminal's in this bridge.
            }
        }
    }
}

/// The thread and what a notification says of it, for the events a thread
/// task follows.
fn event_of(method: &str, params: &Value) -> Option<(String, Event)> {
    let thread = params["threadId"].as_str()?.to_owned();
    let event = match method {
        "thread/status/changed" => Event::Idle(params["status"]["type"] == "idle"),
        "turn/started" => Event::Idle(false),
        "item/completed" if params["item"]["type"] == "agentMessage" => Event::Said {
            turn: params["turnId"].as_str()?.to_owned(),
            text: params["item"]["text"].as_str()?.to_owned(),
        },
        "turn/completed" => Event::Ended {
            turn: params["turn"]["id"].as_str()?.to_owned(),
            status: params["turn"]["status"]
                .as_str()
                .unwrap_or("completed")
                .to_owned(),
        },
        _ => return None,
    };
    Some((thread, event))
}

/// One thread's delivery: its session's messages, one turn each.
struct Thread {
    rpc: rpc::Rpc,
    client: Client,
    thread_id: String,
    args: BridgeArgs,
    records: PathBuf,
    events: mpsc::UnboundedReceiver<Event>,
    idle: bool,
}

impl Thread {
    async fn run(mut self) -> Result<(), String> {
        let resumed = self
            .rpc
            .call(
                "thread/resume",
                json!({"threadId": self.thread_id, "excludeTurns": true}),
            )
            .await?;
        if resumed["thread"]["ephemeral"] == true {
            // Codex's own side threads (a title, say): nobody talks to them.
            return Ok(());
        }
        self.idle = resumed["thread"]["status"]["type"]
            .as_str()
            .is_none_or(|status| status == "idle");
        let session_id = self.bind().await?;
        let mut said: Option<Instant> = None;
        loop {
            if said.is_none_or(|at| at.elapsed() >= SAY_EVERY) {
                said = Some(Instant::now());
                self.say(&session_id).await;
            }
            self.take_events();
            if !self.idle {
                if let Some(event) = self.next_event(Duration::from_secs(1)).await {
                    self.seen(&event);
                }
                continue;
            }
            let Some(claimed) = self.claim(&session_id).await? else {
                continue;
            };
            self.take_events();
            if !self.idle {
                // The person started a turn meanwhile: it goes first.
                self.release(&session_id, &claimed.claim_id).await;
                continue;
            }
            self.deliver(&session_id, claimed).await?;
        }
    }

    /// Registers the thread's exact tuple and binds its session (the open
    /// one again, as the hooks do).
    async fn bind(&self) -> Result<String, String> {
        let thread = RegisterAgentThread {
            goal_id: self.args.goal_id.clone(),
            agent_id: self.args.agent_id.clone(),
            host_surface: HOST_SURFACE.into(),
            host_session_id: self.thread_id.clone(),
        };
        let problem = |e: ClientError| crate::cli::mcp::host::Problem::from(e).log_line();
        self.client.register(&thread).await.map_err(problem)?;
        let bind = BindRequest {
            goal_id: self.args.goal_id.clone(),
            agent_id: self.args.agent_id.clone(),
            host_surface: HOST_SURFACE.into(),
            host_session_id: self.thread_id.clone(),
            executor_endpoint_id: self.args.executor_endpoint_id.clone(),
            terminal: None,
            dry_run: false,
        };
        let bound = self.client.bind(&bind).await.map_err(problem)?;
        Ok(bound.body.session_id)
    }

    fn report(&self, state: Option<AgentState>) -> ReportAgentState {
        ReportAgentState::of(HOST_SURFACE, &self.thread_id, state)
    }

    /// Tells the broker a message sent now reaches the idle agent at once.
    async fn say(&self, session_id: &str) {
        let report = ReportAgentState {
            typing_in: Some(true),
            ..self.report(None)
        };
        let _ = self.client.report_agent(session_id, &report).await;
    }

    fn seen(&mut self, event: &Event) {
        if let Event::Idle(idle) = event {
            self.idle = *idle;
        }
        if let Event::Ended { .. } = event {
            self.idle = true;
        }
    }

    fn take_events(&mut self) {
        while let Ok(event) = self.events.try_recv() {
            self.seen(&event);
        }
    }

    async fn next_event(&mut self, wait: Duration) -> Option<Event> {
        tokio::time::timeout(wait, self.events.recv())
            .await
            .ok()
            .flatten()
    }

    /// The oldest queued message, parked for up to [`PARK_SECONDS`].
    async fn claim(&self, session_id: &str) -> Result<Option<Claimed>, String> {
        let request = ClaimRequest {
            host_surface: HOST_SURFACE.into(),
            host_session_id: self.thread_id.clone(),
            claim_id: format!("{CLAIM_PREFIX}{}", ulid::Ulid::new()),
            wait_seconds: PARK_SECONDS,
        };
        match self.client.claim(session_id, &request).await {
            Ok(answer) => match answer.body {
                ClaimAnswer::Claimed(c) if c.turn_state == TurnState::Claimed => Ok(Some(c)),
                _ => Ok(None),
            },
            // A claim of a bridge before this one (it was stopped): its
            // message is this bridge's to finish ([`Thread::adopt`]).
            Err(ClientError::Refused { error, .. })
                if error
                    .error
                    .active_claim_id
                    .as_deref()
                    .is_some_and(|id| id.starts_with(CLAIM_PREFIX)) =>
            {
                let held = error.error.active_claim_id.unwrap_or_default();
                let again = ClaimRequest {
                    claim_id: held,
                    wait_seconds: 0,
                    ..request
                };
                match self.client.claim(session_id, &again).await {
                    Ok(answer) => match answer.body {
                        ClaimAnswer::Claimed(c) if c.turn_state == TurnState::Claimed => {
                            Ok(Some(c))
                        }
                        _ => Ok(None),
                    },
                    Err(_) => Ok(None),
                }
            }
            Err(ClientError::Refused { reply, .. }) if reply.status == 409 => {
                // Held by another, or the session closed: look again later.
                tokio::time::sleep(Duration::from_secs(1)).await;
                let closed = reply.text.contains("session_closed");
                if closed {
                    Err("the thread's session is closed".into())
                } else {
                    Ok(None)
                }
            }
            Err(_) => {
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok(None)
            }
        }
    }

    async fn release(&self, session_id: &str, claim_id: &str) {
        let host = ReleaseRequest::host(HOST_SURFACE, &self.thread_id);
        let _ = self.client.release(session_id, claim_id, &host).await;
    }

    /// Where a message held by a bridge before this one stands in the
    /// thread: the Codex turn its `clientUserMessageId` (the LoopX turn id)
    /// started, with its status and last agent message; None when no turn
    /// holds it (it was never started).
    async fn started_before(
        &self,
        turn_id: &str,
    ) -> Result<Option<(String, String, String)>, String> {
        let read = self
            .rpc
            .call(
                "thread/read",
                json!({"threadId": self.thread_id, "includeTurns": true}),
            )
            .await?;
        let turns = read["thread"]["turns"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        Ok(turns.iter().find_map(|turn| {
            let items = turn["items"].as_array()?;
            items
                .iter()
                .any(|i| i["type"] == "userMessage" && i["clientId"] == turn_id)
                .then(|| {
                    let last = items
                        .iter()
                        .rev()
                        .find(|i| i["type"] == "agentMessage")
                        .and_then(|i| i["text"].as_str())
                        .unwrap_or_default();
                    (
                        turn["id"].as_str().unwrap_or_default().to_owned(),
                        turn["status"].as_str().unwrap_or_default().to_owned(),
                        last.to_owned(),
                    )
                })
        }))
    }

    /// Starts a turn with the message (marked as the waker marks what it
    /// types, with the record the hooks recognize it by), then answers it
    /// with the turn's last agent message, or settles it interrupted. A
    /// message a bridge before this one started is not started again: its
    /// turn is followed to its end, or answered if it ended.
    async fn deliver(&mut self, session_id: &str, claimed: Claimed) -> Result<(), String> {
        if let Some((turn, status, last)) = self.started_before(&claimed.turn.turn_id).await? {
            let (status, last) = match status.as_str() {
                "inProgress" | "in_progress" | "running" | "" => self.followed(&turn, last).await?,
                _ => (status, last),
            };
            self.settle(session_id, &claimed, &status, last).await;
            return Ok(());
        }
        let typed = text::typed(claimed.turn.seq, claimed.turn.origin, &claimed.turn.text);
        let _ = text::Record::of(claimed.turn.seq, &claimed.turn.turn_id, &typed)
            .keep(&self.records, session_id);
        let started = self
            .rpc
            .call(
                "turn/start",
                json!({
                    "threadId": self.thread_id,
                    "input": [{"type": "text", "text": typed, "text_elements": []}],
                    "clientUserMessageId": claimed.turn.turn_id,
                }),
            )
            .await;
        let turn = match started {
            Ok(started) => started["turn"]["id"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            Err(why) => {
                self.release(session_id, &claimed.claim_id).await;
                return Err(why);
            }
        };
        self.idle = false;
        let (status, last) = self.followed(&turn, String::new()).await?;
        self.settle(session_id, &claimed, &status, last).await;
        Ok(())
    }

    /// Follows the thread's events to the end of Codex turn `turn`: its
    /// status and its last agent message (`last` until one comes).
    async fn followed(&mut self, turn: &str, mut last: String) -> Result<(String, String), String> {
        let status = loop {
            match self.events.recv().await {
                Some(Event::Said { turn: t, text }) if t == turn => last = text,
                Some(Event::Ended { turn: t, status }) if t == turn => break status,
                Some(event) => self.seen(&event),
                None => return Err("the server is gone".into()),
            }
        };
        self.idle = true;
        Ok((status, last))
    }

    /// Answers the claimed message with the turn's last agent message, or
    /// settles it interrupted.
    async fn settle(&self, session_id: &str, claimed: &Claimed, status: &str, last: String) {
        match status {
            "interrupted" => {
                let settled = ReportAgentState {
                    interrupted: true,
                    ..self.report(Some(AgentState::Waiting))
                };
                let _ = self.client.report_agent(session_id, &settled).await;
            }
            _ => {
                let answer = match (status, last.trim().is_empty()) {
                    ("completed", false) => last,
                    ("completed", true) => "(The agent ended its turn without a message.)".into(),
                    _ => format!("(The agent's turn ended: {status}.)"),
                };
                let mut response = serde_json::Map::new();
                response.insert("message".into(), Value::String(answer));
                let completion = CompleteRequest {
                    host_surface: HOST_SURFACE.into(),
                    host_session_id: self.thread_id.clone(),
                    claim_id: claimed.claim_id.clone(),
                    completion_id: format!("{CLAIM_PREFIX}{}", claimed.turn.turn_id),
                    response,
                };
                let _ = self
                    .client
                    .complete(session_id, &claimed.turn.turn_id, &completion)
                    .await;
            }
        }
    }
}

const HOST_SURFACE: &str = "codex-cli";
