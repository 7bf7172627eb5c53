//! The owner can always close (issue 28): releasing a host's claim with
//! `{"by": "owner"}` and no host identity, and closing in one step with
//! `{"release_active_claim": true}`; the host's late completion stays fenced.

use loopx::model::{CloseRequest, ReleaseRequest, SessionState, TurnState};
use reqwest::Method;
use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn the_owner_releases_a_hosts_claim_and_its_late_completion_is_fenced() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let turn = enqueue(c, &host, "stuck").await;
    claim(c, &host, "c1", 0).await;

    let by_owner = ReleaseRequest::owner();
    let released = c.release(host.session_id(), "c1", &by_owner).await.unwrap();
    assert_eq!(released.body.turn_id, turn.turn_id);
    // Idempotent.
    let again = c.release(host.session_id(), "c1", &by_owner).await.unwrap();
    assert_eq!(again.body.turn_id, turn.turn_id);
    let back = c.turn(host.session_id(), &turn.turn_id).await.unwrap().body;
    assert_eq!(back.state, TurnState::Queued);

    // The host's late answer is fenced; the turn comes back as attempt 2.
    let late_answer = || async {
        let late = host.completion("c1", "k1", "late");
        code(c.complete(host.session_id(), &turn.turn_id, &late).await)
    };
    assert_eq!(late_answer().await, (409, "not_claimed".into()));
    let retried = claim(c, &host, "c2", 0).await;
    assert_eq!(
        (retried.turn.turn_id.as_str(), retried.turn.attempt),
        (turn.turn_id.as_str(), 2)
    );
    assert_eq!(late_answer().await, (409, "claim_mismatch".into()));

    // A completed claim cannot be released; an unknown one is 404.
    c.complete(
        host.session_id(),
        &turn.turn_id,
        &host.completion("c2", "k2", "done"),
    )
    .await
    .unwrap();
    let done = c.release(host.session_id(), "c2", &by_owner).await;
    assert_eq!(code(done), (409, "already_completed".into()));
    let unknown = c.release(host.session_id(), "c9", &by_owner).await;
    assert_eq!(code(unknown), (404, "not_found".into()));
}

#[tokio::test]
async fn a_release_names_the_host_or_the_owner_never_both_or_neither() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    enqueue(c, &host, "q").await;
    claim(c, &host, "c1", 0).await;
    let path = format!("/v1/sessions/{}/claims/c1/release", host.session_id());
    for bad in [
        json!({}),
        json!({"by": "owner", "host_surface": HOST_SURFACE, "host_session_id": host.host_session_id}),
        json!({"by": "owner", "host_surface": HOST_SURFACE}),
        json!({"host_surface": HOST_SURFACE}),
        json!({"by": "someone"}),
    ] {
        let reply = c.send(Method::POST, &path, Some(&bad), None).await.unwrap();
        assert_eq!(reply.status, 400, "{bad}: {}", reply.text);
        assert_eq!(reply.json()["error"]["code"], "invalid_request");
    }
    let reply = c
        .send(Method::POST, &path, Some(&json!({"by": "owner"})), None)
        .await
        .unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text);
}

#[tokio::test]
async fn a_close_that_releases_the_active_claim_closes_in_one_step() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let held = enqueue(c, &host, "held by a dead agent").await;
    let queued = enqueue(c, &host, "behind it").await;
    claim(c, &host, "c1", 0).await;

    let refused = c.close(host.session_id()).await;
    assert_eq!(code(refused), (409, "claim_active".into()));
    let releasing = CloseRequest {
        release_active_claim: true,
        ..CloseRequest::default()
    };
    let closed = c
        .close_with(host.session_id(), &releasing)
        .await
        .unwrap()
        .body;
    assert_eq!(closed.state, SessionState::Closed);
    for turn in [&held, &queued] {
        let back = c.turn(host.session_id(), &turn.turn_id).await.unwrap().body;
        assert_eq!(back.state, TurnState::Cancelled, "{}", turn.turn_id);
    }
    let late = c
        .complete(
            host.session_id(),
            &held.turn_id,
            &host.completion("c1", "k1", "too late"),
        )
        .await;
    assert_eq!(code(late), (409, "not_claimed".into()));
    // Closed already: the same answer, whatever the body.
    let again = c
        .close_with(host.session_id(), &releasing)
        .await
        .unwrap()
        .body;
    assert_eq!(again.closed_at, closed.closed_at);
}

#[tokio::test]
async fn a_close_without_an_active_claim_takes_the_flag_as_a_plain_close() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let turn = enqueue(c, &host, "never claimed").await;
    let path = format!("/v1/sessions/{}/close", host.session_id());
    let bad = c
        .send(Method::POST, &path, Some(&json!({"release": true})), None)
        .await
        .unwrap();
    assert_eq!(bad.status, 400);
    let closed = c
        .send(
            Method::POST,
            &path,
            Some(&json!({"release_active_claim": true})),
            None,
        )
        .await
        .unwrap();
    assert_eq!(closed.status, 200, "{}", closed.text);
    let back = c.turn(host.session_id(), &turn.turn_id).await.unwrap().body;
    assert_eq!(back.state, TurnState::Cancelled);
}
