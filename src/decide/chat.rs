//! A chat's commands: messages that start with `/` are answered by the
//! broker in the chat and never queued. `/link <code>` pairs the chat
//! ([`super::pairing`]); `/list` and `/status` show the chat's sessions
//! (numbered, goal · agent, host surface, presence, the current one);
//! `/use N` makes one current; `/unlink N` unlinks one; `/help` and any
//! other `/word` say what there is. `//text` is no command: the agent gets
//! `/text`. A chat holds one session today, so it is always session 1 and
//! the current one; `N` may also be a unique prefix of its goal or agent.

use super::lark::LarkIngest;
use super::pairing::{Note, PairAt, SessionName, noted};
use super::{LinkChange, SessionRow, Writes};
use crate::model::AgentState;

/// A command, read from a text with its @mentions removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatCommand {
    /// `/link <code>`: the code as typed (empty when none was).
    Link(String),
    List,
    Status,
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

/// One session of a chat, as `/list` and `/status` show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub number: usize,
    pub name: SessionName,
    pub presence: AgentState,
    pub current: bool,
}

/// A command other than `/link`, given the session the chat is linked to
/// (if any): help for `/help` (and unknown words) whatever the chat; a chat
/// with no session is told how to pair one; `/list`, `/status`, `/use N`
/// answer from its session; `/unlink N` unlinks it. A number or prefix
/// naming no session is said so, nothing changed.
pub fn command(
    linked: Option<SessionRow>,
    command: ChatCommand,
    at: &PairAt,
    now: i64,
) -> crate::decide::Decided<LarkIngest> {
    let nothing = Writes::default();
    if matches!(command, ChatCommand::Help | ChatCommand::Link(_)) {
        return noted(nothing, at, Note::Help, now);
    }
    let Some(session) = linked else {
        return noted(nothing, at, Note::NoSession, now);
    };
    let sessions = [session];
    let listed = |current: &SessionRow| Listed {
        number: 1,
        name: SessionName::of(current),
        presence: current.agent_state,
        current: true,
    };
    match command {
        ChatCommand::List => noted(nothing, at, Note::List(vec![listed(&sessions[0])]), now),
        ChatCommand::Status => noted(nothing, at, Note::Status(vec![listed(&sessions[0])]), now),
        ChatCommand::Use(arg) => match pick(&arg, &sessions) {
            Some(session) => noted(nothing, at, Note::Current(SessionName::of(session)), now),
            None => noted(nothing, at, Note::NoSuchSession, now),
        },
        ChatCommand::Unlink(arg) => match pick(&arg, &sessions) {
            Some(session) => {
                let writes = Writes {
                    link: Some(LinkChange {
                        session_id: session.session_id.clone(),
                        link: None,
                    }),
                    ..Writes::default()
                };
                noted(writes, at, Note::Unlinked(SessionName::of(session)), now)
            }
            None => noted(nothing, at, Note::NoSuchSession, now),
        },
        ChatCommand::Help | ChatCommand::Link(_) => noted(nothing, at, Note::Help, now),
    }
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
