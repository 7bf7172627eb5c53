//! The queue's rules: enqueue (idempotency, closed session, live steering,
//! the queue limit), claim (one active claim per session, claim id replay and
//! reuse), complete (fencing by claim, completion replay) and release.

use super::{
    Change, ClaimRow, ClaimState, Decided, NewReply, Subject, Writes, existing, hosted, key_reused,
    log, no_active_claim, open,
};
use super::{SessionRow, TurnRow};
use crate::error::{Error, ErrorCode, Result};
use crate::ids::Minter;
use crate::model::HostIdentity;
use crate::model::{
    CompleteRequest, EnqueueRequest, Ingress, LarkRef, Receipt, Released, TurnState,
};
use crate::time::rfc3339;

/// What an enqueue did.
#[derive(Debug)]
pub struct Enqueue {
    pub turn: TurnRow,
    /// The client_message_id was seen before with the same body.
    pub duplicate: bool,
}

/// What a claim found.
#[derive(Debug)]
pub enum ClaimOutcome {
    Claimed {
        turn: Box<TurnRow>,
        attempt: i64,
        /// The claim id had already claimed this turn.
        replayed: bool,
    },
    /// No turn is queued; nothing was stored.
    Empty,
}

/// The most queued turns one session holds.
pub const MAX_QUEUED: i64 = 10_000;

/// Whether a replayed enqueue carries the same body as the stored turn.
fn same_message(turn: &TurnRow, message: &EnqueueRequest) -> bool {
    let lark = match (&turn.lark_chat_id, &turn.lark_message_id) {
        (Some(chat_id), Some(message_id)) => Some(LarkRef {
            chat_id: chat_id.clone(),
            message_id: message_id.clone(),
        }),
        _ => None,
    };
    turn.origin == message.origin
        && turn.text == message.text
        && message.ingress == Ingress::SessionQueue
        && lark == message.lark
        && turn.attachments == crate::attachments::list_json(&message.attachments)
}

/// An enqueue, given the session and the turn already enqueued there with
/// the message's `client_message_id` (if any). In this order: unknown session
/// 404; a known client_message_id answers its turn again (409
/// `session_closed` once closed, 422 `idempotency_key_reused` for another
/// body); closed 409; live steering 409 `live_steering_unavailable`; 429
/// `queue_full` at [`MAX_QUEUED`]. A message without files.
pub fn enqueue(
    session: Option<SessionRow>,
    earlier: Option<TurnRow>,
    message: EnqueueRequest,
    minter: &Minter,
    now: i64,
) -> Result<Decided<Enqueue>> {
    enqueue_within(session, earlier, message, 0, minter, now)
}

/// [`enqueue`], given also the bytes the session's files hold (`held`,
/// read under the session's lock): a message whose files would take the
/// session over its limit is 413 `payload_too_large`
/// ([`crate::attachments::check_session`]), after the queue's own checks.
pub fn enqueue_within(
    session: Option<SessionRow>,
    earlier: Option<TurnRow>,
    message: EnqueueRequest,
    held: u64,
    minter: &Minter,
    now: i64,
) -> Result<Decided<Enqueue>> {
    let mut session = existing(session)?;
    if let Some(turn) = earlier {
        open(&session)?;
        if !same_message(&turn, &message) {
            return Err(key_reused("client_message_id", "another message"));
        }
        return Ok(Decided::nothing(Enqueue {
            turn,
            duplicate: true,
        }));
    }
    open(&session)?;
    if message.ingress == Ingress::LiveSteering {
        return Err(Error::new(
            ErrorCode::LiveSteeringUnavailable,
            "Live steering is unavailable: the host exposes no push transport. Nothing was queued.",
        ));
    }
    if session.queued_count >= MAX_QUEUED {
        return Err(Error::new(
            ErrorCode::QueueFull,
            format!("The session already holds {MAX_QUEUED} queued turns."),
        ));
    }
    let adding = message.attachments.iter().map(|a| a.size).sum();
    if adding > 0 {
        crate::attachments::check_session(held, adding)?;
    }
    let (lark_chat_id, lark_message_id) = message
        .lark
        .map(|l| (Some(l.chat_id), Some(l.message_id)))
        .unwrap_or_default();
    let turn = TurnRow {
        client_message_id: message.client_message_id,
        lark_chat_id,
        lark_message_id,
        attachments: crate::attachments::list_json(&message.attachments),
        ..TurnRow::new(
            minter.mint("turn"),
            &session,
            message.origin,
            message.text,
            now,
        )
    };
    session.next_seq += 1;
    session.queued_count += 1;
    let event = log(
        &mut session,
        Subject::Turn(&turn.turn_id, turn.seq),
        "queued",
        now,
    );
    Ok(Decided {
        writes: Writes {
            turn: Some(Change::Insert(turn.clone())),
            session: Some(session),
            event: Some(event),
            ..Writes::default()
        },
        answer: Enqueue {
            turn,
            duplicate: false,
        },
    })
}

