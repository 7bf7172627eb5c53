//! The store: the seam between the broker and the backends, SQLite
//! (embedded, the default) and PostgreSQL (several replicas sharing one
//! database). [`Store`] is six calls: a [`Command`] decided and applied in
//! one transaction (or two in one commit, [`Store::together`]), a plain
//! [`Read`], the [`ChangeFeed`] (what each committed decision changed,
//! derived once from the events it writes), and health.
//!
//! What is the same for both backends is written once: `dispatch` runs a
//! command's rule ([`crate::decide`]) over any backend's transaction (its
//! `Tx`: load the rows a decision needs, locked; apply the
//! [`crate::decide::Writes`] it returns), `statement` holds the writes both
//! make alike as neutral statements, and `reads` the plain reads. A backend
//! keeps only its own: its connections, locks and retries, its loads, how it
//! writes a turn's rows fastest (SQLite's journal, PostgreSQL's one
//! statement), how its rows decode, and the Lark jobs PostgreSQL leases.
//!
//! It must never decide: no stateful refusal is constructed here, no
//! session event is numbered here (the decision numbers them from the
//! locked session row; for a close's cancelled turns and expired requests it
//! gives the first number and the order, which one set-based statement
//! counts up from). It knows nothing of HTTP and never waits for a client: a
//! claim on an empty queue answers [`ClaimOutcome::Empty`] and the broker
//! parks it until the feed says the session changed. Two decisions in one
//! commit ([`Store::together`]) is how the broker hands a parked claim the
//! turn an enqueue brings.

/// A session's columns, in the order [`SessionRow`] is read.
macro_rules! session_columns {
    () => {
        "session_id, goal_id, agent_id, host_surface, host_session_id, \
         executor_endpoint_id, state, created_at, closed_at, queued_count, active_claim_id, \
         next_seq, next_event_no, agent_state, agent_since, agent_heard_at, holder_heard_at, \
         waker_heard_at, agent_tool, tool_since, terminal_turn_id, stalled_at, terminal, \
         continued_in, continued_from"
    };
}

/// A turn with its Lark reply's state, for readbacks: the turn's columns in
/// table order, then the reply's (the order [`TurnRow`] is read).
macro_rules! turn_readback {
    () => {
        "select t.turn_id, t.session_id, t.seq, t.origin, t.text, t.client_message_id, \
         t.lark_chat_id, t.lark_message_id, t.state, t.enqueued_at, t.claimed_at, \
         t.completed_at, t.claim_count, t.current_claim_id, t.completion_id, t.response, \
         t.cancel_reason, t.attachments, r.state as reply_state, r.attempts as reply_attempts, \
         r.error as reply_error from turns t left join lark_replies r on r.turn_id = t.turn_id"
    };
}

/// A permission request's columns, in the order [`PermissionRow`] is read.
macro_rules! permission_columns {
    () => {
        "session_id, request_id, tool_name, description, input_preview, state, created_at, \
         answered_at, answered_via, relayed_at, detail, answer"
    };
}

mod dispatch;
pub mod postgres;
mod reads;
pub mod retention;
pub mod sqlite;
mod statement;
mod sync_sql;

use async_trait::async_trait;

use crate::decide::lark::{Clicked, LarkClick};
use crate::decide::lark::{LarkEvent, LarkIngest};
use crate::decide::permission::Decision;
use crate::decide::presence::Reported;
use crate::decide::session::{Bound, Closed};
use crate::decide::turn::{ClaimOutcome, Enqueue, Releaser};
use crate::decide::{Changed, EventRow, SessionRow, TurnRow};
use crate::devices::{DeviceRow, NewDevice};
use crate::error::Result;
use crate::model::NewPushSubscription;
use crate::model::{
    AnswerPermission, AnsweredVia, BindRequest, CloseRequest, CompleteRequest,
    CreatePermissionRequest, EnqueueRequest, HostIdentity, LarkLink, ListSessions, ListTurns,
    NotificationKind, PermissionState, Receipt, RegisterAgentThread, Released, ReplyState,
};
use crate::permission::PermissionRow;
use crate::push::PushSubscriptionRow;

/// The open sessions with an active claim, and when it was made (the
/// statement of [`Read::HeldSessions`], on either backend).
pub const HELD_SESSIONS: &str = concat!(
    "select ",
    session_columns!(),
    ", (select c.claimed_at from claims c where c.claim_id = sessions.active_claim_id) \
     as holder_claimed_at from sessions where state = 'open' and active_claim_id is not null"
);

/// A session's columns (`session_columns!`).
pub const SESSION_COLUMNS: &str = session_columns!();

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
    /// The broker's answer to a command, a reply to its message; or, not
    /// `reply`, a card of its own in the chat (`lark_notes`).
    Note { message_id: String, reply: bool },
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
    /// The session it is sent for, if one: what it sends is remembered
    /// ([`Command::LarkMessageSent`]), so a reply to it finds the session.
    pub session_id: Option<String>,
    /// An answer's session, as its card's header names it (goal · agent).
    pub title: Option<String>,
}

