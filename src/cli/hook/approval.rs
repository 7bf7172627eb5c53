//! `permission-request` (and `pre-tool-use` for a question): everything the
//! agent stops to ask, asked on the Web page and in a linked Lark chat: a
//! tool's use (with its "always allow" choices), its questions with their
//! options (`AskUserQuestion`), its plan (`ExitPlanMode`). Answered: the
//! verdict in exactly the agent's shape (HOOKS.md "Every blocking prompt").
//! No answer in time, the broker gone, the session closed: the request is
//! withdrawn (no card stays open) and nothing is printed, so the agent asks
//! at its terminal as usual. Answered at the terminal first: the request is
//! withdrawn as such, and a late answer from the phone is refused.
//! The request's content is never logged.

use serde_json::{Value, json};

use super::{Agent, Failure, Hook};
use crate::client::ClientError;
use crate::model::{
    AnsweredVia, ListPermissions, PermissionKind, PermissionRequest, PermissionState, PlanMode,
    Question, QuestionOption, Suggestion, WithdrawPermission,
};
use crate::permission::Detail;

/// How long the hook waits for an answer by default: Claude Code's terminal
/// shows its own prompt meanwhile (the first answer wins); Codex's shows
/// "Running hook" until the hook returns, so its wait is short.
const DEFAULT_WAIT_SECONDS: u64 = 120;
const CODEX_WAIT_SECONDS: u64 = 30;
/// How much of `tool_input` (compact JSON) the request shows.
const PREVIEW_CHARS: usize = 1500;
/// The longest plan read from `planFilePath` (the broker's text limit).
const MAX_PLAN_BYTES: usize = crate::broker::MAX_TEXT_BYTES;
/// Request ids: five lowercase letters, never `l` (as Claude Code's).
const ID_LETTERS: &[u8] = b"abcdefghijkmnopqrstuvwxyz";
/// Tries at a request id unused in the session.
const ID_TRIES: usize = 5;

/// What the agent asks, as the broker is told it, with the agent's own
/// parts kept to echo back unchanged.
struct Ask {
    tool_name: String,
    description: String,
    preview: String,
    detail: Detail,
    /// `tool_input.questions` exactly as sent (a question's answer echoes it).
    questions: Value,
    /// `permission_suggestions`, each exactly as sent.
    suggestions: Vec<Value>,
}

/// The PermissionRequest hook.
pub async fn permission_request(hook: &Hook) -> Result<Option<String>, Failure> {
    let ask = ask_of(hook)?;
    let Some(answered) = asked(hook, &ask).await? else {
        return Ok(None);
    };
    let decision = decision(hook.agent, &ask, &answered);
    Ok(decision.map(|decision| {
        json!({"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": decision}})
            .to_string()
    }))
}

/// The PreToolUse hook's question: Claude Code's `AskUserQuestion` outside
/// `default` mode reaches no PermissionRequest, only this hook, which the
/// agent waits for. In `default` mode the PermissionRequest asks (never
/// both for one question).
pub async fn question_before_use(hook: &Hook) -> Result<Option<String>, Failure> {
    let mode = hook.field("permission_mode").unwrap_or("default");
    if hook.agent != Agent::ClaudeCode
        || hook.field("tool_name") != Some("AskUserQuestion")
        || mode == "default"
    {
        return Ok(None);
    }
    let ask = ask_of(hook)?;
    let Some(answered) = asked(hook, &ask).await? else {
        return Ok(None);
    };
    let output = match decision(hook.agent, &ask, &answered) {
        Some(d) if d["behavior"] == "allow" => json!({
            "hookEventName": "PreToolUse",
            "permissionDecision": "allow",
            "updatedInput": d["updatedInput"],
        }),
        Some(d) => json!({
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": d["message"],
        }),
        None => return Ok(None),
    };
    Ok(Some(json!({ "hookSpecificOutput": output }).to_string()))
}

