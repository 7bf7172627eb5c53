//! The contract's stateful rules, written once for every store: given the
//! rows a request needs (loaded, and locked, by the store inside its
//! transaction) and the request itself, what happens: the writes to apply and
//! the answer, a replay of an earlier answer, or the contract's refusal, in
//! the contract's order. It knows no SQL, no HTTP and no waiting: a store
//! loads the rows, calls a decision and applies the [`Writes`] it returns in
//! the same transaction; the broker parks the waits.
//!
//! Every stateful refusal (`session_closed`, `claim_active`, `not_claimed`,
//! `session_exists`, `host_mismatch`, …) is constructed here and nowhere
//! else (the broker and the routes check only the request itself). It owns
//! the rows, outcomes and [`Writes`] it decides over, every effect of a
//! decision among them (a close's release, sweep and unlink included), and
//! what committed writes change ([`Changed`]); it imports nothing from the
//! store.

pub mod changes;
pub mod chat;
pub mod ingest;
pub mod lark;
pub mod link;
pub mod notice;
pub mod pairing;
pub mod permission;
pub mod presence;
mod projection;
mod rows;
pub mod session;
pub mod terminal;
pub mod text;
pub mod turn;

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorCode, Result};
use crate::model::HostIdentity;
use crate::model::{CancelReason, PermissionState, SessionState, TurnState};
use crate::permission::PermissionRow;
pub use rows::{EventRow, SessionRow, TurnRow};

/// A claim's state, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClaimState {
    Active,
    Released,
    Completed,
}

/// A stored claim: every claim ever made (a claim id keeps answering the same turn).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRow {
    pub claim_id: String,
    pub session_id: String,
    pub turn_id: String,
    pub attempt: i64,
    pub state: ClaimState,
    pub claimed_at: i64,
    pub released_at: Option<i64>,
}

/// A row a decision writes: a new one, or new values for an existing one.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Change<T> {
    Insert(T),
    Update(T),
}

/// One entry appended to a session's event log, numbered by the decision
/// from the session's (locked) `next_event_no`.
#[derive(Debug, Clone, Serialize)]
pub struct NewEvent {
    pub session_id: String,
    pub event_no: i64,
    /// `turn`, `session`, `permission`, `agent` or `notification`.
    pub kind: &'static str,
    pub turn_id: Option<String>,
    pub seq: Option<i64>,
    pub request_id: Option<String>,
    pub state: &'static str,
    pub at: i64,
}

/// A [`NewEvent`] as read back (from the SQLite store's journal), its words
/// not yet found among those an event is logged with.
#[derive(Deserialize)]
struct StoredEvent {
    session_id: String,
    event_no: i64,
    kind: String,
    turn_id: Option<String>,
    seq: Option<i64>,
    request_id: Option<String>,
    state: String,
    at: i64,
}

/// Every word an event's `kind` and `state` can hold: what [`Subject::kind`]
/// and the decisions' calls of [`log`] give.
const LOGGED_WORDS: &[&str] = &[
    "turn",
    "session",
    "permission",
    "agent",
    "notification",
    "queued",
    "claimed",
    "completed",
    "released",
    "cancelled",
    "closed",
    "pending",
    "allowed",
    "denied",
    "expired",
    "working",
    "waiting",
    "away",
    "stalled",
    "idle_prompt",
    "permission_prompt",
];

impl<'de> Deserialize<'de> for NewEvent {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let e = StoredEvent::deserialize(d)?;
        let word = |w: &str| {
            LOGGED_WORDS
                .iter()
                .find(|known| **known == w)
                .copied()
                .ok_or_else(|| serde::de::Error::custom("an event word no decision logs"))
        };
        Ok(NewEvent {
            kind: word(&e.kind)?,
            state: word(&e.state)?,
            session_id: e.session_id,
            event_no: e.event_no,
            turn_id: e.turn_id,
            seq: e.seq,
            request_id: e.request_id,
            at: e.at,
        })
    }
}

/// A Lark reply to send for a completed turn that came from Lark.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NewReply {
    pub turn_id: String,
    pub session_id: String,
    pub chat_id: String,
    pub message_id: String,
    pub text: String,
    pub at: i64,
}