/// The outbox row all three tables read as: `kind` is `reply` (`key` the
/// turn id, `target` the message id), `permission` (`key` the session id,
/// `target` the request id) or `note` (`key` and `target` the message
/// answered); the session it is for, an answer's title, and whether it
/// replies to a message.
pub const DUE_OUTBOX: &str = "select 'reply' as kind, turn_id as key, message_id as target, \
         chat_id, text, parts_sent, attempts, failures, next_attempt_at, session_id, \
         1 as reply, (select s.goal_id || ' · ' || s.agent_id from sessions s \
             where s.session_id = r.session_id) as title \
         from lark_replies r \
         where state = 'pending' and next_attempt_at <= $1 \
     union all \
     select 'permission', session_id, request_id, chat_id, text, parts_sent, attempts, failures, \
         next_attempt_at, session_id, 1, null from lark_permission_messages \
         where state = 'pending' and next_attempt_at <= $1 \
     union all \
     select 'note', message_id, message_id, chat_id, text, parts_sent, attempts, failures, \
         next_attempt_at, session_id, reply, null from lark_notes \
         where state = 'pending' and next_attempt_at <= $1 \
     order by next_attempt_at limit $2";

/// Remembers a message the broker sent for a session (`$1`..`$4`: message,
/// session, chat, now); once.
pub const INSERT_SENT: &str = "insert into lark_sent (message_id, session_id, chat_id, sent_at) \
     values ($1, $2, $3, $4) on conflict (message_id) do nothing";

/// The session a message the broker sent was for (`$1`: its message id).
pub const SENT_FOR: &str = "select session_id from lark_sent where message_id = $1";

/// When the next pending outbox message of either table falls due.
pub const NEXT_OUTBOX_DUE: &str = "select min(at) from ( \
     select min(next_attempt_at) as at from lark_replies where state = 'pending' \
     union all \
     select min(next_attempt_at) from lark_permission_messages where state = 'pending' \
     union all \
     select min(next_attempt_at) from lark_notes where state = 'pending' \
     union all \
     select min(m.update_next_at) from lark_permission_messages m join permission_requests p \
         on p.session_id = m.session_id and p.request_id = m.request_id \
         where m.update_state = 'pending' and m.message_id is not null \
         and p.state <> 'pending') as due";

/// A decision's pairing writes ([`crate::decide::pairing`]), the same on
/// both backends: a new code (`$1`..`$4`: hash, session, made, expires),
/// a code spent (`$1` when, `$2` hash), a chat's wrong codes (`$1`..`$3`),
/// and a note (`$1`..`$4`: message, chat, card, now).
/// A session's latest report of its working tree, as kept (`$1`): its
/// body and when it came.
pub const KEPT_CHANGES: &str =
    "select body, reported_at from session_changes where session_id = $1";
/// The Lark chat a session is linked to, if any (`$1`: the session).
pub const LINKED_CHAT: &str = "select chat_id from lark_links where session_id = $1";
pub const INSERT_PAIR_CODE: &str = "insert into lark_pair_codes \
     (code_hash, session_id, created_at, expires_at) values ($1, $2, $3, $4)";
pub const SPEND_PAIR_CODE: &str = "update lark_pair_codes set used_at = $1 where code_hash = $2";
pub const UPSERT_CHAT: &str = "insert into lark_chats (chat_id, failed_codes, failed_since, \
     current_session_id) values ($1, $2, $3, $4) on conflict (chat_id) do update \
     set failed_codes = $2, failed_since = $3, current_session_id = $4";
/// A note (`$1`..`$6`: message, chat, card, now, session, reply); a note
/// with the same key (a redelivered command, a close told already) is
/// written once.
pub const INSERT_NOTE: &str = "insert into lark_notes (message_id, chat_id, text, state, \
     next_attempt_at, created_at, updated_at, session_id, reply) \
     values ($1, $2, $3, 'pending', $4, $4, $4, $5, $6) on conflict (message_id) do nothing";

/// A chat's open sessions in the order they were linked (`$1`: the chat):
/// each one's id and its link's approvers.
pub const CHAT_SESSIONS: &str = "select l.session_id, l.approvers from lark_links l \
     join sessions s on s.session_id = l.session_id \
     where l.chat_id = $1 and s.state = 'open' order by l.linked_at, l.session_id";

/// The session of a chat (`$1`) whose permission request has the id `$2`:
/// a pending one first, else the newest.
pub const ASKED_IN_CHAT: &str = "select p.session_id from permission_requests p \
     join lark_links l on l.session_id = p.session_id \
     where l.chat_id = $1 and p.request_id = $2 \
     order by case when p.state = 'pending' then 0 else 1 end, p.created_at desc limit 1";

/// A session's link (`$1`: the session): chat, approvers, when linked.
pub const SESSION_LINK: &str = "select chat_id, approvers, linked_at, terminal_turns \
     from lark_links where session_id = $1";

/// A session's (`$1`) link as [`crate::model::LarkLink::stored`] reads it.
pub const LINK_STATUS: &str =
    "select chat_id, approvers, terminal_turns from lark_links where session_id = $1";

