//! The statements both stores run the same way, neutral: their SQL once
//! (`$1`, `$2`, … numbered in the order they first appear, which SQLite and
//! PostgreSQL both bind by), and their values as [`Arg`]s, which each
//! backend binds its own way. What a decision writes beside its turn (a
//! Lark event guard, a link, a pairing code, a chat, a note, a permission
//! request and its message, a card's answer, a close's sweep, a download
//! job) and the outbox's bookkeeping are here, and the plain reads
//! ([`super::reads`]) are built of them; a turn decision's own rows (turn,
//! claim, session, event, reply) stay with each backend, which writes them
//! its fastest way (SQLite's journal, PostgreSQL's one statement), but their
//! values are listed here once ([`Binder`]): both backends' statements for
//! them number their parameters alike.

use crate::decide::lark::FetchWrite;
use crate::decide::pairing::PairCodeWrite;
use crate::decide::{
    Change, ClaimRow, Continuation, NewEvent, NewReply, SessionRow, Sweep, TurnRow, Writes,
};
use crate::devices::NewDevice;
use crate::model::{NewPushSubscription, RegisterAgentThread};
use crate::store::{Blob, CardUpdateJob, Outbound, ReplyUpdate};

/// A value a statement binds. A null keeps its column's kind (PostgreSQL
/// types every parameter).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Arg {
    Int(Option<i64>),
    Text(Option<String>),
    /// A person's text: SQLite keeps it as text, PostgreSQL as bytes (its
    /// text type refuses U+0000, which a message may hold).
    Body(Option<String>),
    Bytes(bytes::Bytes),
}

impl From<i64> for Arg {
    fn from(v: i64) -> Self {
        Arg::Int(Some(v))
    }
}
impl From<Option<i64>> for Arg {
    fn from(v: Option<i64>) -> Self {
        Arg::Int(v)
    }
}
impl From<bool> for Arg {
    fn from(v: bool) -> Self {
        Arg::Int(Some(i64::from(v)))
    }
}
impl From<&str> for Arg {
    fn from(v: &str) -> Self {
        Arg::Text(Some(v.to_owned()))
    }
}
impl From<&String> for Arg {
    fn from(v: &String) -> Self {
        Arg::Text(Some(v.clone()))
    }
}
impl From<String> for Arg {
    fn from(v: String) -> Self {
        Arg::Text(Some(v))
    }
}
impl From<&Option<String>> for Arg {
    fn from(v: &Option<String>) -> Self {
        Arg::Text(v.clone())
    }
}
impl From<Option<&str>> for Arg {
    fn from(v: Option<&str>) -> Self {
        Arg::Text(v.map(str::to_owned))
    }
}

/// The contract's enums are stored as their snake_case wire names.
macro_rules! wire_arg {
    ($($t:ty),*) => {$(
        impl From<$t> for Arg {
            fn from(v: $t) -> Self {
                Arg::Text(Some(crate::model::wire(&v)))
            }
        }
        impl From<Option<$t>> for Arg {
            fn from(v: Option<$t>) -> Self {
                Arg::Text(v.map(|v| crate::model::wire(&v)))
            }
        }
    )*};
}
wire_arg!(
    crate::model::SessionState,
    crate::model::TurnState,
    crate::model::CancelReason,
    crate::model::ReplyState,
    crate::model::PermissionState,
    crate::model::AnsweredVia
);

/// A person's text ([`Arg::Body`]).
fn body(text: &str) -> Arg {
    Arg::Body(Some(text.to_owned()))
}

/// Content that may be absent.
fn optional_body(text: Option<&str>) -> Arg {
    Arg::Body(text.map(str::to_owned))
}

/// A diagnostic from afar, storable anywhere: a stray U+0000 replaced.
fn diagnostic(error: Option<String>) -> Arg {
    Arg::Text(error.map(|e| e.replace('\0', "\u{fffd}")))
}

/// One statement and its values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Statement {
    pub sql: &'static str,
    pub args: Vec<Arg>,
}

impl Statement {
    pub(crate) fn new(sql: &'static str) -> Self {
        Statement {
            sql,
            args: Vec::new(),
        }
    }

