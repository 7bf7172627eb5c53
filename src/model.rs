//! The wire types of the contract: request bodies (which reject unknown
//! fields), answers and projections. A projection never carries a host session
//! id or a message text; only the turn readback and a claim carry content.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::json;
use utoipa::openapi::RefOr;
use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::{IntoParams, PartialSchema, ToSchema};

/// Where a message came from. Web and Lark share the one queue; a
/// `terminal` turn was typed by the person at the agent's terminal (its
/// hooks record it, HOOKS.md "Presence"): it is never queued or claimed,
/// and is only read back, in its place by `seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(rename_all = "snake_case")]
pub enum Origin {
    Web,
    Lark,
    Terminal,
}

/// How a message wants to reach the agent. Only `session_queue` exists today;
/// `live_steering` is refused with 409 `live_steering_unavailable`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Ingress {
    #[default]
    SessionQueue,
    LiveSteering,
}

/// A session's lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(rename_all = "snake_case")]
pub enum SessionState {
    Open,
    Closed,
}

/// A turn's lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(rename_all = "snake_case")]
pub enum TurnState {
    Queued,
    Claimed,
    Completed,
    Cancelled,
}

/// A turn's change as the session event stream reports it: a [`TurnState`],
/// or `released` (its claim let go; the turn is queued again, at the head).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TurnChange {
    Queued,
    Claimed,
    Completed,
    Released,
    Cancelled,
}

/// The data of an `event: turn` on the session event stream: content-free,
/// read the turn for its text.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"turn_id": "turn_01JD8X6A0B1C2D3E4F5G6H7J8K", "seq": 1, "state": "queued"}))]
pub struct TurnEventData {
    pub turn_id: String,
    pub seq: i64,
    pub state: TurnChange,
}

/// The data of an `event: permission` on the session event stream: a
/// permission request was made (`pending`), answered or expired.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"request_id": "perm-1", "state": "pending"}))]
pub struct PermissionEventData {
    pub request_id: String,
    pub state: PermissionState,
}

/// The data of an `event: session` on the session event stream: the session
/// closed (`state` is always `closed` today).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"state": "closed"}))]
pub struct SessionEventData {
    pub state: SessionState,
}

/// The data of an `event: agent` on the session event stream: the session's
/// agent presence changed (`working`, `waiting` or `away`), since when.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"state": "working", "since": "2026-11-30T10:00:05.000Z"}))]
pub struct AgentEventData {
    pub state: AgentState,
    pub since: String,
}

/// The data of an `event: notification` on the session event stream: the
/// agent waits for someone at its terminal (`idle_prompt`, `permission_prompt`).
/// The notification's own text is not stored.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"state": "idle_prompt"}))]
pub struct NotificationEventData {
    pub state: NotificationKind,
}

/// What the agent waits for at its terminal (Claude Code's notification
/// types), or `typing_unconfirmed`: a message typed into the idle agent was
/// not confirmed by its `UserPromptSubmit` hook (its Enter may have landed
/// as a newline), so it stays queued for the end of the agent's next turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NotificationKind {
    IdlePrompt,
    PermissionPrompt,
    TypingUnconfirmed,
}

impl NotificationKind {
    /// The wire name, as the event log stores it.
    pub fn as_str(self) -> &'static str {
        match self {
            NotificationKind::IdlePrompt => "idle_prompt",
            NotificationKind::PermissionPrompt => "permission_prompt",
            NotificationKind::TypingUnconfirmed => "typing_unconfirmed",
        }
    }
}

/// `POST /v1/sessions/{session_id}/notifications`, by the host: its agent
/// waits for someone at its terminal. The notification's text is not sent.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"host_surface": "claude-code", "host_session_id": "host-abc", "kind": "idle_prompt"}))]
pub struct AgentNotification {
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub host_surface: String,
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub host_session_id: String,
    pub kind: NotificationKind,
}

/// Whether a session's agent is there: `working` while it runs a turn,
/// `stalled` while it runs one but no hook event came for the broker's
/// `--stall-after` (default 10 minutes; the next event clears it; time alone
/// never releases its turn), `waiting` while it is idle and attached (a
/// parked claim, or between turns), `away` after its session ended or when
/// no host was heard from for 10 minutes while it was not working; and, in
/// a session's projection, `asking` while a permission request of the
/// session is pending (the agent waits for a person: "waiting for you").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(rename_all = "snake_case")]
pub enum AgentState {
    Working,
    Stalled,
    Waiting,
    Away,
    /// Shown, never stored or reported: the agent stopped to ask (a tool's
    /// approval, a question, its plan) and a request is pending.
    Asking,
}

impl AgentState {
    /// The wire name, as the event log stores it.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentState::Working => "working",
            AgentState::Stalled => "stalled",
            AgentState::Waiting => "waiting",
            AgentState::Away => "away",
            AgentState::Asking => "asking",
        }
    }
}

/// A session's agent presence, as the projection shows it (content-free).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct AgentPresence {
    pub state: AgentState,
    /// Since when (RFC 3339): the report that changed it, or, for `away`
    /// after silence, 10 minutes after the host was last heard from.
    pub since: String,
    /// How a message sent now reaches the agent.
    #[serde(default = "Delivery::later")]
    pub delivery: Delivery,
    /// While `working`: the tool the agent runs, by name (null: none), and
    /// since when (RFC 3339).
    #[serde(default)]
    #[schema(required = true)]
    pub tool: Option<String>,
    #[serde(default)]
    #[schema(required = true)]
    pub tool_since: Option<String>,
}

/// How a message sent now reaches the agent: `typed_now` (it waits at its
/// prompt and a waker on its host types the message in at once),
/// `end_of_turn` (it works: the message is delivered when the current turn
/// ends), `later` (it waits with no waker, or is away: when the agent next
/// ends a turn or comes back).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    TypedNow,
    EndOfTurn,
    Later,
}

impl Delivery {
    fn later() -> Self {
        Delivery::Later
    }
}