/// A new permission request's message to the session's linked Lark chat,
/// for the outbox (`lark_permission_messages`).
#[derive(Debug, Clone)]
pub struct NewPermissionMessage {
    pub session_id: String,
    pub request_id: String,
    pub chat_id: String,
    pub text: String,
    pub at: i64,
}

/// A code written: a new one, or one spent.
#[derive(Debug, Clone)]
pub enum PairCodeWrite {
    New {
        code_hash: String,
        session_id: String,
        at: i64,
        expires_at: i64,
    },
    Used {
        code_hash: String,
        at: i64,
    },
}

/// A chat, as stored (`lark_chats`; a chat never seen counts no wrong
/// codes and has no current session): its count of wrong codes, and the
/// session its plain messages go to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChatRow {
    pub chat_id: String,
    pub failed_codes: i64,
    pub failed_since: i64,
    /// As last chosen (`/use N`, a link); [`super::chat::ChatRows::current`]
    /// says which session is current now.
    pub current_session_id: Option<String>,
}

impl ChatRow {
    /// The chat as stored, or as a chat never seen.
    pub fn or_new(row: Option<ChatRow>, chat_id: &str) -> ChatRow {
        row.unwrap_or_else(|| ChatRow {
            chat_id: chat_id.to_owned(),
            ..ChatRow::default()
        })
    }
}

/// The broker's answer to a command, a card replying to its message
/// (`lark_notes`: one per message), or a card the broker sends on its own
/// (a session's close: `reply` false, `message_id` only its key).
#[derive(Debug, Clone)]
pub struct NewNote {
    pub message_id: String,
    pub chat_id: String,
    /// The note as its chat shows it: the Lark card's JSON (the
    /// [`notice::Note`]'s `Display`, drawn by `lark::card`).
    pub text: String,
    /// The session it names, if one: a reply to it goes there.
    pub session_id: Option<String>,
    pub reply: bool,
    pub at: i64,
}

/// A Lark turn's download job (`lark_fetches`): started with the event that
/// enqueues the turn, finished once the turn's files are stored or failed.
#[derive(Debug, Clone)]
pub enum FetchWrite {
    Start {
        turn_id: String,
        session_id: String,
        message_id: String,
        /// The [`lark::Resource`]s, as JSON.
        resources: String,
        at: i64,
    },
    /// The job is deleted; `turn`, still queued, takes its files and text.
    Finish {
        turn_id: String,
        turn: Option<Box<TurnRow>>,
    },
}

/// What an answer given in Lark writes on the request's card
/// (`lark_permission_messages`, if the request has one): who answered, and
/// whether the answer to the click already shows the card's final form
/// (then no update of the card follows).
#[derive(Debug, Clone)]
pub struct CardWrite {
    pub session_id: String,
    pub request_id: String,
    /// The approver's Lark open id, when this answer was theirs.
    pub answered_by: Option<String>,
    pub shown: bool,
}

/// A session's Lark link, as written: the link it had (if any) goes, and
/// `link` (if any) takes its place.
#[derive(Debug, Clone)]
pub struct LinkChange {
    pub session_id: String,
    pub link: Option<NewLink>,
}

/// A chat linked to a session, with its approvers (stored form,
/// [`crate::permission::approvers_to_stored`]).
#[derive(Debug, Clone)]
pub struct NewLink {
    pub chat_id: String,
    pub approvers: String,
    pub at: i64,
    /// Whether the chat gets the turns typed at the agent's terminal.
    pub terminal_turns: bool,
}

/// A Lark event recorded once, the guard against its redelivery
/// (`lark_events`: unique by event id and by message id).
#[derive(Debug, Clone)]
pub struct SeenLarkEvent {
    pub app_id: String,
    pub event_id: String,
    pub message_id: Option<String>,
    pub at: i64,
}

/// A Lark message of a session's (a person's message it took as a turn):
/// a reply to it, or a message in its thread, goes to that session
/// (`lark_sent`, which also remembers what the broker sent for it).
#[derive(Debug, Clone)]
pub struct SentMessage {
    pub message_id: String,
    pub session_id: String,
    pub chat_id: String,
    pub at: i64,
}

