//! The broker side of `loopx mcp`: the host session's claims, completions and
//! releases over the typed [`Client`], with the take-over of a claim left
//! active by an earlier run. It knows nothing of MCP; it never logs a message
//! text or the host session id.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Map, Value};
use tokio::sync::{Notify, OnceCell};

use crate::client::{Client, ClientError};
use crate::model::{
    AgentState, BindRequest, ClaimAnswer, ClaimRequest, Claimed, ClaimedTurn, CompleteRequest,
    CreatePermissionRequest, ListPermissions, ListTurns, PermissionRequest, Receipt,
    RegisterAgentThread, RelayedPermission, ReleaseRequest, Released, ReportAgentState, TurnState,
    WaitPermission,
};

/// How many recently claimed turns a bridge remembers, so that a `reply`
/// repeated after the next turn arrived is still a replay.
const RECENT_TURNS: usize = 32;

/// Which session the bridge serves.
#[derive(Debug, Clone)]
pub enum Target {
    /// An existing session.
    Session(String),
    /// Register the host session and bind (reusing the open session) first.
    Bind(BindRequest),
}

/// A claimed turn and the claim that holds it.
#[derive(Debug, Clone)]
pub struct Held {
    pub session_id: String,
    pub claim_id: String,
    pub turn: ClaimedTurn,
    answered: bool,
}

/// Why a broker call failed, as a tool result or a log line says it.
#[derive(Debug, Clone)]
pub enum Problem {
    /// No HTTP answer.
    Unreachable { url: String, reason: String },
    /// The broker's JSON error.
    Refused { code: String, message: String },
    /// An answer this bridge does not understand.
    Unexpected(String),
    /// Nothing to act on: no such turn known to this bridge, a wrong chat id.
    Local(String),
}

impl Problem {
    /// The broker's error code, for a refusal.
    pub fn code(&self) -> Option<&str> {
        match self {
            Problem::Refused { code, .. } => Some(code),
            _ => None,
        }
    }
}

impl Problem {
    /// Whether trying again later may succeed: no answer, or the broker's
    /// store unavailable.
    pub fn is_transient(&self) -> bool {
        match self {
            Problem::Unreachable { .. } | Problem::Unexpected(_) => true,
            Problem::Refused { code, .. } => code == "store_unavailable",
            Problem::Local(_) => false,
        }
    }

    /// What a log line may say: a local problem can quote the caller's
    /// arguments (a message text), so only its kind is logged.
    pub fn log_line(&self) -> String {
        match self {
            Problem::Local(_) => "the call was refused before reaching the broker".into(),
            other => other.to_string(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Unreachable { url, reason } => {
                write!(f, "broker unreachable: no answer from {url} ({reason})")
            }
            Problem::Refused { code, message } => {
                write!(f, "the broker refused ({code}): {message}")
            }
            Problem::Unexpected(reason) => write!(f, "unexpected answer from the broker: {reason}"),
            Problem::Local(message) => f.write_str(message),
        }
    }
}

impl From<ClientError> for Problem {
    fn from(error: ClientError) -> Self {
        match error {
            ClientError::Unreachable { url, reason } => Problem::Unreachable { url, reason },
            ClientError::Refused { error, .. } => Problem::Refused {
                code: error.error.code_str(),
                message: error.error.message,
            },
            // The body is not repeated: it might carry text.
            ClientError::Unexpected { reply, reason } => {
                Problem::Unexpected(format!("{} ({reason})", reply.status))
            }
        }
    }
}

/// One host session's bridge to its LoopX session.
pub struct Host {
    client: Client,
    host_surface: String,
    host_session_id: String,
    target: Target,
    session: OnceCell<String>,
    /// Whether this run's bind made the session (201), not reused an open one.
    created: AtomicBool,
    recent: Mutex<VecDeque<Held>>,
    answered: Notify,
    /// A turn was delivered: the heartbeat starts at once.
    delivered: Notify,
    /// Where delivered turns' files are saved (none: not saved).
    saves: Option<std::path::PathBuf>,
}

impl Host {
    pub fn new(
        client: Client,
        host_surface: String,
        host_session_id: String,
        target: Target,
    ) -> Self {
        Host {
            client,
            host_surface,
            host_session_id,
            target,
            session: OnceCell::new(),
            created: AtomicBool::new(false),
            recent: Mutex::new(VecDeque::new()),
            answered: Notify::new(),
            delivered: Notify::new(),
            saves: None,
        }
    }