/// `POST /v1/sessions/{session_id}/agent-state`, by the host: what its agent is doing.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"host_surface": "claude-code", "host_session_id": "host-abc", "state": "waiting"}))]
pub struct ReportAgentState {
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub host_surface: String,
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub host_session_id: String,
    /// The agent's state; may be left out only by a report of `typing_in`
    /// alone (a waker says it is there, the state stands).
    #[serde(default)]
    pub state: Option<AgentState>,
    /// `true`: a waker on the host (`loopx run`, or the tmux waker the hooks
    /// start) types queued messages into the agent while it waits at its
    /// prompt, and says so again at least every minute; `false`: it
    /// stopped. Each such report is also a sign of life of the agent, whose
    /// process the waker watches. Shown as the presence's `delivery`.
    #[serde(default)]
    pub typing_in: Option<bool>,
    /// With `working` only: the tool the agent runs now, by name only
    /// (`Bash`, `Edit`, an MCP tool's name; never its input), from its
    /// PreToolUse hook; an empty string: the tool ended (PostToolUse). The
    /// broker writes a change of tool at most once per 2 s per session, so a
    /// tool loop costs no row per call; the shown tool may lag that much.
    #[serde(default)]
    pub tool: Option<String>,
    /// With `working` only: the claim whose turn the agent works on, said by
    /// its holder. A holder that names its claim promises to say so again at
    /// least every minute (`loopx mcp` does, while a turn is delivered and
    /// unanswered); once it has been silent for the broker's
    /// `--holder-silence` (default 5 minutes), the broker releases the claim:
    /// its turn goes back to the head of the queue, and a late completion
    /// from it is fenced. Naming a claim that is no longer the session's
    /// active one changes nothing but the presence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub claim_id: Option<String>,
    /// With `working` only: the prompt the person at the agent's terminal
    /// just submitted (its UserPromptSubmit hook), recorded as a turn of
    /// `origin: "terminal"`, in its place among the session's turns: never
    /// queued or claimed, it delays no message. A terminal turn still open
    /// (never answered) is cancelled `unanswered` first; the same prompt as
    /// the open turn's again is a replay and records nothing. 1 to 65,536
    /// bytes.
    #[serde(default)]
    pub prompt: Option<String>,
    /// The agent's last message at the end of its turn (its Stop hook): the
    /// answer of the open terminal turn, if one is open (else nothing
    /// happens). A blank one cancels it `unanswered`. With `working` or
    /// `waiting`.
    #[serde(default)]
    pub answer: Option<String>,
    /// With `waiting` only: the person interrupted the agent mid-turn (Esc,
    /// Ctrl-C), which ends a turn with no Stop hook; a waker on the host
    /// reads it off the agent's own transcript. If the agent is shown
    /// working, the LoopX turn it worked on (the session's active claim)
    /// and the open terminal turn are cancelled `interrupted` (the claim is
    /// spent: a late completion from it is fenced, 409 `not_claimed`), and
    /// the agent waits. An agent shown waiting already: only the report.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
}

impl ReportAgentState {
    /// A report of the host identity saying `state` and nothing else (the
    /// other fields set by the caller).
    pub fn of(
        host_surface: impl Into<String>,
        host_session_id: impl Into<String>,
        state: Option<AgentState>,
    ) -> Self {
        ReportAgentState {
            host_surface: host_surface.into(),
            host_session_id: host_session_id.into(),
            state,
            typing_in: None,
            tool: None,
            claim_id: None,
            prompt: None,
            answer: None,
            interrupted: false,
        }
    }
}

/// `POST .../permission-requests/{request_id}/withdraw`, by the host: nobody
/// answered in time, the agent asks at its terminal instead.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"host_surface": "claude-code", "host_session_id": "host-abc"}))]
pub struct WithdrawPermission {
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub host_surface: String,
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub host_session_id: String,
    /// The person answered at the agent's terminal first: the request is
    /// `expired` with `answered_via: "terminal"` (default false: nobody
    /// answered in time).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub answered_at_terminal: bool,
}

/// Why a turn was cancelled: its session closed; (a `terminal` turn only)
/// the agent never answered it: a new prompt came first, or it stopped
/// with nothing to say; or the person at the terminal interrupted the agent
/// while it worked on the turn (Esc, Ctrl-C: HOOKS.md "The terminal's real
/// life").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(rename_all = "snake_case")]
pub enum CancelReason {
    SessionClosed,
    Unanswered,
    Interrupted,
}

/// `POST /v1/agent-threads`: the exact tuple a host session registers.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"goal_id": "g-1", "agent_id": "agent-7", "host_surface": "codex-cli", "host_session_id": "host-abc"}))]
pub struct RegisterAgentThread {
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub goal_id: String,
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub agent_id: String,
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub host_surface: String,
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub host_session_id: String,
}

/// The registration, without the host session id.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[schema(example = json!({"registered": true, "goal_id": "g-1", "agent_id": "agent-7", "host_surface": "codex-cli"}))]
pub struct Registered {
    /// Always true.
    #[schema(schema_with = always_true)]
    pub registered: bool,
    pub goal_id: String,
    pub agent_id: String,
    pub host_surface: String,
}

/// `POST /v1/sessions`: bind an attached session to a registered host session.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"goal_id": "g-1", "agent_id": "agent-7", "host_surface": "codex-cli", "host_session_id": "host-abc", "executor_endpoint_id": "exec-laptop", "dry_run": false}))]
pub struct BindRequest {
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub goal_id: String,
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub agent_id: String,
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub host_surface: String,
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub host_session_id: String,
    /// The executor's label; must differ from `agent_id`.
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub executor_endpoint_id: String,
    /// The terminal the agent runs in, as its host names it: an opaque
    /// token, the same for every host session started there (the hooks
    /// send a digest of the tmux pane, the `loopx run`, or the agent
    /// process). Binding a new host session from the terminal of an open
    /// session of the same goal, agent, host surface and executor continues
    /// that session (HOOKS.md "The terminal's real life": `/clear`,
    /// `/compact`, a resume, a restart): in one transaction the old session
    /// closes with `continued_in` naming the new one, and its queued
    /// messages (a claimed one released first), Lark link and approvers
    /// move to the new one, in order, keeping their `seq` (the new
    /// session's numbering goes on from the old one's); its pending
    /// permission requests expire and its open terminal turn is cancelled
    /// `unanswered`. Two terminals (two panes) stay two sessions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub terminal: Option<String>,
    /// Validate everything and write nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// What an attached session can do. `live_steering` is false: requests that
/// need it fail closed.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct Capabilities {
    pub session_queue: bool,
    pub bounded_claim_wait: bool,
    pub reply_readback: bool,
    pub live_steering: bool,
}

impl Capabilities {
    pub const ATTACHED: Capabilities = Capabilities {
        session_queue: true,
        bounded_claim_wait: true,
        reply_readback: true,
        live_steering: false,
    };
}

/// The content-free session projection: these are all its fields.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[schema(example = json!({"session_id": "ses_01JD8X5Z2R9V6Q3K4M7N8P0A1B", "goal_id": "g-1", "agent_id": "agent-7", "executor_endpoint_id": "exec-laptop", "host_surface": "codex-cli", "capabilities": {"session_queue": true, "bounded_claim_wait": true, "reply_readback": true, "live_steering": false}, "state": "open", "created_at": "2026-11-30T10:00:00.000Z", "closed_at": null, "agent": {"state": "waiting", "since": "2026-11-30T10:00:02.000Z", "delivery": "typed_now", "tool": null, "tool_since": null}}))]
pub struct Session {
    pub session_id: String,
    pub goal_id: String,
    pub agent_id: String,
    pub executor_endpoint_id: String,
    pub host_surface: String,
    pub capabilities: Capabilities,
    pub state: SessionState,
    pub created_at: String,
    /// Null while the session is open.
    #[schema(required = true)]
    pub closed_at: Option<String>,
    /// Whether the session's agent is there.
    pub agent: AgentPresence,
    /// Closed because the same terminal's next host session (after
    /// `/clear`, `/compact`, a resume or a restart) continues it in this
    /// session, which took its queued messages, Lark link and approvers
    /// (HOOKS.md "The terminal's real life"). Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continued_in: Option<String>,
    /// The session this one continues: its terminal's previous host
    /// session's. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continued_from: Option<String>,
}