/// What a claim decision reads.
#[derive(Debug, Default)]
pub struct ClaimRows {
    pub session: Option<SessionRow>,
    /// The claim stored under the requested claim id, on any session.
    pub earlier: Option<ClaimRow>,
    /// That claim's turn, when it is on this session.
    pub earlier_turn: Option<TurnRow>,
    /// The session's active claim, if it has one.
    pub active: Option<ClaimRow>,
    /// The session's oldest queued turn.
    pub head: Option<TurnRow>,
    /// Whether that turn's files are still being fetched (a Lark turn's
    /// download job, [`crate::decide::lark::fetched`]): then it holds the
    /// queue, and no turn behind it is taken before it.
    pub head_fetching: bool,
}

/// A claim, in this order: unknown session 404; another host 403
/// `host_mismatch`; a claim id used on another session 409 `claim_id_reused`,
/// released 409 `claim_released`, else its turn answered again (also on a
/// closed session); closed 409 `session_closed`; another active claim 409
/// `claim_active`; an empty queue, or one whose oldest turn waits for its
/// files ([`ClaimRows::head_fetching`]), [`ClaimOutcome::Empty`] (nothing
/// written).
pub fn claim(
    rows: ClaimRows,
    host: &HostIdentity,
    claim_id: &str,
    now: i64,
) -> Result<Decided<ClaimOutcome>> {
    let mut session = hosted(rows.session, host)?;
    if let Some(earlier) = rows.earlier {
        if earlier.session_id != session.session_id {
            return Err(Error::new(
                ErrorCode::ClaimIdReused,
                "This claim_id was already used on another session.",
            ));
        }
        if earlier.state == ClaimState::Released {
            return Err(Error::new(
                ErrorCode::ClaimReleased,
                "This claim_id's turn was released; the claim_id is spent. Claim with a new one.",
            ));
        }
        let turn = rows
            .earlier_turn
            .ok_or_else(|| Error::store("replaying a claim", "the claimed turn is missing"))?;
        return Ok(Decided::nothing(ClaimOutcome::Claimed {
            turn: Box::new(turn),
            attempt: earlier.attempt,
            replayed: true,
        }));
    }
    open(&session)?;
    no_active_claim(&session, rows.active.as_ref())?;
    let Some(head) = rows.head.filter(|_| !rows.head_fetching) else {
        return Ok(Decided::nothing(ClaimOutcome::Empty));
    };
    let attempt = head.claim_count + 1;
    let claim = ClaimRow {
        claim_id: claim_id.to_owned(),
        session_id: session.session_id.clone(),
        turn_id: head.turn_id.clone(),
        attempt,
        state: ClaimState::Active,
        claimed_at: now,
        released_at: None,
    };
    let turn = TurnRow {
        state: TurnState::Claimed,
        claimed_at: Some(now),
        claim_count: attempt,
        current_claim_id: Some(claim_id.to_owned()),
        ..head
    };
    session.active_claim_id = Some(claim_id.to_owned());
    // A new holder: it has said nothing yet.
    session.holder_heard_at = None;
    session.queued_count -= 1;
    let event = log(
        &mut session,
        Subject::Turn(&turn.turn_id, turn.seq),
        "claimed",
        now,
    );
    Ok(Decided {
        writes: Writes {
            turn: Some(Change::Update(turn.clone())),
            claim: Some(Change::Insert(claim)),
            session: Some(session),
            event: Some(event),
            ..Writes::default()
        },
        answer: ClaimOutcome::Claimed {
            turn: Box::new(turn),
            attempt,
            replayed: false,
        },
    })
}