/// What the agent's input asks.
fn ask_of(hook: &Hook) -> Result<Ask, Failure> {
    let tool_name = hook
        .field("tool_name")
        .filter(|name| !name.is_empty())
        .ok_or("stdin has no tool_name")?
        .to_owned();
    let input = hook.input.get("tool_input").cloned().unwrap_or(json!({}));
    let claude = hook.agent == Agent::ClaudeCode;
    let mut ask = Ask {
        description: input
            .get("description")
            .and_then(Value::as_str)
            .filter(|d| !d.trim().is_empty())
            .unwrap_or(&tool_name)
            .to_owned(),
        preview: cut(&input.to_string(), PREVIEW_CHARS),
        tool_name,
        detail: Detail::default(),
        questions: input.get("questions").cloned().unwrap_or(Value::Null),
        suggestions: Vec::new(),
    };
    match ask.tool_name.as_str() {
        "AskUserQuestion" if claude => {
            ask.detail.kind = PermissionKind::Question;
            ask.detail.questions = Some(questions(&ask.questions)?);
            ask.description = "The agent asks you".into();
        }
        "ExitPlanMode" if claude => {
            ask.detail.kind = PermissionKind::Plan;
            ask.detail.plan = Some(plan(&input));
            ask.description = "The agent's plan".into();
        }
        _ if claude => {
            ask.suggestions = hook
                .input
                .get("permission_suggestions")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            ask.suggestions.truncate(crate::permission::MAX_SUGGESTIONS);
            ask.detail.suggestions = ask.suggestions.iter().map(suggestion).collect();
        }
        _ => {}
    }
    Ok(ask)
}