/// A dry-run bind's preview: the existing session, or what a bind would
/// create (with `session_id` and `created_at` null).
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct SessionPreview {
    /// Null in a preview of a session the bind would create.
    #[schema(required = true)]
    pub session_id: Option<String>,
    pub goal_id: String,
    pub agent_id: String,
    pub executor_endpoint_id: String,
    pub host_surface: String,
    pub capabilities: Capabilities,
    pub state: SessionState,
    /// Null in a preview of a session the bind would create.
    #[schema(required = true)]
    pub created_at: Option<String>,
    #[schema(required = true)]
    pub closed_at: Option<String>,
}

/// The answer to a dry-run bind.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct BindPreview {
    /// Always true.
    #[schema(schema_with = always_true)]
    pub dry_run: bool,
    pub would_create: bool,
    pub session: SessionPreview,
}

/// `GET /v1/sessions` filters and paging.
#[derive(Debug, Clone, Default, Deserialize, Serialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListSessions {
    /// Only sessions in this state.
    pub state: Option<SessionState>,
    /// Only sessions of this goal.
    #[param(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub goal_id: Option<String>,
    /// Only sessions of this agent.
    #[param(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub agent_id: Option<String>,
    /// Page size, 1 to 500 (default 100).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// A page of sessions, oldest first.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct SessionList {
    pub sessions: Vec<Session>,
    /// Pass as `cursor` for the next page; null on the last page.
    #[schema(required = true)]
    pub next_cursor: Option<String>,
}

/// The Lark message a turn answers, for the reply path.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LarkRef {
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub chat_id: String,
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub message_id: String,
}

/// `POST /v1/sessions/{session_id}/messages`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"origin": "web", "text": "Please summarise the failing test.", "client_message_id": "web-1", "ingress": "session_queue"}))]
pub struct EnqueueRequest {
    pub origin: Origin,
    /// 1 byte to 64 KiB of UTF-8.
    #[schema(min_length = 1, max_length = 65536)]
    pub text: String,
    /// Makes the enqueue idempotent for the life of the session.
    #[serde(default)]
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub client_message_id: Option<String>,
    #[serde(default)]
    pub ingress: Ingress,
    /// Only with `origin: "lark"`.
    #[serde(default)]
    pub lark: Option<LarkRef>,
    /// The files sent with the message (the multipart route's `file`
    /// parts, their bytes stored with the turn); never read from JSON.
    #[serde(skip)]
    #[schema(ignore)]
    pub attachments: Vec<crate::attachments::stored::Stored>,
}

/// The queued turn (or, with `duplicate: true`, the turn an earlier request queued).
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[schema(example = json!({"turn_id": "turn_01JD8X6A0B1C2D3E4F5G6H7J8K", "seq": 1, "state": "queued", "origin": "web", "enqueued_at": "2026-11-30T10:00:01.000Z", "duplicate": false}))]
pub struct Enqueued {
    pub turn_id: String,
    pub seq: i64,
    /// `queued` on a first enqueue; on a replay, the turn's state now.
    pub state: TurnState,
    pub origin: Origin,
    pub enqueued_at: String,
    pub duplicate: bool,
}

/// `POST /v1/sessions/{session_id}/claims`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"host_surface": "codex-cli", "host_session_id": "host-abc", "claim_id": "claim-1", "wait_seconds": 5}))]
pub struct ClaimRequest {
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub host_surface: String,
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub host_session_id: String,
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub claim_id: String,
    /// Seconds to park while the queue is empty; values above 1800 are capped at 1800.
    #[serde(default)]
    #[schema(minimum = 0)]
    pub wait_seconds: u64,
}

/// The claimed turn, with its content.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct ClaimedTurn {
    pub turn_id: String,
    pub seq: i64,
    pub origin: Origin,
    pub text: String,
    pub enqueued_at: String,
    /// How many claims this turn has had: 1, then 2 after a release, …
    pub attempt: i64,
    /// The files sent with the message, in order; absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
}

/// A file sent with a message: what it is, and where the host or the owner
/// downloads it (`download`, a path on the broker, with the owner token).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[schema(example = json!({"position": 0, "name": "shot.png", "content_type": "image/png", "declared_type": "image/png", "size": 12345, "sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "download": "/v1/sessions/ses_01JD8X5Z2R9V6Q3K4M7N8P0A1B/turns/turn_01JD8X6A0B1C2D3E4F5G6H7J8K/attachments/0"}))]
pub struct Attachment {
    /// 0, 1, … in the order the files were sent.
    pub position: u32,
    /// The sender's file name made safe: its last path component, without
    /// control characters or leading dots, at most 200 bytes; `file` when
    /// nothing is left.
    pub name: String,
    /// What the download is served as: `image/png`, `image/jpeg`,
    /// `image/gif` or `image/webp` when the bytes start like one (sniffed,
    /// whatever was declared), else `application/octet-stream`.
    pub content_type: String,
    /// The type the sender declared (kept, never trusted).
    pub declared_type: String,
    /// Bytes.
    pub size: u64,
    /// The SHA-256 of the bytes, lowercase hex.
    pub sha256: String,
    /// `GET` this path (owner token) for the bytes.
    pub download: String,
}

/// A claim's answer: a turn, or (after a wait) nothing.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(untagged)]
pub enum ClaimAnswer {
    Claimed(Claimed),
    NotClaimed(NotClaimed),
}

/// The claim holds a turn.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[schema(example = json!({"claimed": true, "session_id": "ses_01JD8X5Z2R9V6Q3K4M7N8P0A1B", "claim_id": "claim-1", "turn": {"turn_id": "turn_01JD8X6A0B1C2D3E4F5G6H7J8K", "seq": 1, "origin": "web", "text": "Please summarise the failing test.", "enqueued_at": "2026-11-30T10:00:01.000Z", "attempt": 1}, "turn_state": "claimed"}))]
pub struct Claimed {
    /// Always true: `claimed` tells the two answers apart.
    #[schema(schema_with = always_true)]
    pub claimed: bool,
    pub session_id: String,
    pub claim_id: String,
    pub turn: ClaimedTurn,
    /// The turn's state now: `claimed`, or on a replay `completed`.
    pub turn_state: TurnState,
}

/// The wait ended with no turn queued; the claim id is still unused.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[schema(example = json!({"claimed": false, "session_id": "ses_01JD8X5Z2R9V6Q3K4M7N8P0A1B", "waited_ms": 30000}))]
pub struct NotClaimed {
    /// Always false: `claimed` tells the two answers apart.
    #[schema(schema_with = always_false)]
    pub claimed: bool,
    pub session_id: String,
    pub waited_ms: u64,
}

