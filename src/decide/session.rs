//! The session's rules: bind (registration first, one open session per exact
//! tuple, same executor answered again) and close (refused while a claim is
//! active; what it cancels and expires).

use super::{ClaimRow, existing, no_active_claim};
use crate::error::{Error, ErrorCode, Result};
use crate::ids::Minter;
use crate::model::{BindRequest, CancelReason, PermissionState, SessionState};
use crate::store::{Bound, Closed, SessionRow};

/// What a bind decision reads.
#[derive(Debug, Default)]
pub struct BindRows {
    /// Whether the exact tuple is registered.
    pub registered: bool,
    /// The tuple's open session, if any.
    pub open: Option<SessionRow>,
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
/// ([`Bound::Created`]).
pub fn bind(rows: BindRows, bind: BindRequest, minter: &Minter, now: i64) -> Result<Bound> {
    if let Some(existing) = check_bind(rows, &bind)? {
        return Ok(Bound::Existing(existing));
    }
    Ok(Bound::Created(SessionRow {
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
    }))
}

/// What a close decision reads.
#[derive(Debug, Default)]
pub struct CloseRows {
    pub session: Option<SessionRow>,
    /// The session's active claim, if it has one.
    pub active: Option<ClaimRow>,
}

/// What a close does.
#[derive(Debug)]
pub enum Close {
    /// Closed already: answered again, nothing written.
    Replayed(Closed),
    Close(Closing),
}

/// Close the session at `at`: every queued turn is cancelled with
/// `cancel_reason` (one `cancelled` event each, in seq order), every pending
/// permission request becomes `expired` (one `permission` event each, in
/// creation order), then the session's `closed` event; its Lark link goes.
#[derive(Debug, PartialEq, Eq)]
pub struct Closing {
    pub session_id: String,
    pub at: i64,
    pub cancel_reason: CancelReason,
    pub expired: PermissionState,
}

/// A close, in this order: unknown session 404; closed already answers
/// again; an active claim 409 `claim_active`.
pub fn close(rows: CloseRows, now: i64) -> Result<Close> {
    let session = existing(rows.session)?;
    if session.state == SessionState::Closed {
        return Ok(Close::Replayed(Closed {
            session,
            cancelled: 0,
            expired: 0,
        }));
    }
    no_active_claim(&session, rows.active.as_ref())?;
    Ok(Close::Close(Closing {
        session_id: session.session_id,
        at: now,
        cancel_reason: CancelReason::SessionClosed,
        expired: crate::permission::EXPIRED_ON_CLOSE,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::ClaimState;
    use crate::decide::tests::session;

    fn request(executor: &str) -> BindRequest {
        BindRequest {
            goal_id: "g".into(),
            agent_id: "a".into(),
            host_surface: "claude-code".into(),
            host_session_id: "h".into(),
            executor_endpoint_id: executor.into(),
            dry_run: false,
        }
    }

    #[test]
    fn a_bind_needs_a_registration_then_answers_the_open_session_of_its_executor() {
        let minter = Minter::default();
        let unregistered = BindRows::default();
        let refused = bind(unregistered, request("e"), &minter, 1).expect_err("a refusal");
        assert_eq!(refused.code, ErrorCode::NotRegistered);
        let fresh = BindRows {
            registered: true,
            open: None,
        };
        let Ok(Bound::Created(created)) = bind(fresh, request("e"), &minter, 1) else {
            panic!("a registered tuple without an open session gets one")
        };
        assert_eq!(
            (created.next_seq, created.next_event_no, created.created_at),
            (1, 1, 1)
        );
        let open = || BindRows {
            registered: true,
            open: Some(session(SessionState::Open)),
        };
        assert!(matches!(
            bind(open(), request("e"), &minter, 2),
            Ok(Bound::Existing(_))
        ));
        let other = check_bind(open(), &request("e2")).expect_err("a refusal");
        assert_eq!(other.code, ErrorCode::SessionExists);
    }

    #[test]
    fn a_close_waits_for_the_active_claim_and_a_second_close_replays() {
        let closed = CloseRows {
            session: Some(session(SessionState::Closed)),
            active: None,
        };
        assert!(matches!(close(closed, 5), Ok(Close::Replayed(_))));
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
        };
        assert_eq!(
            close(busy, 5).expect_err("a refusal").code,
            ErrorCode::ClaimActive
        );
        let open = CloseRows {
            session: Some(session(SessionState::Open)),
            active: None,
        };
        let Ok(Close::Close(closing)) = close(open, 5) else {
            panic!("an open session without a claim closes")
        };
        let expected = Closing {
            session_id: "ses_1".into(),
            at: 5,
            cancel_reason: CancelReason::SessionClosed,
            expired: PermissionState::Expired,
        };
        assert_eq!(closing, expected);
        let unknown = close(CloseRows::default(), 5).expect_err("a refusal");
        assert_eq!(unknown.code, ErrorCode::NotFound);
    }
}
