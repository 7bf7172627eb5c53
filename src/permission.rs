//! The permission-request rules, written once for both stores: given the
//! loaded rows (or none) and the incoming create or answer, what happens:
//! a new row to write, a replay, or the contract's refusal. It knows no SQL,
//! no HTTP and no waiting: the stores load the rows and apply the outcome
//! inside their own transaction, the broker parks the waits.

use crate::error::{Error, ErrorCode, Result};
use crate::model::{
    AnsweredVia, Behavior, CreatePermissionRequest, PermissionRequest, PermissionState,
    SessionState,
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
        return Err(Error::new(
            ErrorCode::IdempotencyKeyReused,
            "This request_id was used on this session with another request.",
        ));
    }
    if session.state == SessionState::Closed {
        return Err(Error::new(
            ErrorCode::SessionClosed,
            "The session is closed.",
        ));
    }
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

/// A Lark message of the form `yes <id>` or `no <id>` (any case, surrounding
/// blanks ignored): the answer and the request id it names.
pub fn lark_answer(text: &str) -> Option<(Behavior, &str)> {
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
    Some((behavior, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(state: SessionState) -> SessionRow {
        SessionRow {
            session_id: "ses_1".into(),
            goal_id: "g".into(),
            agent_id: "a".into(),
            host_surface: "claude-code".into(),
            host_session_id: "h".into(),
            executor_endpoint_id: "e".into(),
            state,
            created_at: 0,
            closed_at: None,
            queued_count: 0,
            active_claim_id: None,
            next_seq: 0,
            next_event_no: 0,
        }
    }

    fn host(id: &str) -> HostIdentity {
        HostIdentity {
            host_surface: "claude-code".into(),
            host_session_id: id.into(),
        }
    }

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

    #[test]
    fn lark_answers_are_a_verb_and_an_id() {
        assert_eq!(lark_answer("yes abcde"), Some((Behavior::Allow, "abcde")));
        assert_eq!(
            lark_answer("  No   abcde \n"),
            Some((Behavior::Deny, "abcde"))
        );
        assert_eq!(lark_answer("yes"), None);
        assert_eq!(lark_answer("yes abcde please"), None);
        assert_eq!(lark_answer("maybe abcde"), None);
    }
}
