//! `permission-request`: the agent's tool approval asked on the Web page and
//! in a linked Lark chat, exactly as a channel's relayed request. Allowed or
//! denied: the verdict in exactly the agent's shape. No answer in time, the
//! broker gone, the session closed: the request is withdrawn (no card stays
//! open) and nothing is printed, so the agent asks at its terminal as usual.
//! The request's preview is never logged.

use serde_json::{Value, json};

use super::{Failure, Hook};
use crate::client::ClientError;
use crate::model::{AnsweredVia, PermissionRequest, PermissionState, WithdrawPermission};

/// How long the hook waits for an answer by default.
const DEFAULT_WAIT_SECONDS: u64 = 120;
/// How much of `tool_input` (compact JSON) the request shows.
const PREVIEW_CHARS: usize = 1500;
/// Request ids: five lowercase letters, never `l` (as Claude Code's).
const ID_LETTERS: &[u8] = b"abcdefghijkmnopqrstuvwxyz";
/// Tries at a request id unused in the session.
const ID_TRIES: usize = 5;

pub async fn permission_request(hook: &Hook) -> Result<Option<String>, Failure> {
    let tool_name = hook
        .field("tool_name")
        .filter(|name| !name.is_empty())
        .ok_or("stdin has no tool_name")?
        .to_owned();
    let tool_input = hook.input.get("tool_input").cloned().unwrap_or(json!({}));
    let description = tool_input
        .get("description")
        .and_then(Value::as_str)
        .filter(|d| !d.trim().is_empty())
        .unwrap_or(&tool_name)
        .to_owned();
    let preview = cut(&tool_input.to_string(), PREVIEW_CHARS);
    let mut created = None;
    for _ in 0..ID_TRIES {
        let id = request_id()?;
        match hook
            .host
            .create_permission(&id, &tool_name, &description, &preview)
            .await
        {
            Ok(request) => {
                created = Some(request);
                break;
            }
            // The id is taken in this session: another one.
            Err(p) if p.code() == Some("idempotency_key_reused") => continue,
            Err(p) => return Err(p.into()),
        }
    }
    let request = created.ok_or("no unused request id")?;
    let seconds = hook.wait_seconds.unwrap_or(DEFAULT_WAIT_SECONDS);
    let answered = match hook
        .host
        .wait_permission(&request.request_id, seconds)
        .await
    {
        Ok(answered) if answered.state != PermissionState::Pending => answered,
        waited => match withdraw(hook, &request.request_id).await? {
            Some(answered) => answered,
            None => {
                return match waited {
                    Ok(_) => {
                        Err("no answer in time; withdrawn, the agent asks at its terminal".into())
                    }
                    Err(p) => Err(format!("{}; the agent asks at its terminal", p.log_line())),
                };
            }
        },
    };
    Ok(verdict(&answered))
}

/// Withdraws the request; an answer given first is that answer.
async fn withdraw(hook: &Hook, request_id: &str) -> Result<Option<PermissionRequest>, Failure> {
    let session_id = hook.host.session_id().await?;
    let host = WithdrawPermission {
        host_surface: hook.host_surface.clone(),
        host_session_id: hook.host_session_id.clone(),
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

/// The verdict in exactly the agents' shape (nothing for an expired request).
pub fn verdict(request: &PermissionRequest) -> Option<String> {
    let by = match request.answered_via {
        Some(AnsweredVia::Lark) => "in Lark",
        _ => "on the LoopX Web page",
    };
    let decision = match request.state {
        PermissionState::Allowed => json!({"behavior": "allow"}),
        PermissionState::Denied => json!({
            "behavior": "deny",
            "message": format!("A person denied this {by}."),
        }),
        PermissionState::Pending | PermissionState::Expired => return None,
    };
    Some(
        json!({"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": decision}})
            .to_string(),
    )
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
}