/// `POST /v1/sessions/{session_id}/turns/{turn_id}/complete`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"host_surface": "codex-cli", "host_session_id": "host-abc", "claim_id": "claim-1", "completion_id": "done-1", "response": {"message": "The test fails because the fixture is stale."}}))]
pub struct CompleteRequest {
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub host_surface: String,
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub host_session_id: String,
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub claim_id: String,
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub completion_id: String,
    /// Up to 1 MiB.
    #[schema(value_type = TurnResponse)]
    pub response: serde_json::Map<String, Value>,
}

/// The completion receipt.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[schema(example = json!({"completed": true, "session_id": "ses_01JD8X5Z2R9V6Q3K4M7N8P0A1B", "turn_id": "turn_01JD8X6A0B1C2D3E4F5G6H7J8K", "claim_id": "claim-1", "completion_id": "done-1", "completed_at": "2026-11-30T10:00:05.000Z", "replayed": false}))]
pub struct Receipt {
    /// Always true.
    #[schema(schema_with = always_true)]
    pub completed: bool,
    pub session_id: String,
    pub turn_id: String,
    pub claim_id: String,
    pub completion_id: String,
    pub completed_at: String,
    pub replayed: bool,
}

/// `POST /v1/sessions/{session_id}/claims/{claim_id}/release`: by the host
/// (`host_surface` and `host_session_id`), or by the owner (`"by": "owner"`
/// alone), who can always free a session whose agent is gone.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"host_surface": "codex-cli", "host_session_id": "host-abc"}))]
pub struct ReleaseRequest {
    /// The host's surface (with `host_session_id`); not with `by`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub host_surface: Option<String>,
    /// The host session's id (with `host_surface`); not with `by`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub host_session_id: Option<String>,
    /// `owner`: the owner releases, with no host identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<ReleasedBy>,
}

impl ReleaseRequest {
    /// A release by the host.
    pub fn host(host_surface: impl Into<String>, host_session_id: impl Into<String>) -> Self {
        ReleaseRequest {
            host_surface: Some(host_surface.into()),
            host_session_id: Some(host_session_id.into()),
            by: None,
        }
    }

    /// A release by the owner.
    pub fn owner() -> Self {
        ReleaseRequest {
            by: Some(ReleasedBy::Owner),
            ..ReleaseRequest::default()
        }
    }
}

/// Who releases without a host identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReleasedBy {
    Owner,
}

/// The released turn is back at the head of the queue.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[schema(example = json!({"released": true, "turn_id": "turn_01JD8X6A0B1C2D3E4F5G6H7J8K"}))]
pub struct Released {
    /// Always true.
    #[schema(schema_with = always_true)]
    pub released: bool,
    pub turn_id: String,
}

/// The content-bearing turn readback.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[schema(example = json!({"turn_id": "turn_01JD8X6A0B1C2D3E4F5G6H7J8K", "session_id": "ses_01JD8X5Z2R9V6Q3K4M7N8P0A1B", "seq": 1, "origin": "web", "text": "Please summarise the failing test.", "state": "completed", "enqueued_at": "2026-11-30T10:00:01.000Z", "claimed_at": "2026-11-30T10:00:02.000Z", "completed_at": "2026-11-30T10:00:05.000Z", "response": {"message": "The test fails because the fixture is stale."}, "cancel_reason": null, "reply": null}))]
pub struct Turn {
    pub turn_id: String,
    pub session_id: String,
    pub seq: i64,
    pub origin: Origin,
    pub text: String,
    pub state: TurnState,
    pub enqueued_at: String,
    /// Null until the turn is claimed.
    #[schema(required = true)]
    pub claimed_at: Option<String>,
    /// Null until the turn is completed.
    #[schema(required = true)]
    pub completed_at: Option<String>,
    /// The host's response, as given; null until the turn is completed.
    #[schema(value_type = Option<TurnResponse>, required = true)]
    pub response: Option<Value>,
    /// Null unless the turn is cancelled.
    #[schema(required = true)]
    pub cancel_reason: Option<CancelReason>,
    /// For a turn from Lark, once completed: the reply's delivery; else null.
    #[serde(default)]
    #[schema(required = true)]
    pub reply: Option<ReplyStatus>,
    /// The files sent with the message, in order; absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
}

/// `GET /v1/sessions/{session_id}/turns` paging.
#[derive(Debug, Clone, Default, Deserialize, Serialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListTurns {
    /// Turns with a larger `seq` (oldest first).
    #[param(minimum = 0)]
    pub after_seq: Option<i64>,
    /// Turns with a smaller `seq`: the page just before it, still oldest first.
    #[param(minimum = 1)]
    pub before_seq: Option<i64>,
    /// Page size, 1 to 200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
}

/// A page of turns in `seq` order.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct TurnList {
    pub turns: Vec<Turn>,
    /// More turns lie beyond the page (after it, or before it with `before_seq`).
    pub has_more: bool,
}

/// `POST /v1/sessions/{session_id}/close`: an empty body, `{}`,
/// `{"release_active_claim": true}` or `{"if_idle": true}`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"release_active_claim": true}))]
pub struct CloseRequest {
    /// Release the session's active claim first (its turn is then cancelled
    /// with the queued ones) instead of refusing with 409 `claim_active`.
    #[serde(default)]
    pub release_active_claim: bool,
    /// Close only a session with nothing waiting: a queued message, or one
    /// delivered and unanswered (an active claim), answers 409
    /// `messages_waiting` and changes nothing. What the hooks send when
    /// the agent exits (HOOKS.md "The terminal's real life": a session that
    /// is over closes itself; one with messages waiting stays, for the
    /// agent to be resumed). Not with `release_active_claim`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub if_idle: bool,
}

/// `GET /healthz`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[schema(example = json!({"status": "ok"}))]
pub struct Health {
    pub status: String,
}

/// `PUT /v1/sessions/{session_id}/lark-link`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"chat_id": "oc_5ce6d572455d361153b7xx51da133945", "approvers": ["ou_84aad35d084aa403a838cf73ee18467"]}))]
pub struct LarkLinkRequest {
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub chat_id: String,
    /// The Lark open ids (`ou_…`) of the chat members who may answer the
    /// session's permission requests from the chat; absent or empty, nobody
    /// on Lark can (the Web page and the API still can). Each link replaces
    /// the list: send the whole list every time. A repeated id counts once.
    #[serde(default)]
    #[schema(value_type = Vec<LarkOpenId>, max_items = 50)]
    pub approvers: Vec<String>,
    /// `true`: each turn typed at the agent's terminal (`origin:
    /// "terminal"`) is also sent to the chat once answered, as one card
    /// (its prompt and the agent's answer, each cut to 2,000 characters),
    /// so the chat reads the whole conversation. Default `false`; each link
    /// replaces it (a `/link <code>` pairing keeps it for the same chat).
    #[serde(default)]
    pub terminal_turns: bool,
}