    /// Saves delivered turns' files under `root` (see [`Host::delivered_text`]).
    pub fn saving_files_in(self, root: std::path::PathBuf) -> Self {
        Host {
            saves: Some(root),
            ..self
        }
    }

    /// A held turn's text as delivered to the agent: with a line naming
    /// each of its files, saved on this host.
    pub async fn delivered_text(&self, held: &Held) -> String {
        self.delivered(held).await.0
    }

    /// The delivered text, and the files saved for it.
    pub async fn delivered(&self, held: &Held) -> (String, Vec<crate::cli::attachments::Saved>) {
        let Some(root) = &self.saves else {
            return (held.turn.text.clone(), Vec::new());
        };
        let saved = crate::cli::attachments::save(
            &self.client,
            root,
            &held.session_id,
            &held.turn.turn_id,
            &held.turn.attachments,
        )
        .await;
        (
            crate::cli::attachments::with_files(&held.turn.text, &saved),
            saved,
        )
    }

    pub fn broker_url(&self) -> &str {
        self.client.base_url()
    }

    /// The session id, once known (given, or bound).
    pub fn known_session_id(&self) -> Option<&str> {
        match &self.target {
            Target::Session(id) => Some(id),
            Target::Bind(_) => self.session.get().map(String::as_str),
        }
    }

    /// What the host attaches to: a session, or the bind.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The session id; in bind mode the first call that reaches the broker
    /// registers and binds (the open session is reused).
    pub async fn session_id(&self) -> Result<String, Problem> {
        let id = self
            .session
            .get_or_try_init(|| async {
                match &self.target {
                    Target::Session(id) => Ok(id.clone()),
                    Target::Bind(bind) => self.bind(bind).await,
                }
            })
            .await?;
        Ok(id.clone())
    }

    async fn bind(&self, bind: &BindRequest) -> Result<String, Problem> {
        let thread = RegisterAgentThread {
            goal_id: bind.goal_id.clone(),
            agent_id: bind.agent_id.clone(),
            host_surface: bind.host_surface.clone(),
            host_session_id: bind.host_session_id.clone(),
        };
        self.client.register(&thread).await?;
        let bound = self.client.bind(bind).await?;
        let created = bound.reply.status == 201;
        self.created.store(created, Ordering::SeqCst);
        let session = bound.body;
        tracing::info!(session_id = %session.session_id, created, "bound the host session");
        Ok(session.session_id)
    }

    /// At exit, in bind mode: a session this run bound anew that never got a
    /// message is closed, so a host's health check (start, `initialize`,
    /// exit: `claude mcp list`) leaves no open session behind. A session that
    /// was reused, or that has a message, stays open.
    pub async fn leave(&self) {
        let Some(session_id) = self.session.get() else {
            return;
        };
        if !self.created.load(Ordering::SeqCst) {
            return;
        }
        let first = ListTurns {
            limit: Some(1),
            ..ListTurns::default()
        };
        match self.client.turns(session_id, &first).await {
            Ok(page) if page.body.turns.is_empty() => {}
            _ => return,
        }
        match self.client.close(session_id).await {
            Ok(_) => {
                tracing::info!(%session_id, "closed the session this run bound: no message came")
            }
            Err(e) => tracing::info!(%session_id, "left the session open: {}", Problem::from(e)),
        }
    }