/// A close's sweep of its session: every queued turn, and the open
/// terminal turn (`terminal`, if any), becomes `cancelled`
/// (with `cancel_reason`), one `turn` event each, numbered from
/// `cancelled_from` in seq order; every pending permission request becomes
/// `expired`, answered at `at`, one `permission` event each, numbered from
/// `expired_from` in creation order. The decision counted both on the locked
/// session and numbered their events; the store writes each in one set-based
/// statement.
#[derive(Debug, Clone)]
pub struct Sweep {
    pub session_id: String,
    pub cancelled: TurnState,
    pub cancel_reason: CancelReason,
    pub cancelled_from: i64,
    /// The open terminal turn ([`terminal`]), cancelled with the queued ones.
    pub terminal: Option<String>,
    pub expired: PermissionState,
    pub expired_from: i64,
    pub at: i64,
}

/// A session continued in another, new one (HOOKS.md "The terminal's real
/// life", [`session::bind`]): its queued turns move to `to`, keeping their
/// `seq`, one `queued` event each in `to`'s log, numbered from
/// `events_from` in seq order (with their files and download jobs); its
/// Lark link (approvers and all), its chats' current pick and the messages
/// sent for it name `to`; it names `to` as `continued_in`. The decision
/// counted the turns on the locked session; the store writes each part in
/// one set-based statement, before the close's sweep.
#[derive(Debug, Clone)]
pub struct Continuation {
    pub from: String,
    pub to: String,
    pub events_from: i64,
    pub at: i64,
}

/// What a decision writes, applied by the store in this order (a step taken
/// first, then the Lark event guard, link, pairing code, chat, note,
/// permission request, its chat message and card, a close's sweep; then turn, claim, session, event,
/// reply), in the decision's transaction.
///
/// The writes of a turn's cycle (turn, claim, session, event, reply) are
/// what the SQLite store journals as one record: those serialize, the others
/// do not ([`Writes::journaled`] says whether a decision wrote only those).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Writes {
    /// The writes of a step the decision takes first (a close's release of
    /// the active claim, whose turn the sweep then cancels with the rest).
    #[serde(skip)]
    pub before: Option<Box<Writes>>,
    #[serde(skip)]
    pub lark_event: Option<SeenLarkEvent>,
    #[serde(skip)]
    pub link: Option<LinkChange>,
    #[serde(skip)]
    pub permission: Option<Change<PermissionRow>>,
    #[serde(skip)]
    pub permission_message: Option<NewPermissionMessage>,
    #[serde(skip)]
    pub card: Option<CardWrite>,
    #[serde(skip)]
    pub sweep: Option<Sweep>,
    /// A session continued in another (written before the sweep).
    #[serde(skip)]
    pub continuation: Option<Continuation>,
    /// A pairing code minted or spent.
    #[serde(skip)]
    pub pair_code: Option<PairCodeWrite>,
    /// A chat's count of wrong pairing codes, as it is now.
    #[serde(skip)]
    pub chat: Option<ChatRow>,
    /// The broker's answer to a command in a chat.
    #[serde(skip)]
    pub note: Option<NewNote>,
    /// A Lark message remembered as the session's.
    #[serde(skip)]
    pub sent: Option<SentMessage>,
    /// A Lark turn's download job, started or finished.
    #[serde(skip)]
    pub fetch: Option<FetchWrite>,
    /// A host's report of its working tree.
    #[serde(skip)]
    pub changes: Option<changes::ChangesWrite>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<Change<TurnRow>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<Change<ClaimRow>>,
    /// The session after the decision: its counters (`next_seq`,
    /// `next_event_no`, `queued_count`, `active_claim_id`) are written back
    /// as they are (the row is locked for the transaction).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionRow>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<NewEvent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<NewReply>,
}

/// What a committed decision changed, derived from the events it writes:
/// its session's event streams have news, and parked claims may find a turn
/// (`claimable`: a turn queued, released, completed or cancelled, or the
/// session closed; a claim taking a turn frees none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    pub session_id: String,
    pub claimable: bool,
}

impl Writes {
    /// Whether these are only a turn cycle's writes (turn, claim, session,
    /// event, reply): all of them survive serialization.
    pub fn journaled(&self) -> bool {
        self.before.is_none()
            && self.lark_event.is_none()
            && self.link.is_none()
            && self.permission.is_none()
            && self.permission_message.is_none()
            && self.card.is_none()
            && self.sweep.is_none()
            && self.continuation.is_none()
            && self.pair_code.is_none()
            && self.chat.is_none()
            && self.note.is_none()
            && self.sent.is_none()
            && self.fetch.is_none()
            && self.changes.is_none()
    }