/// Which Lark chat feeds a session (`chat_id` null when none), and who on it
/// may answer permission requests.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[schema(example = json!({"session_id": "ses_01JD8X5Z2R9V6Q3K4M7N8P0A1B", "chat_id": "oc_5ce6d572455d361153b7xx51da133945", "approvers": ["ou_84aad35d084aa403a838cf73ee18467"], "terminal_turns": false}))]
pub struct LarkLink {
    pub session_id: String,
    /// Null when no chat is linked.
    #[schema(required = true)]
    pub chat_id: Option<String>,
    /// The open ids that may answer permission requests from the chat, in
    /// the order given; empty when none (or no chat is linked).
    #[schema(value_type = Vec<LarkOpenId>, max_items = 50)]
    pub approvers: Vec<String>,
    /// Whether the chat gets the turns typed at the agent's terminal
    /// (false when no chat is linked).
    #[serde(default)]
    pub terminal_turns: bool,
}

impl LarkLink {
    /// No chat linked.
    pub fn none(session_id: String) -> Self {
        Self {
            session_id,
            chat_id: None,
            approvers: Vec::new(),
            terminal_turns: false,
        }
    }
}

/// `POST /v1/sessions/{session_id}/lark-link/codes`: a one-time code that
/// links the Lark chat it is sent in to the session.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[schema(example = json!({"session_id": "ses_01JD8X5Z2R9V6Q3K4M7N8P0A1B", "code": "7K3M9QX2RT", "command": "/link 7K3M9QX2RT", "expires_at": "2026-11-30T10:10:00.000Z"}))]
pub struct LarkPairCode {
    pub session_id: String,
    /// Ten characters of Crockford's base 32 (50 random bits); case, `-`
    /// and blanks do not matter when it is typed.
    pub code: String,
    /// What to send to the bot: `/link <code>`.
    pub command: String,
    /// Ten minutes after it was made; it is good for one link before then.
    pub expires_at: String,
}

/// `POST /v1/devices/links`: a one-time sign-in code for a device. The
/// link to open on the device is `<base>/#link=<code>` (a fragment, so the
/// code reaches no proxy or server log).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[schema(example = json!({"code": "7K3M9QX2RT7K3M9QX2RT7K3M9Q", "expires_at": "2026-11-30T10:10:00.000Z"}))]
pub struct DeviceLink {
    /// 26 characters of Crockford's base 32 (130 random bits).
    pub code: String,
    /// Ten minutes after it was made; it signs in one device before then.
    pub expires_at: String,
}

/// `POST /v1/devices`: a sign-in code traded for a device credential.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"code": "7K3M9QX2RT7K3M9QX2RT7K3M9Q", "name": "Chrome on Android"}))]
pub struct SignIn {
    /// The code of a sign-in link (case does not matter).
    pub code: String,
    /// What the device is called in the list: 1 to 64 characters, no
    /// control character.
    pub name: String,
}

/// A device signed in: its credential, shown this once.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[schema(example = json!({"device_id": "dev_01JD8X5Z2R9V6Q3K4M7N8P0A1B", "name": "Chrome on Android", "token": "lxd_…"}))]
pub struct SignedIn {
    pub device_id: String,
    pub name: String,
    /// The device credential: `Authorization: Bearer <token>` on every
    /// `/v1` route but the devices' and the sign-in links'. Only its hash
    /// is stored.
    pub token: String,
}

/// A device signed in, as listed (never its credential).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct Device {
    pub device_id: String,
    pub name: String,
    pub created_at: String,
    /// When it was last seen (to the minute), or null.
    pub last_seen_at: Option<String>,
}

/// `GET /v1/devices`: the devices signed in, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct DeviceList {
    pub devices: Vec<Device>,
}

/// `GET /v1/push/key`: the broker's VAPID public key.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[schema(example = json!({"key": "BLn9b-VR0ca83knDNZ32dCHGyjJp-1riX9ZTN40MqV8K_LpQmLqxC_DoHvqvFXO_nGdAB4W9dogZb_sM-uV4JbY"}))]
pub struct PushKey {
    /// The uncompressed P-256 point, base64url: `PushManager.subscribe`'s
    /// `applicationServerKey`.
    pub key: String,
}

/// A browser's push subscription's keys, base64url, as `PushSubscription.toJSON()` gives them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PushKeys {
    /// The browser's P-256 public key (65 bytes, uncompressed).
    pub p256dh: String,
    /// The auth secret (16 bytes).
    pub auth: String,
}

/// `POST /v1/push/subscriptions`: a browser's push subscription.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"endpoint": "https://push.example.net/send/abc", "keys": {"p256dh": "BLn9b-VR0ca83knDNZ32dCHGyjJp-1riX9ZTN40MqV8K_LpQmLqxC_DoHvqvFXO_nGdAB4W9dogZb_sM-uV4JbY", "auth": "_ordMnz7uTCmrpBTeUV4Bw"}}))]
pub struct NewPushSubscription {
    /// The push service's URL for this browser: `https` (plain `http` only
    /// on loopback), at most 2048 bytes.
    pub endpoint: String,
    pub keys: PushKeys,
}

/// A push subscription, as stored (never its keys).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[schema(example = json!({"subscription_id": "psb_01JD8X5Z2R9V6Q3K4M7N8P0A1B", "endpoint": "https://push.example.net/send/abc", "created_at": "2026-11-30T10:00:00.000Z"}))]
pub struct PushSubscription {
    pub subscription_id: String,
    pub endpoint: String,
    pub created_at: String,
}

/// `GET /v1/push/subscriptions`: the caller's subscriptions, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct PushSubscriptionList {
    pub subscriptions: Vec<PushSubscription>,
}

/// A reply's delivery state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(rename_all = "snake_case")]
pub enum ReplyState {
    Pending,
    Sent,
    Failed,
}

/// Where a turn's answer goes back to, and how that went. A Lark answer is
/// sent as replies that render its Markdown: schema 2.0 interactive cards with
/// one `markdown` element (chosen over a `post` with `md`, which renders
/// neither headings nor tables), raw HTML escaped (`<`, `>` as entities), and
/// split below Lark's 30 KB card limit on block boundaries, code fences closed
/// and reopened at a cut, the parts numbered (`(1/3)`) and sent in order,
/// each with its own deterministic `uuid`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct ReplyStatus {
    /// Always `lark` today.
    pub channel: String,
    pub state: ReplyState,
    pub attempts: i64,
    /// The last failure, in words (never the answer's text); null when none.
    #[schema(required = true)]
    pub error: Option<String>,
}

/// A permission request's lifecycle: `pending`, then `allowed` or `denied`
/// by the first answer, or `expired` when its session closed first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(rename_all = "snake_case")]
pub enum PermissionState {
    Pending,
    Allowed,
    Denied,
    Expired,
}

impl PermissionState {
    /// The wire name, as the event log stores it (what [`wire`] gives, as a
    /// `&'static str` for the stores' binds).
    pub fn as_str(self) -> &'static str {
        match self {
            PermissionState::Pending => "pending",
            PermissionState::Allowed => "allowed",
            PermissionState::Denied => "denied",
            PermissionState::Expired => "expired",
        }
    }
}

