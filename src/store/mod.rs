//! The store: durable state, and the transactions in which the contract's
//! decisions ([`crate::decide`]) are taken. It owns the SQL, the
//! transactions (their locks, savepoints and retries), the stored rows and
//! their readback, and telling the broker which sessions changed. For each
//! decision a backend loads the rows it needs (locked for the transaction),
//! calls the decision, and applies the [`crate::decide::Writes`] it returns
//! before committing.
//!
//! It must never decide: no stateful refusal is constructed here, no
//! session event is numbered here (the decision numbers them from the
//! locked session row; for a close's cancelled turns and expired requests it
//! gives the first number and the order, which one set-based statement
//! counts up from), and the two backends share no rule, only SQL that looks
//! alike. It knows nothing of HTTP and never waits for a client: a
//! claim on an empty queue answers [`ClaimOutcome::Empty`] and the broker
//! parks it; the store only tells the broker when a change may have been
//! committed elsewhere ([`Store::watch`], [`Store::recheck_interval`]) and,
//! on SQLite, takes an enqueue and a parked claimer's claim in one commit
//! when the broker asks ([`Store::enqueue_and_claim`]).
//!
//! [`Store`] is the seam for the backends: SQLite (embedded, the default) and
//! PostgreSQL (several replicas sharing one database).

pub mod postgres;
pub mod retention;
pub mod sqlite;
mod sync_sql;

use async_trait::async_trait;

pub use crate::decide::permission::Decision;
pub use crate::decide::presence::Reported;
use crate::error::Result;
use crate::model::{AgentPresence, AgentState, NotificationKind};
use crate::model::{AnsweredVia, Behavior, CreatePermissionRequest, PermissionState};
use crate::model::{
    BindRequest, CancelReason, Capabilities, ClaimedTurn, CompleteRequest, EnqueueRequest,
    LarkLink, ListSessions, ListTurns, Origin, Receipt, RegisterAgentThread, Released, ReplyState,
    ReplyStatus, Session, SessionPreview, SessionState, Turn, TurnState,
};
pub use crate::permission::PermissionRow;
use crate::time::rfc3339;

pub use crate::model::HostIdentity;

/// A stored session, host session id included: never answered as is.
#[derive(Debug, Clone, sqlx::FromRow)]
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
}

impl SessionRow {
    /// The content-free projection, its presence as shown now.
    pub fn projection(&self) -> Session {
        let (state, since) = crate::decide::presence::shown(self, crate::time::now_ms());
        Session {
            session_id: self.session_id.clone(),
            goal_id: self.goal_id.clone(),
            agent_id: self.agent_id.clone(),
            executor_endpoint_id: self.executor_endpoint_id.clone(),
            host_surface: self.host_surface.clone(),
            capabilities: Capabilities::ATTACHED,
            state: self.state,
            created_at: rfc3339(self.created_at),
            closed_at: self.closed_at.map(rfc3339),
            agent: AgentPresence {
                state,
                since: rfc3339(since),
            },
        }
    }

    pub fn is_bound_to(&self, host: &HostIdentity) -> bool {
        self.host_surface == host.host_surface && self.host_session_id == host.host_session_id
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

/// The open sessions with an active claim, and when it was made (the
/// statement of [`Store::held_sessions`], on either backend).
pub const HELD_SESSIONS: &str = "select session_id, goal_id, agent_id, host_surface, \
     host_session_id, executor_endpoint_id, state, created_at, closed_at, queued_count, \
     active_claim_id, next_seq, next_event_no, agent_state, agent_since, agent_heard_at, \
     holder_heard_at, \
     (select c.claimed_at from claims c where c.claim_id = sessions.active_claim_id) \
         as holder_claimed_at \
     from sessions where state = 'open' and active_claim_id is not null";

/// The statement of [`Store::silent_sessions`], its parameters written as
/// the backend writes them: `first` the cut-off (`heard_before`), `second`
/// the silence ([`crate::decide::presence::AWAY_AFTER_MS`]).
pub fn silent_sessions_sql(first: &str, second: &str) -> String {
    format!(
        "select session_id from sessions
         where state = 'open' and agent_state <> 'away' and agent_heard_at <= {first}
           and (agent_since is null or agent_since < agent_heard_at + {second})"
    )
}

/// A stored turn, with its content.
#[derive(Debug, Clone, sqlx::FromRow)]
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
}

impl TurnRow {
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
        }
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

/// How a page of a session's turns is read: forward (after `after_seq`,
/// before `before_seq` if given) oldest first, or, for `before_seq` alone,
/// back from it newest first; one turn more than the page either way, which
/// tells whether more lie beyond it.
#[derive(Debug, Clone, Copy)]
pub struct TurnPage {
    pub backwards: bool,
    pub limit: u32,
}

impl TurnPage {
    pub fn new(page: &ListTurns, limit: u32) -> Self {
        Self {
            backwards: page.before_seq.is_some() && page.after_seq.is_none(),
            limit,
        }
    }

