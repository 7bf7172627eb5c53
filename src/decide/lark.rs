//! The Lark rules: a chat holds several open sessions, one of them current,
//! and a session is linked to at most one chat (linking it elsewhere moves
//! it); an event is taken once (by event id and by message id); a linked
//! chat's text goes to the session whose message it replies to, else to the
//! current one ([`super::chat::ChatRows::target`]), as an ordinary turn, or
//! an approver's `yes <id>` / `no <id>` answer to a permission request, or
//! ignored; a click on a request's card answers it as an approver's
//! `yes`/`no` would.

pub use super::FetchWrite;
use super::chat::{self, ChatCommand, ChatRows};
pub use super::ingest::LarkIngest;
pub use super::link::{LinkOptions, LinkRow, LinkRows, link, unlink};
pub use super::notice::{Choice, Missing, Picked};
use super::notice::{Note, SessionName};
use super::pairing::{PairAt, PairRows, noted, pair};
use super::permission::{AnswerRows, Decision, answer};
use super::turn::enqueue;
use super::{CardWrite, Decided, SeenLarkEvent, SentMessage, Writes};
use super::{SessionRow, TurnRow};
use super::{Subject, log};
use crate::error::Result;
use crate::ids::Minter;
use std::collections::BTreeMap;

use crate::model::{
    AnswerPermission, AnsweredVia, Behavior, EnqueueRequest, Ingress, LarkRef, Origin,
    PermissionKind, PermissionState, Question, TurnState,
};
use crate::permission::{LarkCommand, PermissionRow, approvers_from_stored};

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
    /// The command the text is (its @mentions removed), if one.
    pub chat_command: Option<ChatCommand>,
    /// The messages it replies to: its parent, and its thread's root.
    pub replies_to: Vec<String>,
    /// The files it names, to download after the event is committed
    /// (issue 39): its turn holds its place in the queue until they are
    /// stored or failed for good ([`fetched`]).
    pub files: Vec<Resource>,
}

/// A file a Lark message names (an `image_key` or a `file_key`), to fetch
/// through LARK.md's resource route.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Resource {
    pub key: String,
    /// `image` for an `image_key`, `file` for everything else (LARK.md).
    pub kind: String,
    pub name: Option<String>,
}

/// What a download job fetched: the files stored, and a line for each that
/// could not be fetched, saying which and why.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub session_id: String,
    pub turn_id: String,
    pub attachments: Vec<crate::attachments::Stored>,
    pub failures: Vec<String>,
}

/// What [`fetched`] reads: the session (locked), the turn, and whether its
/// job is still pending.
#[derive(Debug, Default)]
pub struct FetchedRows {
    pub session: Option<SessionRow>,
    pub turn: Option<TurnRow>,
    pub pending: bool,
    /// The bytes the session's files hold already.
    pub held: u64,
}

/// A download job's end: once (a job already finished, by a replica that
/// fetched the same files, changes nothing: `false`). A turn still queued
/// takes the files (none, each a failure line, if they would take the
/// session over its limit) and the failure lines (after its text), and is logged
/// `queued` again, which wakes the claims its job held back; a turn no
/// longer queued (its session closed) only ends the job.
pub fn fetched(rows: FetchedRows, mut fetched: Fetched, now: i64) -> Decided<bool> {
    if !rows.pending {
        return Decided::nothing(false);
    }
    let finish = |turn: Option<Box<TurnRow>>| FetchWrite::Finish {
        turn_id: fetched.turn_id.clone(),
        turn,
    };
    let queued = rows.turn.filter(|t| t.state == TurnState::Queued);
    let (Some(mut session), Some(turn)) = (rows.session, queued) else {
        return Decided {
            writes: Writes {
                fetch: Some(finish(None)),
                ..Writes::default()
            },
            answer: false,
        };
    };
    let adding = fetched.attachments.iter().map(|a| a.size).sum();
    if let Err(over) = crate::attachments::check_session(rows.held, adding) {
        // None is kept: each is a line of the text instead.
        for file in std::mem::take(&mut fetched.attachments) {
            fetched.failures.push(format!(
                "A file sent from Lark, {}, could not be kept: {}",
                file.name, over.message
            ));
        }
    }
    let text = match fetched.failures.is_empty() {
        true => turn.text,
        false => super::text::fit_text(format!("{}\n\n{}", turn.text, fetched.failures.join("\n"))),
    };
    let turn = TurnRow {
        text,
        attachments: crate::attachments::list_json(&fetched.attachments),
        ..turn
    };
    let event = log(
        &mut session,
        Subject::Turn(&turn.turn_id, turn.seq),
        "queued",
        now,
    );
    Decided {
        writes: Writes {
            fetch: Some(finish(Some(Box::new(turn)))),
            session: Some(session),
            event: Some(event),
            ..Writes::default()
        },
        answer: true,
    }
}

