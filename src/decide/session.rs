//! The session's rules: bind (registration first, one open session per exact
//! tuple, same executor answered again) and close (refused while a claim is
//! active; what it cancels and expires).

use super::pairing::{NewNote, Note, SessionName};
use super::{
    ClaimRow, Continuation, Decided, LinkChange, Subject, Sweep, Writes, existing, log,
    no_active_claim,
};
use super::{SessionRow, TurnRow};
use crate::error::{Error, ErrorCode, Result};
use crate::ids::Minter;
use crate::model::{AgentState, BindRequest, CancelReason, CloseRequest, SessionState, TurnState};

/// What a bind did.
#[derive(Debug)]
pub enum Bound {
    Created(SessionRow),
    /// The exact tuple with the same executor endpoint was already bound and open.
    Existing(SessionRow),
}

/// What a close did.
#[derive(Debug)]
pub struct Closed {
    pub session: SessionRow,
    /// Queued turns cancelled.
    pub cancelled: u64,
    /// Pending permission requests expired.
    pub expired: u64,
}

/// What a bind decision reads.
#[derive(Debug, Default)]
pub struct BindRows {
    /// Whether the exact tuple is registered.
    pub registered: bool,
    /// The tuple's open session, if any.
    pub open: Option<SessionRow>,
    /// The open session another host session bound from the bind's
    /// terminal ([`crate::store::TERMINALS_OPEN_SESSION`]), if any.
    pub predecessor: Option<String>,
}

/// The bind checks, in the contract's order: 422 `not_registered`, then the
/// tuple's open session: bound to the same executor endpoint it is answered
/// again, to another 409 `session_exists`. `None`: a bind would create one.
pub fn check_bind(rows: BindRows, bind: &BindRequest) -> Result<Option<SessionRow>> {
    if !rows.registered {
        return Err(Error::new(
            ErrorCode::NotRegistered,
            "This exact goal, agent, host surface and host session is not registered; run bind-agent-thread first.",
        ));
    }
    match rows.open {
        Some(s) if s.executor_endpoint_id != bind.executor_endpoint_id => Err(Error::new(
            ErrorCode::SessionExists,
            "This host session is bound to an open session with another executor endpoint.",
        )),
        open => Ok(open),
    }
}

/// A bind: the open session again, or a new one to insert
/// ([`Bound::Created`]). A new one bound from the terminal of an open
/// session (`predecessor`: what its close reads) continues it
/// ([`continued`]): the writes are that session's, applied once the new
/// one is inserted.
pub fn bind(
    rows: BindRows,
    predecessor: Option<CloseRows>,
    bind: BindRequest,
    minter: &Minter,
    now: i64,
) -> Result<Decided<Bound>> {
    if let Some(existing) = check_bind(rows, &bind)? {
        return Ok(Decided::nothing(Bound::Existing(existing)));
    }
    let mut created = SessionRow {
        session_id: minter.mint("ses"),
        goal_id: bind.goal_id,
        agent_id: bind.agent_id,
        host_surface: bind.host_surface,
        host_session_id: bind.host_session_id,
        executor_endpoint_id: bind.executor_endpoint_id,
        state: SessionState::Open,
        created_at: now,
        closed_at: None,
        queued_count: 0,
        active_claim_id: None,
        next_seq: 1,
        next_event_no: 1,
        agent_state: AgentState::Away,
        agent_since: None,
        agent_heard_at: None,
        holder_heard_at: None,
        waker_heard_at: None,
        agent_tool: None,
        tool_since: None,
        terminal_turn_id: None,
        stalled_at: None,
        terminal: bind.terminal,
        continued_in: None,
        continued_from: None,
    };
    let writes = match predecessor.filter(|p| {
        p.session
            .as_ref()
            .is_some_and(|s| s.state == SessionState::Open)
    }) {
        Some(predecessor) => continued(predecessor, &mut created, now)?,
        None => Writes::default(),
    };
    Ok(Decided {
        answer: Bound::Created(created),
        writes,
    })
}

