//! Permission requests apart from their decisions (which are
//! [`crate::decide::permission`]'s and, for answers from Lark,
//! [`crate::decide::lark`]'s): the stored row and its readback, the list
//! limit, a link's approver list (checked, and its stored form), what a chat
//! text says (`yes <id>` / `no <id>`) and the message a linked chat receives
//! for a new request. It decides nothing and knows no SQL, no HTTP and no
//! waiting.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::model::{
    AnsweredVia, Behavior, ChosenAnswer, CreatePermissionRequest, LarkLink, MAX_OPEN_ID_BYTES,
    PermissionKind, PermissionRequest, PermissionState, Question, Suggestion,
};
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
    /// When its host relayed the answer to the agent.
    pub relayed_at: Option<i64>,
    /// What it asks beyond a tool's preview ([`Detail`] as JSON; none: a
    /// plain tool request). Content, like message text.
    pub detail: Option<String>,
    /// What was chosen with its answer ([`ChosenAnswer`] as JSON; none: a
    /// plain allow or deny). Content, like message text.
    pub answer: Option<String>,
}

impl PermissionRow {
    pub fn readback(&self) -> PermissionRequest {
        let detail = self.detail();
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
            relayed_at: self.relayed_at.map(rfc3339),
            kind: detail.kind,
            questions: detail.questions,
            plan: detail.plan,
            suggestions: detail.suggestions,
            answer: self.chosen(),
        }
    }

    /// What it asks beyond a tool's preview (nothing unreadable is kept).
    pub fn detail(&self) -> Detail {
        self.detail
            .as_deref()
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or_default()
    }

    /// What was chosen with its answer.
    pub fn chosen(&self) -> Option<ChosenAnswer> {
        self.answer
            .as_deref()
            .and_then(|text| serde_json::from_str(text).ok())
    }
}

/// A request's content beyond the tool's preview, as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Detail {
    #[serde(default)]
    pub kind: PermissionKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub questions: Option<Vec<Question>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub suggestions: Vec<Suggestion>,
}

/// A plain tool request's detail: nothing beyond the preview.
pub static PLAIN: Detail = Detail {
    kind: PermissionKind::Tool,
    questions: None,
    plan: None,
    suggestions: Vec::new(),
};

/// The most questions a `question` request holds, and options a question.
pub const MAX_QUESTIONS: usize = 4;
pub const MAX_OPTIONS: usize = 8;
/// The most "always allow" suggestions a tool request holds.
pub const MAX_SUGGESTIONS: usize = 8;
/// The longest question, option description, answer or message (bytes).
pub const MAX_WORDS_BYTES: usize = 4096;
/// The longest header, label or suggestion (bytes).
pub const MAX_LABEL_BYTES: usize = 1024;

pub(crate) fn too_long(field: &str, value: &str, max: usize) -> Result<()> {
    if value.len() > max {
        return Err(Error::invalid(format!(
            "`{field}` must be at most {max} bytes."
        )));
    }
    Ok(())
}

fn blank(field: &str, value: &str) -> Result<()> {
    if value.trim().is_empty() {
        return Err(Error::invalid(format!("`{field}` must not be blank.")));
    }
    Ok(())
}

/// A create's content beyond the preview, checked, as it is stored: each
/// kind with its own fields only (`questions` for `question`, `plan` for
/// `plan`, `suggestions` for `tool`), within the limits above. `None`: a
/// plain tool request.
pub fn detail_of(request: &CreatePermissionRequest) -> Result<Option<String>> {
    let kind = request.kind;
    let only = |field: &str, present: bool, for_kind: PermissionKind| -> Result<()> {
        if present && kind != for_kind {
            return Err(Error::invalid(format!(
                "`{field}` is only for a `{}` request.",
                crate::model::wire(&for_kind)
            )));
        }
        Ok(())
    };
    only(
        "questions",
        request.questions.is_some(),
        PermissionKind::Question,
    )?;
    only("plan", request.plan.is_some(), PermissionKind::Plan)?;
    only(
        "suggestions",
        request.suggestions.is_some(),
        PermissionKind::Tool,
    )?;
    let detail = Detail {
        kind,
        questions: request.questions.clone(),
        plan: request.plan.clone(),
        suggestions: request.suggestions.clone().unwrap_or_default(),
    };
    match kind {
        PermissionKind::Question => check_questions(detail.questions.as_deref())?,
        PermissionKind::Plan => {
            let plan = detail.plan.as_deref().unwrap_or_default();
            blank("plan", plan)?;
            too_long("plan", plan, crate::decide::text::MAX_TEXT_BYTES)?;
        }
        PermissionKind::Tool => {
            if detail.suggestions.len() > MAX_SUGGESTIONS {
                return Err(Error::invalid(format!(
                    "`suggestions` holds at most {MAX_SUGGESTIONS}."
                )));
            }
            for suggestion in &detail.suggestions {
                blank("suggestions[].label", &suggestion.label)?;
                too_long("suggestions[].label", &suggestion.label, MAX_LABEL_BYTES)?;
            }
            if detail.suggestions.is_empty() {
                return Ok(None);
            }
        }
    }
    Ok(serde_json::to_string(&detail).ok())
}

fn check_questions(questions: Option<&[Question]>) -> Result<()> {
    let questions = questions.unwrap_or_default();
    if questions.is_empty() || questions.len() > MAX_QUESTIONS {
        return Err(Error::invalid(format!(
            "A `question` request holds 1 to {MAX_QUESTIONS} `questions`."
        )));
    }
    for (n, q) in questions.iter().enumerate() {
        blank("questions[].question", &q.question)?;
        too_long("questions[].question", &q.question, MAX_WORDS_BYTES)?;
        too_long("questions[].header", &q.header, MAX_LABEL_BYTES)?;
        if questions[..n]
            .iter()
            .any(|other| other.question == q.question)
        {
            return Err(Error::invalid(
                "Each of `questions` must ask another question.",
            ));
        }
        if q.options.is_empty() || q.options.len() > MAX_OPTIONS {
            return Err(Error::invalid(format!(
                "Each question has 1 to {MAX_OPTIONS} `options`."
            )));
        }
        for option in &q.options {
            blank("options[].label", &option.label)?;
            too_long("options[].label", &option.label, MAX_LABEL_BYTES)?;
            too_long(
                "options[].description",
                &option.description,
                MAX_WORDS_BYTES,
            )?;
        }
    }
    Ok(())
}

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

/// The stored form of a link's approver list (a JSON array of open ids).
pub fn approvers_to_stored(approvers: &[String]) -> String {
    serde_json::to_string(approvers).unwrap_or_else(|_| "[]".into())
}

/// The approver list as stored; anything unreadable is nobody.
pub fn approvers_from_stored(stored: &str) -> Vec<String> {
    serde_json::from_str(stored).unwrap_or_default()
}

impl LarkLink {
    /// The link as stored ([`crate::store::LINK_STATUS`]): its chat, its
    /// approvers' stored form and whether it gets terminal turns.
    pub fn stored(session_id: &str, link: Option<(String, String, i64)>) -> Self {
        match link {
            Some((chat_id, approvers, terminal_turns)) => Self {
                session_id: session_id.to_owned(),
                chat_id: Some(chat_id),
                approvers: approvers_from_stored(&approvers),
                terminal_turns: terminal_turns == 1,
            },
            None => Self::none(session_id.to_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

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
}