impl LarkEvent {
    /// The code of a `/link <code>`, as typed.
    pub fn link_code(&self) -> Option<&str> {
        match &self.chat_command {
            Some(ChatCommand::Link(code)) => Some(code),
            _ => None,
        }
    }

    /// The request its `yes <id>` / `no <id>` names, for the store to load
    /// from the linked session ([`crate::decide::lark::EventRows`]).
    pub fn named_request(&self) -> Option<&str> {
        self.command.as_ref().map(|c| c.request_id.as_str())
    }
}

/// What an event decision reads. A store that finds the event seen needs
/// load nothing more, and one that finds no link nothing after it.
#[derive(Debug, Default)]
pub struct EventRows {
    /// Whether an event with the same event id, or the same message id, was
    /// taken before.
    pub seen: bool,
    /// The event's chat: its sessions, the session its message replies to.
    /// The target among them ([`ChatRows::target`]) is locked.
    pub chat: ChatRows,
    /// The target session's request that the event's `yes <id>` / `no <id>`
    /// names ([`LarkEvent::named_request`]), if any.
    pub request: Option<PermissionRow>,
    /// The target session's turn enqueued with the event id as its
    /// `client_message_id`, if any.
    pub earlier: Option<TurnRow>,
    /// What a `/link <code>` reads (loaded for one only).
    pub pairing: PairRows,
}

/// An event from Lark, in this order: seen before (its event id or its
/// message id) a duplicate, nothing written; else it is recorded once, and:
/// not a text message, unsupported; a `/link <code>`, [`pair`]ed, and any
/// other command answered ([`chat::command`]); a chat linked to no session,
/// unlinked; then, for the session its message replies to or else the
/// chat's current one ([`ChatRows::target`]), [`verdict`] on its text: an
/// answer written (or replayed), ignored, or enqueued as a Lark turn (with
/// the enqueue's refusals, which record nothing, so Lark's redelivery is
/// taken again).
pub fn event(
    rows: EventRows,
    event: LarkEvent,
    minter: &Minter,
    now: i64,
) -> Result<Decided<LarkIngest>> {
    if rows.seen {
        return Ok(Decided::nothing(LarkIngest::Duplicate));
    }
    let seen = SeenLarkEvent {
        app_id: event.app_id.clone(),
        event_id: event.event_id.clone(),
        message_id: event.message_id.clone(),
        at: now,
    };
    // Recorded whatever it became, but for the enqueue's refusals (`?`).
    let mut decided = taken(rows, event, minter, now)?;
    decided.writes.lark_event = Some(seen);
    Ok(decided)
}

/// What an event not seen before becomes ([`event`]'s order after its
/// duplicate check).
fn taken(
    rows: EventRows,
    event: LarkEvent,
    minter: &Minter,
    now: i64,
) -> Result<Decided<LarkIngest>> {
    let (Some(text), Some(chat_id), Some(message_id)) =
        (event.text, event.chat_id, event.message_id)
    else {
        return Ok(Decided::nothing(LarkIngest::Unsupported));
    };
    let at = PairAt {
        chat_id,
        message_id,
        sender: event.sender,
    };
    if let Some(command) = event.chat_command {
        return Ok(match command {
            ChatCommand::Link(_) => pair(rows.pairing, at, now),
            command => chat::command(rows.chat, command, &at, now),
        });
    }
    let Some(target) = rows.chat.target() else {
        return Ok(Decided::nothing(LarkIngest::Unlinked));
    };
    let session = target.session.clone();
    let approvers = approvers_from_stored(&target.approvers);
    let sender = at.sender.as_deref();
    match verdict(
        event.command.as_ref(),
        rows.request.as_ref(),
        sender,
        &approvers,
    ) {
        Verdict::Ignore => Ok(Decided::nothing(LarkIngest::Ignored)),
        Verdict::Answer(Behavior::Allow) if needs_answers(rows.request.as_ref()) => {
            // `yes` cannot say what the answers are: the chat is told where
            // to give them, and the request stays pending.
            let note = Note::NeedsAnswers {
                name: SessionName::of(&session),
                request_id: rows.request.map(|r| r.request_id).unwrap_or_default(),
            };
            Ok(noted(Writes::default(), &at, note, now))
        }
        Verdict::Answer(behavior) => Ok(answered(session, rows.request, behavior, at.sender, now)),
        Verdict::Turn => {
            let message = EnqueueRequest {
                attachments: Vec::new(),
                origin: Origin::Lark,
                text,
                client_message_id: Some(event.event_id),
                ingress: Ingress::SessionQueue,
                lark: Some(LarkRef {
                    chat_id: at.chat_id,
                    message_id: at.message_id,
                }),
            };
            lark_turn(session, rows.earlier, message, &event.files, minter, now)
        }
    }
}

