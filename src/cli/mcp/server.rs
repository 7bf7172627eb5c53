//! The MCP side of `loopx mcp` (rmcp over stdio): the `initialize` answer
//! (capabilities, instructions, the 2025 protocol versions only), the tools,
//! and in channel mode the loop that keeps one claim parked and pushes each
//! claimed turn as a `notifications/claude/channel` event. Broker calls go
//! through [`Host`]; nothing here writes to stdout but rmcp's JSON-RPC.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use backon::{BackoffBuilder, Retryable};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, CustomNotification,
    Implementation, InitializeRequestParams, InitializeResult, JsonObject, ListToolsResult,
    PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig, ServerNotification,
    Tool, ToolsCapability,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{ErrorData, Peer, RoleServer, ServerHandler};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::watch;

use super::host::{Held, Host, Problem, backoff, log_problem};
use super::permissions::{self, PermissionRequestParams, Relay};
use crate::model::wire;

/// Claude Code registers channels only on these (MCP.md): a newer version
/// would quietly turn the channel off.
const PROTOCOL_VERSIONS: &[ProtocolVersion] =
    &[ProtocolVersion::V_2025_06_18, ProtocolVersion::V_2025_11_25];
/// The channel capability and notification method of Claude Code.
const CHANNEL: &str = "claude/channel";
const CHANNEL_EVENT: &str = "notifications/claude/channel";
/// How long `initialize` waits for the first bind attempt (a broker that
/// does not answer must not hold up the host's start; Codex allows 10 s).
const FIRST_BIND: Duration = Duration::from_secs(2);
/// How often channel mode checks that the turn it pushed is still its own.
const HELD_CHECK: Duration = Duration::from_secs(15);
/// The parked claim of channel mode: the broker's 30-minute cap.
const PARK_SECONDS: u64 = 1800;
/// `wait_for_message` stays inside Codex's 60 s tool timeout.
const MAX_WAIT_SECONDS: u64 = 50;
const DEFAULT_WAIT_SECONDS: u64 = 45;

/// Channel mode (Claude Code) or tools only (Codex, any MCP host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Channel,
    ToolsOnly,
}

/// The MCP server of one host session.
#[derive(Clone)]
pub struct Server {
    host: Arc<Host>,
    mode: Mode,
    name: String,
    channel_started: Arc<AtomicBool>,
    relay: Relay,
    /// True once the first bind attempt at start is over.
    first_bind: Arc<watch::Sender<bool>>,
    /// One `wait_for_message` at a time: concurrent calls take turns.
    waiting: Arc<tokio::sync::Mutex<()>>,
}

impl Server {
    pub fn new(host: Arc<Host>, mode: Mode, name: String) -> Self {
        Server {
            host,
            mode,
            name,
            channel_started: Arc::new(AtomicBool::new(false)),
            relay: Relay::default(),
            first_bind: Arc::new(watch::Sender::new(false)),
            waiting: Arc::default(),
        }
    }

    pub fn host(&self) -> Arc<Host> {
        self.host.clone()
    }

    /// Binds at start, in both modes (bind mode registers and binds, reusing
    /// the open session), retrying with backoff while the broker is away, so
    /// the session is in the list by the time `initialize` is answered.
    pub fn bind_at_start(&self) {
        let (host, first_bind) = (self.host.clone(), self.first_bind.clone());
        tokio::spawn(async move {
            let mut delays = backoff().build();
            loop {
                let bound = host.session_id().await;
                first_bind.send_replace(true);
                match bound {
                    Ok(_) => return,
                    Err(problem) if !problem.is_transient() => {
                        tracing::warn!("cannot bind: {}", problem.log_line());
                        return;
                    }
                    Err(problem) => {
                        let delay = delays.next().unwrap_or(Duration::from_secs(30));
                        log_problem(&problem, delay);
                        tokio::time::sleep(delay).await;
                    }
                }
            }
        });
    }

    pub fn broker_url(&self) -> &str {
        self.host.broker_url()
    }