/// An answer to a permission request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Behavior {
    Allow,
    Deny,
}

/// Who answered a permission request: the owner (bearer token: the Web page,
/// the API), an approver of the linked Lark chat, or the person at the
/// agent's terminal first (the request is then `expired`: the phone's
/// answer came too late).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(rename_all = "snake_case")]
pub enum AnsweredVia {
    Owner,
    Lark,
    Terminal,
}

/// What a permission request asks: a tool's use (`tool`), the agent's
/// questions with options (`question`, Claude Code's `AskUserQuestion`) or
/// approval of its plan (`plan`, `ExitPlanMode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PermissionKind {
    #[default]
    Tool,
    Question,
    Plan,
}

/// One question of a `question` request, as the agent asked it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Question {
    /// The question's text (at most 4,096 bytes); the answer is keyed by it.
    #[schema(min_length = 1, max_length = 4096)]
    pub question: String,
    /// A short label (at most 256 bytes).
    #[serde(default)]
    #[schema(max_length = 256)]
    pub header: String,
    /// Whether several options may be chosen.
    #[serde(default)]
    pub multi_select: bool,
    /// 1 to 8 options.
    #[schema(min_items = 1, max_items = 8)]
    pub options: Vec<QuestionOption>,
}

/// An option of a question.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuestionOption {
    /// At most 1,024 bytes.
    #[schema(min_length = 1, max_length = 1024)]
    pub label: String,
    /// At most 4,096 bytes.
    #[serde(default)]
    #[schema(max_length = 4096)]
    pub description: String,
}

/// One of the agent's "always allow" choices for a tool request, as a
/// person reads it; the host keeps the agent's own form and echoes it back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Suggestion {
    /// At most 1,024 bytes, e.g. "Always allow Bash(npm test) in this project".
    #[schema(min_length = 1, max_length = 1024)]
    pub label: String,
}

/// How an approved plan goes on: every edit accepted, or each one reviewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PlanMode {
    AcceptEdits,
    Default,
}

/// What was chosen with an answer beyond allow or deny, as read back:
/// content, like message text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChosenAnswer {
    /// The person's words to the agent (a denial's reason, a plan's
    /// feedback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// A question's answers: each question's text to the chosen labels
    /// (joined with ", ") or the person's own words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answers: Option<std::collections::BTreeMap<String, String>>,
    /// The index of the chosen "always allow" suggestion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suggestion: Option<u32>,
    /// How an approved plan goes on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<PlanMode>,
}

/// `POST /v1/sessions/{session_id}/permission-requests`, by the host: a tool
/// approval dialog of the agent CLI, relayed as is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"host_surface": "claude-code", "host_session_id": "host-abc", "request_id": "abcde", "tool_name": "Bash", "description": "Remove the build directory", "input_preview": "rm -rf build"}))]
pub struct CreatePermissionRequest {
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub host_surface: String,
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub host_session_id: String,
    /// Unique per session; the agent CLI's own id (Claude Code: five letters).
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub request_id: String,
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub tool_name: String,
    /// Up to 64 KiB; stored like message text.
    #[schema(max_length = 65536)]
    pub description: String,
    /// Up to 64 KiB; stored like message text, shown as plain preformatted text.
    #[schema(max_length = 65536)]
    pub input_preview: String,
    /// What it asks (default `tool`).
    #[serde(default)]
    pub kind: PermissionKind,
    /// A `question` request's questions: 1 to 4 (only for `question`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_items = 1, max_items = 4)]
    pub questions: Option<Vec<Question>>,
    /// A `plan` request's plan, Markdown, up to 64 KiB (only for `plan`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 65536)]
    pub plan: Option<String>,
    /// A `tool` request's "always allow" choices, in the agent's order: at
    /// most 8 (only for `tool`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_items = 8)]
    pub suggestions: Option<Vec<Suggestion>>,
}

/// A permission request as read back (content-bearing, like a turn).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[schema(example = json!({"request_id": "abcde", "session_id": "ses_01JD8X5Z2R9V6Q3K4M7N8P0A1B", "tool_name": "Bash", "description": "Remove the build directory", "input_preview": "rm -rf build", "state": "allowed", "created_at": "2026-11-30T10:00:01.000Z", "answered_at": "2026-11-30T10:00:09.000Z", "answered_via": "owner", "relayed_at": "2026-11-30T10:00:10.000Z", "kind": "tool", "suggestions": [{"label": "Always allow Bash(rm -rf build) in this project"}], "answer": {"suggestion": 0}}))]
pub struct PermissionRequest {
    pub request_id: String,
    pub session_id: String,
    pub tool_name: String,
    pub description: String,
    pub input_preview: String,
    pub state: PermissionState,
    pub created_at: String,
    /// When it was answered or expired (null while pending).
    #[schema(required = true)]
    pub answered_at: Option<String>,
    /// Who answered (null while pending and for an expired request).
    #[schema(required = true)]
    pub answered_via: Option<AnsweredVia>,
    /// When the host that made the request relayed its answer to the agent
    /// (null until then): a restarted host relays what is answered and not
    /// relayed, so every answer reaches the agent.
    #[serde(default)]
    #[schema(required = true)]
    pub relayed_at: Option<String>,
    /// What it asks.
    #[serde(default)]
    pub kind: PermissionKind,
    /// A `question` request's questions (absent for the other kinds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub questions: Option<Vec<Question>>,
    /// A `plan` request's plan, Markdown (absent for the other kinds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    /// A `tool` request's "always allow" choices (empty when none).
    #[serde(default)]
    pub suggestions: Vec<Suggestion>,
    /// What was chosen with the answer (null while pending, when expired,
    /// and for a plain allow or deny).
    #[serde(default)]
    #[schema(required = true)]
    pub answer: Option<ChosenAnswer>,
}

/// A session's permission requests: pending first, then newest first.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct PermissionList {
    pub permission_requests: Vec<PermissionRequest>,
}

/// `GET /v1/sessions/{session_id}/permission-requests` filter.
#[derive(Debug, Clone, Default, Deserialize, Serialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListPermissions {
    /// Only requests in this state (`pending`: what a restarted bridge waits for again).
    pub state: Option<PermissionState>,
}

/// `POST .../permission-requests/{request_id}/answer`: allow or deny, and
/// for a `question` its answers (an allow needs one for every question), for
/// a `tool` the index of an "always allow" suggestion, for a `plan` how it
/// goes on; `message` reaches the agent with a denial (a plan's feedback).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"behavior": "allow", "answers": {"Which database?": "PostgreSQL"}}))]
pub struct AnswerPermission {
    pub behavior: Behavior,
    /// Up to 4,096 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 4096)]
    pub message: Option<String>,
    /// A `question`'s answers: each question's text to the chosen labels
    /// (joined with ", ") or the person's own words (each 1 to 4,096 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answers: Option<std::collections::BTreeMap<String, String>>,
    /// An index into a `tool` request's `suggestions` (allow only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suggestion: Option<u32>,
    /// A `plan`'s way on (allow only; default `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<PlanMode>,
}