/// An approver's `yes <id>` / `no <id>`, through the same [`answer`] as
/// every other. An answer that changes nothing (another answer to an
/// answered or expired request, an unknown id) is not said in the chat.
fn answered(
    session: SessionRow,
    request: Option<PermissionRow>,
    behavior: Behavior,
    sender: Option<String>,
    now: i64,
) -> Decided<LarkIngest> {
    let session_id = session.session_id.clone();
    let rows = AnswerRows {
        session: Some(session),
        existing: request,
    };
    let Ok(mut answered) = answer(
        rows,
        &AnswerPermission::plain(behavior),
        AnsweredVia::Lark,
        now,
    ) else {
        return Decided::nothing(LarkIngest::Ignored);
    };
    if let Decision::Write(row) = &answered.answer {
        // The card still shows its buttons: it is updated after.
        answered.writes.card = Some(card_write(row, sender, false));
    }
    Decided {
        writes: answered.writes,
        answer: LarkIngest::Answered {
            session_id,
            decision: answered.answer,
        },
    }
}

/// A linked chat's message enqueued as a Lark turn of `session` (its
/// `lark` reference set), with the enqueue's refusals.
fn lark_turn(
    session: SessionRow,
    earlier: Option<TurnRow>,
    message: EnqueueRequest,
    files: &[Resource],
    minter: &Minter,
    now: i64,
) -> Result<Decided<LarkIngest>> {
    let session_id = session.session_id.clone();
    let lark = message.lark.clone();
    let enqueued = enqueue(Some(session), earlier, message, minter, now)?;
    let turn = &enqueued.answer.turn;
    // Its files are fetched once it is committed; until then it holds its
    // place ([`fetched`]).
    let fetch = lark
        .as_ref()
        .filter(|_| !files.is_empty() && !enqueued.answer.duplicate)
        .map(|lark| FetchWrite::Start {
            turn_id: turn.turn_id.clone(),
            session_id: session_id.clone(),
            message_id: lark.message_id.clone(),
            resources: serde_json::to_string(files).unwrap_or_default(),
            at: now,
        });
    // The person's message is the session's too: a reply to it, or a
    // message in its thread, goes there.
    let sent = lark.map(|lark| SentMessage {
        message_id: lark.message_id,
        session_id: session_id.clone(),
        chat_id: lark.chat_id,
        at: now,
    });
    Ok(Decided {
        writes: Writes {
            sent,
            fetch,
            ..enqueued.writes
        },
        answer: LarkIngest::Enqueued {
            session_id,
            turn: Box::new(enqueued.answer.turn),
        },
    })
}

/// A click on a button of a permission request's card (`card.action.trigger`).
#[derive(Debug, Clone)]
pub struct LarkClick {
    pub app_id: String,
    pub event_id: String,
    /// The session and request the button names, and its answer.
    pub session_id: String,
    pub request_id: String,
    pub behavior: Behavior,
    /// What the button (or the form it submits) chooses beyond allow or deny.
    pub choice: Choice,
    /// Who clicked (Lark open id), and in which chat, when Lark said.
    pub operator: Option<String>,
    pub chat_id: Option<String>,
}

/// What a click decision reads. A store that finds the event seen needs load
/// nothing more.
#[derive(Debug, Default)]
pub struct ClickRows {
    pub seen: bool,
    /// The session the button names (locked).
    pub session: Option<SessionRow>,
    /// The session's link: its chat and its approvers as stored.
    pub link: Option<(String, String)>,
    /// The request the button names.
    pub request: Option<PermissionRow>,
    /// The chat its card was sent to: only that chat learns what became of it.
    pub card_chat: Option<String>,
    /// Who answered it in Lark, as its card records.
    pub answered_by: Option<String>,
}

/// What became of a click.
#[derive(Debug)]
pub enum Clicked {
    /// Seen before (same event id): nothing written.
    Duplicate,
    /// The button names no request the broker has.
    Unknown,
    /// The request is pending, and the clicker is no approver of the chat
    /// the session is linked to; or it is settled and the click comes from
    /// another chat than its card's: nothing changes, nothing is told.
    Refused,
    /// This click answered the request (`answered_via: "lark"`).
    Answered {
        session_id: String,
        row: PermissionRow,
        name: SessionName,
        by: Option<String>,
    },
    /// An approver's click that left something out (a question without
    /// its answer, feedback without words): nothing answered.
    Incomplete(Missing),
    /// An approver's click that does not fit the request (an unknown
    /// option or suggestion): nothing answered; what the rule said.
    Unfit(String),
    /// The request was settled before (answered, expired): its final state.
    Settled {
        row: PermissionRow,
        name: SessionName,
        by: Option<String>,
    },
}

