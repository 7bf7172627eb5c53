//! The permission-request rules, written once for both stores: given the
//! loaded rows (or none) and the incoming create or answer, what happens:
//! a new row to write, a replay, or the contract's refusal. It knows no SQL,
//! no HTTP and no waiting: the stores load the rows and apply the outcome
//! inside their own transaction, the broker parks the waits. It also owns
//! who may answer from a linked Lark chat (the link's approvers), what a chat
//! text means (`yes <id>` / `no <id>`: an answer, ignored, or an ordinary
//! turn) and the message a linked chat receives for a new request.

use crate::decide;
use crate::error::{Error, Result};
use crate::model::{
    AnsweredVia, Behavior, CreatePermissionRequest, PermissionRequest, PermissionState,
};
use crate::store::{HostIdentity, SessionRow};
use crate::time::rfc3339;

/// A stored permission request, with its content.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct PermissionRow {
    pub session_id: String,
    pub request_id: String,
    pub tool_name: String,
    pub description: String,
    pub input_preview: String,
    pub state: PermissionState,
    pub created_at: i64,
    pub answered_at: Option<i64>,
    pub answered_via: Option<AnsweredVia>,
}

impl PermissionRow {
    pub fn readback(&self) -> PermissionRequest {
        PermissionRequest {
            request_id: self.request_id.clone(),
            session_id: self.session_id.clone(),
            tool_name: self.tool_name.clone(),
            description: self.description.clone(),
            input_preview: self.input_preview.clone(),
            state: self.state,
            created_at: rfc3339(self.created_at),
            answered_at: self.answered_at.map(rfc3339),
            answered_via: self.answered_via,
        }
    }

    fn same_request(&self, request: &CreatePermissionRequest) -> bool {
        self.tool_name == request.tool_name
            && self.description == request.description
            && self.input_preview == request.input_preview
    }
}

/// What a create or an answer decided.
#[derive(Debug)]
pub enum Decision {
    /// Write this row (insert for a create, update for an answer).
    Write(PermissionRow),
    /// The same request again: answer the stored row, write nothing.
    Replayed(PermissionRow),
}

impl Decision {
    pub fn row(&self) -> &PermissionRow {
        match self {
            Decision::Write(row) | Decision::Replayed(row) => row,
        }
    }

    pub fn into_row(self) -> PermissionRow {
        match self {
            Decision::Write(row) | Decision::Replayed(row) => row,
        }
    }
}

/// The host records a request, in this order: wrong host 403
/// `host_mismatch`; the same request id with the same body a replay (another
/// body 422 `idempotency_key_reused`), also on a closed session; a closed
/// session 409 `session_closed`.
pub fn create(
    session: &SessionRow,
    host: &HostIdentity,
    existing: Option<PermissionRow>,
    request: CreatePermissionRequest,
    now_ms: i64,
) -> Result<Decision> {
    if !session.is_bound_to(host) {
        return Err(Error::host_mismatch());
    }
    if let Some(row) = existing {
        if row.same_request(&request) {
            return Ok(Decision::Replayed(row));
        }
        return Err(decide::key_reused(
            "request_id",
            "another request on this session",
        ));
    }
    decide::open(session)?;
    Ok(Decision::Write(PermissionRow {
        session_id: session.session_id.clone(),
        request_id: request.request_id,
        tool_name: request.tool_name,
        description: request.description,
        input_preview: request.input_preview,
        state: PermissionState::Pending,
        created_at: now_ms,
        answered_at: None,
        answered_via: None,
    }))
}

/// The state an answer gives a request.
pub fn answered_state(behavior: Behavior) -> PermissionState {
    match behavior {
        Behavior::Allow => PermissionState::Allowed,
        Behavior::Deny => PermissionState::Denied,
    }
}