/// The chat a session (`$1`) is linked to when the link asks for the turns
/// typed at the agent's terminal.
pub const TERMINAL_FEED: &str =
    "select chat_id from lark_links where session_id = $1 and terminal_turns = 1";

/// Whether a Lark event was seen (`$1` app, `$2` event id, `$3` its
/// message's id, or null).
pub const EVENT_SEEN: &str =
    "select 1 from lark_events where app_id = $1 and (event_id = $2 or message_id = $3)";

/// A pairing code (`$1` its hash), as [`crate::decide::pairing::PairCodeRow`] reads it.
pub const PAIR_CODE: &str =
    "select code_hash, session_id, expires_at, used_at from lark_pair_codes where code_hash = $1";

/// A permission request's card (`$1` session, `$2` request): its chat, and
/// who answered on it.
pub const CARD: &str = "select chat_id, answered_by from lark_permission_messages \
     where session_id = $1 and request_id = $2";

/// A permission request's card was sent (`$1` its message id, `$2`
/// session, `$3` request).
pub const CARD_SENT: &str = "update lark_permission_messages set message_id = $1 \
     where session_id = $2 and request_id = $3";

/// Records a card update attempt: `$1`..`$5` state, attempts, failures,
/// error, next attempt; `$6` session, `$7` request.
pub const RECORD_CARD_UPDATE: &str = "update lark_permission_messages \
     set update_state = $1, update_attempts = $2, update_failures = $3, update_error = $4, \
         update_next_at = $5 \
     where session_id = $6 and request_id = $7";

/// A session a bind created (`$1`…`$10`, in this order).
pub const INSERT_SESSION: &str = "insert into sessions (session_id, goal_id, agent_id, \
     host_surface, host_session_id, executor_endpoint_id, state, created_at, next_seq, \
     next_event_no, queued_count, terminal, continued_from) \
     values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)";

/// The open session bound from a terminal (`$5`) by another host session
/// (`$6`) of the same goal, agent, surface and executor (`$1`…`$4`): the
/// one a new host session there continues (the newest, should there be
/// two). The open tuple's index narrows it to the goal's agent's sessions.
pub const TERMINALS_OPEN_SESSION: &str = "select session_id from sessions \
     where goal_id = $1 and agent_id = $2 and host_surface = $3 and executor_endpoint_id = $4 \
       and state = 'open' and terminal = $5 and host_session_id <> $6 \
     order by session_id desc limit 1";

/// An agent thread registered (`$1` goal, `$2` agent, `$3` host surface,
/// `$4` host session, `$5` now); a second registration inserts nothing.
pub const REGISTER: &str = "insert into agent_threads \
     (goal_id, agent_id, host_surface, host_session_id, registered_at) \
     values ($1, $2, $3, $4, $5) on conflict do nothing";

/// A chat (`$1`), as [`crate::decide::pairing::ChatRow`] reads it.
pub const CHAT: &str = "select chat_id, failed_codes, failed_since, current_session_id \
     from lark_chats where chat_id = $1";

/// A permission card due for its final form: the request it shows was
/// settled after it was sent (`lark_permission_messages`, its `update_`
/// columns).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct CardUpdateJob {
    pub session_id: String,
    pub request_id: String,
    pub chat_id: String,
    /// The card's Lark message, to PATCH.
    pub message_id: String,
    pub answered_by: Option<String>,
    pub update_attempts: i64,
    pub update_failures: i64,
}

/// Runs `migrator`'s migrations (each store's own folder) on a connection of
/// their own, opened with `options` and closed once they are in; `opening`
/// names the step in a failure's log.
async fn migrate<C>(
    options: &C::Options,
    migrator: sqlx::migrate::Migrator,
    opening: &'static str,
) -> Result<()>
where
    C: sqlx::Connection,
    for<'a> &'a mut C: sqlx::Acquire<'a, Connection = &'a mut C>,
    C: sqlx::migrate::Migrate,
{
    use crate::error::Error;
    let mut conn = C::connect_with(options)
        .await
        .map_err(|e| Error::store(opening, e))?;
    migrator
        .run(&mut conn)
        .await
        .map_err(|e| Error::store("migrating the database", e))?;
    conn.close()
        .await
        .map_err(|e| Error::store("closing the migration connection", e))
}

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
        Outbound::Note { message_id, .. } => (
            "update lark_notes set parts_sent = $1, state = $2, attempts = $3, failures = $4, \
             error = $5, next_attempt_at = $6, updated_at = $7 where message_id = $8",
            vec![message_id],
        ),
    }
}

/// An outbox row's columns, as [`DUE_OUTBOX`] (and PostgreSQL's leases)
/// read them.
#[derive(sqlx::FromRow)]
pub struct OutboxRow {
    pub kind: String,
    pub key: String,
    pub target: String,
    pub chat_id: String,
    pub text: String,
    pub parts_sent: i64,
    pub attempts: i64,
    pub failures: i64,
    pub session_id: Option<String>,
    pub title: Option<String>,
    pub reply: i64,
}