/// A click, in this order: seen before (its event id) a duplicate, nothing
/// written; else it is recorded once, and: an unknown session or request,
/// unknown; a request settled before, its final state (which the answer to
/// the click shows on the card) in its card's chat, refused in any other (a
/// stranger's chat learns nothing of it); from anyone but an approver of the link,
/// in the linked chat, refused; else an approver's answer, through the same
/// [`answer`] as every other.
pub fn click(rows: ClickRows, click: LarkClick, now: i64) -> Result<Decided<Clicked>> {
    if rows.seen {
        return Ok(Decided::nothing(Clicked::Duplicate));
    }
    let mut decided = click_decision(rows, &click, now)?;
    decided.writes.lark_event = Some(SeenLarkEvent {
        app_id: click.app_id,
        event_id: click.event_id,
        message_id: None,
        at: now,
    });
    Ok(decided)
}

fn click_decision(rows: ClickRows, click: &LarkClick, now: i64) -> Result<Decided<Clicked>> {
    let (Some(session), Some(request)) = (rows.session, rows.request) else {
        return Ok(Decided::nothing(Clicked::Unknown));
    };
    if request.state != PermissionState::Pending {
        let own_chat = rows.card_chat.is_some() && click.chat_id == rows.card_chat;
        if !own_chat {
            return Ok(Decided::nothing(Clicked::Refused));
        }
        return Ok(settled(
            request,
            SessionName::of(&session),
            rows.answered_by,
        ));
    }
    let approvers = match &rows.link {
        Some((chat_id, stored)) if click.chat_id.as_deref() == Some(chat_id) => {
            approvers_from_stored(stored)
        }
        _ => Vec::new(),
    };
    let approved = click
        .operator
        .as_deref()
        .is_some_and(|o| approvers.iter().any(|a| a == o));
    if !approved {
        return Ok(Decided::nothing(Clicked::Refused));
    }
    let answered_by = rows.answered_by;
    let name = SessionName::of(&session);
    let wanted = match answer_of(click, &request) {
        Ok(wanted) => wanted,
        Err(missing) => return Ok(Decided::nothing(Clicked::Incomplete(missing))),
    };
    let rows = AnswerRows {
        session: Some(session),
        existing: Some(request),
    };
    let answered = match answer(rows, &wanted, AnsweredVia::Lark, now) {
        Err(e) if e.unfit => return Ok(Decided::nothing(Clicked::Unfit(e.message.into()))),
        answered => answered?,
    };
    let Decision::Write(row) = answered.answer else {
        return Ok(settled(answered.answer.into_row(), name, answered_by));
    };
    let mut writes = answered.writes;
    writes.card = Some(card_write(&row, click.operator.clone(), true));
    Ok(Decided {
        writes,
        answer: Clicked::Answered {
            session_id: row.session_id.clone(),
            by: click.operator.clone(),
            name,
            row,
        },
    })
}

/// The answer a click gives: its behavior and its choice, a form read
/// against the request's questions. A form that leaves something out is
/// what it misses; an option that is not one of the request's is left to
/// [`answer`] to refuse.
fn answer_of(click: &LarkClick, request: &PermissionRow) -> Result<AnswerPermission, Missing> {
    let mut wanted = AnswerPermission::plain(click.behavior);
    match &click.choice {
        Choice::Plain => {}
        Choice::Suggestion(index) => wanted.suggestion = Some(*index),
        Choice::Mode(mode) => wanted.mode = Some(*mode),
        Choice::Option(option) => {
            let questions = request.detail().questions.unwrap_or_default();
            let label = match questions.as_slice() {
                [only] => only.options.get(*option as usize).map(|o| &o.label),
                _ => None,
            };
            // An option the request does not have answers nothing: the
            // empty map is refused as unfit.
            let answers = questions
                .iter()
                .zip(label)
                .map(|(q, label)| (q.question.clone(), label.clone()))
                .collect();
            wanted.answers = Some(answers);
        }
        Choice::Answers(picked) => {
            let questions = request.detail().questions.unwrap_or_default();
            wanted.answers = Some(answers_of(&questions, picked)?);
        }
        Choice::Feedback(text) => {
            if text.trim().is_empty() {
                return Err(Missing::Feedback);
            }
            wanted.message = Some(text.trim().to_owned());
        }
    }
    Ok(wanted)
}

