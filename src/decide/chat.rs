//! A chat's commands: messages that start with `/` are answered by the
//! broker in the chat and never queued. `/link <code>` pairs the chat
//! ([`super::pairing`]); `/list` and `/status` show the chat's sessions
//! (numbered, goal · agent, host surface, presence, the current one);
//! `/use N` makes one current; `/unlink N` unlinks one; `/help` and any
//! other `/word` say what there is. `//text` is no command: the agent gets
//! `/text`. A chat's sessions are numbered from 1 in the order they were
//! linked to it; `N` may also be a unique prefix of a goal or an agent.

use super::ingest::LarkIngest;
pub use super::notice::Listed;
use super::notice::{Note, SessionName};
use super::pairing::{PairAt, noted};
use super::{ChatRow, LinkChange, SessionRow, Writes};
use crate::model::AgentState;

/// One of a chat's sessions: the session, its link's approvers (as stored).
#[derive(Debug, Clone)]
pub struct ChatSession {
    pub session: SessionRow,
    pub approvers: String,
}

/// What a chat's message reads: the chat, its open sessions in the order
/// they were linked, the session the message replies to (the one the broker
/// sent its parent, or its thread's root, for), if any, and the session of
/// the chat whose permission request its `yes <id>` / `no <id>` names (a
/// pending one first), if any.
#[derive(Debug, Clone, Default)]
pub struct ChatRows {
    pub chat: Option<ChatRow>,
    pub sessions: Vec<ChatSession>,
    pub replied: Option<String>,
    pub asked: Option<String>,
    /// For `/changes`: the target session's latest report of its working
    /// tree, as kept (its body and when).
    pub changes: Option<(Vec<u8>, i64)>,
}

impl ChatRows {
    /// The chat's current session: the one last chosen (`/use N`, a link)
    /// while it is among the chat's sessions, else the last linked.
    pub fn current(&self) -> Option<&ChatSession> {
        let chosen = self
            .chat
            .as_ref()
            .and_then(|c| c.current_session_id.as_deref());
        self.find(chosen).or_else(|| self.sessions.last())
    }

    /// Where a plain message goes: to the session it replies to, if that is
    /// one of the chat's, whichever is current; else, for an answer to a
    /// permission request, to the session that asked; else to the current one.
    pub fn target(&self) -> Option<&ChatSession> {
        self.find(self.replied.as_deref())
            .or_else(|| self.find(self.asked.as_deref()))
            .or_else(|| self.current())
    }

    fn find(&self, session_id: Option<&str>) -> Option<&ChatSession> {
        let session_id = session_id?;
        self.sessions
            .iter()
            .find(|s| s.session.session_id == session_id)
    }
}

/// A command, read from a text with its @mentions removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatCommand {
    /// `/link <code>`: the code as typed (empty when none was).
    Link(String),
    List,
    Status,
    /// `/changes`: what the agent of the session messages go to changed.
    Changes,
    /// `/use N`: a number or a prefix of a goal or agent.
    Use(String),
    /// `/unlink N`.
    Unlink(String),
    /// `/help`, and every other `/word`.
    Help,
}

/// The command a text is, if it is one: `None` for ordinary text and for
/// `//text` (which the agent gets with one slash removed, [`unescaped`]).
pub fn parse(text: &str) -> Option<ChatCommand> {
    let text = text.trim();
    let rest = text.strip_prefix('/')?;
    if rest.starts_with('/') {
        return None;
    }
    let (word, arg) = rest
        .split_once(char::is_whitespace)
        .map_or((rest, ""), |(w, a)| (w, a.trim()));
    Some(match word.to_ascii_lowercase().as_str() {
        "link" => ChatCommand::Link(arg.to_owned()),
        "list" => ChatCommand::List,
        "status" => ChatCommand::Status,
        "changes" => ChatCommand::Changes,
        "use" => ChatCommand::Use(arg.to_owned()),
        "unlink" => ChatCommand::Unlink(arg.to_owned()),
        _ => ChatCommand::Help,
    })
}

/// `//text` as the agent gets it, `/text`; `None` for any other text.
pub fn unescaped(text: &str) -> Option<String> {
    let text = text.trim();
    text.starts_with("//").then(|| text[1..].to_owned())
}