    /// Claims the oldest queued turn, parking up to `wait_seconds`, with a
    /// fresh claim id. A claim left active by an earlier run of this host (a
    /// restart) is taken over and its turn answered again. `None`: nothing
    /// came within the wait.
    pub async fn claim(&self, wait_seconds: u64) -> Result<Option<Held>, Problem> {
        let session_id = self.session_id().await?;
        let claim_id = format!("mcp-{}", ulid::Ulid::new());
        match self.claim_as(&session_id, &claim_id, wait_seconds).await {
            Err(ClientError::Refused { error, .. }) if error.error.active_claim_id.is_some() => {
                let active = error.error.active_claim_id.unwrap_or_default();
                // This run's own claim, still unanswered: never delivered twice.
                if let Some(held) = self.unanswered().filter(|h| h.claim_id == active) {
                    return Err(Problem::Local(format!(
                        "message {} (seq {}) was delivered earlier and is not answered yet: reply to \
                         it (or release it) before waiting for the next",
                        held.turn.turn_id, held.turn.seq
                    )));
                }
                tracing::info!("taking over the claim an earlier run left active");
                match self.claim_as(&session_id, &active, 0).await? {
                    ClaimAnswer::Claimed(c) => Ok(self.deliver(c).await),
                    ClaimAnswer::NotClaimed(_) => Ok(None),
                }
            }
            Err(error) => Err(error.into()),
            Ok(ClaimAnswer::Claimed(c)) => Ok(self.deliver(c).await),
            Ok(ClaimAnswer::NotClaimed(_)) => Ok(None),
        }
    }

    /// Holds a claimed turn, and tells the broker that the agent works on it
    /// before the turn is handed to the agent, so that a bridge that dies
    /// holding a delivered turn has always named its claim (and the broker
    /// releases it after the silence).
    async fn deliver(&self, claimed: Claimed) -> Option<Held> {
        let held = self.hold(claimed)?;
        self.say_working(&held).await;
        Some(held)
    }

    /// One heartbeat: `working`, naming the held claim. A failure is only
    /// logged (the next one may pass).
    async fn say_working(&self, held: &Held) {
        let report = ReportAgentState {
            claim_id: Some(held.claim_id.clone()),
            ..ReportAgentState::of(
                &self.host_surface,
                &self.host_session_id,
                Some(AgentState::Working),
            )
        };
        if let Err(e) = self.client.report_agent(&held.session_id, &report).await {
            tracing::debug!("the heartbeat was not recorded: {}", Problem::from(e));
        }
    }

    async fn claim_as(
        &self,
        session_id: &str,
        claim_id: &str,
        wait_seconds: u64,
    ) -> Result<ClaimAnswer, ClientError> {
        let request = ClaimRequest {
            host_surface: self.host_surface.clone(),
            host_session_id: self.host_session_id.clone(),
            claim_id: claim_id.to_owned(),
            wait_seconds,
        };
        Ok(self.client.claim(session_id, &request).await?.body)
    }

    /// Remembers a claimed turn (a replayed claim whose turn moved on since is
    /// not held any more: nothing to deliver).
    fn hold(&self, claimed: Claimed) -> Option<Held> {
        if claimed.turn_state != TurnState::Claimed {
            return None;
        }
        let held = Held {
            session_id: claimed.session_id,
            claim_id: claimed.claim_id,
            turn: claimed.turn,
            answered: false,
        };
        tracing::info!(turn_id = %held.turn.turn_id, seq = held.turn.seq, "claimed a turn");
        let mut recent = self.recent.lock().expect("recent turns");
        recent.retain(|h| h.turn.turn_id != held.turn.turn_id);
        recent.push_back(held.clone());
        if recent.len() > RECENT_TURNS {
            recent.pop_front();
        }
        drop(recent);
        self.delivered.notify_waiters();
        Some(held)
    }

    /// The turn a tool means: the given one, else the one claimed last.
    fn find(&self, turn_id: Option<&str>) -> Result<Held, Problem> {
        let recent = self.recent.lock().expect("recent turns");
        let found = match turn_id {
            Some(id) => recent.iter().rev().find(|h| h.turn.turn_id == id),
            None => recent.back(),
        };
        found.cloned().ok_or_else(|| {
            Problem::Local(match turn_id {
                Some(id) => format!("turn {id} was not delivered through this bridge"),
                None => "no message has been delivered yet: nothing to reply to".to_owned(),
            })
        })
    }