    /// How many turns to read.
    pub fn read_limit(self) -> u32 {
        self.limit + 1
    }

    /// The turns read, as the page in seq order and whether more lie beyond it.
    pub fn finish(self, mut turns: Vec<TurnRow>) -> (Vec<TurnRow>, bool) {
        let has_more = turns.len() > self.limit as usize;
        turns.truncate(self.limit as usize);
        if self.backwards {
            turns.reverse();
        }
        (turns, has_more)
    }
}

/// What a close did.
#[derive(Debug)]
pub struct Closed {
    pub session: SessionRow,
    /// Queued turns cancelled.
    pub cancelled: u64,
    /// Pending permission requests expired.
    pub expired: u64,
}

/// An event accepted from Lark, reduced to what the store keeps.
#[derive(Debug, Clone)]
pub struct LarkEvent {
    pub app_id: String,
    pub event_id: String,
    pub message_id: Option<String>,
    pub chat_id: Option<String>,
    /// The message text, when it is a text message.
    pub text: Option<String>,
    /// The sender's Lark open id, when Lark gave one.
    pub sender: Option<String>,
    /// `yes <id>` / `no <id>`, when the text (its @mentions removed) is one.
    pub command: Option<crate::permission::LarkCommand>,
}

impl LarkEvent {
    /// The request its `yes <id>` / `no <id>` names, for the store to load
    /// from the linked session ([`crate::decide::lark::EventRows`]).
    pub fn named_request(&self) -> Option<&str> {
        self.command.as_ref().map(|c| c.request_id.as_str())
    }
}

/// What became of a Lark event.
#[derive(Debug)]
pub enum LarkIngest {
    /// Seen before (same event id, or same message id): nothing enqueued.
    Duplicate,
    /// Enqueued into the linked session.
    Enqueued {
        session_id: String,
        turn: Box<TurnRow>,
    },
    /// No open session is linked to the chat: acknowledged, not enqueued.
    Unlinked,
    /// Not a text message: acknowledged, not enqueued.
    Unsupported,
    /// `yes <id>` / `no <id>` from an approver of the link: the request's
    /// answer (written, or a replay); not enqueued.
    Answered {
        session_id: String,
        decision: Decision,
    },
    /// An answer that nobody may give there or that changes nothing
    /// ([`crate::decide::lark::event`]): acknowledged, not enqueued.
    Ignored,
}

/// What an outbox message is, and so how Lark gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outbound {
    /// A Lark turn's answer, a reply to the message that asked (`lark_replies`).
    Reply { turn_id: String, message_id: String },
    /// A permission request, a new message in the linked chat
    /// (`lark_permission_messages`).
    Permission {
        session_id: String,
        request_id: String,
    },
}

/// A reply (or permission-request message) due for sending.
#[derive(Debug, Clone)]
pub struct ReplyJob {
    pub outbound: Outbound,
    pub chat_id: String,
    pub text: String,
    pub parts_sent: i64,
    pub attempts: i64,
    /// Failed attempts, not counting rate-limit waits.
    pub failures: i64,
}