/// A command other than `/link`, given the chat's sessions: help for
/// `/help` (and unknown words) whatever the chat; a chat with no session is
/// told how to pair one; `/list` and `/status` number its sessions, the
/// current one marked; `/use N` makes N current; `/unlink N` unlinks N. A
/// number or prefix naming no session is said so, nothing changed.
pub fn command(
    rows: ChatRows,
    command: ChatCommand,
    at: &PairAt,
    now: i64,
) -> crate::decide::Decided<LarkIngest> {
    let nothing = Writes::default();
    if matches!(command, ChatCommand::Help | ChatCommand::Link(_)) {
        return noted(nothing, at, Note::Help, now);
    }
    if rows.sessions.is_empty() {
        return noted(nothing, at, Note::NoSession, now);
    }
    if command == ChatCommand::Changes {
        return changes(rows, at, now);
    }
    let current = rows.current().map(|s| s.session.session_id.clone());
    let sessions: Vec<SessionRow> = rows.sessions.into_iter().map(|s| s.session).collect();
    let listed = || {
        sessions
            .iter()
            .enumerate()
            .map(|(i, s)| Listed {
                number: i + 1,
                name: SessionName::of(s),
                presence: s.agent_state,
                tool: s
                    .agent_tool
                    .clone()
                    .filter(|_| s.agent_state == AgentState::Working),
                current: current.as_deref() == Some(s.session_id.as_str()),
            })
            .collect()
    };
    let Some(named) = (match &command {
        ChatCommand::List => return noted(nothing, at, Note::List(listed()), now),
        ChatCommand::Status => return noted(nothing, at, Note::Status(listed()), now),
        ChatCommand::Use(arg) | ChatCommand::Unlink(arg) => pick(arg, &sessions),
        ChatCommand::Help | ChatCommand::Link(_) | ChatCommand::Changes => {
            return noted(nothing, at, Note::Help, now);
        }
    }) else {
        return noted(nothing, at, Note::NoSuchSession, now);
    };
    let name = SessionName::of(named);
    match command {
        ChatCommand::Unlink(_) => {
            let writes = Writes {
                link: Some(LinkChange {
                    session_id: named.session_id.clone(),
                    link: None,
                }),
                ..Writes::default()
            };
            noted(writes, at, Note::Unlinked(name), now)
        }
        _ => {
            let writes = Writes {
                chat: Some(ChatRow {
                    current_session_id: Some(named.session_id.clone()),
                    ..ChatRow::or_new(rows.chat, &at.chat_id)
                }),
                ..Writes::default()
            };
            noted(writes, at, Note::Current(name), now)
        }
    }
}

/// `/changes`: what the agent of the session a message would go to
/// changed, as its latest report says (the diff left out), or that it
/// reported nothing.
fn changes(rows: ChatRows, at: &PairAt, now: i64) -> crate::decide::Decided<LarkIngest> {
    let Some(target) = rows.target() else {
        return noted(Writes::default(), at, Note::NoSession, now);
    };
    let name = SessionName::of(&target.session);
    let shown = super::changes::shown(&name.session_id, rows.changes, Vec::new()).ok();
    let changes = shown.map(|c| {
        Box::new(crate::model::Changes {
            diff: String::new(),
            ..c
        })
    });
    noted(Writes::default(), at, Note::Changes { name, changes }, now)
}

