//! A claim whose holder is gone is released by the broker (issue 28), and
//! time alone never releases a turn an agent may still be working on: a
//! holder that names its claim in `working` reports and then falls silent
//! for the broker's holder silence loses its turn to the next claimer; one
//! that keeps reporting keeps it; one that never names its claim is never
//! released by time; a host that reports `away` (a hook's `session-end`)
//! leaves no turn held. The released holder's late completion is fenced.

use std::time::{Duration, Instant};

use loopx::model::{AgentState, ReportAgentState, TurnState};
use reqwest::Method;
use serde_json::json;

use crate::support::*;

const SILENCE: Duration = Duration::from_millis(1200);

fn working_on(host: &Host, claim_id: &str) -> ReportAgentState {
    ReportAgentState {
        claim_id: Some(claim_id.into()),
        ..crate::presence::report(host, AgentState::Working)
    }
}

async fn state_of(c: &loopx::client::Client, host: &Host, turn_id: &str) -> TurnState {
    c.turn(host.session_id(), turn_id).await.unwrap().body.state
}

/// Polls until the turn is back in the queue; how long that took.
async fn requeued_within(
    c: &loopx::client::Client,
    host: &Host,
    turn_id: &str,
    limit: Duration,
) -> Duration {
    let started = Instant::now();
    while state_of(c, host, turn_id).await != TurnState::Queued {
        assert!(
            started.elapsed() < limit,
            "the turn was not released within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

#[tokio::test]
async fn a_silent_holder_loses_its_turn_to_the_next_claimer_and_its_late_answer_is_fenced() {
    let broker = TestBroker::start_holder_silence(SILENCE).await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let turn = enqueue(c, &host, "the holder dies").await;
    claim(c, &host, "c1", 0).await;
    c.report_agent(host.session_id(), &working_on(&host, "c1"))
        .await
        .unwrap();

    let took = requeued_within(c, &host, &turn.turn_id, SILENCE * 4).await;
    assert!(
        took >= SILENCE / 2,
        "released after {took:?}, before the silence"
    );

    // Delivered to the next claimer, its attempt counted.
    let next = claim(c, &host, "c2", 0).await;
    assert_eq!(
        (next.turn.turn_id.as_str(), next.turn.attempt),
        (turn.turn_id.as_str(), 2)
    );
    // The gone holder's late answer changes nothing.
    let late = host.completion("c1", "k1", "late");
    assert_eq!(
        code(c.complete(host.session_id(), &turn.turn_id, &late).await),
        (409, "claim_mismatch".into())
    );
    let answer = host.completion("c2", "k2", "on time");
    c.complete(host.session_id(), &turn.turn_id, &answer)
        .await
        .unwrap();
    let done = c.turn(host.session_id(), &turn.turn_id).await.unwrap().body;
    assert_eq!(done.response.unwrap()["message"], "on time");
}

#[tokio::test]
async fn a_holder_that_keeps_saying_it_works_keeps_its_turn_past_the_silence() {
    let broker = TestBroker::start_holder_silence(SILENCE).await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let turn = enqueue(c, &host, "a long turn").await;
    claim(c, &host, "c1", 0).await;
    let started = Instant::now();
    while started.elapsed() < SILENCE * 3 {
        c.report_agent(host.session_id(), &working_on(&host, "c1"))
            .await
            .unwrap();
        tokio::time::sleep(SILENCE / 4).await;
        assert_eq!(state_of(c, &host, &turn.turn_id).await, TurnState::Claimed);
    }
    let answer = host.completion("c1", "k1", "done after all");
    c.complete(host.session_id(), &turn.turn_id, &answer)
        .await
        .unwrap();
}

#[tokio::test]
async fn time_alone_never_releases_a_holder_that_never_named_its_claim() {
    let broker = TestBroker::start_holder_silence(SILENCE).await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let turn = enqueue(c, &host, "an hour of work").await;
    claim(c, &host, "c1", 0).await;
    // Presence alone (a hook's `stop` says working) names no claim.
    c.report_agent(
        host.session_id(),
        &crate::presence::report(&host, AgentState::Working),
    )
    .await
    .unwrap();
    // Naming some other claim is only a report.
    c.report_agent(host.session_id(), &working_on(&host, "c-other"))
        .await
        .unwrap();
    tokio::time::sleep(SILENCE * 3).await;
    assert_eq!(state_of(c, &host, &turn.turn_id).await, TurnState::Claimed);
}

#[tokio::test]
async fn a_host_that_reports_away_after_its_claim_leaves_no_turn_held() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    // Away before the claim changes nothing for a later claim.
    c.report_agent(
        host.session_id(),
        &crate::presence::report(&host, AgentState::Away),
    )
    .await
    .unwrap();
    let turn = enqueue(c, &host, "then the session ends").await;
    claim(c, &host, "hook-1", 0).await;
    c.report_agent(
        host.session_id(),
        &crate::presence::report(&host, AgentState::Working),
    )
    .await
    .unwrap();
    assert_eq!(state_of(c, &host, &turn.turn_id).await, TurnState::Claimed);

    // The hook's session-end: the agent's session is over.
    let away = c
        .report_agent(
            host.session_id(),
            &crate::presence::report(&host, AgentState::Away),
        )
        .await
        .unwrap();
    assert_eq!(away.body.agent.state, AgentState::Away);
    assert_eq!(state_of(c, &host, &turn.turn_id).await, TurnState::Queued);
    let late = host.completion("hook-1", "k1", "late");
    assert_eq!(
        code(c.complete(host.session_id(), &turn.turn_id, &late).await),
        (409, "not_claimed".into())
    );
    let next = claim(c, &host, "hook-2", 0).await;
    assert_eq!(
        (next.turn.turn_id.as_str(), next.turn.attempt),
        (turn.turn_id.as_str(), 2)
    );
}

#[tokio::test]
async fn a_claim_id_goes_with_working_only_and_is_an_identifier() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let path = format!("/v1/sessions/{}/agent-state", host.session_id());
    let body = |state: &str, claim_id: &str| {
        json!({"host_surface": HOST_SURFACE, "host_session_id": host.host_session_id,
               "state": state, "claim_id": claim_id})
    };
    for bad in [
        body("waiting", "c1"),
        body("away", "c1"),
        body("working", ""),
    ] {
        let reply = c.send(Method::POST, &path, Some(&bad), None).await.unwrap();
        assert_eq!(reply.status, 400, "{bad}: {}", reply.text);
        assert_eq!(reply.json()["error"]["code"], "invalid_request");
    }
    let reply = c
        .send(Method::POST, &path, Some(&body("working", "c1")), None)
        .await
        .unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text);
}

#[tokio::test]
async fn a_waiting_agent_silent_for_ten_minutes_is_announced_away_once() {
    use loopx::decide::presence::AWAY_AFTER_MS;
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let waiting = crate::presence::report(&host, AgentState::Waiting);
    c.report_agent(host.session_id(), &waiting).await.unwrap();
    let agent_events = || async {
        let events = broker
            .broker
            .store()
            .events(host.session_id(), 0, 100)
            .await
            .unwrap();
        events
            .into_iter()
            .filter(|e| e.kind == "agent")
            .map(|e| e.state)
            .collect::<Vec<_>>()
    };
    let now = loopx::time::now_ms();
    let announce = |at| broker.broker.announce_silent_agents(at);
    assert_eq!(announce(now + AWAY_AFTER_MS - 5_000).await.unwrap(), 0);
    assert_eq!(announce(now + AWAY_AFTER_MS + 1_000).await.unwrap(), 1);
    // Once.
    assert_eq!(announce(now + AWAY_AFTER_MS + 2_000).await.unwrap(), 0);
    assert_eq!(agent_events().await, ["waiting", "away"]);
}