    fn instructions(&self) -> String {
        let session = self
            .host
            .known_session_id()
            .map(|id| format!(" (chat_id {id})"))
            .unwrap_or_default();
        match self.mode {
            Mode::Channel => format!(
                "People write to this session through LoopX{session}: from its Web page or a linked \
                 Lark chat. Each message arrives as a <channel source=\"{name}\" chat_id=\"…\" \
                 turn_id=\"…\" seq=\"…\" origin=\"…\" sent_at=\"…\"> event whose body is the \
                 message. chat_id is the LoopX session, turn_id the message, seq its place in the \
                 session's queue, origin where it was written (web or lark), sent_at when. \
                 Messages come one at a time: the next arrives after you answer this one. The \
                 sender never sees your transcript: answer each message once by calling the reply \
                 tool with its chat_id and turn_id and your answer as text. Only reply reaches the \
                 sender.",
                name = self.name
            ),
            Mode::ToolsOnly => format!(
                "People write to this session through LoopX{session}: from its Web page or a linked \
                 Lark chat. Call wait_for_message to receive the next message; it waits up to \
                 wait_seconds and answers claimed:false when nothing came, then call it again. \
                 Answer each message once with reply (its chat_id and turn_id, your answer as \
                 text): the sender never sees your transcript, only reply reaches them. If you \
                 cannot answer a message, release hands it back."
            ),
        }
    }

    fn tools(&self) -> Vec<Tool> {
        let mut tools = vec![reply_tool()];
        if self.mode == Mode::ToolsOnly {
            tools.insert(0, wait_tool());
            tools.push(release_tool());
        }
        tools
    }

    async fn call(&self, name: &str, arguments: JsonObject) -> Result<CallToolResult, ToolError> {
        match (name, self.mode) {
            ("reply", _) => {
                let a: ReplyArgs = arguments_of(arguments)?;
                // The broker's own rule, checked before anything is sent.
                crate::decide::turn::answer_text(Some(&Value::String(a.text.clone()))).map_err(
                    |e| Problem::Local(format!("the reply was not sent: {}", e.message)),
                )?;
                // A replay answers the same: the sender got the answer once.
                self.host
                    .reply(&a.chat_id, a.turn_id.as_deref(), &a.text)
                    .await
                    .map_err(reply_problem)?;
                Ok(text_result("sent".into()))
            }
            ("wait_for_message", Mode::ToolsOnly) => {
                let a: WaitArgs = arguments_of(arguments)?;
                let wait = a.wait_seconds.unwrap_or(DEFAULT_WAIT_SECONDS);
                if wait > MAX_WAIT_SECONDS {
                    return Err(ToolError::Invalid(format!(
                        "wait_seconds must be 0 to {MAX_WAIT_SECONDS}, not {wait}"
                    )));
                }
                let _one_at_a_time = self.waiting.lock().await;
                // A message delivered and not answered yet: wait for its
                // answer first (the queue hands out one at a time), and never
                // deliver it twice.
                if let Some(held) = self.host.unanswered() {
                    let answered = self.host.answered(&held.turn.turn_id);
                    if tokio::time::timeout(Duration::from_secs(wait), answered)
                        .await
                        .is_err()
                    {
                        return Err(Problem::Local(format!(
                            "message {} (seq {}) was delivered earlier and is not answered yet: \
                             reply to it (or release it) before waiting for the next",
                            held.turn.turn_id, held.turn.seq
                        ))
                        .into());
                    }
                }
                let mut held = self.host.claim(wait).await?;
                let mut images = Vec::new();
                if let Some(held) = &mut held {
                    let (text, saved) = self.host.delivered(held).await;
                    held.turn.text = text;
                    images = image_blocks(&saved);
                }
                let session_id = self.host.session_id().await?;
                let mut result =
                    CallToolResult::structured(message_json(&session_id, held.as_ref()));
                result.content.extend(images);
                Ok(result)
            }
            ("release", Mode::ToolsOnly) => {
                let a: ReleaseArgs = arguments_of(arguments)?;
                let released = self.host.release(Some(&a.turn_id)).await?;
                Ok(text_result(format!(
                    "released turn {}: it is back at the head of the queue",
                    released.turn_id
                )))
            }
            (other, _) => Err(ToolError::Invalid(format!("no tool named {other}"))),
        }
    }

    /// Channel mode: keeps one claim parked; pushes each claimed turn once and
    /// waits for its reply before parking the next claim.
    async fn channel_loop(self, peer: Peer<RoleServer>) {
        loop {
            let claimed = (|| self.host.claim(PARK_SECONDS))
                .retry(backoff())
                .when(|p| p.code() != Some("session_closed"))
                .notify(log_problem)
                .await;
            let held = match claimed {
                Ok(Some(held)) => held,
                Ok(None) => continue,
                Err(problem) => {
                    tracing::warn!("{problem}; no more messages will arrive");
                    return;
                }
            };
            let text = self.host.delivered_text(&held).await;
            let mut delivered = held.clone();
            delivered.turn.text = text;
            if let Err(e) = peer.send_notification(channel_event(&delivered)).await {
                tracing::info!("the MCP client is gone ({e}); stopping");
                return;
            }
            self.settled(&held).await;
        }
    }