impl AnswerPermission {
    /// A plain allow or deny (a Lark button, `yes <id>`).
    pub fn plain(behavior: Behavior) -> Self {
        AnswerPermission {
            behavior,
            message: None,
            answers: None,
            suggestion: None,
            mode: None,
        }
    }
}

/// `POST .../permission-requests/{request_id}/relayed`, by the host.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"host_surface": "claude-code", "host_session_id": "host-abc"}))]
pub struct RelayedPermission {
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub host_surface: String,
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub host_session_id: String,
}

/// `POST .../permission-requests/{request_id}/wait`, by the host.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"host_surface": "claude-code", "host_session_id": "host-abc", "wait_seconds": 600}))]
pub struct WaitPermission {
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub host_surface: String,
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub host_session_id: String,
    /// Seconds to park while the request is pending; values above 1800 are capped at 1800.
    #[serde(default)]
    #[schema(minimum = 0)]
    pub wait_seconds: u64,
}

/// A value's wire name: the text serde gives a unit enumeration variant
/// (`web`, `claimed`, `queue_full`). The one helper for the contract's
/// enumerations as text, in columns, metric labels and command output.
pub fn wire(value: &impl Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(name)) => name,
        // Not an enumeration: its JSON text, so nothing is silently dropped.
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

/// The host's writeback authority: the exact host identity of a binding. The
/// store keeps it with the session, every host call presents it, and the
/// client commands take it as two flags. `Debug` never shows the host
/// session id (it stays in the local store, out of logs).
#[derive(Clone, PartialEq, Eq, clap::Args)]
pub struct HostIdentity {
    /// Which kind of host runs the agent session (e.g. codex-cli, claude-code, vscode).
    #[arg(long)]
    pub host_surface: String,
    /// The running host session's opaque id (stays in the local store).
    #[arg(long)]
    pub host_session_id: String,
}

impl std::fmt::Debug for HostIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostIdentity")
            .field("host_surface", &self.host_surface)
            .field("host_session_id", &format_args!("<redacted>"))
            .finish()
    }
}

impl From<Session> for SessionPreview {
    fn from(s: Session) -> Self {
        SessionPreview {
            session_id: Some(s.session_id),
            goal_id: s.goal_id,
            agent_id: s.agent_id,
            executor_endpoint_id: s.executor_endpoint_id,
            host_surface: s.host_surface,
            capabilities: s.capabilities,
            state: s.state,
            created_at: Some(s.created_at),
            closed_at: s.closed_at,
        }
    }
}

/// The longest Lark open id accepted as an approver.
pub const MAX_OPEN_ID_BYTES: usize = 64;

// Schemas the document gives to fields whose Rust type says less.

/// A schema with one allowed value (`const`), so a typed client can narrow a
/// union on it. utoipa has no attribute for `const`; JSON Schema 2020-12 (and
/// so OpenAPI 3.1) does.
pub(crate) fn constant(value: Value, schema_type: Type) -> Schema {
    let keyword: Extensions = [("const", value)].into_iter().collect();
    ObjectBuilder::new()
        .schema_type(schema_type)
        .extensions(Some(keyword))
        .build()
        .into()
}

/// For `#[schema(schema_with = …)]` on a field that is always `true`.
pub(crate) fn always_true() -> Schema {
    constant(json!(true), Type::Boolean)
}

/// For `#[schema(schema_with = …)]` on a field that is always `false`.
pub(crate) fn always_false() -> Schema {
    constant(json!(false), Type::Boolean)
}

/// A turn's response: the document's name for the JSON object a host
/// completes a turn with (the code keeps it as a JSON map, exactly as given).
pub struct TurnResponse;

impl PartialSchema for TurnResponse {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(
                "The host's response: a JSON object with at least a string `message` that is not blank (not empty, not only whitespace: 400 `invalid_request`); \
                 other fields are kept and read back exactly as given.",
            ))
            .property(
                "message",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .min_length(Some(1))
                    .pattern(Some(r"\S"))
                    .description(Some("The answer for the people in the chat: not blank.")),
            )
            .required("message")
            .additional_properties(Some(AdditionalProperties::FreeForm(true)))
            .examples([
                json!({"message": "The test fails because the fixture is stale.", "tokens": 812}),
            ])
            .into()
    }
}

impl ToSchema for TurnResponse {}

/// A Lark open id, as a chat link's approver (checked by
/// [`crate::permission::approvers`]).
pub struct LarkOpenId;

impl PartialSchema for LarkOpenId {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(4))
            .max_length(Some(MAX_OPEN_ID_BYTES))
            .pattern(Some(r"^ou_[0-9A-Za-z_-]+$"))
            .description(Some(
                "A Lark user's open id (`ou_…`), as in an event's `sender.sender_id.open_id`.",
            ))
            .into()
    }
}

impl ToSchema for LarkOpenId {}

/// One Server-Sent Event of a stream, as the document describes it: its
/// `event:` name (a constant), its `id:` when it has one, and its `data:`
/// line, JSON of the named schema (`contentMediaType` + `contentSchema`).
pub(crate) fn sse_event<Data: ToSchema>(name: &str, with_id: bool, description: &str) -> Schema {
    let content_schema: Extensions = [(
        "contentSchema",
        json!({"$ref": format!("#/components/schemas/{}", Data::name())}),
    )]
    .into_iter()
    .collect();
    let mut event = ObjectBuilder::new()
        .schema_type(Type::Object)
        .title(Some(format!("event: {name}")))
        .description(Some(description))
        .property("event", crate::model::constant(json!(name), Type::String))
        .required("event")
        .property(
            "data",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .content_media_type("application/json")
                .extensions(Some(content_schema)),
        )
        .required("data");
    if with_id {
        event = event
            .property(
                "id",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some("^[0-9]+$"))
                    .description(Some("The per-session event number: 1, 2, 3, …")),
            )
            .required("id");
    }
    event.build().into()
}

/// Lists `T` and what it refers to among the document's schemas, as a
/// derived `ToSchema` does for its fields.
pub(crate) fn register<T: ToSchema>(schemas: &mut Vec<(String, RefOr<Schema>)>) {
    schemas.push((T::name().into(), T::schema()));
    T::schemas(schemas);
}

/// A stream of events, described by the schema of one event: under OpenAPI
/// 3.1 a `text/event-stream` schema describes each event of the stream (what
/// 3.2 names `itemSchema`), and tools such as schemathesis check each event
/// against it.
pub(crate) fn sse_stream(description: &str, events: Vec<Schema>) -> RefOr<Schema> {
    events
        .into_iter()
        .fold(
            OneOfBuilder::new().description(Some(description)),
            |one_of, event| one_of.item(event),
        )
        .into()
}

/// A file's state in the working tree, as `git status` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileStatus {
    Modified,
    Added,
    Deleted,
    Renamed,
    Copied,
    TypeChanged,
    Unmerged,
    Untracked,
}