/// The outbox row both tables read as: `kind` is `reply` (`key` the turn id,
/// `target` the message id) or `permission` (`key` the session id, `target`
/// the request id).
pub const DUE_OUTBOX: &str = "select 'reply' as kind, turn_id as key, message_id as target, \
         chat_id, text, parts_sent, attempts, failures, next_attempt_at from lark_replies \
         where state = 'pending' and next_attempt_at <= $1 \
     union all \
     select 'permission', session_id, request_id, chat_id, text, parts_sent, attempts, failures, \
         next_attempt_at from lark_permission_messages \
         where state = 'pending' and next_attempt_at <= $1 \
     order by next_attempt_at limit $2";

/// When the next pending outbox message of either table falls due.
pub const NEXT_OUTBOX_DUE: &str = "select min(at) from ( \
     select min(next_attempt_at) as at from lark_replies where state = 'pending' \
     union all \
     select min(next_attempt_at) from lark_permission_messages where state = 'pending') as due";

/// The statement recording a send attempt on `outbound`'s outbox row
/// (`$1`..`$7`: parts sent, state, attempts, failures, error, next attempt,
/// now), and the row's key, bound after them.
pub fn record_outbox(outbound: Outbound) -> (&'static str, Vec<String>) {
    match outbound {
        Outbound::Reply { turn_id, .. } => (
            "update lark_replies set parts_sent = $1, state = $2, attempts = $3, failures = $4, \
             error = $5, next_attempt_at = $6, updated_at = $7 where turn_id = $8",
            vec![turn_id],
        ),
        Outbound::Permission {
            session_id,
            request_id,
        } => (
            "update lark_permission_messages set parts_sent = $1, state = $2, attempts = $3, \
             failures = $4, error = $5, next_attempt_at = $6, updated_at = $7 \
             where session_id = $8 and request_id = $9",
            vec![session_id, request_id],
        ),
    }
}

impl ReplyJob {
    /// A job from the columns of [`DUE_OUTBOX`].
    pub fn from_outbox(
        kind: &str,
        key: String,
        target: String,
        chat_id: String,
        text: String,
        counts: (i64, i64, i64),
    ) -> Self {
        let outbound = match kind {
            "permission" => Outbound::Permission {
                session_id: key,
                request_id: target,
            },
            _ => Outbound::Reply {
                turn_id: key,
                message_id: target,
            },
        };
        let (parts_sent, attempts, failures) = counts;
        Self {
            outbound,
            chat_id,
            text,
            parts_sent,
            attempts,
            failures,
        }
    }
}

/// What a send attempt did to a reply.
#[derive(Debug, Clone)]
pub struct ReplyUpdate {
    pub parts_sent: i64,
    pub state: ReplyState,
    pub attempts: i64,
    pub failures: i64,
    pub error: Option<String>,
    pub next_attempt_at: i64,
}

/// What a bind did.
#[derive(Debug)]
pub enum Bound {
    Created(SessionRow),
    /// The exact tuple with the same executor endpoint was already bound and open.
    Existing(SessionRow),
}

/// What an enqueue did.
#[derive(Debug)]
pub struct Enqueue {
    pub turn: TurnRow,
    /// The client_message_id was seen before with the same body.
    pub duplicate: bool,
}

/// What a claim found.
#[derive(Debug)]
pub enum ClaimOutcome {
    Claimed {
        turn: Box<TurnRow>,
        attempt: i64,
        /// The claim id had already claimed this turn.
        replayed: bool,
    },
    /// No turn is queued; nothing was stored.
    Empty,
}

/// Called with a session id whenever a change to that session may have been
/// committed elsewhere (another replica): the broker wakes its local waiters.
pub type ChangeHook = std::sync::Arc<dyn Fn(&str) + Send + Sync>;