    /// Answers a delivered turn with `text`. The completion id is derived
    /// from the turn, so a repeated reply is a replay, never a second answer.
    pub async fn reply(
        &self,
        chat_id: &str,
        turn_id: Option<&str>,
        text: &str,
    ) -> Result<Receipt, Problem> {
        let session_id = self.session_id().await?;
        if chat_id != session_id {
            return Err(Problem::Local(format!(
                "chat_id {chat_id} is not this session's id; reply with chat_id {session_id}"
            )));
        }
        let held = self.find(turn_id)?;
        let mut response = Map::new();
        response.insert("message".into(), Value::String(text.to_owned()));
        let request = CompleteRequest {
            host_surface: self.host_surface.clone(),
            host_session_id: self.host_session_id.clone(),
            claim_id: held.claim_id.clone(),
            completion_id: completion_id(&held.turn.turn_id),
            response,
        };
        let receipt = match self
            .client
            .complete(&session_id, &held.turn.turn_id, &request)
            .await
        {
            Ok(receipt) => receipt.body,
            Err(error) => {
                let problem = Problem::from(error);
                // The turn is no longer this bridge's to answer (answered
                // elsewhere, released by the owner, cancelled): stop waiting
                // for it, so a refused reply never wedges the bridge.
                if is_settled(&problem) {
                    self.mark_answered(&held.turn.turn_id);
                }
                return Err(problem);
            }
        };
        self.mark_answered(&held.turn.turn_id);
        Ok(receipt)
    }

    /// The latest delivered turn not answered yet.
    pub fn unanswered(&self) -> Option<Held> {
        let recent = self.recent.lock().expect("recent turns");
        recent.iter().rev().find(|h| !h.answered).cloned()
    }

    /// Whether the turn is still claimed by this bridge's claim: `false` once
    /// it was answered, released (by the owner too) or cancelled. A broker
    /// that cannot tell counts as still held.
    pub async fn still_held(&self, held: &Held) -> bool {
        match self.claim_as(&held.session_id, &held.claim_id, 0).await {
            Ok(ClaimAnswer::Claimed(c)) => c.turn_state == TurnState::Claimed,
            Ok(ClaimAnswer::NotClaimed(_)) => true,
            Err(error) => !is_settled(&Problem::from(error)),
        }
    }

    /// Stops waiting for a turn's answer: it is not this bridge's any more.
    pub fn give_up(&self, turn_id: &str) {
        self.mark_answered(turn_id);
    }

    /// Hands a delivered turn back to the head of the queue.
    pub async fn release(&self, turn_id: Option<&str>) -> Result<Released, Problem> {
        let session_id = self.session_id().await?;
        let held = self.find(turn_id)?;
        let host = ReleaseRequest::host(self.host_surface.clone(), self.host_session_id.clone());
        let released = self
            .client
            .release(&session_id, &held.claim_id, &host)
            .await?
            .body;
        tracing::info!(turn_id = %released.turn_id, "released a turn");
        self.mark_answered(&released.turn_id);
        Ok(released)
    }

    fn mark_answered(&self, turn_id: &str) {
        let mut recent = self.recent.lock().expect("recent turns");
        if let Some(held) = recent.iter_mut().find(|h| h.turn.turn_id == turn_id) {
            held.answered = true;
        }
        drop(recent);
        self.answered.notify_waiters();
    }

    fn is_answered(&self, turn_id: &str) -> bool {
        let recent = self.recent.lock().expect("recent turns");
        recent
            .iter()
            .find(|h| h.turn.turn_id == turn_id)
            .is_none_or(|h| h.answered)
    }

    /// Runs for the bridge's life: while a delivered turn is unanswered, tells
    /// the broker every `every` that the agent works on it, naming its claim
    /// (the first time when it was delivered: [`Host::claim`]). The broker
    /// releases the turn of a holder silent for its `--holder-silence`.
    pub async fn heartbeat(self: std::sync::Arc<Self>, every: std::time::Duration) {
        loop {
            let delivered = self.delivered.notified();
            tokio::pin!(delivered);
            delivered.as_mut().enable();
            if self.unanswered().is_none() {
                delivered.await;
                continue;
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                // A new turn was just reported: the count starts again.
                _ = delivered => continue,
            }
            if let Some(held) = self.unanswered() {
                self.say_working(&held).await;
            }
        }
    }