/// An answer's text (a completion's `response.message`, a bridge's `reply`, a
/// hook's last message): a string with more than whitespace in it, since an
/// answer is final and a blank one would tell the sender nothing. Else 400
/// `invalid_request`.
pub fn answer_text(message: Option<&serde_json::Value>) -> Result<&str> {
    match message {
        Some(serde_json::Value::String(text)) if !text.trim().is_empty() => Ok(text),
        _ => Err(Error::invalid(
            "The answer (`response.message`) must be a string that is not blank: an answer is final, and whitespace alone says nothing.",
        )),
    }
}

/// What a completion decision reads.
#[derive(Debug, Default)]
pub struct CompleteRows {
    pub session: Option<SessionRow>,
    /// The turn being completed.
    pub turn: Option<TurnRow>,
    /// Whether a turn of the session already carries the completion id.
    pub completion_id_used: bool,
}

fn receipt(turn: &TurnRow, replayed: bool) -> Receipt {
    Receipt {
        completed: true,
        session_id: turn.session_id.clone(),
        turn_id: turn.turn_id.clone(),
        claim_id: turn.current_claim_id.clone().unwrap_or_default(),
        completion_id: turn.completion_id.clone().unwrap_or_default(),
        completed_at: turn.completed_at.map(rfc3339).unwrap_or_default(),
        replayed,
    }
}

/// A completion by `claim_id` on `turn`, in the contract's order: 409
/// `already_completed` (by another completion), `not_claimed`, or
/// `claim_mismatch` (held by another claim).
fn completable(turn: &TurnRow, claim_id: &str) -> Result<()> {
    match turn.state {
        TurnState::Completed => Err(Error::new(
            ErrorCode::AlreadyCompleted,
            "The turn is already completed by another completion.",
        )),
        TurnState::Queued | TurnState::Cancelled => Err(Error::new(
            ErrorCode::NotClaimed,
            "The turn is not claimed; claim it before completing it.",
        )),
        TurnState::Claimed if turn.current_claim_id.as_deref() != Some(claim_id) => {
            Err(Error::new(
                ErrorCode::ClaimMismatch,
                "The turn is held by another claim.",
            ))
        }
        TurnState::Claimed => Ok(()),
    }
}

/// A completion, in this order: unknown session 404; another host 403; unknown
/// turn 404; the turn's own completion id with the same claim and response
/// answers its receipt again (another claim or response, or the id on another
/// turn: 422 `idempotency_key_reused`); completed 409 `already_completed`;
/// queued or cancelled 409 `not_claimed`; held by another claim 409
/// `claim_mismatch`. A turn that came from Lark gets its reply queued.
pub fn complete(
    rows: CompleteRows,
    completion: CompleteRequest,
    now: i64,
) -> Result<Decided<Receipt>> {
    let host = HostIdentity {
        host_surface: completion.host_surface,
        host_session_id: completion.host_session_id,
    };
    let mut session = hosted(rows.session, &host)?;
    let turn = rows.turn.ok_or_else(|| Error::not_found("turn"))?;
    let response = serde_json::Value::Object(completion.response);
    let reused = || key_reused("completion_id", "another claim, turn or response");
    if turn.completion_id.as_deref() == Some(completion.completion_id.as_str()) {
        let stored: Option<serde_json::Value> = turn
            .response
            .as_deref()
            .and_then(|r| serde_json::from_str(r).ok());
        let same = turn.current_claim_id.as_deref() == Some(completion.claim_id.as_str())
            && stored.as_ref() == Some(&response);
        return match same {
            true => Ok(Decided::nothing(receipt(&turn, true))),
            false => Err(reused()),
        };
    }
    if rows.completion_id_used {
        return Err(reused());
    }
    completable(&turn, &completion.claim_id)?;
    let reply = lark_reply(&turn, &response, now);
    let turn = TurnRow {
        state: TurnState::Completed,
        completed_at: Some(now),
        completion_id: Some(completion.completion_id),
        response: Some(response.to_string()),
        ..turn
    };
    let claim = ClaimRow {
        claim_id: completion.claim_id,
        session_id: session.session_id.clone(),
        turn_id: turn.turn_id.clone(),
        attempt: turn.claim_count,
        state: ClaimState::Completed,
        claimed_at: turn.claimed_at.unwrap_or(now),
        released_at: None,
    };
    session.active_claim_id = None;
    let event = log(
        &mut session,
        Subject::Turn(&turn.turn_id, turn.seq),
        "completed",
        now,
    );
    Ok(Decided {
        answer: receipt(&turn, false),
        writes: Writes {
            turn: Some(Change::Update(turn)),
            claim: Some(Change::Update(claim)),
            session: Some(session),
            event: Some(event),
            reply,
            ..Writes::default()
        },
    })
}