    /// Waits until the pushed turn is answered through `reply`, or is no
    /// longer this bridge's (the owner released it, or it was answered or
    /// cancelled elsewhere), checked every [`HELD_CHECK`].
    async fn settled(&self, held: &Held) {
        loop {
            let answered = self.host.answered(&held.turn.turn_id);
            if tokio::time::timeout(HELD_CHECK, answered).await.is_ok() {
                return;
            }
            if !self.host.still_held(held).await {
                tracing::info!(turn_id = %held.turn.turn_id, "the delivered turn is no longer held by this bridge (released or settled elsewhere); claiming the next");
                self.host.give_up(&held.turn.turn_id);
                return;
            }
        }
    }
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        let mut capabilities = ServerCapabilities::default();
        capabilities.tools = Some(ToolsCapability::default());
        if self.mode == Mode::Channel {
            capabilities.experimental = Some(
                [
                    (CHANNEL.to_owned(), JsonObject::new()),
                    (permissions::CAPABILITY.to_owned(), JsonObject::new()),
                ]
                .into(),
            );
        }
        let mut info = InitializeResult::new(capabilities).with_instructions(self.instructions());
        info.protocol_version = ProtocolVersion::V_2025_11_25;
        info.server_info = Implementation::new(self.name.clone(), env!("CARGO_PKG_VERSION"));
        info
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        context.peer.set_peer_info(request.clone());
        let mut first_bind = self.first_bind.subscribe();
        let _ = tokio::time::timeout(FIRST_BIND, first_bind.wait_for(|done| *done)).await;
        self.negotiate_initialize(&request)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(PROTOCOL_VERSIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = request.arguments.unwrap_or_default();
        let result = match self.call(&request.name, arguments).await {
            Ok(result) => result,
            // Arguments that do not fit the tool's schema, an unknown tool:
            // JSON-RPC's invalid params, as for any other request.
            Err(ToolError::Invalid(message)) => {
                tracing::warn!(tool = %request.name, "refused a tool call with invalid arguments");
                return Err(ErrorData::invalid_params(message, None));
            }
            Err(ToolError::Problem(problem)) => {
                tracing::warn!(tool = %request.name, "the tool call failed: {}", problem.log_line());
                CallToolResult::error(vec![ContentBlock::text(problem.to_string())])
            }
        };
        Ok(result.into())
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        if self.mode == Mode::Channel && !self.channel_started.swap(true, Ordering::SeqCst) {
            self.relay.resume(self.host.clone(), context.peer.clone());
            tokio::spawn(self.clone().channel_loop(context.peer));
        }
    }

    async fn on_custom_notification(
        &self,
        notification: CustomNotification,
        context: NotificationContext<RoleServer>,
    ) {
        if self.mode != Mode::Channel || notification.method != permissions::REQUEST {
            return;
        }
        match notification.params_as::<PermissionRequestParams>() {
            Ok(Some(params)) => self.relay.request(self.host.clone(), context.peer, params),
            // The parameters are not echoed: they carry the tool's input.
            _ => tracing::warn!("ignored a permission request without its four string parameters"),
        }
    }
}

/// A reply's refusal, with a sentence of its own for an answered turn.
fn reply_problem(problem: Problem) -> Problem {
    match problem.code() {
        Some("idempotency_key_reused") => Problem::Local(
            "this message was already answered with another text (idempotency_key_reused); an \
             answer cannot be changed"
                .into(),
        ),
        _ => problem,
    }
}

fn channel_event(held: &Held) -> ServerNotification {
    let turn = &held.turn;
    let params = json!({
        "content": turn.text,
        "meta": {
            "chat_id": held.session_id,
            "turn_id": turn.turn_id,
            "seq": turn.seq.to_string(),
            "origin": wire(&turn.origin),
            "sent_at": turn.enqueued_at,
        },
    });
    ServerNotification::CustomNotification(CustomNotification::new(CHANNEL_EVENT, Some(params)))
}

/// `wait_for_message`'s answer.
fn message_json(session_id: &str, held: Option<&Held>) -> Value {
    match held {
        None => json!({"claimed": false}),
        Some(held) => json!({
            "claimed": true,
            "chat_id": session_id,
            "turn_id": held.turn.turn_id,
            "seq": held.turn.seq,
            "origin": wire(&held.turn.origin),
            "text": held.turn.text,
            "sent_at": held.turn.enqueued_at,
        }),
    }
}