/// An answer: the first one wins and is final; the same answer again is a
/// replay; another answer, or any answer to an expired request, is 409
/// `permission_already_answered` (with the state); unknown 404.
pub fn answer(
    existing: Option<PermissionRow>,
    behavior: Behavior,
    via: AnsweredVia,
    now_ms: i64,
) -> Result<Decision> {
    let row = existing.ok_or_else(|| Error::not_found("permission request"))?;
    let wanted = answered_state(behavior);
    match row.state {
        PermissionState::Pending => Ok(Decision::Write(PermissionRow {
            state: wanted,
            answered_at: Some(now_ms),
            answered_via: Some(via),
            ..row
        })),
        state if state == wanted => Ok(Decision::Replayed(row)),
        state => Err(Error::permission_already_answered(state)),
    }
}

/// What a session's close does to its pending requests.
pub const EXPIRED_ON_CLOSE: PermissionState = PermissionState::Expired;

/// The most requests a list answers: every pending one first, then the
/// newest answered ones.
pub const LIST_LIMIT: u32 = 200;

/// Whether a waiting host has its answer.
pub fn is_settled(row: &PermissionRow) -> bool {
    row.state != PermissionState::Pending
}

// ---------------------------------------------------------------------------
// Lark: who may answer from a linked chat, and how.

/// The most approvers one chat link holds.
pub const MAX_APPROVERS: usize = 50;
/// The longest Lark open id accepted as an approver.
pub const MAX_OPEN_ID_BYTES: usize = 64;

/// A chat link's approver list, checked: at most [`MAX_APPROVERS`] Lark open
/// ids (`ou_` and ASCII letters, digits, `_` or `-`, at most
/// [`MAX_OPEN_ID_BYTES`] bytes); a repeated id is kept once, in first order.
pub fn approvers(list: Vec<String>) -> Result<Vec<String>> {
    if list.len() > MAX_APPROVERS {
        return Err(Error::invalid(format!(
            "`approvers` holds at most {MAX_APPROVERS} open ids."
        )));
    }
    let mut kept: Vec<String> = Vec::with_capacity(list.len());
    for id in list {
        if !is_open_id(&id) {
            return Err(Error::invalid(format!(
                "Each of `approvers` must be a Lark open id: `ou_` and then letters, digits,                  `_` or `-`, at most {MAX_OPEN_ID_BYTES} bytes."
            )));
        }
        if !kept.contains(&id) {
            kept.push(id);
        }
    }
    Ok(kept)
}

fn is_open_id(id: &str) -> bool {
    id.len() <= MAX_OPEN_ID_BYTES
        && id.strip_prefix("ou_").is_some_and(|rest| {
            !rest.is_empty()
                && rest
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        })
}

/// A Lark text of the form `yes <id>` or `no <id>`, as parsed from the chat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LarkCommand {
    pub behavior: Behavior,
    pub request_id: String,
}

/// Parses `yes <id>` / `no <id>`: the verb in any case, the id exactly as the
/// request message showed it, blanks (any Unicode white space) around and
/// between them ignored. The webhook removes @mentions first. Anything else,
/// one more word included, is not a command.
pub fn lark_command(text: &str) -> Option<LarkCommand> {
    let mut words = text.split_whitespace();
    let (verb, id) = (words.next()?, words.next()?);
    if words.next().is_some() {
        return None;
    }
    let behavior = match verb.to_ascii_lowercase().as_str() {
        "yes" => Behavior::Allow,
        "no" => Behavior::Deny,
        _ => return None,
    };
    Some(LarkCommand {
        behavior,
        request_id: id.to_owned(),
    })
}

/// Claude Code's request id form: five lowercase letters, never `l`.
fn looks_like_request_id(id: &str) -> bool {
    id.len() == 5 && id.bytes().all(|b| b.is_ascii_lowercase() && b != b'l')
}

/// What a text message in a linked chat is, permission-wise.
#[derive(Debug)]
pub enum LarkVerdict {
    /// An ordinary message: enqueue it as a turn.
    Turn,
    /// An answer from an approver: write (or replay) this decision; no turn.
    Answer(Decision),
    /// An answer nobody may give here (the sender is no approver of the
    /// link), or one that changes nothing (an unknown id of the request form,
    /// another answer to an answered or expired request): acknowledged,
    /// nothing written, no turn, nothing said in the chat.
    Ignore,
}