/// A form's answers, one for each question: the person's words when not
/// blank, else the labels picked, in the question's order, joined with
/// ", " (HOOKS.md); a pick that names no option counts for nothing. A
/// question with neither is missing.
fn answers_of(
    questions: &[Question],
    picked: &[Picked],
) -> Result<BTreeMap<String, String>, Missing> {
    let mut answers = BTreeMap::new();
    let mut missing = Vec::new();
    for (n, question) in questions.iter().enumerate() {
        let picked = picked.get(n).cloned().unwrap_or_default();
        let labels: Vec<&str> = question
            .options
            .iter()
            .enumerate()
            .filter(|(i, _)| picked.options.contains(&(*i as u32)))
            .map(|(_, o)| o.label.as_str())
            .collect();
        let answer = match picked.text.trim() {
            "" => labels.join(", "),
            text => text.to_owned(),
        };
        if answer.is_empty() {
            missing.push(match question.header.trim() {
                "" => question.question.clone(),
                header => header.to_owned(),
            });
        } else {
            answers.insert(question.question.clone(), answer);
        }
    }
    match missing.is_empty() {
        true => Ok(answers),
        false => Err(Missing::Answers(missing)),
    }
}

/// A click on a settled request: the answer to it shows the card's final
/// form, so no update of the card need follow.
fn settled(row: PermissionRow, name: SessionName, by: Option<String>) -> Decided<Clicked> {
    Decided {
        writes: Writes {
            card: Some(card_write(&row, None, true)),
            ..Writes::default()
        },
        answer: Clicked::Settled { row, name, by },
    }
}

fn card_write(row: &PermissionRow, answered_by: Option<String>, shown: bool) -> CardWrite {
    CardWrite {
        session_id: row.session_id.clone(),
        request_id: row.request_id.clone(),
        answered_by,
        shown,
    }
}

/// What a text message in a linked chat is, permission-wise.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// An ordinary message: enqueue it as a turn.
    Turn,
    /// An answer from an approver, to take if the request is pending.
    Answer(Behavior),
    /// An answer nobody may give here (the sender is no approver of the
    /// link), or to an unknown id of the request form: acknowledged, nothing
    /// written, no turn, nothing said in the chat.
    Ignore,
}

/// Whether the request is a pending question, which an allow without its
/// answers cannot answer.
fn needs_answers(request: Option<&PermissionRow>) -> bool {
    request.is_some_and(|r| {
        r.state == PermissionState::Pending && r.detail().kind == PermissionKind::Question
    })
}

/// Claude Code's request id form: five lowercase letters, never `l`.
fn looks_like_request_id(id: &str) -> bool {
    id.len() == 5 && id.bytes().all(|b| b.is_ascii_lowercase() && b != b'l')
}