/// The Lark reply a completed Lark turn sends: the response's `message`.
fn lark_reply(turn: &TurnRow, response: &serde_json::Value, now: i64) -> Option<NewReply> {
    let (Some(chat_id), Some(message_id)) = (&turn.lark_chat_id, &turn.lark_message_id) else {
        return None;
    };
    Some(NewReply {
        turn_id: turn.turn_id.clone(),
        session_id: turn.session_id.clone(),
        chat_id: chat_id.clone(),
        message_id: message_id.clone(),
        text: response["message"].as_str().unwrap_or_default().to_owned(),
        at: now,
    })
}

/// What a release decision reads.
#[derive(Debug, Default)]
pub struct ReleaseRows {
    pub session: Option<SessionRow>,
    /// The claim, when it is one of this session's.
    pub claim: Option<ClaimRow>,
    /// The claim's turn.
    pub turn: Option<TurnRow>,
}

/// Who releases a claim: its host (the exact host identity), the owner
/// (the bearer token alone), who can always free a session whose agent is
/// gone, or the broker itself, for a holder that is gone ([`holder_gone`]
/// after `silence_ms` without a sign of life).
#[derive(Debug, Clone)]
pub enum Releaser {
    Host(HostIdentity),
    Owner,
    Broker { silence_ms: i64 },
}

/// Whether the holder of the session's active claim `claim` is gone at
/// `now`, so that the broker releases its turn. Time alone never releases a
/// turn an agent may still be working on (a turn can run for an hour), so
/// only these end a hold:
/// - the host reported its agent `away` after the claim was made (a hook's
///   `session-end`: the agent's session is over, nobody works on the turn);
/// - the holder said it is working on this claim (an `agent-state` report
///   `working` with its `claim_id`, which a `loopx mcp` bridge repeats every
///   minute) and has been silent for `silence_ms` since it last did.
///
/// A holder that never names its claim (a hook, an API client) keeps it
/// until it completes or releases it, its host reports `away`, or the owner
/// releases it.
///
/// `claimed_at` is when the session's active claim was made.
pub fn holder_gone(session: &SessionRow, claimed_at: i64, silence_ms: i64, now: i64) -> bool {
    if session.active_claim_id.is_none() {
        return false;
    }
    let left = session.agent_state == crate::model::AgentState::Away
        && session.agent_since.is_some_and(|since| since >= claimed_at);
    let silent = session
        .holder_heard_at
        .is_some_and(|heard| now - heard.max(claimed_at) >= silence_ms);
    left || silent
}