    pub(crate) fn bind(mut self, arg: impl Into<Arg>) -> Self {
        self.args.push(arg.into());
        self
    }
}

/// A backend's query under construction, for a turn decision's own rows:
/// their values listed once, in the order both backends' statements number
/// them, bound without going through [`Arg`] (the hot path allocates no
/// list of values of its own).
pub(crate) trait Binder<'a>: Sized {
    fn int(self, v: Option<i64>) -> Self;
    fn text(self, v: Option<&'a str>) -> Self;
    /// A person's text ([`Arg::Body`]).
    fn body(self, v: &'a str) -> Self;
    /// An enumeration, as its snake_case wire name.
    fn word(self, v: &impl serde::Serialize) -> Self;
}

/// A new turn's 12 values: `turn_id, session_id, seq, origin, text,
/// client_message_id, lark_chat_id, lark_message_id, state, enqueued_at,
/// claimed_at, attachments`.
pub(crate) fn turn_values<'a, B: Binder<'a>>(b: B, t: &'a TurnRow) -> B {
    b.text(Some(&t.turn_id))
        .text(Some(&t.session_id))
        .int(Some(t.seq))
        .word(&t.origin)
        .body(&t.text)
        .text(t.client_message_id.as_deref())
        .text(t.lark_chat_id.as_deref())
        .text(t.lark_message_id.as_deref())
        .word(&t.state)
        .int(Some(t.enqueued_at))
        .int(t.claimed_at)
        .text(t.attachments.as_deref())
}

/// A turn update's first 5 values, which every update sets: `state $1,
/// claimed_at $2, claim_count $3, current_claim_id $4` where `turn_id $5`
/// (a completion's `completed_at $6, completion_id $7, response $8` and a
/// cancellation's reason follow, as each backend's statement has them).
pub(crate) fn turn_update_values<'a, B: Binder<'a>>(b: B, t: &'a TurnRow) -> B {
    b.word(&t.state)
        .int(t.claimed_at)
        .int(Some(t.claim_count))
        .text(t.current_claim_id.as_deref())
        .text(Some(&t.turn_id))
}

/// A claim's values: a new one's `claim_id, session_id, turn_id, attempt,
/// state, claimed_at`; an update's `state $1, released_at $2` where
/// `claim_id $3`.
pub(crate) fn claim_values<'a, B: Binder<'a>>(b: B, change: &'a Change<ClaimRow>) -> B {
    match change {
        Change::Insert(c) => b
            .text(Some(&c.claim_id))
            .text(Some(&c.session_id))
            .text(Some(&c.turn_id))
            .int(Some(c.attempt))
            .word(&c.state)
            .int(Some(c.claimed_at)),
        Change::Update(c) => b.word(&c.state).int(c.released_at).text(Some(&c.claim_id)),
    }
}

/// What a decision changes in a session row, 14 values: `next_seq $1,
/// next_event_no $2, queued_count $3, active_claim_id $4` where
/// `session_id $5`, then `agent_state $6, agent_since $7, agent_heard_at $8,
/// holder_heard_at $9, waker_heard_at $10, agent_tool $11, tool_since $12,
/// terminal_turn_id $13, stalled_at $14` (a statement that sets `state` and
/// `closed_at` binds them after, `$15` and `$16`).
pub(crate) fn session_values<'a, B: Binder<'a>>(b: B, s: &'a SessionRow) -> B {
    b.int(Some(s.next_seq))
        .int(Some(s.next_event_no))
        .int(Some(s.queued_count))
        .text(s.active_claim_id.as_deref())
        .text(Some(&s.session_id))
        .text(Some(s.agent_state.as_str()))
        .int(s.agent_since)
        .int(s.agent_heard_at)
        .int(s.holder_heard_at)
        .int(s.waker_heard_at)
        .text(s.agent_tool.as_deref())
        .int(s.tool_since)
        .text(s.terminal_turn_id.as_deref())
        .int(s.stalled_at)
}

/// A new event's 8 values: `session_id, event_no, kind, turn_id, seq,
/// request_id, state, at`.
pub(crate) fn event_values<'a, B: Binder<'a>>(b: B, e: &'a NewEvent) -> B {
    b.text(Some(&e.session_id))
        .int(Some(e.event_no))
        .text(Some(e.kind))
        .text(e.turn_id.as_deref())
        .int(e.seq)
        .text(e.request_id.as_deref())
        .text(Some(e.state))
        .int(Some(e.at))
}

/// A new Lark reply's 6 values: `turn_id, session_id, chat_id, message_id,
/// text, at` (its `at` stands for when it is next due, created and updated).
pub(crate) fn reply_values<'a, B: Binder<'a>>(b: B, r: &'a NewReply) -> B {
    b.text(Some(&r.turn_id))
        .text(Some(&r.session_id))
        .text(Some(&r.chat_id))
        .text(Some(&r.message_id))
        .body(&r.text)
        .int(Some(r.at))
}

const INSERT_LARK_EVENT: &str = "insert into lark_events (app_id, event_id, message_id, \
     received_at) values ($1, $2, $3, $4)";
const DELETE_LINK: &str = "delete from lark_links where session_id = $1";
const INSERT_LINK: &str = "insert into lark_links (chat_id, session_id, linked_at, approvers, \
     terminal_turns) values ($1, $2, $3, $4, $5)";
const INSERT_PERMISSION: &str = "insert into permission_requests (session_id, request_id, \
     tool_name, description, input_preview, state, created_at, answered_at, answered_via, \
     detail) values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";
const UPDATE_PERMISSION: &str = "update permission_requests set state = $1, answered_at = $2, \
     answered_via = $3, relayed_at = $4, answer = $5 where session_id = $6 and request_id = $7";
const INSERT_PERMISSION_MESSAGE: &str = "insert into lark_permission_messages (session_id, \
     request_id, chat_id, text, state, next_attempt_at, created_at, updated_at) \
     values ($1, $2, $3, $4, 'pending', $5, $5, $5)";
const ANSWER_CARD: &str = "update lark_permission_messages \
     set answered_by = coalesce($1, answered_by), \
         update_state = case when $2 = 1 and update_state = 'pending' then 'sent' \
                             else update_state end \
     where session_id = $3 and request_id = $4";
const SWEEP_TURN_EVENTS: &str = "insert into session_events (session_id, event_no, kind, \
         turn_id, seq, state, at) \
     select session_id, $1 - 1 + row_number() over (order by seq), 'turn', turn_id, seq, $2, $3 \
     from turns where session_id = $4 and (state = 'queued' or turn_id = $5)";
const SWEEP_TURNS: &str = "update turns set state = $1, cancel_reason = $2 \
     where session_id = $3 and (state = 'queued' or turn_id = $4)";
const SWEEP_PERMISSION_EVENTS: &str = "insert into session_events (session_id, event_no, kind, \
         request_id, state, at) \
     select session_id, $1 - 1 + row_number() over (order by created_at, request_id), \
         'permission', request_id, $2, $3 \
     from permission_requests where session_id = $4 and state = 'pending'";
const SWEEP_PERMISSIONS: &str = "update permission_requests set state = $1, answered_at = $2 \
     where session_id = $3 and state = 'pending'";

/// What a decision writes before its turn, in this order: the Lark event
/// guard, the pairing code, chat, sent message and note, the link change,
/// the permission request and its message, the card's answer, the close's
/// sweep. (The step taken before, [`Writes::before`], is the caller's.)
pub(crate) fn side_writes(writes: &Writes) -> Vec<Statement> {
    let mut out = Vec::new();
    if let Some(c) = &writes.continuation {
        out.extend(continuation_writes(c));
    }
    if let Some(e) = &writes.lark_event {
        out.push(
            Statement::new(INSERT_LARK_EVENT)
                .bind(&e.app_id)
                .bind(&e.event_id)
                .bind(&e.message_id)
                .bind(e.at),
        );
    }
    pairing_writes(writes, &mut out);
    if let Some(change) = &writes.link {
        out.push(Statement::new(DELETE_LINK).bind(&change.session_id));
        if let Some(link) = &change.link {
            out.push(
                Statement::new(INSERT_LINK)
                    .bind(&link.chat_id)
                    .bind(&change.session_id)
                    .bind(link.at)
                    .bind(&link.approvers)
                    .bind(link.terminal_turns),
            );
        }
    }
    permission_writes(writes, &mut out);
    if let Some(card) = &writes.card {
        out.push(
            Statement::new(ANSWER_CARD)
                .bind(&card.answered_by)
                .bind(card.shown)
                .bind(&card.session_id)
                .bind(&card.request_id),
        );
    }
    if let Some(sweep) = &writes.sweep {
        out.extend(sweep_writes(sweep));
    }
    if let Some(changes) = &writes.changes {
        out.extend(changes_writes(changes));
    }
    out
}

/// A session's latest report (`$1` session, `$2` body, `$3` now).
const UPSERT_CHANGES: &str = "insert into session_changes (session_id, body, reported_at) \
     values ($1, $2, $3) on conflict (session_id) \
     do update set body = excluded.body, reported_at = excluded.reported_at";
/// A turn's files (`$1` turn, `$2` session, `$3` files, `$4` now).
const UPSERT_TURN_CHANGES: &str = "insert into turn_changes \
     (turn_id, session_id, files, updated_at) values ($1, $2, $3, $4) on conflict (turn_id) \
     do update set files = excluded.files, updated_at = excluded.updated_at";

/// A report kept: the session's latest, and its turn's files.
fn changes_writes(changes: &crate::decide::changes::ChangesWrite) -> Vec<Statement> {
    let mut out = vec![
        Statement::new(UPSERT_CHANGES)
            .bind(&changes.session_id)
            .bind(Arg::Bytes(changes.body.clone().into()))
            .bind(changes.at),
    ];
    if let Some(turn) = &changes.turn {
        out.push(
            Statement::new(UPSERT_TURN_CHANGES)
                .bind(&turn.turn_id)
                .bind(&turn.session_id)
                .bind(Arg::Bytes(turn.files.clone().into()))
                .bind(turn.at),
        );
    }
    out
}

fn pairing_writes(writes: &Writes, out: &mut Vec<Statement>) {
    match &writes.pair_code {
        Some(PairCodeWrite::New {
            code_hash,
            session_id,
            at,
            expires_at,
        }) => out.push(
            Statement::new(crate::store::INSERT_PAIR_CODE)
                .bind(code_hash)
                .bind(session_id)
                .bind(*at)
                .bind(*expires_at),
        ),
        Some(PairCodeWrite::Used { code_hash, at }) => out.push(
            Statement::new(crate::store::SPEND_PAIR_CODE)
                .bind(*at)
                .bind(code_hash),
        ),
        None => {}
    }
    if let Some(chat) = &writes.chat {
        out.push(
            Statement::new(crate::store::UPSERT_CHAT)
                .bind(&chat.chat_id)
                .bind(chat.failed_codes)
                .bind(chat.failed_since)
                .bind(&chat.current_session_id),
        );
    }
    if let Some(sent) = &writes.sent {
        out.push(message_sent(
            &sent.message_id,
            &sent.session_id,
            &sent.chat_id,
            sent.at,
        ));
    }
    if let Some(note) = &writes.note {
        out.push(
            Statement::new(crate::store::INSERT_NOTE)
                .bind(&note.message_id)
                .bind(&note.chat_id)
                .bind(body(&note.text))
                .bind(note.at)
                .bind(&note.session_id)
                .bind(note.reply),
        );
    }
}

fn permission_writes(writes: &Writes, out: &mut Vec<Statement>) {
    match &writes.permission {
        Some(Change::Insert(row)) => out.push(
            Statement::new(INSERT_PERMISSION)
                .bind(&row.session_id)
                .bind(&row.request_id)
                .bind(&row.tool_name)
                .bind(body(&row.description))
                .bind(body(&row.input_preview))
                .bind(row.state)
                .bind(row.created_at)
                .bind(row.answered_at)
                .bind(row.answered_via)
                .bind(optional_body(row.detail.as_deref())),
        ),
        Some(Change::Update(row)) => out.push(
            Statement::new(UPDATE_PERMISSION)
                .bind(row.state)
                .bind(row.answered_at)
                .bind(row.answered_via)
                .bind(row.relayed_at)
                .bind(optional_body(row.answer.as_deref()))
                .bind(&row.session_id)
                .bind(&row.request_id),
        ),
        None => {}
    }
    if let Some(m) = &writes.permission_message {
        out.push(
            Statement::new(INSERT_PERMISSION_MESSAGE)
                .bind(&m.session_id)
                .bind(&m.request_id)
                .bind(&m.chat_id)
                .bind(body(&m.text))
                .bind(m.at),
        );
    }
}

/// A session continued in another: the queued turns' events in the new
/// session's log first (they are read where the turns still are), then
/// their files, download jobs and the turns, then what is Lark's.
fn continuation_writes(c: &Continuation) -> [Statement; 8] {
    let (from, to) = (&c.from, &c.to);
    [
        Statement::new(MOVE_TURN_EVENTS)
            .bind(to)
            .bind(c.events_from)
            .bind(c.at)
            .bind(from),
        Statement::new(MOVE_TURN_FILES).bind(to).bind(from),
        Statement::new(MOVE_FETCHES).bind(to).bind(from),
        Statement::new(MOVE_TURNS).bind(to).bind(from),
        Statement::new(MOVE_LINK).bind(to).bind(from),
        Statement::new(MOVE_CURRENT).bind(to).bind(from),
        Statement::new(MOVE_SENT).bind(to).bind(from),
        Statement::new(CONTINUED_IN).bind(to).bind(from),
    ]
}

const MOVE_TURN_EVENTS: &str = "insert into session_events (session_id, event_no, kind, \
         turn_id, seq, state, at) \
     select $1, $2 - 1 + row_number() over (order by seq), 'turn', turn_id, seq, 'queued', $3 \
     from turns where session_id = $4 and state = 'queued'";
const MOVE_TURN_FILES: &str = "update turn_attachments set session_id = $1 \
     where turn_id in (select turn_id from turns where session_id = $2 and state = 'queued')";
const MOVE_FETCHES: &str = "update lark_fetches set session_id = $1 where session_id = $2";
const MOVE_TURNS: &str = "update turns set session_id = $1 \
     where session_id = $2 and state = 'queued'";
const MOVE_LINK: &str = "update lark_links set session_id = $1 where session_id = $2";
const MOVE_CURRENT: &str = "update lark_chats set current_session_id = $1 \
     where current_session_id = $2";
const MOVE_SENT: &str = "update lark_sent set session_id = $1 where session_id = $2";
const CONTINUED_IN: &str = "update sessions set continued_in = $1 where session_id = $2";

/// A close's sweep: the session's queued turns (and its open terminal turn)
/// cancelled and its pending permission requests expired, each with its
/// numbered event.
fn sweep_writes(sweep: &Sweep) -> [Statement; 4] {
    [
        Statement::new(SWEEP_TURN_EVENTS)
            .bind(sweep.cancelled_from)
            .bind(sweep.cancelled)
            .bind(sweep.at)
            .bind(&sweep.session_id)
            .bind(&sweep.terminal),
        Statement::new(SWEEP_TURNS)
            .bind(sweep.cancelled)
            .bind(sweep.cancel_reason)
            .bind(&sweep.session_id)
            .bind(&sweep.terminal),
        Statement::new(SWEEP_PERMISSION_EVENTS)
            .bind(sweep.expired_from)
            .bind(sweep.expired)
            .bind(sweep.at)
            .bind(&sweep.session_id),
        Statement::new(SWEEP_PERMISSIONS)
            .bind(sweep.expired)
            .bind(sweep.at)
            .bind(&sweep.session_id),
    ]
}

/// A turn's files (its `attachments` list), one `turn_attachments` row
/// each, written after the turn.
pub(crate) fn attachment_rows(t: &TurnRow) -> Vec<Statement> {
    crate::attachments::parse_list(t.attachments.as_deref())
        .into_iter()
        .map(|a| {
            Statement::new(crate::store::INSERT_TURN_ATTACHMENT)
                .bind(&t.turn_id)
                .bind(i64::from(a.position))
                .bind(&t.session_id)
                .bind(a.name)
                .bind(a.declared_type)
                .bind(a.content_type)
                .bind(a.size as i64)
                .bind(a.sha256)
        })
        .collect()
}

/// A Lark turn's download job started, or finished (the turn, still
/// queued, taking its files and text): written after the turn.
pub(crate) fn fetch_writes(fetch: &FetchWrite) -> Vec<Statement> {
    match fetch {
        FetchWrite::Start {
            turn_id,
            session_id,
            message_id,
            resources,
            at,
        } => vec![
            Statement::new(crate::store::INSERT_FETCH)
                .bind(turn_id)
                .bind(session_id)
                .bind(message_id)
                .bind(resources)
                .bind(*at),
        ],
        FetchWrite::Finish { turn_id, turn } => {
            let mut out = Vec::new();
            if let Some(t) = turn {
                out.push(
                    Statement::new(crate::store::FETCHED_TURN)
                        .bind(body(&t.text))
                        .bind(&t.attachments)
                        .bind(&t.turn_id),
                );
                out.extend(attachment_rows(t));
            }
            out.push(Statement::new(crate::store::DELETE_FETCH).bind(turn_id));
            out
        }
    }
}

/// A session a bind created.
pub(crate) fn insert_session(s: &SessionRow) -> Statement {
    Statement::new(crate::store::INSERT_SESSION)
        .bind(&s.session_id)
        .bind(&s.goal_id)
        .bind(&s.agent_id)
        .bind(&s.host_surface)
        .bind(&s.host_session_id)
        .bind(&s.executor_endpoint_id)
        .bind(s.state)
        .bind(s.created_at)
        .bind(s.next_seq)
        .bind(s.next_event_no)
        .bind(s.queued_count)
        .bind(&s.terminal)
        .bind(&s.continued_from)
}

/// An agent thread registered (one row affected: it was new).
pub(crate) fn register(thread: &RegisterAgentThread, at: i64) -> Statement {
    Statement::new(crate::store::REGISTER)
        .bind(&thread.goal_id)
        .bind(&thread.agent_id)
        .bind(&thread.host_surface)
        .bind(&thread.host_session_id)
        .bind(at)
}

/// A message the broker sent for a session, to route replies to it.
pub(crate) fn message_sent(
    message_id: &str,
    session_id: &str,
    chat_id: &str,
    at: i64,
) -> Statement {
    Statement::new(crate::store::INSERT_SENT)
        .bind(message_id)
        .bind(session_id)
        .bind(chat_id)
        .bind(at)
}

/// A permission request's card was sent, as `message_id`.
pub(crate) fn card_sent(session_id: &str, request_id: &str, message_id: &str) -> Statement {
    Statement::new(crate::store::CARD_SENT)
        .bind(message_id)
        .bind(session_id)
        .bind(request_id)
}

/// What became of an outbox message's attempt (it replaces the lease).
pub(crate) fn record_reply(outbound: Outbound, update: ReplyUpdate, at: i64) -> Statement {
    let (sql, keys) = crate::store::record_outbox(outbound);
    let statement = Statement::new(sql)
        .bind(update.parts_sent)
        .bind(update.state)
        .bind(update.attempts)
        .bind(update.failures)
        .bind(diagnostic(update.error))
        .bind(update.next_attempt_at)
        .bind(at);
    keys.into_iter().fold(statement, Statement::bind)
}

/// What became of a card update's attempt (it replaces the lease).
pub(crate) fn record_card_update(job: &CardUpdateJob, update: ReplyUpdate) -> Statement {
    Statement::new(crate::store::RECORD_CARD_UPDATE)
        .bind(update.state)
        .bind(update.attempts)
        .bind(update.failures)
        .bind(diagnostic(update.error))
        .bind(update.next_attempt_at)
        .bind(&job.session_id)
        .bind(&job.request_id)
}

/// A file's bytes, stored once under their sha256.
pub(crate) fn put_blob(blob: &Blob) -> Statement {
    Statement::new(crate::store::UPSERT_BLOB)
        .bind(&blob.sha256)
        .bind(blob.bytes.len() as i64)
        .bind(blob.sniffed_type)
        .bind(Arg::Bytes(blob.bytes.clone()))
        .bind(blob.at)
}

/// A download job's failed attempt, and when to try again.
pub(crate) fn record_fetch(turn_id: &str, failures: i64, next_attempt_at: i64) -> Statement {
    Statement::new(crate::store::RECORD_FETCH)
        .bind(failures)
        .bind(next_attempt_at)
        .bind(turn_id)
}

/// A sign-in link (`$1` its code's hash, `$2` now, `$3` when it expires),
/// made only while fewer than `$4` links are open; expired links go first
/// ([`DROP_EXPIRED_LINKS`]).
pub(crate) fn mint_device_link(code_hash: &str, now: i64, max_open: i64) -> [Statement; 2] {
    [
        Statement::new(DROP_EXPIRED_LINKS).bind(now),
        Statement::new(INSERT_DEVICE_LINK)
            .bind(code_hash)
            .bind(now)
            .bind(now + crate::devices::LINK_TTL_MS)
            .bind(max_open),
    ]
}

/// Links expired (`$1` now) are no use to anyone: gone at the next mint.
const DROP_EXPIRED_LINKS: &str = "delete from device_links where expires_at <= $1";
const INSERT_DEVICE_LINK: &str = "insert into device_links (code_hash, created_at, expires_at) \
     select $1, $2, $3 where (select count(*) from device_links where used_at is null) < $4";

/// Spends a sign-in link (`$1` now, `$2` its code's hash): one row when it
/// was good (unused, not expired), none otherwise.
pub(crate) fn spend_device_link(code_hash: &str, now: i64) -> Statement {
    Statement::new(
        "update device_links set used_at = $1 \
         where code_hash = $2 and used_at is null and expires_at > $1",
    )
    .bind(now)
    .bind(code_hash)
}

/// A device signed in (`$1` id, `$2` name, `$3` its credential's hash,
/// `$4` now), while fewer than `$5` are.
pub(crate) fn insert_device(device_id: &str, device: &NewDevice, now: i64, max: i64) -> Statement {
    Statement::new(
        "insert into devices (device_id, name, token_hash, created_at) \
         select $1, $2, $3, $4 where (select count(*) from devices) < $5",
    )
    .bind(device_id)
    .bind(&device.name)
    .bind(&device.token_hash)
    .bind(now)
    .bind(max)
}

/// A device revoked (`$1`): its row and credential gone, and then its
/// push subscriptions.
pub(crate) fn revoke_device(device_id: &str) -> [Statement; 2] {
    [
        Statement::new("delete from devices where device_id = $1").bind(device_id),
        Statement::new("delete from push_subscriptions where device_id = $1").bind(device_id),
    ]
}

/// A push subscription (`$1` id, `$2` its caller's device or null for the
/// owner, `$3` endpoint, `$4` p256dh, `$5` auth, `$6` now), while its
/// caller holds fewer than `$7`; the endpoint's earlier row goes first (a
/// browser subscribing again).
pub(crate) fn subscribe(
    subscription_id: &str,
    device_id: Option<&str>,
    subscription: &NewPushSubscription,
    now: i64,
    max: i64,
) -> [Statement; 2] {
    [
        Statement::new("delete from push_subscriptions where endpoint = $1")
            .bind(subscription.endpoint.as_str()),
        Statement::new(
            "insert into push_subscriptions \
             (subscription_id, device_id, endpoint, p256dh, auth, created_at) \
             select $1, $2, $3, $4, $5, $6 where (select count(*) from push_subscriptions \
             where coalesce(device_id, '') = coalesce($2, '')) < $7",
        )
        .bind(subscription_id)
        .bind(device_id)
        .bind(subscription.endpoint.as_str())
        .bind(subscription.keys.p256dh.as_str())
        .bind(subscription.keys.auth.as_str())
        .bind(now)
        .bind(max),
    ]
}

/// A subscription (`$1`) of its caller (`$2`, null for the owner) removed.
pub(crate) fn unsubscribe(subscription_id: &str, device_id: Option<&str>) -> Statement {
    Statement::new(
        "delete from push_subscriptions \
         where subscription_id = $1 and coalesce(device_id, '') = coalesce($2, '')",
    )
    .bind(subscription_id)
    .bind(device_id)
}

/// A device (`$2`) was seen at `$1`.
pub(crate) fn device_seen(device_id: &str, at: i64) -> Statement {
    Statement::new("update devices set last_seen_at = $1 where device_id = $2")
        .bind(at)
        .bind(device_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every placeholder is `$n`, first seen in order 1, 2, …: SQLite
    /// numbers a `$n` by where it first appears, PostgreSQL by its `n`.
    fn numbered_in_order(sql: &str) -> bool {
        let mut next = 1;
        let mut rest = sql;
        while let Some(at) = rest.find('$') {
            let digits: String = rest[at + 1..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            let Ok(n) = digits.parse::<usize>() else {
                return false;
            };
            if n > next {
                return false;
            }
            if n == next {
                next += 1;
            }
            rest = &rest[at + 1 + digits.len()..];
        }
        true
    }

    /// A diagnostic Lark sent back may hold U+0000, which PostgreSQL text
    /// refuses: both stores record it with U+FFFD in its place, and the
    /// rest of it as it was.
    #[test]
    fn a_diagnostic_holding_nul_is_recorded_with_a_replacement_character() {
        let update = ReplyUpdate {
            parts_sent: 0,
            state: crate::model::ReplyState::Failed,
            attempts: 1,
            failures: 1,
            error: Some("bad\0request".into()),
            next_attempt_at: 0,
        };
        let outbound = Outbound::Reply {
            turn_id: "t".into(),
            message_id: "m".into(),
        };
        let recorded = record_reply(outbound, update, 1);
        assert_eq!(
            recorded.args[4],
            Arg::Text(Some("bad\u{fffd}request".into()))
        );
    }

    #[test]
    fn every_shared_statement_numbers_its_placeholders_in_order() {
        let outbound = [
            Outbound::Reply {
                turn_id: "t".into(),
                message_id: "m".into(),
            },
            Outbound::Permission {
                session_id: "s".into(),
                request_id: "r".into(),
            },
            Outbound::Note {
                message_id: "m".into(),
                reply: false,
            },
        ];
        let mut sqls: Vec<&str> = vec![
            INSERT_LARK_EVENT,
            DELETE_LINK,
            INSERT_LINK,
            INSERT_PERMISSION,
            UPDATE_PERMISSION,
            INSERT_PERMISSION_MESSAGE,
            ANSWER_CARD,
            SWEEP_TURN_EVENTS,
            SWEEP_TURNS,
            SWEEP_PERMISSION_EVENTS,
            SWEEP_PERMISSIONS,
            crate::store::INSERT_PAIR_CODE,
            crate::store::SPEND_PAIR_CODE,
            crate::store::UPSERT_CHAT,
            crate::store::INSERT_NOTE,
            crate::store::INSERT_SENT,
            crate::store::INSERT_TURN_ATTACHMENT,
            crate::store::INSERT_FETCH,
            crate::store::FETCHED_TURN,
            crate::store::DELETE_FETCH,
            crate::store::INSERT_SESSION,
            crate::store::REGISTER,
            crate::store::CARD_SENT,
            crate::store::RECORD_CARD_UPDATE,
            crate::store::UPSERT_BLOB,
            crate::store::RECORD_FETCH,
        ];
        sqls.extend(outbound.map(|o| crate::store::record_outbox(o).0));
        let device = NewDevice {
            name: "n".into(),
            token_hash: "h".into(),
        };
        let devices = [
            spend_device_link("h", 1),
            insert_device("d", &device, 1, 2),
            device_seen("d", 1),
            unsubscribe("s", None),
        ];
        let subscription = NewPushSubscription {
            endpoint: "e".into(),
            keys: crate::model::PushKeys {
                p256dh: "p".into(),
                auth: "a".into(),
            },
        };
        sqls.extend(revoke_device("d").iter().map(|s| s.sql));
        sqls.extend(
            subscribe("s", None, &subscription, 1, 2)
                .iter()
                .map(|s| s.sql),
        );
        sqls.extend(mint_device_link("h", 1, 2).iter().map(|s| s.sql));
        sqls.extend(devices.iter().map(|s| s.sql));
        for sql in sqls {
            assert!(numbered_in_order(sql), "placeholders out of order: {sql}");
        }
        assert!(!numbered_in_order("set a = $2, b = $1"));
    }
}