/// One changed file of a working tree, against `HEAD`: lines added and
/// removed; a binary file, or one whose diff is over 256 KiB or beyond the
/// report's 1 MiB (`truncated`), is listed with its counts only.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"path": "src/main.rs", "status": "modified", "added": 12, "removed": 3, "binary": false, "truncated": false}))]
pub struct ChangedFile {
    /// The path from the repository's root, `/`-separated.
    #[schema(min_length = 1, max_length = 4096)]
    pub path: String,
    pub status: FileStatus,
    #[serde(default)]
    pub added: u32,
    #[serde(default)]
    pub removed: u32,
    #[serde(default)]
    pub binary: bool,
    #[serde(default)]
    pub truncated: bool,
}

/// `POST /v1/sessions/{session_id}/changes`, by the host: the working tree
/// of its agent's directory, read with git by its hooks.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"host_surface": "claude-code", "host_session_id": "host-abc", "branch": "main", "head": "3f2a9c1e", "ahead": 1, "behind": 0, "files": [{"path": "src/main.rs", "status": "modified", "added": 1, "removed": 1, "binary": false, "truncated": false}], "diff": "diff --git a/src/main.rs b/src/main.rs\n--- a/src/main.rs\n+++ b/src/main.rs\n@@ -1 +1 @@\n-old\n+new\n", "turn_files": ["src/main.rs"]}))]
pub struct ReportChanges {
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub host_surface: String,
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1F\x7F-\x9F]+$"
    )]
    pub host_session_id: String,
    /// The branch checked out; null on a detached `HEAD`.
    #[serde(default)]
    #[schema(max_length = 256)]
    pub branch: Option<String>,
    /// The commit `HEAD` names; null before the first commit.
    #[serde(default)]
    #[schema(max_length = 64)]
    pub head: Option<String>,
    /// Commits ahead of and behind the branch's upstream (0 without one).
    #[serde(default)]
    pub ahead: u32,
    #[serde(default)]
    pub behind: u32,
    /// At most 1,000 files.
    #[serde(default)]
    pub files: Vec<ChangedFile>,
    /// The unified diff (`--unified=3`) of the files not listed `binary`
    /// or `truncated`, one `diff --git` section each; at most 1 MiB.
    #[serde(default)]
    pub diff: String,
    /// The paths (from the repository's root) the tools of the turn the
    /// agent works on wrote so far (its `Edit`, `Write`, `MultiEdit`,
    /// `NotebookEdit`, Codex's `apply_patch`); at most 1,000.
    #[serde(default)]
    pub turn_files: Vec<String>,
}

/// A file a turn's tools wrote, with its lines added and removed in the
/// working tree as of the turn's last report.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct TurnFile {
    pub path: String,
    pub added: u32,
    pub removed: u32,
}

/// What a turn's tools changed: its files and their totals.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct TurnChanges {
    pub turn_id: String,
    pub files: Vec<TurnFile>,
    pub added: u32,
    pub removed: u32,
}

/// `GET /v1/sessions/{session_id}/changes`: the latest report, and what
/// the session's latest turns changed.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[schema(example = json!({"session_id": "ses_01JD8X5Z2R9V6Q3K4M7N8P0A1B", "reported_at": "2026-11-30T10:00:09.000Z", "branch": "main", "head": "3f2a9c1e", "ahead": 1, "behind": 0, "files": [{"path": "src/main.rs", "status": "modified", "added": 1, "removed": 1, "binary": false, "truncated": false}], "added": 1, "removed": 1, "diff": "diff --git a/src/main.rs b/src/main.rs\n", "turns": [{"turn_id": "trn_01JD8X5Z2R9V6Q3K4M7N8P0A1C", "files": [{"path": "src/main.rs", "added": 1, "removed": 1}], "added": 1, "removed": 1}]}))]
pub struct Changes {
    pub session_id: String,
    pub reported_at: String,
    #[schema(required = true)]
    pub branch: Option<String>,
    #[schema(required = true)]
    pub head: Option<String>,
    pub ahead: u32,
    pub behind: u32,
    pub files: Vec<ChangedFile>,
    /// The files' lines added and removed, all together.
    pub added: u32,
    pub removed: u32,
    pub diff: String,
    /// The session's latest 50 turns whose tools wrote files, newest first.
    pub turns: Vec<TurnChanges>,
}

/// `GET /v1/sessions/{session_id}/changes/files/{path}`: one file of the
/// latest report, with its section of the diff (empty for a file listed
/// `binary` or `truncated`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct FileChanges {
    #[serde(flatten)]
    pub file: ChangedFile,
    pub reported_at: String,
    pub diff: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_names_are_the_serde_names_and_debug_hides_the_host_session_id() {
        assert_eq!(wire(&TurnState::Claimed), "claimed");
        assert_eq!(wire(&crate::error::ErrorCode::QueueFull), "queue_full");
        for state in [
            PermissionState::Pending,
            PermissionState::Allowed,
            PermissionState::Denied,
            PermissionState::Expired,
        ] {
            assert_eq!(wire(&state), state.as_str());
        }
        let host = HostIdentity {
            host_surface: "codex-cli".into(),
            host_session_id: "host-secret-1".into(),
        };
        let shown = format!("{host:?}");
        assert!(
            shown.contains("codex-cli") && !shown.contains("host-secret-1"),
            "{shown}"
        );
    }
}

/// How the Lark connector receives events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LarkEvents {
    /// The connector is not configured.
    Off,
    /// Lark posts events to `POST /v1/connectors/lark/events`.
    Webhook,
    /// The broker holds a WebSocket to Lark (outbound HTTPS only).
    LongConnection,
}

/// The state of the long connection to Lark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LarkConnectionState {
    /// Asking Lark for an endpoint, or opening the WebSocket.
    Connecting,
    /// Connected: events arrive.
    Connected,
    /// The connection failed or closed; it is tried again (`reason` says why).
    Retrying,
    /// Lark refused the app for good (bad credentials, wrong domain, 403, too
    /// many connections): the connector stopped, the rest of the broker
    /// serves on. Fix the configuration and restart.
    Fatal,
    /// The broker is shutting down.
    Stopped,
}

/// The Lark connector, as the broker sees it now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"events": "long_connection", "state": "retrying", "reason": "Lark closed the connection", "since": "2026-12-02T03:15:50.000Z", "reconnects": 1}))]
pub struct LarkConnector {
    pub events: LarkEvents,
    /// The long connection's state; null unless `events` is `long_connection`.
    #[schema(required = true)]
    pub state: Option<LarkConnectionState>,
    /// Why it is retrying or fatal (never a secret or a message's text).
    #[schema(required = true)]
    pub reason: Option<String>,
    /// When it entered this state (RFC 3339); null unless `events` is
    /// `long_connection`.
    #[schema(required = true)]
    pub since: Option<String>,
    /// Connections lost or refused since the broker started.
    pub reconnects: u64,
}