/// The durable state behind the broker: one transaction per decision (its
/// rows loaded and locked, [`crate::decide`] called, its writes applied),
/// plain reads, and the hooks by which a backend tells the broker of changes
/// committed elsewhere. An implementation decides nothing and never waits
/// for a client.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Starts delivering changes committed by other processes to `hook`. A
    /// single-process store (SQLite) has none and ignores it.
    fn watch(&self, hook: ChangeHook) {
        let _ = hook;
    }

    /// How often parked claims and event streams re-check the store even
    /// without a wake-up, for stores whose cross-process notifications can be
    /// lost (PostgreSQL while its listening connection is down). `None`: never.
    fn recheck_interval(&self) -> Option<std::time::Duration> {
        None
    }

    /// Whether [`Store::enqueue_and_claim`] can claim in the enqueue's own
    /// transaction. A store whose waiters may sit on other processes
    /// (PostgreSQL replicas) wakes them instead.
    fn hands_off(&self) -> bool {
        false
    }

    /// Enqueues, then claims the session's oldest queued turn for `host` and
    /// `claim_id` in the same transaction, exactly as [`Store::claim`] would:
    /// a refused claim keeps the enqueue. Only
    /// called on a store that [`Store::hands_off`].
    async fn enqueue_and_claim(
        &self,
        session_id: String,
        message: EnqueueRequest,
        claimer: (HostIdentity, String),
    ) -> Result<(Enqueue, Result<ClaimOutcome>)> {
        let _ = (session_id, message, claimer);
        Err(crate::error::Error::store(
            "enqueueing",
            "this store does not claim in the enqueue's transaction",
        ))
    }

    /// Answers when the store can serve requests.
    async fn ping(&self) -> Result<()>;
    /// Registers the exact tuple; true when it was new.
    async fn register(&self, thread: RegisterAgentThread) -> Result<bool>;
    /// Checks a bind without writing: the open session it would answer, if any.
    async fn preview_bind(&self, bind: BindRequest) -> Result<Option<SessionRow>>;
    async fn bind(&self, bind: BindRequest) -> Result<Bound>;
    async fn session(&self, session_id: &str) -> Result<Option<SessionRow>>;
    /// Sessions matching the filters after the cursor, oldest first, at most `limit`.
    async fn sessions(&self, filter: ListSessions, limit: u32) -> Result<Vec<SessionRow>>;
    async fn enqueue(&self, session_id: String, message: EnqueueRequest) -> Result<Enqueue>;
    async fn claim(
        &self,
        session_id: String,
        host: HostIdentity,
        claim_id: String,
    ) -> Result<ClaimOutcome>;
    async fn complete(
        &self,
        session_id: String,
        turn_id: String,
        completion: CompleteRequest,
    ) -> Result<Receipt>;
    async fn release(
        &self,
        session_id: String,
        claim_id: String,
        by: crate::decide::turn::Releaser,
    ) -> Result<Released>;
    /// Closes the session, cancelling its queued turns and expiring its
    /// pending permission requests in the same transaction.
    /// With `release_active_claim`, an active claim is released first, in the
    /// same transaction, instead of refusing the close.
    async fn close(&self, session_id: String, release_active_claim: bool) -> Result<Closed>;
    /// Records a permission request by the host ([`crate::decide::permission::create`]).
    async fn create_permission(
        &self,
        session_id: String,
        host: HostIdentity,
        request: CreatePermissionRequest,
    ) -> Result<Decision>;
    /// Answers a permission request ([`crate::decide::permission::answer`]).
    async fn answer_permission(
        &self,
        session_id: String,
        request_id: String,
        behavior: Behavior,
        via: AnsweredVia,
    ) -> Result<Decision>;
    /// The host withdraws its request ([`crate::decide::permission::withdraw`]).
    async fn withdraw_permission(
        &self,
        session_id: String,
        request_id: String,
        host: HostIdentity,
    ) -> Result<Decision>;
    /// The host reports its agent's state (with `claim_id`: the holder of
    /// that claim says it is working on it), or (None) was heard from by a
    /// parked claim ([`crate::decide::presence::report`]).
    async fn report_agent(
        &self,
        session_id: String,
        host: HostIdentity,
        state: Option<AgentState>,
        claim_id: Option<String>,
    ) -> Result<Reported>;
    /// The open sessions that hold an active claim, each with when its claim
    /// was made: what the broker's sweep for gone holders
    /// ([`crate::decide::turn::holder_gone`]) looks at. A plain read.
    async fn held_sessions(&self) -> Result<Vec<(SessionRow, i64)>>;
    /// The open sessions whose agent, last reported there, has not been
    /// heard from since `heard_before` and was not announced away since: the
    /// candidates of [`crate::decide::presence::lapsed`]. A plain read.
    async fn silent_sessions(&self, heard_before: i64) -> Result<Vec<String>>;
    /// Announces a silent agent away ([`crate::decide::presence::lapse`]).
    async fn lapse_agent(&self, session_id: String, now: i64) -> Result<Reported>;
    /// The host's agent waits at its terminal ([`crate::decide::presence::notify`]).
    async fn notify(
        &self,
        session_id: String,
        host: HostIdentity,
        kind: NotificationKind,
    ) -> Result<SessionRow>;
    /// Records that the host relayed the answer ([`crate::decide::permission::relayed`]).
    async fn relayed_permission(
        &self,
        session_id: String,
        request_id: String,
        host: HostIdentity,
    ) -> Result<Decision>;
    /// One request; 404 for an unknown session or request.
    async fn permission(&self, session_id: &str, request_id: &str) -> Result<PermissionRow>;
    /// The session's requests (in `state`, if given): pending first, then
    /// newest first, at most [`crate::permission::LIST_LIMIT`].
    async fn permissions(
        &self,
        session_id: &str,
        state: Option<PermissionState>,
    ) -> Result<Vec<PermissionRow>>;
    /// Links a Lark chat to an open session ([`crate::decide::lark::link`]),
    /// replacing the session's link and its approvers (already checked by
    /// [`crate::permission::approvers`]).
    async fn lark_link(
        &self,
        session_id: String,
        chat_id: String,
        approvers: Vec<String>,
    ) -> Result<LarkLink>;
    /// Removes the session's link, if any ([`crate::decide::lark::unlink`]).
    async fn lark_unlink(&self, session_id: String) -> Result<LarkLink>;
    async fn lark_link_status(&self, session_id: &str) -> Result<LarkLink>;
    /// Takes a Lark event once ([`crate::decide::lark::event`]): records it
    /// and enqueues its text into the linked session, or takes it as an
    /// approver's answer, in one transaction.
    async fn lark_event(&self, event: LarkEvent) -> Result<LarkIngest>;
    /// Pending replies and permission-request messages due at `now_ms`,
    /// oldest first.
    async fn due_replies(&self, now_ms: i64, limit: u32) -> Result<Vec<ReplyJob>>;
    /// When the next pending reply or permission-request message falls due.
    async fn next_reply_due(&self) -> Result<Option<i64>>;
    async fn record_reply(&self, outbound: Outbound, update: ReplyUpdate) -> Result<()>;
    /// Queued turns over all sessions, and when the oldest was enqueued.
    async fn queue_stats(&self) -> Result<(i64, Option<i64>)>;
    /// One small step of retention (see [`retention`]): part of the oldest
    /// session closed before `cutoff_ms`, or old Lark redelivery guards.
    async fn prune_step(&self, cutoff_ms: i64) -> Result<retention::PruneStep>;
    /// The number of the session's latest event (0 when none); 404 for an unknown session.
    async fn last_event_no(&self, session_id: &str) -> Result<i64>;
    /// The session's events after `after`, in order, at most `limit`.
    async fn events(&self, session_id: &str, after: i64, limit: u32) -> Result<Vec<EventRow>>;
    async fn turn(&self, session_id: &str, turn_id: &str) -> Result<TurnRow>;
    /// A page of a session's turns in seq order, and whether more lie beyond it.
    async fn turns(
        &self,
        session_id: &str,
        page: ListTurns,
        limit: u32,
    ) -> Result<(Vec<TurnRow>, bool)>;
}
