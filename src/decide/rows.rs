//! The rows the decisions read and write, as stored: a session (with its
//! counters and presence), a turn (with its content) and an entry of a
//! session's event log. Each store reads them with its own SQL; their
//! projections are the contract's answers.

use crate::model::{
    AgentState, CancelReason, ClaimedTurn, HostIdentity, Origin, ReplyState, ReplyStatus,
    SessionState, Turn, TurnState,
};
use crate::time::rfc3339;

/// A stored session, host session id included: never answered as is.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, serde::Serialize, serde::Deserialize)]
pub struct SessionRow {
    pub session_id: String,
    pub goal_id: String,
    pub agent_id: String,
    pub host_surface: String,
    pub host_session_id: String,
    pub executor_endpoint_id: String,
    pub state: SessionState,
    pub created_at: i64,
    pub closed_at: Option<i64>,
    pub queued_count: i64,
    pub active_claim_id: Option<String>,
    /// The next turn's seq and the next event's number: a decision taken on
    /// the locked row numbers what it appends from them.
    pub next_seq: i64,
    pub next_event_no: i64,
    /// Presence, as last reported ([`crate::decide::presence`]): the state,
    /// since when (None: since the session's creation), and when a host was
    /// last heard from (None: never).
    pub agent_state: AgentState,
    pub agent_since: Option<i64>,
    pub agent_heard_at: Option<i64>,
    /// When the holder of the active claim last said it is working on it
    /// (None: it never did; a new claim starts with None):
    /// [`crate::decide::turn::holder_gone`].
    pub holder_heard_at: Option<i64>,
    /// When a waker last said it types into this session's idle agent
    /// (None: none does): [`crate::decide::presence::delivery`].
    ///
    /// This and the next two are left out of a journal record while None
    /// (the usual case): a record costs no more bytes for them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waker_heard_at: Option<i64>,
    /// The tool the agent runs (None: none) and since when the tool last
    /// changed: [`crate::decide::presence::report`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_tool: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_since: Option<i64>,
    /// The open turn typed at the agent's terminal (None: none):
    /// [`crate::decide::terminal`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal_turn_id: Option<String>,
    /// When the broker announced the working agent stalled (None: it is
    /// not): [`crate::decide::presence::stalls`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalled_at: Option<i64>,
    /// The terminal the agent runs in, as its host named it at the bind
    /// (None: it did not say): [`crate::decide::session::bind`]. Set once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal: Option<String>,
    /// The session its terminal's next host session continues it in (set
    /// when it closed for it), and the one it continues (set at its bind).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continued_in: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continued_from: Option<String>,
}

impl SessionRow {
    pub fn is_bound_to(&self, host: &HostIdentity) -> bool {
        self.host_surface == host.host_surface && self.host_session_id == host.host_session_id
    }
}

/// A stored turn, with its content.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, serde::Serialize, serde::Deserialize)]
pub struct TurnRow {
    pub turn_id: String,
    pub session_id: String,
    pub seq: i64,
    pub origin: Origin,
    pub text: String,
    pub client_message_id: Option<String>,
    pub lark_chat_id: Option<String>,
    pub lark_message_id: Option<String>,
    pub state: TurnState,
    pub enqueued_at: i64,
    pub claimed_at: Option<i64>,
    pub completed_at: Option<i64>,
    pub claim_count: i64,
    pub current_claim_id: Option<String>,
    pub completion_id: Option<String>,
    pub response: Option<String>,
    pub cancel_reason: Option<CancelReason>,
    /// The Lark reply's state, when the turn has one (a left join; absent
    /// from rows that a write returns).
    #[sqlx(default)]
    pub reply_state: Option<ReplyState>,
    #[sqlx(default)]
    pub reply_attempts: Option<i64>,
    #[sqlx(default)]
    pub reply_error: Option<String>,
    /// The turn's files as JSON ([`crate::attachments::Stored`]); null: none.
    #[sqlx(default)]
    #[serde(default)]
    pub attachments: Option<String>,
}

impl TurnRow {
    /// A new turn of `session` from `origin`, numbered `session.next_seq`,
    /// `queued` at `now` (with no client id and no Lark message).
    pub fn new(
        turn_id: String,
        session: &SessionRow,
        origin: Origin,
        text: String,
        now: i64,
    ) -> Self {
        TurnRow {
            turn_id,
            session_id: session.session_id.clone(),
            seq: session.next_seq,
            origin,
            text,
            client_message_id: None,
            lark_chat_id: None,
            lark_message_id: None,
            state: TurnState::Queued,
            enqueued_at: now,
            claimed_at: None,
            completed_at: None,
            claim_count: 0,
            current_claim_id: None,
            completion_id: None,
            response: None,
            cancel_reason: None,
            reply_state: None,
            reply_attempts: None,
            reply_error: None,
            attachments: None,
        }
    }

    /// The content-bearing readback.
    pub fn readback(&self) -> Turn {
        Turn {
            turn_id: self.turn_id.clone(),
            session_id: self.session_id.clone(),
            seq: self.seq,
            origin: self.origin,
            text: self.text.clone(),
            state: self.state,
            enqueued_at: rfc3339(self.enqueued_at),
            claimed_at: self.claimed_at.map(rfc3339),
            completed_at: self.completed_at.map(rfc3339),
            response: self
                .response
                .as_deref()
                .and_then(|r| serde_json::from_str(r).ok()),
            cancel_reason: self.cancel_reason,
            reply: self.reply_state.map(|state| ReplyStatus {
                channel: "lark".into(),
                state,
                attempts: self.reply_attempts.unwrap_or(0),
                error: self.reply_error.clone(),
            }),
            attachments: self.attachment_list(),
        }
    }

    pub fn claimed_turn(&self, attempt: i64) -> ClaimedTurn {
        ClaimedTurn {
            turn_id: self.turn_id.clone(),
            seq: self.seq,
            origin: self.origin,
            text: self.text.clone(),
            enqueued_at: rfc3339(self.enqueued_at),
            attempt,
            attachments: self.attachment_list(),
        }
    }

    /// The turn's files, in their wire form.
    pub fn attachment_list(&self) -> Vec<crate::model::Attachment> {
        crate::attachments::parse_list(self.attachments.as_deref())
            .iter()
            .map(|a| a.wire(&self.session_id, &self.turn_id))
            .collect()
    }
}

/// One entry of a session's event log.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EventRow {
    pub event_no: i64,
    /// `turn`, `session` or `permission`.
    pub kind: String,
    pub turn_id: Option<String>,
    pub seq: Option<i64>,
    pub request_id: Option<String>,
    pub state: String,
    /// When it was logged.
    pub at: i64,
}
