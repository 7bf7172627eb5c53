//! The host's side of HOOKS.md on the HTTP contract: withdrawing an
//! unanswered permission request, and presence (`agent` in the projection and
//! the list, `event: agent` on the stream), every refusal. Runs on SQLite and
//! again on PostgreSQL.

use loopx::model::{
    AgentState, Behavior, ListSessions, PermissionState, ReportAgentState, WithdrawPermission,
};

use crate::events::{states, subscribe, take};
use crate::permissions::created;
use crate::support::*;

pub fn withdrawal(host: &Host) -> WithdrawPermission {
    WithdrawPermission {
        host_surface: HOST_SURFACE.into(),
        host_session_id: host.host_session_id.clone(),
        answered_at_terminal: false,
    }
}

pub fn report(host: &Host, state: AgentState) -> ReportAgentState {
    ReportAgentState::of(HOST_SURFACE, &host.host_session_id, Some(state))
}

#[tokio::test]
async fn the_host_withdraws_a_pending_request_once_and_never_an_answered_one() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let sid = host.session_id();
    created(c, &host, "abcde").await;
    let mut events = subscribe(&broker.url, TOKEN, sid, None).await;

    let first = c
        .withdraw_permission(sid, "abcde", &withdrawal(&host))
        .await
        .unwrap();
    assert_eq!(
        (first.reply.status.as_u16(), first.reply.replayed),
        (200, false)
    );
    assert_eq!(first.body.state, PermissionState::Expired);
    assert!(first.body.answered_at.is_some() && first.body.answered_via.is_none());
    let again = c
        .withdraw_permission(sid, "abcde", &withdrawal(&host))
        .await
        .unwrap();
    assert_eq!(
        (again.reply.status.as_u16(), again.reply.replayed),
        (200, true)
    );
    assert_eq!(again.body, first.body);
    assert_eq!(states(&take(&mut events, 1).await), ["permission:expired"]);
    let late = c.answer_permission(sid, "abcde", Behavior::Allow).await;
    assert_eq!(code(late), (409, "permission_already_answered".into()));

    created(c, &host, "fghij").await;
    c.answer_permission(sid, "fghij", Behavior::Deny)
        .await
        .unwrap();
    let answered = c
        .withdraw_permission(sid, "fghij", &withdrawal(&host))
        .await;
    match answered {
        Err(loopx::client::ClientError::Refused { reply, error }) => {
            assert_eq!(reply.status, 409);
            assert_eq!(error.error.code_str(), "permission_already_answered");
            assert_eq!(reply.json()["error"]["state"], "denied");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let stranger = Host {
        host_session_id: "someone-else".into(),
        ..host.clone()
    };
    let wrong = c
        .withdraw_permission(sid, "fghij", &withdrawal(&stranger))
        .await;
    assert_eq!(code(wrong), (403, "host_mismatch".into()));
    let unknown = c.withdraw_permission(sid, "nope", &withdrawal(&host)).await;
    assert_eq!(code(unknown), (404, "not_found".into()));
    let no_session = c
        .withdraw_permission("ses_unknown", "abcde", &withdrawal(&host))
        .await;
    assert_eq!(code(no_session), (404, "not_found".into()));
}

#[tokio::test]
async fn presence_changes_in_order_on_the_projection_the_list_and_the_stream() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let sid = host.session_id();
    assert_eq!(host.session.agent.state, AgentState::Away);
    assert_eq!(host.session.agent.since, host.session.created_at);
    let mut events = subscribe(&broker.url, TOKEN, sid, None).await;

    for state in [
        AgentState::Waiting,
        AgentState::Working,
        AgentState::Waiting,
    ] {
        let session = c
            .report_agent(sid, &report(&host, state))
            .await
            .unwrap()
            .body;
        assert_eq!(session.agent.state, state);
        // A repeat changes nothing and announces nothing.
        let again = c
            .report_agent(sid, &report(&host, state))
            .await
            .unwrap()
            .body;
        assert_eq!(again.agent, session.agent);
    }
    let ended = c
        .report_agent(sid, &report(&host, AgentState::Away))
        .await
        .unwrap()
        .body;
    let seen = take(&mut events, 4).await;
    assert_eq!(
        states(&seen),
        [
            "agent:waiting",
            "agent:working",
            "agent:waiting",
            "agent:away"
        ]
    );
    assert_eq!(seen[3].2["since"], ended.agent.since.as_str());
    assert_eq!(c.session(sid).await.unwrap().body.agent, ended.agent);
    let filter = ListSessions {
        goal_id: Some(host.goal_id.clone()),
        ..Default::default()
    };
    let listed = c.sessions(&filter).await.unwrap().body.sessions;
    assert_eq!(listed[0].agent, ended.agent);
    let shown = serde_json::to_value(&listed[0]).unwrap();
    assert_eq!(shown["agent"]["state"], "away");

    let stranger = Host {
        host_session_id: "someone-else".into(),
        ..host.clone()
    };
    let wrong = c
        .report_agent(sid, &report(&stranger, AgentState::Working))
        .await;
    assert_eq!(code(wrong), (403, "host_mismatch".into()));
    let unknown = c
        .report_agent("ses_unknown", &report(&host, AgentState::Working))
        .await;
    assert_eq!(code(unknown), (404, "not_found".into()));
    c.close(sid).await.unwrap();
    let closed = c
        .report_agent(sid, &report(&host, AgentState::Working))
        .await;
    assert_eq!(code(closed), (409, "session_closed".into()));
}