    /// Waits until `reply` answered this turn.
    pub async fn answered(&self, turn_id: &str) {
        loop {
            // Enabled before the check, so an answer in between is not missed.
            let notified = self.answered.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_answered(turn_id) {
                return;
            }
            notified.await;
        }
    }
}

/// Permission requests of the host's agent CLI: recorded on the session,
/// waited for parked, listed again after a restart.
impl Host {
    /// Records a permission request (a replay answers the same request).
    pub async fn create_permission(
        &self,
        request_id: &str,
        tool_name: &str,
        description: &str,
        input_preview: &str,
        detail: &crate::permission::Detail,
    ) -> Result<PermissionRequest, Problem> {
        let session_id = self.session_id().await?;
        let request = CreatePermissionRequest {
            host_surface: self.host_surface.clone(),
            host_session_id: self.host_session_id.clone(),
            request_id: request_id.to_owned(),
            tool_name: tool_name.to_owned(),
            description: description.to_owned(),
            input_preview: input_preview.to_owned(),
            kind: detail.kind,
            questions: detail.questions.clone(),
            plan: detail.plan.clone(),
            suggestions: (!detail.suggestions.is_empty()).then(|| detail.suggestions.clone()),
        };
        Ok(self
            .client
            .create_permission(&session_id, &request)
            .await?
            .body)
    }

    /// Parks up to `wait_seconds` until the request is answered or expires.
    pub async fn wait_permission(
        &self,
        request_id: &str,
        wait_seconds: u64,
    ) -> Result<PermissionRequest, Problem> {
        let session_id = self.session_id().await?;
        let wait = WaitPermission {
            host_surface: self.host_surface.clone(),
            host_session_id: self.host_session_id.clone(),
            wait_seconds,
        };
        Ok(self
            .client
            .wait_permission(&session_id, request_id, &wait)
            .await?
            .body)
    }

    /// The session's requests (pending first, then newest): what a restarted
    /// bridge waits for again (pending) or relays now (answered, not relayed).
    pub async fn permissions(&self) -> Result<Vec<PermissionRequest>, Problem> {
        let session_id = self.session_id().await?;
        let filter = ListPermissions { state: None };
        Ok(self
            .client
            .permissions(&session_id, &filter)
            .await?
            .body
            .permission_requests)
    }
}

/// Whether a refusal means the turn is settled without this bridge: answered
/// (by another completion), released, its claim spent, or its session closed.
fn is_settled(problem: &Problem) -> bool {
    matches!(
        problem.code(),
        Some(
            "already_completed"
                | "idempotency_key_reused"
                | "not_claimed"
                | "claim_mismatch"
                | "claim_released"
                | "session_closed"
        )
    )
}

impl Host {
    /// Tells the broker the request's answer reached the agent.
    pub async fn relayed_permission(&self, request_id: &str) -> Result<PermissionRequest, Problem> {
        let session_id = self.session_id().await?;
        let relayed = RelayedPermission {
            host_surface: self.host_surface.clone(),
            host_session_id: self.host_session_id.clone(),
        };
        Ok(self
            .client
            .relayed_permission(&session_id, request_id, &relayed)
            .await?
            .body)
    }
}

/// The completion id of a bridge's answer to a turn.
pub fn completion_id(turn_id: &str) -> String {
    format!("mcp-reply-{turn_id}")
}

/// How the bridge retries the broker: from 250 ms up to 30 s, jittered, for ever.
pub fn backoff() -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default()
        .with_min_delay(std::time::Duration::from_millis(250))
        .with_max_delay(std::time::Duration::from_secs(30))
        .with_jitter()
        .without_max_times()
}

pub fn log_problem(problem: &Problem, after: std::time::Duration) {
    tracing::warn!("{problem}; retrying in {:.1} s", after.as_secs_f64());
}