/// The session `arg` names: its number in the list (from 1), or a prefix
/// (any case) of one session's goal or agent and of no other's.
fn pick<'a>(arg: &str, sessions: &'a [SessionRow]) -> Option<&'a SessionRow> {
    let arg = arg.trim();
    if arg.is_empty() {
        return None;
    }
    if let Ok(number) = arg.parse::<usize>() {
        return number.checked_sub(1).and_then(|i| sessions.get(i));
    }
    let arg = arg.to_lowercase();
    let named = |s: &&SessionRow| {
        s.goal_id.to_lowercase().starts_with(&arg) || s.agent_id.to_lowercase().starts_with(&arg)
    };
    let mut matching = sessions.iter().filter(named);
    match (matching.next(), matching.next()) {
        (Some(session), None) => Some(session),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::tests::session;
    use crate::model::SessionState;

    #[test]
    fn commands_are_read_and_double_slashes_are_text() {
        assert_eq!(parse(" /list "), Some(ChatCommand::List));
        assert_eq!(parse("/USE 2"), Some(ChatCommand::Use("2".into())));
        assert_eq!(
            parse("/link  ab-cd "),
            Some(ChatCommand::Link("ab-cd".into()))
        );
        assert_eq!(parse("/frobnicate"), Some(ChatCommand::Help));
        assert_eq!(parse("//clear"), None);
        assert_eq!(parse("hello /list"), None);
        assert_eq!(unescaped("//clear now").as_deref(), Some("/clear now"));
        assert_eq!(unescaped("/clear"), None);
    }

    fn three() -> ChatRows {
        let named = |id: &str, goal: &str, agent: &str| ChatSession {
            session: SessionRow {
                session_id: id.into(),
                goal_id: goal.into(),
                agent_id: agent.into(),
                ..session(SessionState::Open)
            },
            approvers: "[]".into(),
        };
        ChatRows {
            chat: None,
            sessions: vec![
                named("ses_1", "web", "claude"),
                named("ses_2", "api", "codex"),
                named("ses_3", "docs", "claude2"),
            ],
            replied: None,
            asked: None,
            changes: None,
        }
    }

    fn at() -> PairAt {
        PairAt {
            chat_id: "oc_1".into(),
            message_id: "om_1".into(),
            sender: None,
        }
    }

    #[test]
    fn the_current_session_is_the_chosen_one_else_the_last_linked() {
        let mut rows = three();
        let id = |s: Option<&ChatSession>| s.map(|s| s.session.session_id.clone());
        assert_eq!(id(rows.current()), Some("ses_3".into()));
        rows.chat = Some(ChatRow {
            current_session_id: Some("ses_2".into()),
            ..ChatRow::default()
        });
        assert_eq!(id(rows.current()), Some("ses_2".into()));
        assert_eq!(id(rows.target()), Some("ses_2".into()));
        // An answer to session 3's request goes there.
        rows.asked = Some("ses_3".into());
        assert_eq!(id(rows.target()), Some("ses_3".into()));
        // A reply to session 1's message goes there, whichever is current.
        rows.replied = Some("ses_1".into());
        assert_eq!(id(rows.target()), Some("ses_1".into()));
        // A reply to a session no longer in the chat goes to the current one.
        rows.replied = Some("ses_9".into());
        rows.asked = None;
        assert_eq!(id(rows.target()), Some("ses_2".into()));
        // A chosen session unlinked since: the last linked is current.
        rows.sessions.remove(1);
        assert_eq!(id(rows.current()), Some("ses_3".into()));
    }

    #[test]
    fn use_switches_and_unlink_unlinks_the_named_session() {
        let used = command(three(), ChatCommand::Use("2".into()), &at(), 5);
        let chat = used.writes.chat.expect("the chat");
        assert_eq!(chat.current_session_id.as_deref(), Some("ses_2"));
        assert!(matches!(used.answer, LarkIngest::Command(Note::Current(_))));
        let used = command(three(), ChatCommand::Use("cod".into()), &at(), 5);
        assert_eq!(
            used.writes
                .chat
                .and_then(|c| c.current_session_id)
                .as_deref(),
            Some("ses_2")
        );
        let gone = command(three(), ChatCommand::Unlink("docs".into()), &at(), 5);
        assert!(matches!(
            gone.writes.link,
            Some(LinkChange { ref session_id, link: None }) if session_id == "ses_3"
        ));
        let none = command(three(), ChatCommand::Use("claude".into()), &at(), 5);
        assert!(matches!(
            none.answer,
            LarkIngest::Command(Note::NoSuchSession)
        ));
        assert!(none.writes.chat.is_none() && none.writes.link.is_none());
        let LarkIngest::Command(Note::List(listed)) =
            command(three(), ChatCommand::List, &at(), 5).answer
        else {
            panic!("a list")
        };
        let marks: Vec<(usize, bool)> = listed.iter().map(|l| (l.number, l.current)).collect();
        assert_eq!(marks, vec![(1, false), (2, false), (3, true)]);
    }

    #[test]
    fn a_session_is_named_by_number_or_unique_prefix() {
        let one = session(SessionState::Open);
        let two = SessionRow {
            goal_id: "gx".into(),
            agent_id: "b".into(),
            ..session(SessionState::Open)
        };
        let sessions = [one, two];
        assert_eq!(pick("2", &sessions).map(|s| s.agent_id.as_str()), Some("b"));
        assert!(pick("3", &sessions).is_none() && pick("0", &sessions).is_none());
        assert_eq!(pick("A", &sessions).map(|s| s.agent_id.as_str()), Some("a"));
        // `g` starts both goals: not unique.
        assert!(pick("g", &sessions).is_none());
    }
}