/// The open session its terminal's next host session continues in `new`
/// (HOOKS.md "The terminal's real life"): closed as any close that releases
/// its active claim first, but its queued turns (the released one among
/// them) move to `new` with their `seq`, in order, one `queued` event each
/// in `new`'s log; its Lark link, approvers and thread follow; its open
/// terminal turn is cancelled `unanswered`, its pending requests expire;
/// each names the other (`continued_in`, `continued_from`), and the linked
/// chat is told once.
fn continued(rows: CloseRows, new: &mut SessionRow, now: i64) -> Result<Writes> {
    let session = existing(rows.session.clone())?;
    let (mut session, before, released) = release_first(session, &rows, true, now)?;
    let moved = rows.queued + released;
    let from = session.session_id.clone();
    new.next_seq = session.next_seq;
    new.queued_count = moved;
    new.next_event_no = 1 + moved;
    new.continued_from = Some(from.clone());
    session.continued_in = Some(new.session_id.clone());
    session.queued_count = 0;
    let (writes, _) = shut(session, 0, rows.pending, CancelReason::Unanswered, now);
    let note = rows.lark_chat.map(|chat_id| NewNote {
        message_id: format!("continued-{from}"),
        text: Note::Continued(SessionName::of(new)).to_string(),
        session_id: Some(new.session_id.clone()),
        chat_id,
        reply: false,
        at: now,
    });
    Ok(Writes {
        before,
        note,
        continuation: Some(Continuation {
            from,
            to: new.session_id.clone(),
            events_from: 1,
            at: now,
        }),
        ..writes
    })
}

/// What a close decision reads.
#[derive(Debug, Default, Clone)]
pub struct CloseRows {
    pub session: Option<SessionRow>,
    /// The session's active claim, if it has one.
    pub active: Option<ClaimRow>,
    /// That claim's turn.
    pub active_turn: Option<TurnRow>,
    /// How many of its turns are queued.
    pub queued: i64,
    /// How many of its permission requests are pending.
    pub pending: i64,
    /// The Lark chat it is linked to, if any: told once that it left the
    /// chat's list.
    pub lark_chat: Option<String>,
}

/// A close, in this order: `if_idle` with `release_active_claim` 400;
/// unknown session 404; closed already answers again; `if_idle` with
/// messages waiting (queued, or an active claim's) 409 `messages_waiting`;
/// an active claim 409 `claim_active`, unless the owner asked to release it
/// (`release_active_claim`): then its turn goes back to the queue (its
/// attempt counted, a late completion fenced) and is cancelled with the
/// others, in one step.
pub fn close(rows: CloseRows, how: &CloseRequest, now: i64) -> Result<Decided<Closed>> {
    if how.if_idle && how.release_active_claim {
        return Err(Error::invalid(
            "Give `if_idle` or `release_active_claim`, not both: one keeps what waits, the other lets it go.",
        ));
    }
    let session = existing(rows.session.clone())?;
    if session.state == SessionState::Closed {
        return Ok(Decided::nothing(Closed {
            session,
            cancelled: 0,
            expired: 0,
        }));
    }
    let waiting = rows.queued + i64::from(session.active_claim_id.is_some());
    if how.if_idle && waiting > 0 {
        return Err(Error::new(
            ErrorCode::MessagesWaiting,
            format!("{waiting} message(s) wait for the agent: the session stays open."),
        ));
    }
    let (session, before, released) = release_first(session, &rows, how.release_active_claim, now)?;
    let (writes, closed) = shut(
        session,
        rows.queued + released,
        rows.pending,
        CancelReason::SessionClosed,
        now,
    );
    let note = rows
        .lark_chat
        .map(|chat_id| closed_note(&closed.session, chat_id, now));
    Ok(Decided {
        writes: Writes {
            before,
            note,
            link: Some(LinkChange {
                session_id: closed.session.session_id.clone(),
                link: None,
            }),
            ..writes
        },
        answer: closed,
    })
}

/// A closing session's active claim, released first when `release` (its
/// turn back to the queue: the writes of that step, and 1), else 409
/// `claim_active` if it has one.
fn release_first(
    mut session: SessionRow,
    rows: &CloseRows,
    release: bool,
    now: i64,
) -> Result<(SessionRow, Option<Box<Writes>>, i64)> {
    match (release, &session.active_claim_id) {
        (true, Some(_)) => {
            let (Some(claim), Some(turn)) = (rows.active.clone(), rows.active_turn.clone()) else {
                return Err(Error::store(
                    "closing",
                    "the session's active claim or its turn is missing",
                ));
            };
            let mut release = super::turn::requeue(session, claim, turn, now).writes;
            session = release
                .session
                .take()
                .ok_or_else(|| Error::store("closing", "a release wrote no session"))?;
            Ok((session, Some(Box::new(release)), 1))
        }
        _ => {
            no_active_claim(&session, rows.active.as_ref())?;
            Ok((session, None, 0))
        }
    }
}