/// The one decision on a linked chat's text: is it an answer, by whom, with
/// which outcome. `existing` is the session's request the command names (if
/// any); `approvers` the link's list; `sender` the sender's open id.
///
/// A command-shaped text that names no request of the session and does not
/// look like a request id (`yes please`) is an ordinary message. Every other
/// command-shaped text never becomes a turn, whoever sent it: a stranger's
/// `yes abcde` must not reach the agent as if it were a chat message asking
/// for something.
pub fn lark_verdict(
    command: Option<&LarkCommand>,
    existing: Option<PermissionRow>,
    sender: Option<&str>,
    approvers: &[String],
    now_ms: i64,
) -> LarkVerdict {
    let Some(command) = command else {
        return LarkVerdict::Turn;
    };
    if existing.is_none() && !looks_like_request_id(&command.request_id) {
        return LarkVerdict::Turn;
    }
    let approved = sender.is_some_and(|s| approvers.iter().any(|a| a == s));
    if !approved {
        return LarkVerdict::Ignore;
    }
    match answer(existing, command.behavior, AnsweredVia::Lark, now_ms) {
        Ok(decision) => LarkVerdict::Answer(decision),
        Err(_) => LarkVerdict::Ignore,
    }
}

/// The stored form of a link's approver list (a JSON array of open ids).
pub fn approvers_to_stored(approvers: &[String]) -> String {
    serde_json::to_string(approvers).unwrap_or_else(|_| "[]".into())
}

/// The approver list as stored; anything unreadable is nobody.
pub fn approvers_from_stored(stored: &str) -> Vec<String> {
    serde_json::from_str(stored).unwrap_or_default()
}

/// How much of the description and of the preview a chat message shows.
const MESSAGE_DESCRIPTION_CHARS: usize = 500;
const MESSAGE_PREVIEW_CHARS: usize = 1500;

/// The message a linked chat receives for a new request: what is asked and
/// how to answer. Long descriptions and previews are cut (the Web page shows
/// them whole).
pub fn lark_message(row: &PermissionRow) -> String {
    let id = &row.request_id;
    format!(
        "The agent asks to use {tool}: {description}\n\n{preview}\n\n\
         Reply \"yes {id}\" to allow or \"no {id}\" to deny (approvers of this chat only).",
        tool = row.tool_name,
        description = cut(&row.description, MESSAGE_DESCRIPTION_CHARS),
        preview = cut(&row.input_preview, MESSAGE_PREVIEW_CHARS),
    )
}