/// Is a linked chat's text an answer, and by whom. `request` is the
/// session's request the command names (if any).
///
/// A command-shaped text that names no request of the session and does not
/// look like a request id (`yes please`) is an ordinary message. Every other
/// command-shaped text never becomes a turn, whoever sent it: a stranger's
/// `yes abcde` must not reach the agent as if it were a chat message asking
/// for something.
fn verdict(
    command: Option<&LarkCommand>,
    request: Option<&PermissionRow>,
    sender: Option<&str>,
    approvers: &[String],
) -> Verdict {
    let Some(command) = command else {
        return Verdict::Turn;
    };
    if request.is_none() && !looks_like_request_id(&command.request_id) {
        return Verdict::Turn;
    }
    let approved = sender.is_some_and(|s| approvers.iter().any(|a| a == s));
    if !approved {
        return Verdict::Ignore;
    }
    Verdict::Answer(command.behavior)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::permission::tests::created;
    use crate::decide::permission::{Decision, EXPIRED_ON_CLOSE};
    use crate::decide::tests::session;
    use crate::decide::{Change, ChatRow, LinkChange, NewLink};
    use crate::error::ErrorCode;
    use crate::model::{PermissionState, SessionState};
    use crate::permission::approvers_to_stored;
    use crate::permission::lark_command;

    #[test]
    fn a_link_joins_the_chat_as_its_current_session() {
        let rows = |state, link: Option<LinkRow>| LinkRows {
            session: Some(session(state)),
            link,
            chat: Some(ChatRow {
                chat_id: "oc_1".into(),
                failed_codes: 2,
                failed_since: 3,
                current_session_id: Some("ses_2".into()),
            }),
        };
        let options = LinkOptions {
            approvers: vec!["ou_a".into()],
            terminal_turns: None,
        };
        let linked = |rows| link(rows, "oc_1".into(), options.clone(), 7);
        let first = linked(rows(SessionState::Open, None)).expect("linked");
        assert_eq!(first.answer.chat_id.as_deref(), Some("oc_1"));
        let written = first.writes.link.and_then(|change| change.link);
        assert!(matches!(
            written,
            Some(NewLink { ref approvers, at: 7, .. }) if approvers == "[\"ou_a\"]"
        ));
        let chat = first.writes.chat.expect("the chat");
        assert_eq!(
            (chat.current_session_id.as_deref(), chat.failed_codes),
            (Some("ses_1"), 2)
        );
        // Linked to this chat already: it keeps its place in the list.
        let again = LinkRow {
            chat_id: "oc_1".into(),
            approvers: "[]".into(),
            linked_at: 4,
            terminal_turns: true,
        };
        let kept = linked(rows(SessionState::Open, Some(again.clone()))).expect("linked");
        assert!(
            kept.answer.terminal_turns,
            "a link that does not say keeps the option"
        );
        assert_eq!(kept.writes.link.and_then(|l| l.link).map(|l| l.at), Some(4));
        let moved = LinkRow {
            chat_id: "oc_2".into(),
            ..again
        };
        let moved = linked(rows(SessionState::Open, Some(moved))).expect("linked");
        assert_eq!(
            moved.writes.link.and_then(|l| l.link).map(|l| l.at),
            Some(7)
        );
        let closed = linked(rows(SessionState::Closed, None));
        assert_eq!(
            closed.expect_err("a refusal").code,
            ErrorCode::SessionClosed
        );
        let unknown = linked(LinkRows::default()).expect_err("a refusal");
        assert_eq!(unknown.code, ErrorCode::NotFound);
    }

    #[test]
    fn an_unlink_needs_the_session_only() {
        let gone = unlink(Some(session(SessionState::Closed))).expect("unlinked");
        assert_eq!(gone.answer.chat_id, None);
        assert!(matches!(
            gone.writes.link,
            Some(LinkChange { link: None, .. })
        ));
        assert_eq!(unlink(None).expect_err("404").code, ErrorCode::NotFound);
    }

    fn lark(text: Option<&str>, sender: &str) -> LarkEvent {
        LarkEvent {
            app_id: "cli_1".into(),
            event_id: "ev_1".into(),
            message_id: Some("om_1".into()),
            chat_id: Some("oc_1".into()),
            text: text.map(str::to_owned),
            sender: Some(sender.into()),
            command: text.and_then(lark_command),
            chat_command: None,
            replies_to: Vec::new(),
            files: Vec::new(),
        }
    }

    /// The event `text` from `sender` in a chat linked with `approvers`,
    /// naming `request`.
    fn ingest(
        text: &str,
        request: Option<PermissionRow>,
        sender: &str,
        approvers: &[&str],
    ) -> Decided<LarkIngest> {
        let approvers: Vec<String> = approvers.iter().map(|a| a.to_string()).collect();
        let rows = EventRows {
            chat: ChatRows {
                sessions: vec![chat::ChatSession {
                    session: session(SessionState::Open),
                    approvers: approvers_to_stored(&approvers),
                }],
                ..ChatRows::default()
            },
            request,
            ..EventRows::default()
        };
        event(rows, lark(Some(text), sender), &Minter::default(), 9).expect("decided")
    }

    fn is_ignored(decided: &Decided<LarkIngest>) -> bool {
        matches!(decided.answer, LarkIngest::Ignored)
            && decided.writes.event.is_none()
            && decided.writes.lark_event.is_some()
    }

    #[test]
    fn an_event_is_taken_once_and_recorded_whatever_it_is() {
        let seen = EventRows {
            seen: true,
            ..EventRows::default()
        };
        let again = event(seen, lark(Some("hi"), "ou_a"), &Minter::default(), 9).unwrap();
        assert!(matches!(again.answer, LarkIngest::Duplicate));
        assert!(again.writes.lark_event.is_none(), "nothing written");
        let image = event(
            EventRows::default(),
            lark(None, "ou_a"),
            &Minter::default(),
            9,
        );
        let image = image.unwrap();
        assert!(matches!(image.answer, LarkIngest::Unsupported));
        let recorded = image.writes.lark_event.expect("recorded");
        assert_eq!((recorded.event_id.as_str(), recorded.at), ("ev_1", 9));
        let unlinked = event(
            EventRows::default(),
            lark(Some("hi"), "ou_a"),
            &Minter::default(),
            9,
        );
        let unlinked = unlinked.unwrap();
        assert!(matches!(unlinked.answer, LarkIngest::Unlinked));
        assert!(unlinked.writes.lark_event.is_some() && unlinked.writes.turn.is_none());
    }

    #[test]
    fn a_linked_chats_text_is_a_lark_turn() {
        let decided = ingest("hello there", None, "ou_x", &["ou_a"]);
        let LarkIngest::Enqueued { session_id, turn } = &decided.answer else {
            panic!("{:?}", decided.answer)
        };
        assert_eq!(session_id, "ses_1");
        assert_eq!(turn.client_message_id.as_deref(), Some("ev_1"));
        assert_eq!(turn.lark_message_id.as_deref(), Some("om_1"));
        assert!(matches!(decided.writes.turn, Some(Change::Insert(_))));
        assert_eq!(decided.writes.event.as_ref().map(|e| e.event_no), Some(9));
        assert!(decided.writes.lark_event.is_some());
    }

    #[test]
    fn an_approvers_answer_is_written_and_its_replay_replayed() {
        let decided = ingest("yes abcde", Some(created()), "ou_a", &["ou_a"]);
        let LarkIngest::Answered {
            decision: Decision::Write(row),
            ..
        } = &decided.answer
        else {
            panic!("an approver's first answer writes")
        };
        assert_eq!(row.state, PermissionState::Allowed);
        assert_eq!(row.answered_via, Some(AnsweredVia::Lark));
        let event = decided.writes.event.as_ref().expect("its event");
        assert_eq!(
            (event.kind, event.state, event.event_no),
            ("permission", "allowed", 9)
        );
        assert!(decided.writes.lark_event.is_some());
        let again = ingest("YES abcde", Some(row.clone()), "ou_a", &["ou_a"]);
        assert!(matches!(
            again.answer,
            LarkIngest::Answered {
                decision: Decision::Replayed(_),
                ..
            }
        ));
        // Another answer to an answered request changes nothing.
        assert!(is_ignored(&ingest(
            "no abcde",
            Some(row.clone()),
            "ou_a",
            &["ou_a"]
        )));
        let denied = ingest("no abcde", Some(created()), "ou_b", &["ou_a", "ou_b"]);
        assert!(matches!(
            denied.answer,
            LarkIngest::Answered {
                decision: Decision::Write(PermissionRow {
                    state: PermissionState::Denied,
                    ..
                }),
                ..
            }
        ));
    }

    #[test]
    fn strangers_and_linkless_answers_are_ignored_never_turns() {
        assert!(is_ignored(&ingest(
            "yes abcde",
            Some(created()),
            "ou_x",
            &["ou_a"]
        )));
        // Without approvers nobody on Lark can answer.
        assert!(is_ignored(&ingest(
            "yes abcde",
            Some(created()),
            "ou_a",
            &[]
        )));
        let command = lark_command("yes abcde");
        let approvers = ["ou_a".to_owned()];
        let no_sender = verdict(command.as_ref(), Some(&created()), None, &approvers);
        assert_eq!(no_sender, Verdict::Ignore);
        // An unknown id of the request form: ignored, from anyone.
        assert!(is_ignored(&ingest("yes qwert", None, "ou_a", &["ou_a"])));
        assert!(is_ignored(&ingest("yes qwert", None, "ou_x", &["ou_a"])));
        // An expired request.
        let expired = PermissionRow {
            state: EXPIRED_ON_CLOSE,
            ..created()
        };
        assert!(is_ignored(&ingest(
            "yes abcde",
            Some(expired),
            "ou_a",
            &["ou_a"]
        )));
    }

    #[test]
    fn ordinary_messages_stay_turns() {
        for text in [
            "hello there",
            "yes please",
            "no thanks",
            "yes ok",
            "yes hello",
        ] {
            let decided = ingest(text, None, "ou_a", &["ou_a"]);
            assert!(
                matches!(decided.answer, LarkIngest::Enqueued { .. }),
                "{text}"
            );
        }
        // A request of another form is still answered by its exact id.
        let long = PermissionRow {
            request_id: "req-42".into(),
            ..created()
        };
        assert!(matches!(
            ingest("yes req-42", Some(long), "ou_a", &["ou_a"]).answer,
            LarkIngest::Answered {
                decision: Decision::Write(_),
                ..
            }
        ));
    }

    #[test]
    fn a_forms_answers_are_the_words_else_the_labels_in_order_and_a_gap_is_named() {
        let option = |label: &str| crate::model::QuestionOption {
            label: label.into(),
            description: String::new(),
        };
        let questions = vec![
            Question {
                question: "Which?".into(),
                header: String::new(),
                multi_select: true,
                options: vec![option("A"), option("B"), option("C")],
            },
            Question {
                question: "Why?".into(),
                header: "Reason".into(),
                multi_select: false,
                options: vec![option("X")],
            },
        ];
        let picked = |options: Vec<u32>, text: &str| Picked {
            options,
            text: text.into(),
        };
        let full = [picked(vec![2, 0, 9], ""), picked(vec![0], " mine ")];
        let answers = answers_of(&questions, &full).expect("complete");
        assert_eq!(answers["Which?"], "A, C");
        assert_eq!(answers["Why?"], "mine");
        let gaps = [picked(vec![9], " "), picked(vec![], "")];
        assert_eq!(
            answers_of(&questions, &gaps),
            Err(Missing::Answers(vec!["Which?".into(), "Reason".into()]))
        );
    }

    fn tap(operator: &str, chat: &str) -> LarkClick {
        LarkClick {
            app_id: "cli_1".into(),
            event_id: "ev_9".into(),
            session_id: "ses_1".into(),
            request_id: "abcde".into(),
            behavior: Behavior::Deny,
            choice: Choice::Plain,
            operator: Some(operator.into()),
            chat_id: Some(chat.into()),
        }
    }

    fn tapped(request: Option<PermissionRow>, operator: &str, chat: &str) -> Decided<Clicked> {
        let rows = ClickRows {
            seen: false,
            session: Some(session(SessionState::Open)),
            link: Some(("oc_1".into(), approvers_to_stored(&["ou_a".to_owned()]))),
            request,
            card_chat: Some("oc_1".into()),
            answered_by: Some("ou_b".into()),
        };
        click(rows, tap(operator, chat), 9).expect("decided")
    }

    #[test]
    fn an_approvers_tap_answers_once_and_shows_the_final_card() {
        let decided = tapped(Some(created()), "ou_a", "oc_1");
        let Clicked::Answered { row, by, .. } = &decided.answer else {
            panic!("{:?}", decided.answer)
        };
        assert_eq!(
            (row.state, row.answered_via, by.as_deref()),
            (
                PermissionState::Denied,
                Some(AnsweredVia::Lark),
                Some("ou_a")
            )
        );
        assert_eq!(
            decided.writes.event.as_ref().map(|e| e.state),
            Some("denied")
        );
        let card = decided.writes.card.as_ref().expect("the card");
        assert!(card.shown && card.answered_by.as_deref() == Some("ou_a"));
        let guard = decided.writes.lark_event.as_ref().expect("recorded");
        assert_eq!(
            (guard.event_id.as_str(), guard.message_id.as_ref()),
            ("ev_9", None)
        );
        let seen = ClickRows {
            seen: true,
            ..ClickRows::default()
        };
        let again = click(seen, tap("ou_a", "oc_1"), 10).unwrap();
        assert!(matches!(again.answer, Clicked::Duplicate));
        assert!(again.writes.lark_event.is_none() && again.writes.card.is_none());
    }

    #[test]
    fn a_strangers_tap_or_one_elsewhere_changes_nothing() {
        for (operator, chat) in [("ou_x", "oc_1"), ("ou_a", "oc_2")] {
            let decided = tapped(Some(created()), operator, chat);
            assert!(matches!(decided.answer, Clicked::Refused));
            assert!(decided.writes.permission.is_none() && decided.writes.card.is_none());
            assert!(decided.writes.lark_event.is_some());
        }
        let unknown = tapped(None, "ou_a", "oc_1");
        assert!(matches!(unknown.answer, Clicked::Unknown));
    }

    #[test]
    fn a_tap_on_a_settled_request_shows_its_final_state_to_its_own_chat_only() {
        let expired = PermissionRow {
            state: EXPIRED_ON_CLOSE,
            ..created()
        };
        let decided = tapped(Some(expired.clone()), "ou_x", "oc_1");
        let Clicked::Settled { row, by, .. } = &decided.answer else {
            panic!("{:?}", decided.answer)
        };
        assert_eq!((row.state, by.as_deref()), (EXPIRED_ON_CLOSE, Some("ou_b")));
        assert!(decided.writes.permission.is_none() && decided.writes.event.is_none());
        assert!(decided.writes.card.as_ref().is_some_and(|c| c.shown));
        // Another chat learns nothing: not the state, not who answered.
        let elsewhere = tapped(Some(expired), "ou_x", "oc_9");
        assert!(matches!(elsewhere.answer, Clicked::Refused));
        assert!(elsewhere.writes.card.is_none() && elsewhere.writes.permission.is_none());
    }
}