/// A session closed: its `queued` turns and its open terminal turn
/// cancelled (`reason`), its `pending` requests expired, each with its
/// event, then `closed` logged.
fn shut(
    mut session: SessionRow,
    queued: i64,
    pending: i64,
    reason: CancelReason,
    now: i64,
) -> (Writes, Closed) {
    let terminal = session.terminal_turn_id.take();
    let cancelled = queued + i64::from(terminal.is_some());
    let sweep = Sweep {
        session_id: session.session_id.clone(),
        cancelled: TurnState::Cancelled,
        cancel_reason: reason,
        cancelled_from: session.next_event_no,
        terminal,
        expired: super::permission::EXPIRED_ON_CLOSE,
        expired_from: session.next_event_no + cancelled,
        at: now,
    };
    session.next_event_no = sweep.expired_from + pending;
    session.state = SessionState::Closed;
    session.closed_at = Some(now);
    session.queued_count = 0;
    let event = log(&mut session, Subject::Session, "closed", now);
    let closed = Closed {
        session: session.clone(),
        cancelled: cancelled as u64,
        expired: pending as u64,
    };
    let writes = Writes {
        sweep: Some(sweep),
        session: Some(session),
        event: Some(event),
        ..Writes::default()
    };
    (writes, closed)
}

/// What the chat a closed session was linked to is told, once (the note's
/// key is the session's): it left the chat's list.
fn closed_note(session: &SessionRow, chat_id: String, now: i64) -> NewNote {
    let note = Note::Closed(SessionName::of(session));
    NewNote {
        message_id: format!("closed-{}", session.session_id),
        chat_id,
        text: note.to_string(),
        session_id: Some(session.session_id.clone()),
        reply: false,
        at: now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::tests::session;
    use crate::decide::{Change, ClaimState};
    use crate::model::PermissionState;

    const KEEP: CloseRequest = CloseRequest {
        release_active_claim: false,
        if_idle: false,
    };
    const RELEASE: CloseRequest = CloseRequest {
        release_active_claim: true,
        if_idle: false,
    };
    const IF_IDLE: CloseRequest = CloseRequest {
        release_active_claim: false,
        if_idle: true,
    };

    #[test]
    fn a_close_if_idle_keeps_a_session_with_messages_waiting() {
        let with = |queued, active: Option<&str>| CloseRows {
            session: Some(SessionRow {
                active_claim_id: active.map(str::to_owned),
                ..session(SessionState::Open)
            }),
            queued,
            ..CloseRows::default()
        };
        let waiting = close(with(2, None), &IF_IDLE, 5).expect_err("a refusal");
        assert_eq!(waiting.code, ErrorCode::MessagesWaiting);
        let delivered = close(with(0, Some("c1")), &IF_IDLE, 5).expect_err("a refusal");
        assert_eq!(delivered.code, ErrorCode::MessagesWaiting);
        let idle = close(with(0, None), &IF_IDLE, 5).expect("closed");
        assert_eq!(idle.answer.session.state, SessionState::Closed);
        let both = CloseRequest {
            release_active_claim: true,
            if_idle: true,
        };
        let refused = close(with(0, None), &both, 5).expect_err("a refusal");
        assert_eq!(refused.code, ErrorCode::InvalidRequest);
    }

    fn request(executor: &str) -> BindRequest {
        BindRequest {
            goal_id: "g".into(),
            agent_id: "a".into(),
            host_surface: "claude-code".into(),
            host_session_id: "h".into(),
            executor_endpoint_id: executor.into(),
            terminal: None,
            dry_run: false,
        }
    }

    #[test]
    fn a_bind_needs_a_registration_then_answers_the_open_session_of_its_executor() {
        let minter = Minter::default();
        let unregistered = BindRows::default();
        let refused = bind(unregistered, None, request("e"), &minter, 1).expect_err("a refusal");
        assert_eq!(refused.code, ErrorCode::NotRegistered);
        let fresh = BindRows {
            registered: true,
            ..BindRows::default()
        };
        let Ok(Decided {
            answer: Bound::Created(created),
            ..
        }) = bind(fresh, None, request("e"), &minter, 1)
        else {
            panic!("a registered tuple without an open session gets one")
        };
        assert_eq!(
            (created.next_seq, created.next_event_no, created.created_at),
            (1, 1, 1)
        );
        let open = || BindRows {
            registered: true,
            open: Some(session(SessionState::Open)),
            predecessor: None,
        };
        assert!(matches!(
            bind(open(), None, request("e"), &minter, 2),
            Ok(Decided {
                answer: Bound::Existing(_),
                ..
            })
        ));
        let other = check_bind(open(), &request("e2")).expect_err("a refusal");
        assert_eq!(other.code, ErrorCode::SessionExists);
    }

    #[test]
    fn a_close_waits_for_the_active_claim_and_a_second_close_replays() {
        let closed = CloseRows {
            session: Some(session(SessionState::Closed)),
            ..CloseRows::default()
        };
        let replayed = close(closed, &KEEP, 5).expect("a replay");
        assert!(replayed.writes.session.is_none() && replayed.writes.sweep.is_none());
        let unknown = close(CloseRows::default(), &RELEASE, 5).expect_err("a refusal");
        assert_eq!(unknown.code, ErrorCode::NotFound);
        let held = ClaimRow {
            claim_id: "c1".into(),
            session_id: "ses_1".into(),
            turn_id: "turn_1".into(),
            attempt: 1,
            state: ClaimState::Active,
            claimed_at: 4,
            released_at: None,
        };
        let busy = CloseRows {
            session: Some(SessionRow {
                active_claim_id: Some("c1".into()),
                ..session(SessionState::Open)
            }),
            active: Some(held),
            ..CloseRows::default()
        };
        let turn = crate::decide::turn::enqueue(
            Some(session(SessionState::Open)),
            None,
            crate::model::EnqueueRequest {
                attachments: Vec::new(),
                origin: crate::model::Origin::Web,
                text: "hi".into(),
                client_message_id: None,
                ingress: crate::model::Ingress::SessionQueue,
                lark: None,
            },
            &Minter::default(),
            3,
        )
        .unwrap()
        .answer
        .turn;
        let busy = CloseRows {
            active_turn: Some(TurnRow {
                state: TurnState::Claimed,
                ..turn
            }),
            ..busy
        };
        let refused = close(busy.clone(), &KEEP, 5);
        assert_eq!(refused.expect_err("a refusal").code, ErrorCode::ClaimActive);
        // The owner's close with release_active_claim: released, then cancelled with the rest.
        let Ok(closing) = close(busy, &RELEASE, 5) else {
            panic!("a close that releases the active claim closes")
        };
        let closing = closing.writes;
        let released = closing.before.expect("the release's writes");
        assert!(
            matches!(released.turn, Some(Change::Update(ref t)) if t.state == TurnState::Queued)
        );
        assert!(
            matches!(released.claim, Some(Change::Update(ref c)) if c.state == ClaimState::Released)
        );
        let before = session(SessionState::Open);
        assert_eq!(released.event.unwrap().event_no, before.next_event_no);
        assert_eq!(
            closing.sweep.unwrap().cancelled_from,
            before.next_event_no + 1
        );
        assert_eq!(closing.session.unwrap().active_claim_id, None);
    }

    #[test]
    fn a_close_cancels_expires_and_unlinks_in_its_writes_then_logs_closed() {
        let open = CloseRows {
            session: Some(session(SessionState::Open)),
            queued: 3,
            pending: 2,
            ..CloseRows::default()
        };
        let Ok(closing) = close(open, &KEEP, 5) else {
            panic!("an open session without a claim closes")
        };
        assert_eq!((closing.answer.cancelled, closing.answer.expired), (3, 2));
        let closing = closing.writes;
        let before = session(SessionState::Open);
        let sweep = closing.sweep.expect("a sweep");
        assert_eq!(sweep.cancel_reason, CancelReason::SessionClosed);
        assert_eq!(sweep.expired, PermissionState::Expired);
        // Cancelled turns, then expired requests, then the close itself.
        assert_eq!(sweep.cancelled_from, before.next_event_no);
        assert_eq!(sweep.expired_from, before.next_event_no + 3);
        let event = closing.event.expect("the closed event");
        assert_eq!(event.event_no, before.next_event_no + 5);
        assert_eq!(event.state, "closed");
        // Its Lark link goes.
        assert!(matches!(closing.link, Some(LinkChange { link: None, .. })));
        let after = closing.session.as_ref().expect("the session");
        assert_eq!(after.next_event_no, before.next_event_no + 6);
        assert_eq!(
            (after.state, after.closed_at, after.queued_count),
            (SessionState::Closed, Some(5), 0)
        );
    }
}