fn cut(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::LarkVerdict::*;
    use super::*;
    use crate::decide::tests::{host, session};
    use crate::error::ErrorCode;
    use crate::model::SessionState;

    fn request(preview: &str) -> CreatePermissionRequest {
        CreatePermissionRequest {
            host_surface: "claude-code".into(),
            host_session_id: "h".into(),
            request_id: "abcde".into(),
            tool_name: "Bash".into(),
            description: "d".into(),
            input_preview: preview.into(),
        }
    }

    fn created() -> PermissionRow {
        match create(
            &session(SessionState::Open),
            &host("h"),
            None,
            request("ls"),
            5,
        ) {
            Ok(Decision::Write(row)) => row,
            other => panic!("{other:?}"),
        }
    }

    fn code(result: Result<Decision>) -> ErrorCode {
        result.expect_err("a refusal").code
    }

    #[test]
    fn create_checks_host_then_replay_then_closed() {
        let open = session(SessionState::Open);
        let closed = session(SessionState::Closed);
        let row = created();
        assert_eq!(row.state, PermissionState::Pending);
        let wrong = create(&closed, &host("x"), Some(row.clone()), request("ls"), 6);
        assert_eq!(code(wrong), ErrorCode::HostMismatch);
        let again = create(&closed, &host("h"), Some(row.clone()), request("ls"), 6);
        assert!(matches!(again, Ok(Decision::Replayed(r)) if r == row));
        let other = create(&open, &host("h"), Some(row), request("rm"), 6);
        assert_eq!(code(other), ErrorCode::IdempotencyKeyReused);
        let late = create(&closed, &host("h"), None, request("ls"), 6);
        assert_eq!(code(late), ErrorCode::SessionClosed);
    }

    #[test]
    fn the_first_answer_wins_and_the_same_answer_replays() {
        assert_eq!(
            code(answer(None, Behavior::Allow, AnsweredVia::Owner, 1)),
            ErrorCode::NotFound
        );
        let first = answer(Some(created()), Behavior::Allow, AnsweredVia::Lark, 9).unwrap();
        let Decision::Write(allowed) = first else {
            panic!("a first answer writes")
        };
        assert_eq!(allowed.state, PermissionState::Allowed);
        assert_eq!(allowed.answered_via, Some(AnsweredVia::Lark));
        assert_eq!(allowed.answered_at, Some(9));
        let same = answer(
            Some(allowed.clone()),
            Behavior::Allow,
            AnsweredVia::Owner,
            10,
        );
        assert!(matches!(same, Ok(Decision::Replayed(r)) if r == allowed));
        let other = answer(Some(allowed), Behavior::Deny, AnsweredVia::Owner, 10);
        assert_eq!(code(other), ErrorCode::PermissionAlreadyAnswered);
        let expired = PermissionRow {
            state: EXPIRED_ON_CLOSE,
            ..created()
        };
        let late = answer(Some(expired), Behavior::Deny, AnsweredVia::Owner, 10);
        assert_eq!(code(late), ErrorCode::PermissionAlreadyAnswered);
    }

    fn command(behavior: Behavior, id: &str) -> LarkCommand {
        LarkCommand {
            behavior,
            request_id: id.into(),
        }
    }

    #[test]
    fn lark_commands_are_a_verb_and_an_id() {
        assert_eq!(
            lark_command("yes abcde"),
            Some(command(Behavior::Allow, "abcde"))
        );
        assert_eq!(
            lark_command("  No \u{3000} abcde \n"),
            Some(command(Behavior::Deny, "abcde"))
        );
        assert_eq!(
            lark_command("YES AbCde"),
            Some(command(Behavior::Allow, "AbCde"))
        );
        assert_eq!(lark_command("yes"), None);
        assert_eq!(lark_command("yes abcde please"), None);
        assert_eq!(lark_command("maybe abcde"), None);
        assert_eq!(lark_command("yes, abcde"), None);
    }

    #[test]
    fn approver_lists_are_checked_and_deduplicated() {
        let ok = approvers(vec!["ou_a1".into(), "ou_b-2_c".into(), "ou_a1".into()]).unwrap();
        assert_eq!(ok, vec!["ou_a1".to_owned(), "ou_b-2_c".to_owned()]);
        assert_eq!(approvers(vec![]).unwrap(), Vec::<String>::new());
        for bad in ["", "ou_", "on_abc", "ou_a b", "ou_é", "OU_abc"] {
            let refused = approvers(vec![bad.into()]).expect_err(bad);
            assert_eq!(refused.code, ErrorCode::InvalidRequest);
        }
        let longest = format!("ou_{}", "a".repeat(MAX_OPEN_ID_BYTES - 3));
        assert!(approvers(vec![longest.clone()]).is_ok());
        assert!(approvers(vec![format!("{longest}a")]).is_err());
        let most: Vec<String> = (0..MAX_APPROVERS).map(|i| format!("ou_{i}")).collect();
        assert!(approvers(most.clone()).is_ok());
        let too_many = [most, vec!["ou_x".into()]].concat();
        assert!(approvers(too_many).is_err());
        assert_eq!(
            approvers_from_stored(&approvers_to_stored(&ok)),
            ok,
            "stored and read back"
        );
        assert!(approvers_from_stored("not json").is_empty());
    }

    fn verdict(
        text: &str,
        existing: Option<PermissionRow>,
        sender: &str,
        approvers: &[&str],
    ) -> LarkVerdict {
        let approvers: Vec<String> = approvers.iter().map(|a| a.to_string()).collect();
        lark_verdict(
            lark_command(text).as_ref(),
            existing,
            Some(sender),
            &approvers,
            9,
        )
    }

    #[test]
    fn an_approvers_answer_is_written_and_its_replay_replayed() {
        let Answer(Decision::Write(row)) = verdict("yes abcde", Some(created()), "ou_a", &["ou_a"])
        else {
            panic!("an approver's first answer writes")
        };
        assert_eq!(row.state, PermissionState::Allowed);
        assert_eq!(row.answered_via, Some(AnsweredVia::Lark));
        let again = verdict("YES abcde", Some(row.clone()), "ou_a", &["ou_a"]);
        assert!(matches!(again, Answer(Decision::Replayed(_))));
        // Another answer to an answered request changes nothing.
        assert!(matches!(
            verdict("no abcde", Some(row), "ou_a", &["ou_a"]),
            Ignore
        ));
        let Answer(Decision::Write(denied)) =
            verdict("no abcde", Some(created()), "ou_b", &["ou_a", "ou_b"])
        else {
            panic!("a deny writes")
        };
        assert_eq!(denied.state, PermissionState::Denied);
    }

    #[test]
    fn strangers_and_linkless_answers_are_ignored_never_turns() {
        assert!(matches!(
            verdict("yes abcde", Some(created()), "ou_x", &["ou_a"]),
            Ignore
        ));
        // Without approvers nobody on Lark can answer.
        assert!(matches!(
            verdict("yes abcde", Some(created()), "ou_a", &[]),
            Ignore
        ));
        let no_sender = lark_verdict(
            lark_command("yes abcde").as_ref(),
            Some(created()),
            None,
            &["ou_a".into()],
            9,
        );
        assert!(matches!(no_sender, Ignore));
        // An unknown id of the request form: ignored, from anyone.
        assert!(matches!(
            verdict("yes qwert", None, "ou_a", &["ou_a"]),
            Ignore
        ));
        assert!(matches!(
            verdict("yes qwert", None, "ou_x", &["ou_a"]),
            Ignore
        ));
        // An expired request.
        let expired = PermissionRow {
            state: EXPIRED_ON_CLOSE,
            ..created()
        };
        assert!(matches!(
            verdict("yes abcde", Some(expired), "ou_a", &["ou_a"]),
            Ignore
        ));
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
            assert!(
                matches!(verdict(text, None, "ou_a", &["ou_a"]), Turn),
                "{text}"
            );
        }
        // A request of another form is still answered by its exact id.
        let long = PermissionRow {
            request_id: "req-42".into(),
            ..created()
        };
        assert!(matches!(
            verdict("yes req-42", Some(long), "ou_a", &["ou_a"]),
            Answer(Decision::Write(_))
        ));
    }

    #[test]
    fn the_chat_message_says_what_is_asked_and_how_to_answer() {
        let row = PermissionRow {
            description: "Delete the build dir".into(),
            input_preview: "rm -rf build".into(),
            ..created()
        };
        let text = lark_message(&row);
        assert!(text.contains("Bash"), "{text}");
        assert!(text.contains("Delete the build dir"), "{text}");
        assert!(text.contains("rm -rf build"), "{text}");
        assert!(text.contains("\"yes abcde\""), "{text}");
        assert!(text.contains("\"no abcde\""), "{text}");
        let long = PermissionRow {
            input_preview: "é".repeat(5000),
            ..created()
        };
        let text = lark_message(&long);
        assert!(text.contains(&format!("{}…", "é".repeat(MESSAGE_PREVIEW_CHARS))));
        assert!(!text.contains(&"é".repeat(MESSAGE_PREVIEW_CHARS + 1)));
    }
}