#[tokio::test]
async fn a_parked_claim_keeps_a_reported_agent_heard_from_without_an_event() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let sid = host.session_id();
    c.report_agent(sid, &report(&host, AgentState::Waiting))
        .await
        .unwrap();
    let mut events = subscribe(&broker.url, TOKEN, sid, None).await;
    let parked = c.claim(sid, &host.claim_request("c1", 1)).await.unwrap();
    assert!(matches!(
        parked.body,
        loopx::model::ClaimAnswer::NotClaimed(_)
    ));
    enqueue(c, &host, "hello").await;
    assert_eq!(states(&take(&mut events, 1).await), ["turn:queued"]);
    let session = c.session(sid).await.unwrap().body;
    assert_eq!(session.agent.state, AgentState::Waiting);
}

/// A waker's `typing_in` reports: the projection's `delivery` follows them
/// and the agent's state, which they never change; a report that says
/// neither a state nor `typing_in` is refused and changes nothing.
#[tokio::test]
async fn a_wakers_reports_set_how_a_message_arrives() {
    use loopx::model::Delivery;
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let sid = host.session_id();
    let waker = |typing_in| ReportAgentState {
        state: None,
        typing_in: Some(typing_in),
        ..report(&host, AgentState::Waiting)
    };
    let delivery = |s: loopx::model::Session| (s.agent.state, s.agent.delivery);
    let reported = |r: &ReportAgentState| {
        let r = r.clone();
        async move { c.report_agent(sid, &r).await }
    };
    let waiting = reported(&report(&host, AgentState::Waiting))
        .await
        .unwrap()
        .body;
    assert_eq!(delivery(waiting), (AgentState::Waiting, Delivery::Later));
    let typed = reported(&waker(true)).await.unwrap().body;
    assert_eq!(delivery(typed), (AgentState::Waiting, Delivery::TypedNow));
    let working = reported(&report(&host, AgentState::Working))
        .await
        .unwrap()
        .body;
    assert_eq!(
        delivery(working),
        (AgentState::Working, Delivery::EndOfTurn)
    );
    let neither = ReportAgentState {
        typing_in: None,
        ..waker(true)
    };
    assert_eq!(
        code(reported(&neither).await),
        (400, "invalid_request".into())
    );
    let stopped = reported(&waker(false)).await.unwrap().body;
    assert_eq!(
        delivery(stopped),
        (AgentState::Working, Delivery::EndOfTurn)
    );
    let idle = reported(&report(&host, AgentState::Waiting))
        .await
        .unwrap()
        .body;
    assert_eq!(delivery(idle), (AgentState::Waiting, Delivery::Later));
}

/// Every notification kind a host may send is stored and streamed, on both
/// backends: each one's state is one the event log takes (a kind the log
/// refused would fail its write after the answer, or as a 5xx).
#[tokio::test]
async fn every_notification_kind_is_logged_and_streamed() {
    use loopx::model::{AgentNotification, NotificationKind};
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let sid = host.session_id();
    let mut events = subscribe(&broker.url, TOKEN, sid, None).await;
    let kinds = [
        NotificationKind::IdlePrompt,
        NotificationKind::PermissionPrompt,
        NotificationKind::TypingUnconfirmed,
    ];
    for kind in kinds {
        let notice = AgentNotification {
            host_surface: HOST_SURFACE.into(),
            host_session_id: host.host_session_id.clone(),
            kind,
        };
        c.notify(sid, &notice).await.unwrap();
    }
    let seen = take(&mut events, 3).await;
    assert_eq!(
        states(&seen),
        [
            "notification:idle_prompt",
            "notification:permission_prompt",
            "notification:typing_unconfirmed"
        ]
    );
    // Read back from the log itself, after a restart of the stream.
    let mut replay = subscribe(&broker.url, TOKEN, sid, Some(0)).await;
    let all = take(&mut replay, 3).await;
    assert_eq!(states(&all), states(&seen));
}
