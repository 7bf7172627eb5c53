//! What a rule says to a chat, neutral: a note (the answer to a chat's
//! command, a session closed or stalled, a terminal turn), how a session is
//! named, a chat's sessions as listed, and what a click on a request's card
//! chose or left out. The rules return these; each channel draws them its
//! own way: the Lark layer implements `Display` for [`Note`] and [`Ask`] as
//! its card's JSON (`lark::card`), which is the text a note or a request's
//! chat message is stored with. It knows no channel.

use super::rows::SessionRow;
use crate::model::{AgentState, PlanMode};
use crate::permission::PermissionRow;

/// How much of a prompt and of its answer a terminal turn's card shows.
pub const FEED_CHARS: usize = 2_000;

/// A permission request as a linked chat is asked it: the request, and the
/// session it is in.
pub struct Ask<'a> {
    pub request: &'a PermissionRow,
    pub name: &'a SessionName,
}

/// What an answer to a command says (drawn by the channel: `Display`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// The chat is linked to the session named.
    Linked(SessionName),
    /// The code is wrong, used or expired (which, it does not say).
    BadCode,
    /// Too many wrong codes from this chat: try again later.
    Throttled,
    /// The session closed: it left this chat's list.
    Closed(SessionName),
    /// The session's terminal went on in a new host session (`/clear`, a
    /// restart): the conversation goes on in the session named, which took
    /// the old one's place in this chat.
    Continued(SessionName),
    /// The session's working agent has said nothing for the broker's
    /// `--stall-after` (HOOKS.md "Presence").
    Stalled(SessionName),
    /// A turn typed at the session's terminal, and the agent's answer
    /// (for a link that asks for them, HOOKS.md "Presence").
    Terminal {
        name: SessionName,
        prompt: String,
        answer: String,
    },
    /// What the commands are.
    Help,
    /// The chat is linked to no open session: how to pair one.
    NoSession,
    /// The chat's sessions (`/list`).
    List(Vec<Listed>),
    /// What each of the chat's agents is doing (`/status`).
    Status(Vec<Listed>),
    /// What the session's agent changed (`/changes`): its latest report
    /// of the working tree without the diff, or none reported.
    Changes {
        name: SessionName,
        changes: Option<Box<crate::model::Changes>>,
    },
    /// The session now current (`/use N`).
    Current(SessionName),
    /// The session unlinked from the chat (`/unlink N`).
    Unlinked(SessionName),
    /// `N` names none of the chat's sessions.
    NoSuchSession,
    /// `yes <id>` to a question: an allow needs its answers, given on the
    /// request's card or the Web page (nothing was answered).
    NeedsAnswers {
        name: SessionName,
        request_id: String,
    },
}

/// How a session is named in a chat: goal · agent, and its host surface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionName {
    pub session_id: String,
    pub goal_id: String,
    pub agent_id: String,
    pub host_surface: String,
}

impl Note {
    /// The session the note names, if one.
    pub fn session_id(&self) -> Option<&str> {
        match self {
            Note::Linked(name)
            | Note::Current(name)
            | Note::Unlinked(name)
            | Note::Closed(name)
            | Note::Stalled(name)
            | Note::Terminal { name, .. }
            | Note::Changes { name, .. }
            | Note::NeedsAnswers { name, .. } => Some(&name.session_id),
            _ => None,
        }
    }
}

impl SessionName {
    pub fn of(session: &SessionRow) -> Self {
        Self {
            session_id: session.session_id.clone(),
            goal_id: session.goal_id.clone(),
            agent_id: session.agent_id.clone(),
            host_surface: session.host_surface.clone(),
        }
    }
}

/// One session of a chat, as `/list` and `/status` show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub number: usize,
    pub name: SessionName,
    pub presence: AgentState,
    /// The tool a working agent runs, if it said.
    pub tool: Option<String>,
    pub current: bool,
}

/// What a click chooses beyond allow or deny (issue 54): the card drew
/// the button, the Lark layer read the click back into one of these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// A plain Allow / Deny.
    Plain,
    /// A tool request's "always allow" suggestion, by its index.
    Suggestion(u32),
    /// A plan approved, and how it goes on.
    Mode(PlanMode),
    /// One tap on an option of a request's only (single-select) question.
    Option(u32),
    /// A question card's form: what was picked for each question, in the
    /// request's order.
    Answers(Vec<Picked>),
    /// A plan's "Keep planning…" form: the person's feedback.
    Feedback(String),
}

/// What a question card's form holds for one question: the options picked
/// (their indexes) and the person's own words (which win when not blank).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Picked {
    pub options: Vec<u32>,
    pub text: String,
}

/// What a click on a card left out, so nothing was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Missing {
    /// The questions (their headers, or their text when they have none)
    /// that have neither a pick nor words.
    Answers(Vec<String>),
    /// "Keep planning…" without feedback.
    Feedback,
}