impl OutboxRow {
    /// The job the row is.
    pub fn job(self) -> ReplyJob {
        let outbound = match self.kind.as_str() {
            "permission" => Outbound::Permission {
                session_id: self.key,
                request_id: self.target,
            },
            "note" => Outbound::Note {
                message_id: self.target,
                reply: self.reply != 0,
            },
            _ => Outbound::Reply {
                turn_id: self.key,
                message_id: self.target,
            },
        };
        ReplyJob {
            outbound,
            chat_id: self.chat_id,
            text: self.text,
            parts_sent: self.parts_sent,
            attempts: self.attempts,
            failures: self.failures,
            session_id: self.session_id,
            title: self.title,
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

/// What committed decisions changed ([`Changed`], derived once from the
/// events each decision writes), published by the store once they are
/// committed (on SQLite when the caller is answered, after the sync at
/// `full`), and on PostgreSQL what other replicas committed too. The broker
/// subscribes once and wakes its waiters from it.
#[derive(Default)]
pub struct ChangeFeed {
    subscribers: std::sync::RwLock<Vec<ChangeHook>>,
}

/// One entry of the [`ChangeFeed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A session changed.
    Session(Changed),
    /// Changes may have gone unannounced (PostgreSQL's announcements can be
    /// lost while its listening connection is down): every waiter re-checks.
    Unknown,
}

/// A subscriber of the [`ChangeFeed`].
pub type ChangeHook = std::sync::Arc<dyn Fn(&Change) + Send + Sync>;

impl ChangeFeed {
    pub fn subscribe(&self, hook: ChangeHook) {
        self.subscribers
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(hook);
    }

    pub fn publish(&self, change: &Change) {
        let subscribers = self.subscribers.read().unwrap_or_else(|e| e.into_inner());
        subscribers.iter().for_each(|hook| hook(change));
    }
}

/// The store's decisions, each once: its variant of [`Command`] (the
/// command's fields), its answer (the same variant of [`Done`]), the typed
/// call on `dyn Store` that takes it ([`Store::decide`]), and the words a
/// store failure names it by.
macro_rules! commands {
    ($(
        $(#[$doc:meta])*
        $variant:ident { $($field:ident : $ty:ty),* $(,)? } -> $answer:ty, $method:ident, $what:literal;
    )*) => {
        /// A decision for [`Store::decide`]: a backend loads the rows its
        /// rule needs, in one transaction, calls the rule
        /// ([`crate::decide`]) and applies its writes. The broker may also
        /// compose two into one commit ([`Store::together`]).
        #[derive(Clone)]
        pub enum Command {
            $( $(#[$doc])* $variant { $($field: $ty),* }, )*
        }

        /// What a [`Command`] decided: the answer of the same variant.
        pub enum Done {
            $( $variant(Box<$answer>), )*
        }

        impl Command {
            /// What the store was doing, as a store failure says it.
            pub fn what(&self) -> &'static str {
                match self {
                    $( Command::$variant { .. } => $what, )*
                }
            }
        }

        impl dyn Store {
            $(
                $(#[$doc])*
                pub async fn $method(&self, $($field: $ty),*) -> Result<$answer> {
                    match self.decide(Command::$variant { $($field),* }).await? {
                        Done::$variant(answer) => Ok(*answer),
                        #[allow(unreachable_patterns)]
                        _ => Err(mismatched()),
                    }
                }
            )*
        }
    };
}

commands! {
    /// Registers the exact tuple; true when it was new.
    Register { thread: RegisterAgentThread } -> bool, register, "registering an agent thread";
    /// Checks a bind without writing: the open session it would answer, if any.
    PreviewBind { bind: BindRequest } -> Option<SessionRow>, preview_bind, "checking a bind";
    /// Binds a session ([`crate::decide::session::bind`]).
    Bind { bind: BindRequest } -> Bound, bind, "binding a session";
    /// Enqueues a message ([`crate::decide::turn::enqueue`]) and, in the
    /// same transaction, the bytes of the files its new turn names (none for
    /// a replay or a refusal: a refused upload leaves nothing behind).
    Enqueue { session_id: String, message: EnqueueRequest, blobs: Vec<Blob> } -> Enqueue, enqueue,
        "enqueueing";
    /// Claims the oldest queued turn ([`crate::decide::turn::claim`]).
    Claim { session_id: String, host: HostIdentity, claim_id: String } -> ClaimOutcome, claim,
        "claiming";
    /// Completes a claimed turn ([`crate::decide::turn::complete`]).
    Complete { session_id: String, turn_id: String, completion: CompleteRequest } -> Receipt,
        complete, "completing";
    /// Releases a claim ([`crate::decide::turn::release`]).
    Release { session_id: String, claim_id: String, by: Releaser } -> Released, release,
        "releasing";
    /// Closes the session, cancelling its queued turns and expiring its
    /// pending permission requests in the same transaction.
    /// With `release_active_claim`, an active claim is released first, in the
    /// same transaction, instead of refusing the close; with `if_idle`,
    /// messages waiting refuse it ([`crate::decide::session::close`]).
    Close { session_id: String, how: CloseRequest } -> Closed, close, "closing";
    /// Records a permission request by the host ([`crate::decide::permission::create`]).
    CreatePermission { session_id: String, host: HostIdentity, request: CreatePermissionRequest }
        -> Decision, create_permission, "recording a permission request";
    /// Answers a permission request ([`crate::decide::permission::answer`]).
    AnswerPermission { session_id: String, request_id: String, answer: AnswerPermission, via: AnsweredVia }
        -> Decision, answer_permission, "answering a permission request";
    /// The host withdraws its request ([`crate::decide::permission::withdraw`]).
    WithdrawPermission { session_id: String, request_id: String, host: HostIdentity, at_terminal: bool }
        -> Decision, withdraw_permission, "withdrawing a permission request";
    /// Records that the host relayed the answer ([`crate::decide::permission::relayed`]).
    RelayedPermission { session_id: String, request_id: String, host: HostIdentity }
        -> Decision, relayed_permission, "recording a relayed permission answer";
    /// The host reports its agent's state (with `claim_id`: the holder of
    /// that claim says it is working on it), or (None) was heard from by a
    /// parked claim ([`crate::decide::presence::report`]).
    ReportAgent { session_id: String, host: HostIdentity, report: crate::decide::presence::Report }
        -> Reported, report_agent, "recording the agent's state";
    /// Announces a silent agent away or stalled ([`crate::decide::presence::lapse`]).
    LapseAgent { session_id: String, stall_after_ms: i64, now: i64 } -> Reported, lapse_agent,
        "announcing a silent agent";
    /// The host's agent waits at its terminal ([`crate::decide::presence::notify`]).
    Notify { session_id: String, host: HostIdentity, kind: NotificationKind } -> SessionRow,
        notify, "recording a notification";
    /// Keeps a host's report of its working tree
    /// ([`crate::decide::changes::report`]).
    ReportChanges { session_id: String, host: HostIdentity, report: crate::model::ReportChanges }
        -> (), report_changes, "recording the agent's changes";
    /// Links a Lark chat to an open session ([`crate::decide::lark::link`]),
    /// replacing the session's link and its approvers (already checked by
    /// [`crate::permission::approvers`]).
    LarkLink { session_id: String, chat_id: String, options: crate::decide::lark::LinkOptions }
        -> LarkLink, lark_link, "linking a Lark chat";
    /// Records a new pairing code's hash for the session
    /// ([`crate::decide::pairing::new_code`]): when it expires.
    LarkPairCode { session_id: String, code_hash: String } -> i64, lark_pair_code,
        "minting a Lark pairing code";
    /// Removes the session's link, if any ([`crate::decide::lark::unlink`]).
    LarkUnlink { session_id: String } -> LarkLink, lark_unlink, "unlinking a Lark chat";
    /// Takes a Lark event once ([`crate::decide::lark::event`]): records it
    /// and enqueues its text into the linked session, or takes it as an
    /// approver's answer, in one transaction.
    LarkEvent { event: LarkEvent } -> LarkIngest, lark_event, "recording a Lark event";
    /// Takes a click on a permission card once ([`crate::decide::lark::click`]).
    LarkClick { click: LarkClick } -> Clicked, lark_click, "taking a Lark card click";
    /// Records an attempt to send a reply or a message (`parts_sent` so far).
    RecordReply { outbound: Outbound, update: ReplyUpdate } -> (), record_reply,
        "recording a Lark reply";
    /// Remembers a message sent for a session: a reply to it goes there.
    LarkMessageSent { message_id: String, session_id: String, chat_id: String } -> (),
        lark_message_sent, "recording a sent Lark message";
    /// Records the Lark message a permission card was sent as.
    LarkCardSent { session_id: String, request_id: String, message_id: String } -> (),
        lark_card_sent, "recording a sent Lark card";
    /// Records an attempt to update a card (`parts_sent` unused).
    RecordCardUpdate { job: CardUpdateJob, update: ReplyUpdate } -> (), record_card_update,
        "recording a Lark card update";
    /// One small step of retention (see [`retention`]): part of the oldest
    /// session closed before `cutoff_ms`, or old Lark redelivery guards.
    PruneStep { cutoff_ms: i64 } -> retention::PruneStep, prune_step, "pruning";
    /// Removes up to ten files' bytes that no turn names, stored before
    /// `cutoff_ms` ([`retention::DELETE_UNNAMED_BLOBS`]): how many.
    SweepBlobs { cutoff_ms: i64 } -> u64, sweep_blobs, "removing files no turn names";
    /// Ends a Lark turn's download job, once ([`crate::decide::lark::fetched`]):
    /// the turn takes its files, and the claims it held back may take it;
    /// the bytes of those it keeps are stored in the same transaction.
    LarkFetched { fetched: crate::decide::lark::Fetched, blobs: Vec<Blob> } -> bool, lark_fetched,
        "storing a Lark message's files";
    /// Records a download job's attempt that is to be tried again: its
    /// failures so far, and when.
    RecordFetch { turn_id: String, failures: i64, next_attempt_at: i64 } -> (), record_fetch,
        "recording a Lark download attempt";
    /// Records a sign-in link's code hash ([`crate::devices`]): when it
    /// expires; 429 while [`crate::devices::MAX_OPEN_LINKS`] are open.
    MintDeviceLink { code_hash: String } -> i64, mint_device_link, "making a sign-in link";
    /// Spends a sign-in link and signs the device in, in one transaction:
    /// its new row; 401 for a used, expired or unknown code, 409
    /// `too_many_devices` past [`crate::devices::MAX_DEVICES`].
    SignInDevice { code_hash: String, device: NewDevice } -> DeviceRow, sign_in_device,
        "signing a device in";
    /// Revokes a device: whether it was there.
    RevokeDevice { device_id: String } -> bool, revoke_device, "revoking a device";
    /// Records when a device was last seen.
    DeviceSeen { device_id: String, at: i64 } -> (), device_seen, "recording a device's visit";
    /// A push subscription for the owner (`None`) or a device, replacing
    /// the endpoint's earlier one; 409 `too_many_subscriptions` past
    /// [`crate::push::MAX_SUBSCRIPTIONS`] for that caller.
    Subscribe { device_id: Option<String>, subscription: NewPushSubscription }
        -> PushSubscriptionRow, subscribe, "recording a push subscription";
    /// Removes a subscription of that caller: whether it was there.
    Unsubscribe { subscription_id: String, device_id: Option<String> } -> bool, unsubscribe,
        "removing a push subscription";
}

/// The store's plain reads, each once, as [`commands!`] makes the
/// decisions: its variant of [`Read`], its answer (the same variant of
/// [`Found`]), and the typed call on `dyn Store` ([`Store::read`]).
macro_rules! reads {
    ($(
        $(#[$doc:meta])*
        $variant:ident { $($field:ident : $ty:ty),* $(,)? } -> $answer:ty, $method:ident;
    )*) => {
        /// A plain read for [`Store::read`]: no lock, no transaction of its
        /// own, what the store holds now.
        pub enum Read<'a> {
            $( $(#[$doc])* $variant { $($field: $ty),* }, )*
        }

        /// What a [`Read`] found: the answer of the same variant.
        pub enum Found {
            $( $variant(Box<$answer>), )*
        }

        /// The plain reads a backend answers, each with its own SQL: what
        /// its [`Store::read`] turns a [`Read`] into ([`Read::answer`]).
        #[async_trait]
        pub trait Reader<'a>: Sync {
            $( $(#[$doc])* async fn $method(&self, $($field: $ty),*) -> Result<$answer>; )*
        }

        impl<'a> Read<'a> {
            /// Answers this read from `reader`, the backend.
            pub async fn answer<R: Reader<'a> + ?Sized>(self, reader: &R) -> Result<Found> {
                Ok(match self {
                    $( Read::$variant { $($field),* } =>
                        Found::$variant(Box::new(reader.$method($($field),*).await?)), )*
                })
            }
        }

        impl dyn Store {
            $(
                $(#[$doc])*
                #[allow(clippy::extra_unused_lifetimes)]
                pub async fn $method<'a>(&self, $($field: $ty),*) -> Result<$answer> {
                    match self.read(Read::$variant { $($field),* }).await? {
                        Found::$variant(answer) => Ok(*answer),
                        #[allow(unreachable_patterns)]
                        _ => Err(mismatched()),
                    }
                }
            )*
        }
    };
}

reads! {
    /// A session, if it exists.
    Session { session_id: &'a str } -> Option<SessionRow>, session;
    /// Sessions matching the filters after the cursor, oldest first, at most `limit`.
    Sessions { filter: ListSessions, limit: u32 } -> Vec<SessionRow>, sessions;
    /// The open sessions that hold an active claim, each with when its claim
    /// was made: what the broker's sweep for gone holders
    /// ([`crate::decide::turn::holder_gone`]) looks at.
    HeldSessions {} -> Vec<(SessionRow, i64)>, held_sessions;
    /// The open sessions whose agent, last reported waiting, has not been
    /// heard from since `away_before` and was not announced away since, or,
    /// last reported working, not since `stalled_before` and not announced
    /// stalled: the candidates of [`crate::decide::presence::lapsed`] and
    /// [`crate::decide::presence::stalls`].
    SilentSessions { away_before: i64, stalled_before: i64 } -> Vec<String>, silent_sessions;
    /// The open sessions whose agent exited before `left_before`, nothing
    /// waiting.
    ExitedSessions { left_before: i64 } -> Vec<String>, exited_sessions;
    /// One request; 404 for an unknown session or request.
    Permission { session_id: &'a str, request_id: &'a str } -> PermissionRow, permission;
    /// The session's requests (in `state`, if given): pending first, then
    /// newest first, at most [`crate::permission::LIST_LIMIT`].
    Permissions { session_id: &'a str, state: Option<PermissionState> } -> Vec<PermissionRow>,
        permissions;
    /// Of the sessions from `first` to `last` (by id), those with a pending
    /// permission request: their agent waits for a person ("asking").
    AskingSessions { first: &'a str, last: &'a str } -> Vec<String>, asking_sessions;
    /// The session's Lark link; 404 for an unknown session.
    LarkLinkStatus { session_id: &'a str } -> LarkLink, lark_link_status;
    /// Pending replies and permission-request messages due at `now_ms`,
    /// oldest first (on PostgreSQL, leased to this replica).
    DueReplies { now_ms: i64, limit: u32 } -> Vec<ReplyJob>, due_replies;
    /// When the next pending reply or permission-request message falls due.
    NextReplyDue {} -> Option<i64>, next_reply_due;
    /// Permission cards due for their final form at `now_ms`, oldest first.
    DueCardUpdates { now_ms: i64, limit: u32 } -> Vec<CardUpdateJob>, due_card_updates;
    /// Queued turns over all sessions, and when the oldest was enqueued.
    QueueStats {} -> (i64, Option<i64>), queue_stats;
    /// The number of the session's latest event (0 when none); 404 for an unknown session.
    LastEventNo { session_id: &'a str } -> i64, last_event_no;
    /// The session's events after `after`, in order, at most `limit`.
    Events { session_id: &'a str, after: i64, limit: u32 } -> Vec<EventRow>, events;
    /// One turn; 404 for an unknown session or turn.
    Turn { session_id: &'a str, turn_id: &'a str } -> TurnRow, turn;
    /// A page of a session's turns in seq order, and whether more lie beyond it.
    Turns { session_id: &'a str, page: ListTurns, limit: u32 } -> (Vec<TurnRow>, bool), turns;
    /// Lark download jobs due at `now_ms`, oldest first (on PostgreSQL,
    /// leased to this replica for [`FETCH_LEASE_MS`]).
    DueFetches { now_ms: i64, limit: u32 } -> Vec<FetchJob>, due_fetches;
    /// When the next Lark download job falls due.
    NextFetchDue {} -> Option<i64>, next_fetch_due;
    /// Whether the session holds a turn enqueued with this `client_message_id`
    /// (a replay: its files are counted in the session's already).
    HasClientMessageId { session_id: &'a str, client_message_id: &'a str } -> bool,
        has_client_message_id;
    /// The bytes of the session's turns' files, all together.
    SessionAttachmentBytes { session_id: &'a str } -> u64, session_attachment_bytes;
    /// The session's latest report of its working tree, with its latest
    /// turns' files; 404 for an unknown session or none reported.
    Changes { session_id: &'a str } -> crate::model::Changes, changes;
    /// One file of the session's latest report, with its diff; 404 for an
    /// unknown session, none reported, or a file not in it.
    FileChanges { session_id: &'a str, path: &'a str } -> crate::model::FileChanges, file_changes;
    /// A turn's file at `position`: its name, the type it is served as and
    /// its bytes; `None` when the session, turn or position names none.
    Attachment { session_id: &'a str, turn_id: &'a str, position: u32 } -> Option<AttachmentBytes>,
        attachment;
    /// The devices signed in, oldest first.
    Devices {} -> Vec<DeviceRow>, devices;
    /// The device whose credential has this hash, if one is signed in.
    DeviceByToken { token_hash: &'a str } -> Option<DeviceRow>, device_by_token;
    /// The push subscriptions of the owner (`None`) or a device, oldest first.
    PushSubscriptions { device_id: Option<&'a str> } -> Vec<PushSubscriptionRow>,
        push_subscriptions;
    /// Every push subscription (at most 10 for the owner and for each device).
    AllPushSubscriptions {} -> Vec<PushSubscriptionRow>, all_push_subscriptions;
}

impl Done {
    /// What an enqueue decided (an error for any other command's outcome).
    pub fn enqueued(self) -> Result<Enqueue> {
        match self {
            Done::Enqueue(done) => Ok(*done),
            _ => Err(mismatched()),
        }
    }

    /// What a claim decided (an error for any other command's outcome).
    pub fn claimed(self) -> Result<ClaimOutcome> {
        match self {
            Done::Claim(outcome) => Ok(*outcome),
            _ => Err(mismatched()),
        }
    }
}

fn mismatched() -> crate::error::Error {
    crate::error::Error::store("deciding", "a command answered with another's outcome")
}

/// The durable state behind the broker: one transaction per decision (its
/// rows loaded and locked, [`crate::decide`] called, its writes applied),
/// plain reads, and the feed of what committed decisions changed. An
/// implementation decides nothing and never waits for a client.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// What committed decisions change, as they commit.
    fn feed(&self) -> &ChangeFeed;

    /// Whether other processes may share this store (PostgreSQL replicas).
    /// Their waiters are woken through the store's feed; only a store of
    /// one process lets the broker hand its own parked claims a turn.
    fn shared(&self) -> bool;

    /// Decides `first` and then `then` in one transaction, each exactly as
    /// its own method would: `first`'s refusal or failure fails both, and
    /// `then`'s refusal undoes its own writes only and is answered in its
    /// place (a claim refused after an enqueue keeps the enqueue).
    async fn together(&self, first: Command, then: Command) -> Result<(Done, Result<Done>)>;

    /// Takes one decision in its own transaction (the typed calls on
    /// `dyn Store`, one per [`Command`], come here).
    async fn decide(&self, command: Command) -> Result<Done>;

    /// Answers one plain read (the typed calls on `dyn Store`, one per
    /// [`Read`], come here).
    async fn read(&self, read: Read<'_>) -> Result<Found>;

    /// Answers when the store can serve requests.
    async fn ping(&self) -> Result<()>;
}

/// A Lark turn's download job, as [`Read::DueFetches`] gives it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct FetchJob {
    pub turn_id: String,
    pub session_id: String,
    pub message_id: String,
    /// The [`crate::decide::lark::Resource`]s, as JSON.
    pub resources: String,
    /// Failed attempts so far (a rate-limit wait is none).
    pub failures: i64,
}

/// How long a PostgreSQL replica holds the download jobs it took before
/// another may take them (a replica that died mid-download); on SQLite the
/// one broker takes every due job, a restart's at once.
pub const FETCH_LEASE_MS: i64 = 10 * 60_000;

/// [`Read::DueFetches`] (`$1` now, `$2` limit).
pub const DUE_FETCHES: &str = "select turn_id, session_id, message_id, resources, failures \
     from lark_fetches where next_attempt_at <= $1 order by next_attempt_at limit $2";
/// [`Read::NextFetchDue`].
pub const NEXT_FETCH_DUE: &str = "select min(next_attempt_at) from lark_fetches";
/// A download job started (`$1` turn, `$2` session, `$3` message, `$4`
/// resources, `$5` now).
pub const INSERT_FETCH: &str = "insert into lark_fetches \
     (turn_id, session_id, message_id, resources, failures, next_attempt_at, created_at) \
     values ($1, $2, $3, $4, 0, $5, $5)";
/// A download job over (`$1` turn).
pub const DELETE_FETCH: &str = "delete from lark_fetches where turn_id = $1";
/// Whether a download job is pending (`$1` turn).
pub const FETCH_PENDING: &str = "select count(*) from lark_fetches where turn_id = $1";
/// [`Command::RecordFetch`] (`$1` failures, `$2` next attempt, `$3` turn).
pub const RECORD_FETCH: &str =
    "update lark_fetches set failures = $1, next_attempt_at = $2 where turn_id = $3";
/// A queued turn takes its fetched files and text (`$1` text, `$2`
/// attachments JSON, `$3` turn); its `turn_attachments` rows follow.
pub const FETCHED_TURN: &str = "update turns set text = $1, attachments = $2 where turn_id = $3";

/// A file's bytes to store, with the turn that names them
/// ([`Command::Enqueue`], [`Command::LarkFetched`]).
#[derive(Debug, Clone)]
pub struct Blob {
    pub sha256: String,
    pub sniffed_type: Option<&'static str>,
    pub bytes: bytes::Bytes,
    pub at: i64,
}

/// The bytes of each upload, to be stored in the transaction of the turn
/// that names them (never before: a refused upload leaves nothing behind).
pub fn blobs(uploads: &[crate::attachments::Upload]) -> Vec<Blob> {
    let at = crate::time::now_ms();
    uploads
        .iter()
        .map(|upload| Blob {
            sha256: upload.stored.sha256.clone(),
            sniffed_type: crate::attachments::sniff_image(&upload.bytes),
            bytes: upload.bytes.clone(),
            at,
        })
        .collect()
}

/// A stored file, for its download.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AttachmentBytes {
    pub name: String,
    pub content_type: String,
    pub bytes: Vec<u8>,
}

/// A file's bytes (`$1` sha256, `$2` size, `$3` sniffed type, `$4` bytes,
/// `$5` now): stored once; stored again, only `created_at` is touched, so
/// retention's sweep of unnamed blobs spares one an enqueue is about to name.
pub const UPSERT_BLOB: &str = "insert into attachment_blobs \
     (sha256, size, sniffed_type, bytes, created_at) values ($1, $2, $3, $4, $5) \
     on conflict (sha256) do update set created_at = excluded.created_at";

/// A turn's file, in the enqueue's transaction (`$1` turn, `$2` position,
/// `$3` session, `$4` name, `$5` declared type, `$6` content type, `$7` size,
/// `$8` sha256).
pub const INSERT_TURN_ATTACHMENT: &str = "insert into turn_attachments \
     (turn_id, position, session_id, name, declared_type, content_type, size, sha256) \
     values ($1, $2, $3, $4, $5, $6, $7, $8)";

/// [`Read::HasClientMessageId`] (`$1` session, `$2` id).
pub const CLIENT_MESSAGE_ID_USED: &str =
    "select count(*) from turns where session_id = $1 and client_message_id = $2";

/// The bytes a session's files hold (`$1`).
pub const SESSION_ATTACHMENT_BYTES: &str =
    "select cast(coalesce(sum(size), 0) as bigint) from turn_attachments where session_id = $1";

/// One file of a turn, for its download (`$1` session, `$2` turn, `$3` position).
pub const ATTACHMENT_DOWNLOAD: &str = "select a.name, a.content_type, b.bytes \
     from turn_attachments a join attachment_blobs b on b.sha256 = a.sha256 \
     where a.session_id = $1 and a.turn_id = $2 and a.position = $3";