    /// What these writes change, once committed: `None` when they log no
    /// event (a replay, a refresh of presence that shows nothing new).
    pub fn changed(&self) -> Option<Changed> {
        let before = self.before.as_deref().and_then(Writes::changed);
        let claimable = |e: &NewEvent| match e.kind {
            "turn" => e.state != "claimed",
            "session" => true,
            _ => false,
        };
        let own = match (&self.event, &self.sweep) {
            (_, Some(sweep)) => Some(Changed {
                session_id: sweep.session_id.clone(),
                claimable: true,
            }),
            (Some(event), None) => Some(Changed {
                session_id: event.session_id.clone(),
                claimable: claimable(event),
            }),
            (None, None) => None,
        };
        match (before, own) {
            (Some(before), Some(own)) => Some(Changed {
                claimable: before.claimable || own.claimable,
                ..own
            }),
            (before, own) => own.or(before),
        }
    }
}

/// A decision's answer and what to write for it (nothing for a replay, or when
/// there is nothing to do).
#[derive(Debug)]
pub struct Decided<T> {
    pub answer: T,
    pub writes: Writes,
}

impl<T> Decided<T> {
    pub(crate) fn nothing(answer: T) -> Self {
        Decided {
            answer,
            writes: Writes::default(),
        }
    }
}

/// What an event of a session's log is about.
#[derive(Debug, Clone, Copy)]
pub enum Subject<'a> {
    /// A turn: its id and seq.
    Turn(&'a str, i64),
    /// The session itself (its close).
    Session,
    /// A permission request: its id.
    Permission(&'a str),
    /// The session's agent presence.
    Agent,
    /// The agent's notification (waiting at its terminal).
    Notification,
}

impl<'a> Subject<'a> {
    /// The log's `kind` column.
    pub fn kind(self) -> &'static str {
        match self {
            Subject::Turn(..) => "turn",
            Subject::Session => "session",
            Subject::Permission(_) => "permission",
            Subject::Agent => "agent",
            Subject::Notification => "notification",
        }
    }

    /// The `turn_id`, `seq` and `request_id` columns.
    pub fn columns(self) -> (Option<&'a str>, Option<i64>, Option<&'a str>) {
        match self {
            Subject::Turn(turn_id, seq) => (Some(turn_id), Some(seq), None),
            Subject::Session | Subject::Agent | Subject::Notification => (None, None, None),
            Subject::Permission(request_id) => (None, None, Some(request_id)),
        }
    }
}

/// Appends one event to the session's log: numbers it and advances the
/// session's counter.
fn log(session: &mut SessionRow, subject: Subject<'_>, state: &'static str, at: i64) -> NewEvent {
    let (turn_id, seq, request_id) = subject.columns();
    let event = NewEvent {
        session_id: session.session_id.clone(),
        event_no: session.next_event_no,
        kind: subject.kind(),
        turn_id: turn_id.map(str::to_owned),
        seq,
        request_id: request_id.map(str::to_owned),
        state,
        at,
    };
    session.next_event_no += 1;
    event
}

/// The session the request names: 404 when there is none.
pub fn existing(session: Option<SessionRow>) -> Result<SessionRow> {
    session.ok_or_else(|| Error::not_found("session"))
}

/// A read of one of a session's items (a turn, a permission request): 404
/// for an unknown session first, then 404 naming the item.
pub fn item<T>(session: Option<SessionRow>, item: Option<T>, what: &'static str) -> Result<T> {
    existing(session)?;
    item.ok_or_else(|| Error::not_found(what))
}

/// The number of the session's latest event (0 when none), given its
/// `next_event_no`: 404 when there is no session.
pub fn last_event_no(next_event_no: Option<i64>) -> Result<i64> {
    next_event_no
        .map(|next| next - 1)
        .ok_or_else(|| Error::not_found("session"))
}

/// The session, if the host identity is the one it is bound to (else 403
/// `host_mismatch`).
pub fn hosted(session: Option<SessionRow>, host: &HostIdentity) -> Result<SessionRow> {
    let session = existing(session)?;
    if !session.is_bound_to(host) {
        return Err(Error::host_mismatch());
    }
    Ok(session)
}

