//! The permission-request rules: a host's create (replay, key reuse, closed
//! session), an answer (the first one wins and is final), and what each
//! writes: the request, its numbered event in the session's log and, for a
//! new request in a session linked to a Lark chat, its message to the chat.
//! What a close expires is [`super::session::close`]'s.

use super::SessionRow;
use super::notice::{Ask, SessionName};
use super::{
    Change, Decided, NewPermissionMessage, Subject, Writes, existing, hosted, key_reused, log, open,
};
use crate::error::{Error, Result};
use crate::model::HostIdentity;
use crate::model::{
    AnswerPermission, AnsweredVia, Behavior, ChosenAnswer, CreatePermissionRequest, PermissionKind,
    PermissionState,
};
use crate::permission::{MAX_WORDS_BYTES, PermissionRow};

/// What a create or an answer answers: the request as written, or as stored
/// for a replay.
#[derive(Debug)]
pub enum Decision {
    /// Written by this call (inserted for a create, updated for an answer).
    Write(PermissionRow),
    /// The same request again: the stored row, nothing written.
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

/// What a create reads.
#[derive(Debug, Default)]
pub struct CreateRows {
    pub session: Option<SessionRow>,
    /// The session's request stored under the request id, if any.
    pub existing: Option<PermissionRow>,
    /// The Lark chat the session is linked to, if any.
    pub chat_id: Option<String>,
}

/// What an answer reads.
#[derive(Debug, Default)]
pub struct AnswerRows {
    pub session: Option<SessionRow>,
    /// The request answered, if the session has it.
    pub existing: Option<PermissionRow>,
}

fn same_request(
    row: &PermissionRow,
    request: &CreatePermissionRequest,
    detail: &Option<String>,
) -> bool {
    row.tool_name == request.tool_name
        && row.description == request.description
        && row.input_preview == request.input_preview
        && &row.detail == detail
}

/// The host records a request, in this order: unknown session 404; wrong
/// host 403 `host_mismatch`; the same request id with the same body a replay
/// (another body 422 `idempotency_key_reused`), also on a closed session; a
/// closed session 409 `session_closed`.
pub fn create(
    rows: CreateRows,
    host: &HostIdentity,
    request: CreatePermissionRequest,
    now: i64,
) -> Result<Decided<Decision>> {
    let mut session = hosted(rows.session, host)?;
    let detail = crate::permission::detail_of(&request)?;
    if let Some(row) = rows.existing {
        if same_request(&row, &request, &detail) {
            return Ok(Decided::nothing(Decision::Replayed(row)));
        }
        return Err(key_reused("request_id", "another request on this session"));
    }
    open(&session)?;
    let row = PermissionRow {
        session_id: session.session_id.clone(),
        request_id: request.request_id,
        tool_name: request.tool_name,
        description: request.description,
        input_preview: request.input_preview,
        state: PermissionState::Pending,
        created_at: now,
        answered_at: None,
        answered_via: None,
        relayed_at: None,
        detail,
        answer: None,
    };
    let event = log(
        &mut session,
        Subject::Permission(&row.request_id),
        row.state.as_str(),
        now,
    );
    let permission_message = rows.chat_id.map(|chat_id| NewPermissionMessage {
        session_id: row.session_id.clone(),
        request_id: row.request_id.clone(),
        chat_id,
        // The message a linked chat receives: the request as the chat is
        // asked it, drawn by the channel (Lark: its interactive card, as
        // the JSON string Lark's `content` takes).
        text: Ask {
            request: &row,
            name: &SessionName::of(&session),
        }
        .to_string(),
        at: now,
    });
    Ok(Decided {
        writes: Writes {
            permission: Some(Change::Insert(row.clone())),
            permission_message,
            session: Some(session),
            event: Some(event),
            ..Writes::default()
        },
        answer: Decision::Write(row),
    })
}

/// A pending request settled (answered, or withdrawn without `via`): the
/// request updated and its event logged.
fn settle(
    mut session: SessionRow,
    row: PermissionRow,
    state: PermissionState,
    via: Option<AnsweredVia>,
    chosen: Option<ChosenAnswer>,
    now: i64,
) -> Decided<Decision> {
    let row = PermissionRow {
        state,
        answered_at: Some(now),
        answered_via: via,
        answer: chosen.and_then(|c| serde_json::to_string(&c).ok()),
        ..row
    };
    let event = log(
        &mut session,
        Subject::Permission(&row.request_id),
        state.as_str(),
        now,
    );
    Decided {
        writes: Writes {
            permission: Some(Change::Update(row.clone())),
            session: Some(session),
            event: Some(event),
            ..Writes::default()
        },
        answer: Decision::Write(row),
    }
}

/// The state an answer gives a request.
pub fn answered_state(behavior: Behavior) -> PermissionState {
    match behavior {
        Behavior::Allow => PermissionState::Allowed,
        Behavior::Deny => PermissionState::Denied,
    }
}

/// An answer, in this order: unknown session or request 404; an answer
/// that does not fit the request 422 (a `question` allowed without an
/// answer for each of its questions, an unknown question, a suggestion that
/// is not one of the request's, a `mode` for anything but a plan); a pending
/// request takes it; the same answer again is a replay; another answer, or
/// any answer to an expired request (one answered at the terminal first
/// among them), is 409 `permission_already_answered` (with the state).
pub fn answer(
    rows: AnswerRows,
    answer: &AnswerPermission,
    via: AnsweredVia,
    now: i64,
) -> Result<Decided<Decision>> {
    let session = existing(rows.session)?;
    let row = rows
        .existing
        .ok_or_else(|| Error::not_found("permission request"))?;
    let chosen = chosen(&row, answer)?;
    let wanted = answered_state(answer.behavior);
    match row.state {
        PermissionState::Pending => Ok(settle(session, row, wanted, Some(via), chosen, now)),
        state if state == wanted && row.chosen() == chosen => {
            Ok(Decided::nothing(Decision::Replayed(row)))
        }
        state => Err(Error::permission_already_answered(state)),
    }
}

/// What an answer chooses beyond allow or deny, checked against the request
/// (none: a plain allow or deny).
fn chosen(row: &PermissionRow, answer: &AnswerPermission) -> Result<Option<ChosenAnswer>> {
    let detail = row.detail();
    let allow = answer.behavior == Behavior::Allow;
    if let Some(message) = &answer.message
        && message.len() > MAX_WORDS_BYTES
    {
        return Err(Error::unfit(format!(
            "`message` must be at most {MAX_WORDS_BYTES} bytes."
        )));
    }
    if answer.mode.is_some() && (detail.kind != PermissionKind::Plan || !allow) {
        return Err(Error::unfit(
            "`mode` is only for allowing a `plan` request.",
        ));
    }
    if let Some(index) = answer.suggestion
        && (!allow || index as usize >= detail.suggestions.len())
    {
        return Err(Error::unfit(
            "`suggestion` must be the index of one of the request's `suggestions`, with an allow.",
        ));
    }
    let answers = match (&detail.questions, &answer.answers, allow) {
        (_, None, false) => None,
        (_, Some(_), false) => {
            return Err(Error::unfit("`answers` goes with an allow."));
        }
        (Some(questions), Some(answers), _) => {
            check_answers(questions, answers)?;
            Some(answers.clone())
        }
        (Some(_), None, true) => {
            return Err(Error::unfit(
                "Allowing a `question` request needs `answers`: one for each question.",
            ));
        }
        (None, Some(_), _) => {
            return Err(Error::unfit("`answers` is only for a `question` request."));
        }
        (None, None, true) => None,
    };
    let mode = match detail.kind {
        PermissionKind::Plan if allow => {
            Some(answer.mode.unwrap_or(crate::model::PlanMode::Default))
        }
        _ => None,
    };
    let chosen = ChosenAnswer {
        message: answer.message.clone().filter(|m| !m.trim().is_empty()),
        answers,
        suggestion: answer.suggestion,
        mode,
    };
    Ok((chosen != ChosenAnswer::default()).then_some(chosen))
}

/// A question's answers: one for each question, none for another, each
/// 1 to [`MAX_WORDS_BYTES`] bytes and not blank.
fn check_answers(
    questions: &[crate::model::Question],
    answers: &std::collections::BTreeMap<String, String>,
) -> Result<()> {
    if answers
        .keys()
        .any(|k| !questions.iter().any(|q| &q.question == k))
    {
        return Err(Error::unfit(
            "`answers` names a question the request does not ask.",
        ));
    }
    for question in questions {
        match answers.get(&question.question) {
            Some(text) if !text.trim().is_empty() && text.len() <= MAX_WORDS_BYTES => {}
            Some(_) => {
                return Err(Error::unfit(format!(
                    "Each of `answers` must be 1 to {MAX_WORDS_BYTES} bytes, not blank."
                )));
            }
            None => {
                return Err(Error::unfit(
                    "`answers` needs an answer for each question of the request.",
                ));
            }
        }
    }
    Ok(())
}

/// The host records that it relayed the answer to its agent, in this order:
/// unknown session 404; wrong host 403 `host_mismatch`; unknown request 404;
/// pending or expired 409 `permission_not_answered` (with the state); relayed
/// already: answered again, nothing written (so nothing is relayed twice by a
/// host that asks first). No event: the request's state does not change.
pub fn relayed(rows: AnswerRows, host: &HostIdentity, now: i64) -> Result<Decided<Decision>> {
    super::hosted(rows.session, host)?;
    let row = rows
        .existing
        .ok_or_else(|| Error::not_found("permission request"))?;
    match (row.state, row.relayed_at) {
        (PermissionState::Pending | PermissionState::Expired, _) => {
            Err(Error::permission_not_answered(row.state))
        }
        (_, Some(_)) => Ok(Decided::nothing(Decision::Replayed(row))),
        (_, None) => {
            let row = PermissionRow {
                relayed_at: Some(now),
                ..row
            };
            Ok(Decided {
                writes: Writes {
                    permission: Some(Change::Update(row.clone())),
                    ..Writes::default()
                },
                answer: Decision::Write(row),
            })
        }
    }
}

/// Whether the host still owes its agent this request's answer: answered
/// (allowed or denied) and not relayed yet.
pub fn owed(row: &crate::model::PermissionRequest) -> bool {
    matches!(
        row.state,
        PermissionState::Allowed | PermissionState::Denied
    ) && row.relayed_at.is_none()
}

/// What a session's close does to its pending requests.
pub const EXPIRED_ON_CLOSE: PermissionState = PermissionState::Expired;

/// What a host's withdrawal makes of a pending request: nobody answered in
/// time, the agent asks at its terminal, no card stays open.
pub const WITHDRAWN: PermissionState = PermissionState::Expired;

/// The host withdraws its request, in this order: unknown session or request
/// 404; another host 403 `host_mismatch`; a pending request becomes
/// [`WITHDRAWN`] (its event logged; `answered_via: "terminal"` when the
/// person answered at the terminal first); an expired one again is a
/// replay; an answered one is 409 `permission_already_answered` with its
/// state (the host then uses that answer after all). Also on a closed
/// session, whose requests are all expired already.
pub fn withdraw(
    rows: AnswerRows,
    host: &HostIdentity,
    at_terminal: bool,
    now: i64,
) -> Result<Decided<Decision>> {
    let session = existing(rows.session)?;
    let row = rows
        .existing
        .ok_or_else(|| Error::not_found("permission request"))?;
    if !session.is_bound_to(host) {
        return Err(Error::host_mismatch());
    }
    match row.state {
        PermissionState::Pending => {
            let via = at_terminal.then_some(AnsweredVia::Terminal);
            Ok(settle(session, row, WITHDRAWN, via, None, now))
        }
        PermissionState::Expired => Ok(Decided::nothing(Decision::Replayed(row))),
        state => Err(Error::permission_already_answered(state)),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::decide::tests::{host, session};
    use crate::error::ErrorCode;
    use crate::model::SessionState;

    pub fn request(preview: &str) -> CreatePermissionRequest {
        CreatePermissionRequest {
            host_surface: "claude-code".into(),
            host_session_id: "h".into(),
            request_id: "abcde".into(),
            tool_name: "Bash".into(),
            description: "d".into(),
            input_preview: preview.into(),
            ..CreatePermissionRequest::default()
        }
    }

    fn rows(state: SessionState, existing: Option<PermissionRow>) -> CreateRows {
        CreateRows {
            session: Some(session(state)),
            existing,
            chat_id: None,
        }
    }

    /// A pending request, as a first create writes it.
    pub fn created() -> PermissionRow {
        match create(rows(SessionState::Open, None), &host("h"), request("ls"), 5) {
            Ok(Decided {
                answer: Decision::Write(row),
                ..
            }) => row,
            other => panic!("{other:?}"),
        }
    }

    fn code<T: std::fmt::Debug>(result: Result<T>) -> ErrorCode {
        result.expect_err("a refusal").code
    }

    #[test]
    fn create_checks_session_then_host_then_replay_then_closed() {
        let row = created();
        assert_eq!(row.state, PermissionState::Pending);
        let unknown = CreateRows::default();
        assert_eq!(
            code(create(unknown, &host("h"), request("ls"), 6)),
            ErrorCode::NotFound
        );
        let closed = || rows(SessionState::Closed, Some(row.clone()));
        let wrong = create(closed(), &host("x"), request("ls"), 6);
        assert_eq!(code(wrong), ErrorCode::HostMismatch);
        let again = create(closed(), &host("h"), request("ls"), 6).unwrap();
        assert!(matches!(again.answer, Decision::Replayed(r) if r == row));
        assert!(again.writes.permission.is_none() && again.writes.event.is_none());
        let other = create(
            rows(SessionState::Open, Some(row)),
            &host("h"),
            request("rm"),
            6,
        );
        assert_eq!(code(other), ErrorCode::IdempotencyKeyReused);
        let late = create(
            rows(SessionState::Closed, None),
            &host("h"),
            request("ls"),
            6,
        );
        assert_eq!(code(late), ErrorCode::SessionClosed);
    }

    #[test]
    fn a_create_numbers_its_event_and_messages_a_linked_chat_only() {
        let unlinked =
            create(rows(SessionState::Open, None), &host("h"), request("ls"), 5).unwrap();
        let writes = unlinked.writes;
        assert!(matches!(&writes.permission, Some(Change::Insert(r)) if r.created_at == 5));
        let event = writes.event.expect("an event");
        assert_eq!(
            (event.event_no, event.kind, event.state),
            (9, "permission", "pending")
        );
        assert_eq!(event.request_id.as_deref(), Some("abcde"));
        assert_eq!(writes.session.expect("the session").next_event_no, 10);
        assert!(writes.permission_message.is_none());
        let linked = CreateRows {
            chat_id: Some("oc_1".into()),
            ..rows(SessionState::Open, None)
        };
        let writes = create(linked, &host("h"), request("ls"), 5).unwrap().writes;
        let message = writes.permission_message.expect("a chat message");
        assert_eq!(
            (message.chat_id.as_str(), message.request_id.as_str()),
            ("oc_1", "abcde")
        );
        assert!(message.text.contains("yes abcde"), "{}", message.text);
    }

    #[test]
    fn a_withdrawal_expires_a_pending_request_once_and_never_an_answer() {
        let rows = |existing: Option<PermissionRow>| AnswerRows {
            session: Some(session(SessionState::Open)),
            existing,
        };
        assert_eq!(
            code(withdraw(rows(None), &host("h"), false, 7)),
            ErrorCode::NotFound
        );
        let wrong = withdraw(rows(Some(created())), &host("x"), false, 7);
        assert_eq!(code(wrong), ErrorCode::HostMismatch);
        let first = withdraw(rows(Some(created())), &host("h"), false, 7).unwrap();
        let Decision::Write(expired) = first.answer else {
            panic!("a first withdrawal writes")
        };
        assert_eq!((expired.state, expired.answered_at), (WITHDRAWN, Some(7)));
        let event = first.writes.event.expect("an event");
        assert_eq!((event.kind, event.state), ("permission", "expired"));
        let again = withdraw(rows(Some(expired.clone())), &host("h"), false, 8).unwrap();
        assert!(matches!(again.answer, Decision::Replayed(ref r) if *r == expired));
        assert!(again.writes.event.is_none());
        let allowed = PermissionRow {
            state: PermissionState::Allowed,
            ..created()
        };
        let late = withdraw(rows(Some(allowed)), &host("h"), false, 8);
        assert_eq!(code(late), ErrorCode::PermissionAlreadyAnswered);
    }

    fn answered(existing: Option<PermissionRow>, behavior: Behavior) -> Result<Decided<Decision>> {
        let rows = AnswerRows {
            session: Some(session(SessionState::Open)),
            existing,
        };
        answer(
            rows,
            &AnswerPermission::plain(behavior),
            AnsweredVia::Owner,
            10,
        )
    }

    #[test]
    fn the_first_answer_wins_and_the_same_answer_replays() {
        assert_eq!(code(answered(None, Behavior::Allow)), ErrorCode::NotFound);
        let no_session = AnswerRows {
            session: None,
            existing: Some(created()),
        };
        let unknown = answer(
            no_session,
            &AnswerPermission::plain(Behavior::Allow),
            AnsweredVia::Owner,
            1,
        );
        assert_eq!(code(unknown), ErrorCode::NotFound);
        let rows = AnswerRows {
            session: Some(session(SessionState::Open)),
            existing: Some(created()),
        };
        let first = answer(
            rows,
            &AnswerPermission::plain(Behavior::Allow),
            AnsweredVia::Lark,
            9,
        )
        .unwrap();
        let Decision::Write(allowed) = first.answer else {
            panic!("a first answer writes")
        };
        assert_eq!(allowed.state, PermissionState::Allowed);
        assert_eq!(allowed.answered_via, Some(AnsweredVia::Lark));
        assert_eq!(allowed.answered_at, Some(9));
        let event = first.writes.event.expect("an event");
        assert_eq!((event.event_no, event.state), (9, "allowed"));
        assert_eq!(first.writes.session.expect("the session").next_event_no, 10);
        let same = answered(Some(allowed.clone()), Behavior::Allow).unwrap();
        assert!(matches!(same.answer, Decision::Replayed(ref r) if *r == allowed));
        assert!(same.writes.event.is_none() && same.writes.session.is_none());
        let other = answered(Some(allowed), Behavior::Deny);
        assert_eq!(code(other), ErrorCode::PermissionAlreadyAnswered);
        let expired = PermissionRow {
            state: EXPIRED_ON_CLOSE,
            ..created()
        };
        let late = answered(Some(expired), Behavior::Deny);
        assert_eq!(code(late), ErrorCode::PermissionAlreadyAnswered);
    }
}