/// A release, in this order: unknown session 404; a host other than the
/// session's 403 (the owner and the broker need no host identity); no such
/// claim on the session 404; completed 409 `already_completed`; released
/// already: answered again; the broker's release of a holder that is not
/// gone ([`holder_gone`]: it spoke meanwhile) 409 `claim_active`; else the
/// turn goes back to the head of the queue.
pub fn release(rows: ReleaseRows, by: &Releaser, now: i64) -> Result<Decided<Released>> {
    let session = match by {
        Releaser::Host(host) => hosted(rows.session, host)?,
        Releaser::Owner | Releaser::Broker { .. } => existing(rows.session)?,
    };
    let claim = rows
        .claim
        .ok_or_else(|| Error::not_found("claim on this session"))?;
    match claim.state {
        ClaimState::Completed => Err(Error::new(
            ErrorCode::AlreadyCompleted,
            "The claimed turn is already completed; there is nothing to release.",
        )),
        ClaimState::Released => Ok(Decided::nothing(Released {
            released: true,
            turn_id: claim.turn_id,
        })),
        ClaimState::Active
            if matches!(by, Releaser::Broker { silence_ms }
                if session.active_claim_id.as_deref() != Some(claim.claim_id.as_str())
                    || !holder_gone(&session, claim.claimed_at, *silence_ms, now)) =>
        {
            Err(Error::claim_active(claim.claim_id, claim.claimed_at))
        }
        ClaimState::Active => {
            let turn = rows
                .turn
                .ok_or_else(|| Error::store("releasing a claim", "the claimed turn is missing"))?;
            Ok(requeue(session, claim, turn, now))
        }
    }
}

/// An active claim's turn back to the head of the queue (its `seq` kept, its
/// attempt still counted: the next claim is attempt + 1); the claim is spent,
/// so a late completion from it is fenced.
pub(crate) fn requeue(
    mut session: SessionRow,
    claim: ClaimRow,
    turn: TurnRow,
    now: i64,
) -> Decided<Released> {
    let turn = TurnRow {
        state: TurnState::Queued,
        claimed_at: None,
        current_claim_id: None,
        ..turn
    };
    session.active_claim_id = None;
    session.queued_count += 1;
    let event = log(
        &mut session,
        Subject::Turn(&turn.turn_id, turn.seq),
        "released",
        now,
    );
    Decided {
        answer: Released {
            released: true,
            turn_id: turn.turn_id.clone(),
        },
        writes: Writes {
            turn: Some(Change::Update(turn)),
            claim: Some(Change::Update(ClaimRow {
                state: ClaimState::Released,
                released_at: Some(now),
                ..claim
            })),
            session: Some(session),
            event: Some(event),
            ..Writes::default()
        },
    }
}

/// The person at the terminal interrupted the agent while it worked on the
/// active claim's turn: the turn is cancelled `interrupted` (never completed
/// later: its claim is spent, so a late completion is fenced), and a Lark
/// turn's message is told so.
pub(crate) fn interrupted(
    session: &mut SessionRow,
    claim: ClaimRow,
    turn: TurnRow,
    now: i64,
) -> Writes {
    let turn = TurnRow {
        state: TurnState::Cancelled,
        cancel_reason: Some(crate::model::CancelReason::Interrupted),
        current_claim_id: None,
        ..turn
    };
    session.active_claim_id = None;
    let event = log(
        session,
        Subject::Turn(&turn.turn_id, turn.seq),
        "cancelled",
        now,
    );
    let told = serde_json::json!({ "message": INTERRUPTED_NOTE });
    Writes {
        reply: lark_reply(&turn, &told, now),
        turn: Some(Change::Update(turn)),
        claim: Some(Change::Update(ClaimRow {
            state: ClaimState::Released,
            released_at: Some(now),
            ..claim
        })),
        session: Some(session.clone()),
        event: Some(event),
        ..Writes::default()
    }
}