/// A host's read of one of its session's items (a permission request,
/// found after its session): 403 `host_mismatch` unless the host identity is
/// the one the session is bound to.
pub fn hosted_item<T>(session: &SessionRow, item: T, host: &HostIdentity) -> Result<T> {
    if !session.is_bound_to(host) {
        return Err(Error::host_mismatch());
    }
    Ok(item)
}

/// 422 `idempotency_key_reused`: `key` (a `client_message_id`, a
/// `completion_id`, a permission `request_id`) was used before with a
/// different request; `with` says with what.
pub fn key_reused(key: &str, with: &str) -> Error {
    Error::new(
        ErrorCode::IdempotencyKeyReused,
        format!("This {key} was used with {with}."),
    )
}

/// 409 `session_closed` when the session is closed.
pub fn open(session: &SessionRow) -> Result<()> {
    match session.state {
        SessionState::Closed => Err(Error::new(
            ErrorCode::SessionClosed,
            "The session is closed.",
        )),
        SessionState::Open => Ok(()),
    }
}

/// 409 `claim_active` when the session holds an active claim (`active`, loaded
/// by its `active_claim_id`).
pub fn no_active_claim(session: &SessionRow, active: Option<&ClaimRow>) -> Result<()> {
    match (&session.active_claim_id, active) {
        (None, _) => Ok(()),
        (Some(_), Some(claim)) => Err(Error::claim_active(
            claim.claim_id.clone(),
            claim.claimed_at,
        )),
        (Some(_), None) => Err(Error::store(
            "checking the active claim",
            "the session's active claim is missing",
        )),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn session(state: SessionState) -> SessionRow {
        SessionRow {
            session_id: "ses_1".into(),
            goal_id: "g".into(),
            agent_id: "a".into(),
            host_surface: "claude-code".into(),
            host_session_id: "h".into(),
            executor_endpoint_id: "e".into(),
            state,
            created_at: 0,
            closed_at: None,
            queued_count: 3,
            active_claim_id: None,
            next_seq: 4,
            next_event_no: 9,
            agent_state: crate::model::AgentState::Away,
            agent_since: None,
            agent_heard_at: None,
            holder_heard_at: None,
            waker_heard_at: None,
            agent_tool: None,
            tool_since: None,
            terminal_turn_id: None,
            stalled_at: None,
            terminal: None,
            continued_in: None,
            continued_from: None,
        }
    }

    /// A host's report of nothing yet (its fields set by the caller).
    pub fn report_of(id: &str) -> crate::model::ReportAgentState {
        crate::model::ReportAgentState::of("claude-code", id, None)
    }

    pub fn host(id: &str) -> HostIdentity {
        HostIdentity {
            host_surface: "claude-code".into(),
            host_session_id: id.into(),
        }
    }

    #[test]
    fn what_writes_change_follows_the_events_they_log() {
        let logged = |subject: Subject<'_>, state: &'static str| Writes {
            event: Some(log(&mut session(SessionState::Open), subject, state, 1)),
            ..Writes::default()
        };
        let changed = |writes: Writes| writes.changed().map(|c| c.claimable);
        assert_eq!(changed(logged(Subject::Turn("t", 1), "queued")), Some(true));
        assert_eq!(
            changed(logged(Subject::Turn("t", 1), "completed")),
            Some(true)
        );
        // Taking a turn frees none; news for the streams only.
        assert_eq!(
            changed(logged(Subject::Turn("t", 1), "claimed")),
            Some(false)
        );
        assert_eq!(
            changed(logged(Subject::Permission("r"), "allowed")),
            Some(false)
        );
        assert_eq!(changed(logged(Subject::Session, "closed")), Some(true));
        // A replay logs nothing and changes nothing.
        assert_eq!(changed(Writes::default()), None);
        let after_release = Writes {
            before: Some(Box::new(logged(Subject::Turn("t", 1), "released"))),
            ..logged(Subject::Agent, "working")
        };
        assert_eq!(changed(after_release), Some(true));
    }

    #[test]
    fn an_items_read_names_the_session_first_then_the_item() {
        let message = |r: Result<u8>| r.unwrap_err().message.into_owned();
        assert_eq!(message(item(None, None, "turn")), "No such session.");
        assert_eq!(message(item(None, Some(1), "turn")), "No such session.");
        let open = || Some(session(SessionState::Open));
        assert_eq!(message(item(open(), None, "turn")), "No such turn.");
        assert_eq!(item(open(), Some(7), "turn").unwrap(), 7);
    }
}