/// `AskUserQuestion`'s questions (`multiSelect` named `multi_select`).
fn questions(sent: &Value) -> Result<Vec<Question>, Failure> {
    let text = |v: &Value, key: &str| {
        v.get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let list = sent.as_array().ok_or("AskUserQuestion without questions")?;
    Ok(list
        .iter()
        .map(|q| Question {
            question: text(q, "question"),
            header: text(q, "header"),
            multi_select: q
                .get("multiSelect")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            options: q
                .get("options")
                .and_then(Value::as_array)
                .map(|options| {
                    options
                        .iter()
                        .map(|o| QuestionOption {
                            label: text(o, "label"),
                            description: text(o, "description"),
                        })
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect())
}

/// The plan's Markdown: `tool_input.plan`, else the file `planFilePath`
/// names (read up to the broker's text limit).
fn plan(input: &Value) -> String {
    if let Some(plan) = input
        .get("plan")
        .and_then(Value::as_str)
        .filter(|p| !p.trim().is_empty())
    {
        return plan.to_owned();
    }
    let read = input
        .get("planFilePath")
        .and_then(Value::as_str)
        .and_then(|path| std::fs::read(path).ok())
        .map(|mut bytes| {
            bytes.truncate(MAX_PLAN_BYTES);
            String::from_utf8_lossy(&bytes).into_owned()
        });
    read.filter(|p| !p.trim().is_empty())
        .unwrap_or_else(|| "(The agent gave no plan text.)".into())
}

/// An "always allow" suggestion as a person reads it.
fn suggestion(sent: &Value) -> Suggestion {
    let text = |key: &str| sent.get(key).and_then(Value::as_str).unwrap_or_default();
    let place = match text("destination") {
        "session" => "for this session",
        "localSettings" => "in this project (on this machine)",
        "projectSettings" => "in this project",
        "userSettings" => "in all your projects",
        _ => "",
    };
    let label = match text("type") {
        "addRules" | "replaceRules" => {
            let rules: Vec<String> = sent
                .get("rules")
                .and_then(Value::as_array)
                .map(|rules| {
                    rules
                        .iter()
                        .map(|r| {
                            let tool = r.get("toolName").and_then(Value::as_str).unwrap_or("?");
                            match r.get("ruleContent").and_then(Value::as_str) {
                                Some(content) => format!("{tool}({content})"),
                                None => tool.to_owned(),
                            }
                        })
                        .collect()
                })
                .unwrap_or_default();
            let verb = if text("behavior") == "deny" {
                "Always deny"
            } else {
                "Always allow"
            };
            format!("{verb} {} {place}", rules.join(", "))
        }
        "setMode" => format!("Switch to {} mode {place}", text("mode")),
        "addDirectories" => {
            let dirs: Vec<&str> = sent
                .get("directories")
                .and_then(Value::as_array)
                .map(|d| d.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            format!("Allow access to {} {place}", dirs.join(", "))
        }
        other => format!("Apply the agent's suggestion ({other}) {place}"),
    };
    Suggestion {
        label: cut(label.trim(), crate::permission::MAX_LABEL_BYTES / 4),
    }
}

/// Records the request and waits for its answer: the answered request, or
/// nothing (no answer in time, or answered at the terminal first: then
/// withdrawn, and the agent asks at its terminal as usual).
async fn asked(hook: &Hook, ask: &Ask) -> Result<Option<PermissionRequest>, Failure> {
    let request = create(hook, ask).await?;
    let default_wait = match hook.agent {
        Agent::ClaudeCode => DEFAULT_WAIT_SECONDS,
        Agent::Codex => CODEX_WAIT_SECONDS,
    };
    let seconds = hook.wait_seconds.unwrap_or(default_wait);
    let waited = tokio::select! {
        waited = hook.host.wait_permission(&request.request_id, seconds) => waited,
        () = ended_by_agent() => {
            // The agent ended this hook: the person answered at its
            // terminal first.
            withdraw(hook, &request.request_id, true).await?;
            return Err("answered at the terminal first".into());
        }
    };
    match waited {
        Ok(answered) if answered.state != PermissionState::Pending => Ok(Some(answered)),
        waited => match withdraw(hook, &request.request_id, false).await? {
            Some(answered) => Ok(Some(answered)),
            None => match waited {
                Ok(_) => Err("no answer in time; withdrawn, the agent asks at its terminal".into()),
                Err(p) => Err(format!("{}; the agent asks at its terminal", p.log_line())),
            },
        },
    }
}

/// Records the request under a fresh id (another one if the id is taken).
async fn create(hook: &Hook, ask: &Ask) -> Result<PermissionRequest, Failure> {
    for _ in 0..ID_TRIES {
        let id = request_id()?;
        match hook
            .host
            .create_permission(
                &id,
                &ask.tool_name,
                &ask.description,
                &ask.preview,
                &ask.detail,
            )
            .await
        {
            Ok(request) => return Ok(request),
            // The id is taken in this session: another one.
            Err(p) if p.code() == Some("idempotency_key_reused") => continue,
            Err(p) => return Err(p.into()),
        }
    }
    Err("no unused request id".into())
}

/// Resolves when the agent ends the hook (SIGTERM, SIGHUP or SIGINT).
async fn ended_by_agent() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut hup), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = hup.recv() => {}
        _ = int.recv() => {}
    }
}

/// Withdraws the request (`at_terminal`: the person answered at the
/// terminal first); an answer given first is that answer.
async fn withdraw(
    hook: &Hook,
    request_id: &str,
    at_terminal: bool,
) -> Result<Option<PermissionRequest>, Failure> {
    let session_id = hook.host.session_id().await?;
    let host = WithdrawPermission {
        host_surface: hook.host_surface.clone(),
        host_session_id: hook.host_session_id.clone(),
        answered_at_terminal: at_terminal,
    };
    match hook
        .client
        .withdraw_permission(&session_id, request_id, &host)
        .await
    {
        Ok(_) => Ok(None),
        Err(ClientError::Refused { error, .. }) if error.error.state.is_some() => {
            let answered = hook
                .client
                .permission(&session_id, request_id)
                .await
                .map_err(|e| super::Problem::from(e).log_line())?;
            Ok(Some(answered.body))
        }
        Err(e) => Err(super::Problem::from(e).log_line()),
    }
}

/// The agent moved on (a tool ran, a turn ended or began, the session
/// ended): a request of this host still pending was answered at the
/// terminal first. After PostToolUse only the request for that very tool
/// use (its tool and preview) is, as other tools may be running beside it.
pub async fn moved_on(hook: &Hook, event: &str) -> Result<(), Failure> {
    let session_id = hook.host.session_id().await?;
    let pending = hook
        .client
        .permissions(
            &session_id,
            &ListPermissions {
                state: Some(PermissionState::Pending),
            },
        )
        .await
        .map_err(|e| super::Problem::from(e).log_line())?
        .body
        .permission_requests;
    let used = (event == "post-tool-use")
        .then(|| ask_of(hook).ok())
        .flatten();
    for request in pending {
        let this_use = used.as_ref().is_none_or(|ask| {
            ask.tool_name == request.tool_name && ask.preview == request.input_preview
        });
        if this_use {
            // Another host's request is refused (403): not ours to settle.
            let _ = withdraw(hook, &request.request_id, true).await;
        }
    }
    Ok(())
}

/// The `decision` in the agent's shape (nothing for an expired request).
/// Codex takes the plain verdict only.
fn decision(agent: Agent, ask: &Ask, request: &PermissionRequest) -> Option<Value> {
    let by = match request.answered_via {
        Some(AnsweredVia::Lark) => "in Lark",
        _ => "on the LoopX Web page",
    };
    let chosen = request.answer.clone().unwrap_or_default();
    match request.state {
        PermissionState::Allowed => {}
        PermissionState::Denied => {
            let message = chosen.message.unwrap_or_else(|| match request.kind {
                PermissionKind::Plan => format!("A person asked {by} to keep planning."),
                _ => format!("A person denied this {by}."),
            });
            return Some(json!({"behavior": "deny", "message": message}));
        }
        PermissionState::Pending | PermissionState::Expired => return None,
    }
    let mut allow = json!({"behavior": "allow"});
    if agent == Agent::Codex {
        return Some(allow);
    }
    match request.kind {
        PermissionKind::Question => {
            let answers = chosen.answers.unwrap_or_default();
            allow["updatedInput"] = json!({"questions": ask.questions, "answers": answers});
        }
        PermissionKind::Plan => {
            let mode = match chosen.mode {
                Some(PlanMode::AcceptEdits) => "acceptEdits",
                _ => "default",
            };
            allow["updatedPermissions"] =
                json!([{"type": "setMode", "mode": mode, "destination": "session"}]);
        }
        PermissionKind::Tool => {
            if let Some(sent) = chosen
                .suggestion
                .and_then(|i| ask.suggestions.get(i as usize))
            {
                allow["updatedPermissions"] = json!([sent]);
            }
        }
    }
    Some(allow)
}

/// Five random lowercase letters without `l`.
fn request_id() -> Result<String, Failure> {
    let mut bytes = [0u8; 5];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness: {e}"))?;
    Ok(bytes
        .iter()
        .map(|b| ID_LETTERS[*b as usize % ID_LETTERS.len()] as char)
        .collect())
}

/// The first `chars` characters.
fn cut(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((end, _)) => text[..end].to_owned(),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_five_letters_without_l_and_previews_are_cut() {
        for _ in 0..200 {
            let id = request_id().unwrap();
            assert_eq!(id.len(), 5);
            assert!(
                id.bytes().all(|b| b.is_ascii_lowercase() && b != b'l'),
                "{id}"
            );
        }
        assert_eq!(cut(&"é".repeat(2000), PREVIEW_CHARS).chars().count(), 1500);
        assert_eq!(cut("short", PREVIEW_CHARS), "short");
    }

    #[test]
    fn suggestions_read_as_a_person_would() {
        let rule = json!({"type": "addRules", "rules": [{"toolName": "Bash", "ruleContent": "npm test"}],
                          "behavior": "allow", "destination": "localSettings"});
        assert_eq!(
            suggestion(&rule).label,
            "Always allow Bash(npm test) in this project (on this machine)"
        );
        let mode = json!({"type": "setMode", "mode": "acceptEdits", "destination": "session"});
        assert_eq!(
            suggestion(&mode).label,
            "Switch to acceptEdits mode for this session"
        );
    }
}