/// What a Lark message whose turn was interrupted is answered with.
pub const INTERRUPTED_NOTE: &str = "⏹ Interrupted at the terminal before the agent answered: this message was not answered. Send it again to ask anew.";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::tests::{host, session};
    use crate::model::{Origin, SessionState};

    fn message(text: &str, id: Option<&str>) -> EnqueueRequest {
        EnqueueRequest {
            attachments: Vec::new(),
            origin: Origin::Web,
            text: text.into(),
            client_message_id: id.map(str::to_owned),
            ingress: Ingress::SessionQueue,
            lark: None,
        }
    }

    fn code<T: std::fmt::Debug>(result: Result<T>) -> ErrorCode {
        result.expect_err("a refusal").code
    }

    fn enqueued(session: &SessionRow) -> Decided<Enqueue> {
        enqueue(
            Some(session.clone()),
            None,
            message("hi", Some("m1")),
            &Minter::default(),
            7,
        )
        .unwrap()
    }

    #[test]
    fn an_enqueue_numbers_the_turn_and_its_event_from_the_session() {
        let open = session(SessionState::Open);
        let done = enqueued(&open);
        assert_eq!(done.answer.turn.seq, open.next_seq);
        let after = done.writes.session.as_ref().unwrap();
        assert_eq!(after.next_seq, open.next_seq + 1);
        assert_eq!(after.queued_count, open.queued_count + 1);
        let event = done.writes.event.as_ref().unwrap();
        assert_eq!(
            (event.event_no, event.state),
            (open.next_event_no, "queued")
        );
        assert_eq!(after.next_event_no, open.next_event_no + 1);
    }

    #[test]
    fn an_enqueue_replays_then_refuses_closed_then_steering_then_a_full_queue() {
        let open = session(SessionState::Open);
        let closed = session(SessionState::Closed);
        let turn = enqueued(&open).answer.turn;
        let minter = Minter::default();
        let again = enqueue(
            Some(open.clone()),
            Some(turn.clone()),
            message("hi", Some("m1")),
            &minter,
            8,
        );
        let again = again.unwrap();
        assert!(again.answer.duplicate && again.writes.session.is_none());
        let other = enqueue(
            Some(open.clone()),
            Some(turn.clone()),
            message("ho", Some("m1")),
            &minter,
            8,
        );
        assert_eq!(code(other), ErrorCode::IdempotencyKeyReused);
        let late = enqueue(
            Some(closed.clone()),
            Some(turn),
            message("ho", Some("m1")),
            &minter,
            8,
        );
        assert_eq!(code(late), ErrorCode::SessionClosed);
        let steering = EnqueueRequest {
            attachments: Vec::new(),
            ingress: Ingress::LiveSteering,
            ..message("hi", None)
        };
        let refused = enqueue(Some(closed), None, steering.clone(), &minter, 8);
        assert_eq!(code(refused), ErrorCode::SessionClosed);
        let refused = enqueue(Some(open.clone()), None, steering, &minter, 8);
        assert_eq!(code(refused), ErrorCode::LiveSteeringUnavailable);
        let full = SessionRow {
            queued_count: MAX_QUEUED,
            ..open
        };
        let refused = enqueue(Some(full), None, message("hi", None), &minter, 8);
        assert_eq!(code(refused), ErrorCode::QueueFull);
        let unknown = enqueue(None, None, message("hi", None), &minter, 8);
        assert_eq!(code(unknown), ErrorCode::NotFound);
    }

    fn claim_rows(session: SessionRow, head: Option<TurnRow>) -> ClaimRows {
        ClaimRows {
            session: Some(session),
            head,
            ..ClaimRows::default()
        }
    }

    fn claimed(session: &SessionRow) -> (TurnRow, ClaimRow, SessionRow) {
        let head = enqueued(session).answer.turn;
        let done = claim(claim_rows(session.clone(), Some(head)), &host("h"), "c1", 9).unwrap();
        let (Some(Change::Update(turn)), Some(Change::Insert(claim))) =
            (done.writes.turn, done.writes.claim)
        else {
            panic!("a claim updates the turn and inserts the claim")
        };
        (turn, claim, done.writes.session.unwrap())
    }

    #[test]
    fn a_claim_checks_host_then_its_id_then_closed_then_the_active_claim() {
        let open = session(SessionState::Open);
        let closed = session(SessionState::Closed);
        let (turn, held, busy) = claimed(&open);
        assert_eq!(turn.state, TurnState::Claimed);
        assert_eq!(
            (held.attempt, busy.queued_count),
            (1, open.queued_count - 1)
        );
        let wrong = claim(claim_rows(open.clone(), None), &host("x"), "c1", 9);
        assert_eq!(code(wrong), ErrorCode::HostMismatch);
        let elsewhere = ClaimRow {
            session_id: "ses_other".into(),
            ..held.clone()
        };
        let rows = ClaimRows {
            earlier: Some(elsewhere),
            ..claim_rows(closed.clone(), None)
        };
        assert_eq!(
            code(claim(rows, &host("h"), "c1", 9)),
            ErrorCode::ClaimIdReused
        );
        let spent = ClaimRow {
            state: ClaimState::Released,
            ..held.clone()
        };
        let rows = ClaimRows {
            earlier: Some(spent),
            ..claim_rows(closed.clone(), None)
        };
        assert_eq!(
            code(claim(rows, &host("h"), "c1", 9)),
            ErrorCode::ClaimReleased
        );
        let rows = ClaimRows {
            earlier: Some(held.clone()),
            earlier_turn: Some(turn.clone()),
            ..claim_rows(closed.clone(), None)
        };
        let replay = claim(rows, &host("h"), "c1", 9).unwrap();
        assert!(matches!(
            replay.answer,
            ClaimOutcome::Claimed {
                replayed: true,
                attempt: 1,
                ..
            }
        ));
        assert!(replay.writes.turn.is_none());
        let late = claim(claim_rows(closed, Some(turn.clone())), &host("h"), "c2", 9);
        assert_eq!(code(late), ErrorCode::SessionClosed);
        let rows = ClaimRows {
            active: Some(held),
            ..claim_rows(busy, Some(turn))
        };
        let refused = claim(rows, &host("h"), "c2", 9).expect_err("a refusal");
        assert_eq!(refused.code, ErrorCode::ClaimActive);
        let empty = claim(claim_rows(open.clone(), None), &host("h"), "c2", 9).unwrap();
        assert!(matches!(empty.answer, ClaimOutcome::Empty));
        assert!(empty.writes.session.is_none());
        // A head whose files are on their way holds the queue.
        let head = enqueued(&open).answer.turn;
        let rows = ClaimRows {
            head_fetching: true,
            ..claim_rows(open, Some(head))
        };
        let held_back = claim(rows, &host("h"), "c3", 9).unwrap();
        assert!(matches!(held_back.answer, ClaimOutcome::Empty));
        assert!(held_back.writes.turn.is_none());
    }

    fn completion(claim_id: &str, completion_id: &str, message: &str) -> CompleteRequest {
        let response = serde_json::json!({ "message": message });
        CompleteRequest {
            host_surface: "claude-code".into(),
            host_session_id: "h".into(),
            claim_id: claim_id.into(),
            completion_id: completion_id.into(),
            response: response.as_object().unwrap().clone(),
        }
    }

    #[test]
    fn a_completion_is_fenced_by_its_claim_and_replays_its_receipt() {
        let (turn, _, busy) = claimed(&session(SessionState::Open));
        let rows = |turn: &TurnRow, used| CompleteRows {
            session: Some(busy.clone()),
            turn: Some(turn.clone()),
            completion_id_used: used,
        };
        let other = complete(rows(&turn, false), completion("c9", "d1", "ok"), 10);
        assert_eq!(code(other), ErrorCode::ClaimMismatch);
        let reused = complete(rows(&turn, true), completion("c1", "d1", "ok"), 10);
        assert_eq!(code(reused), ErrorCode::IdempotencyKeyReused);
        let done = complete(rows(&turn, false), completion("c1", "d1", "ok"), 10).unwrap();
        assert!(!done.answer.replayed && done.writes.reply.is_none());
        assert_eq!(done.writes.session.as_ref().unwrap().active_claim_id, None);
        let Some(Change::Update(completed)) = done.writes.turn else {
            panic!("a completion updates the turn")
        };
        let again = complete(rows(&completed, true), completion("c1", "d1", "ok"), 11).unwrap();
        assert!(again.answer.replayed && again.writes.turn.is_none());
        let changed = complete(rows(&completed, true), completion("c1", "d1", "no"), 11);
        assert_eq!(code(changed), ErrorCode::IdempotencyKeyReused);
        let second = complete(rows(&completed, false), completion("c1", "d2", "ok"), 11);
        assert_eq!(code(second), ErrorCode::AlreadyCompleted);
        let queued = TurnRow {
            state: TurnState::Queued,
            ..turn
        };
        let early = complete(rows(&queued, false), completion("c1", "d1", "ok"), 10);
        assert_eq!(code(early), ErrorCode::NotClaimed);
    }

    #[test]
    fn an_answer_needs_text_that_is_not_blank() {
        use serde_json::json;
        assert_eq!(answer_text(Some(&json!(" ok "))).unwrap(), " ok ");
        for blank in [json!(""), json!("  \n\t "), json!(5), json!(null)] {
            assert_eq!(code(answer_text(Some(&blank))), ErrorCode::InvalidRequest);
        }
        assert_eq!(code(answer_text(None)), ErrorCode::InvalidRequest);
    }

    #[test]
    fn a_holder_is_gone_after_an_away_since_its_claim_or_silence_after_naming_it() {
        use crate::model::AgentState;
        let (turn, held, busy) = claimed(&session(SessionState::Open));
        let at = held.claimed_at;
        // Never named, never away: time alone never makes it gone.
        assert!(!holder_gone(&busy, at, 100, at + 1_000_000));
        let heard = SessionRow {
            holder_heard_at: Some(at + 50),
            ..busy.clone()
        };
        assert!(!holder_gone(&heard, at, 100, at + 149));
        assert!(holder_gone(&heard, at, 100, at + 150));
        let away_before = SessionRow {
            agent_state: AgentState::Away,
            agent_since: Some(at - 1),
            ..busy.clone()
        };
        assert!(!holder_gone(&away_before, at, 100, at + 1_000_000));
        let left = SessionRow {
            agent_since: Some(at + 5),
            ..away_before
        };
        assert!(holder_gone(&left, at, 100, at + 6));
        let free = SessionRow {
            active_claim_id: None,
            ..left.clone()
        };
        assert!(!holder_gone(&free, at, 100, at + 6));
        // The broker's release checks again on the locked rows.
        let rows = |session: &SessionRow| ReleaseRows {
            session: Some(session.clone()),
            claim: Some(held.clone()),
            turn: Some(turn.clone()),
        };
        let broker = Releaser::Broker { silence_ms: 100 };
        let kept = release(rows(&heard), &broker, at + 100);
        assert_eq!(code(kept), ErrorCode::ClaimActive);
        let done = release(rows(&left), &broker, at + 6).unwrap();
        assert_eq!(done.answer.turn_id, turn.turn_id);
        assert!(done.writes.turn.is_some());
    }

    #[test]
    fn a_release_requeues_once_and_never_a_completed_turn() {
        let (turn, held, busy) = claimed(&session(SessionState::Open));
        let rows = |claim: &ClaimRow| ReleaseRows {
            session: Some(busy.clone()),
            claim: Some(claim.clone()),
            turn: Some(turn.clone()),
        };
        let done = release(rows(&held), &Releaser::Host(host("h")), 12).unwrap();
        let after = done.writes.session.unwrap();
        assert_eq!(
            (after.active_claim_id, after.queued_count),
            (None, busy.queued_count + 1)
        );
        let Some(Change::Update(requeued)) = done.writes.turn else {
            panic!("a release updates the turn")
        };
        assert_eq!(requeued.state, TurnState::Queued);
        let Some(Change::Update(spent)) = done.writes.claim else {
            panic!("a release updates the claim")
        };
        let again = release(rows(&spent), &Releaser::Host(host("h")), 13).unwrap();
        assert!(again.writes.turn.is_none());
        // The owner releases without a host identity; another host cannot.
        let by_owner = release(rows(&held), &Releaser::Owner, 12).unwrap();
        assert_eq!(by_owner.answer.turn_id, turn.turn_id);
        assert!(by_owner.writes.turn.is_some());
        assert_eq!(
            code(release(rows(&held), &Releaser::Host(host("x")), 12)),
            ErrorCode::HostMismatch
        );
        let completed = ClaimRow {
            state: ClaimState::Completed,
            ..held
        };
        assert_eq!(
            code(release(rows(&completed), &Releaser::Host(host("h")), 13)),
            ErrorCode::AlreadyCompleted
        );
        let none = ReleaseRows {
            claim: None,
            ..rows(&spent)
        };
        assert_eq!(
            code(release(none, &Releaser::Owner, 13)),
            ErrorCode::NotFound
        );
    }
}