/// The largest image also given as MCP image content (base64 in the
/// answer); a larger one is only named by its saved path.
const MAX_INLINE_IMAGE: u64 = 5 * 1024 * 1024;

/// The saved images of a delivered turn as MCP image content, for a client
/// that shows them to its model; every file is named in the text anyway.
fn image_blocks(saved: &[crate::cli::attachments::Saved]) -> Vec<ContentBlock> {
    use base64::Engine;
    saved
        .iter()
        .filter(|s| {
            s.attachment.content_type.starts_with("image/") && s.attachment.size <= MAX_INLINE_IMAGE
        })
        .filter_map(|s| {
            let bytes = std::fs::read(s.outcome.as_ref().ok()?).ok()?;
            let data = base64::engine::general_purpose::STANDARD.encode(bytes);
            Some(ContentBlock::image(data, s.attachment.content_type.clone()))
        })
        .collect()
}

fn text_result(text: String) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(text)])
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplyArgs {
    chat_id: String,
    text: String,
    #[serde(default)]
    turn_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WaitArgs {
    #[serde(default)]
    wait_seconds: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseArgs {
    turn_id: String,
}

/// Why a tool call failed: arguments that do not fit (a protocol error), or
/// the call itself (a tool error the model reads).
enum ToolError {
    Invalid(String),
    Problem(Problem),
}

impl From<Problem> for ToolError {
    fn from(problem: Problem) -> Self {
        ToolError::Problem(problem)
    }
}

fn arguments_of<T: serde::de::DeserializeOwned>(arguments: JsonObject) -> Result<T, ToolError> {
    serde_json::from_value(Value::Object(arguments))
        .map_err(|e| ToolError::Invalid(format!("invalid arguments: {e}")))
}

fn schema(value: Value) -> Arc<JsonObject> {
    match value {
        Value::Object(object) => Arc::new(object),
        _ => unreachable!("a schema is an object"),
    }
}

fn reply_tool() -> Tool {
    Tool::new(
        "reply",
        "Answer a LoopX message: the text goes back to the person who wrote it (the Web page or \
         Lark chat). Call it once per message; repeating it does not send a second answer.",
        schema(json!({
            "type": "object",
            "properties": {
                "chat_id": {"type": "string", "description": "The chat_id of the message (the LoopX session id)."},
                "text": {"type": "string", "minLength": 1, "description": "Your answer, as the sender will read it."},
                "turn_id": {"type": "string", "description": "The turn_id of the message; defaults to the latest one delivered."},
            },
            "required": ["chat_id", "text"],
            "additionalProperties": false,
        })),
    )
}

fn wait_tool() -> Tool {
    Tool::new(
        "wait_for_message",
        "Wait for the next message people send to this session through LoopX. Answers \
         claimed:true with the message, or claimed:false when none came within wait_seconds: then \
         call wait_for_message again. Answer a message with reply.",
        schema(json!({
            "type": "object",
            "properties": {
                "wait_seconds": {
                    "type": "integer", "minimum": 0, "maximum": MAX_WAIT_SECONDS,
                    "default": DEFAULT_WAIT_SECONDS,
                    "description": "How long to wait for a message, 0 to 50 seconds.",
                },
            },
            "additionalProperties": false,
        })),
    )
    .with_raw_output_schema(schema(json!({
        "type": "object",
        "properties": {
            "claimed": {"type": "boolean", "description": "true: a message is here; false: none came, call again."},
            "chat_id": {"type": "string", "description": "The LoopX session id, for reply."},
            "turn_id": {"type": "string"},
            "seq": {"type": "integer", "description": "The message's place in the session's queue."},
            "origin": {"type": "string", "enum": ["web", "lark"]},
            "text": {"type": "string", "description": "The message."},
            "sent_at": {"type": "string", "description": "When it was sent (RFC 3339)."},
        },
        "required": ["claimed"],
    })))
}

fn release_tool() -> Tool {
    Tool::new(
        "release",
        "Hand a message you cannot answer back to the head of the queue. Nothing is delivered \
         again until the next wait_for_message.",
        schema(json!({
            "type": "object",
            "properties": {
                "turn_id": {"type": "string", "description": "The turn_id of the message."},
            },
            "required": ["turn_id"],
            "additionalProperties": false,
        })),
    )
}
