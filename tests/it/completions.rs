//! Completions: fenced by the claim, idempotent by completion id.

use loopx::model::TurnState;
use reqwest::Method;
use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn a_completion_is_committed_and_read_back() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let turn = enqueue(c, &host, "question").await;
    claim(c, &host, "c1", 0).await;
    let mut completion = host.completion("c1", "k1", "answer");
    completion
        .response
        .insert("extra".into(), json!({"kept": [1, 2, 3]}));
    let receipt = c
        .complete(host.session_id(), &turn.turn_id, &completion)
        .await
        .unwrap();
    assert_eq!(receipt.reply.status, 200);
    assert!(!receipt.reply.replayed);
    let r = &receipt.body;
    assert!(r.completed && !r.replayed);
    assert_eq!(
        (r.claim_id.as_str(), r.completion_id.as_str()),
        ("c1", "k1")
    );
    assert_eq!(r.turn_id, turn.turn_id);
    assert!(r.completed_at.ends_with('Z') && r.completed_at.len() == 24);

    let read = c.turn(host.session_id(), &turn.turn_id).await.unwrap().body;
    assert_eq!(read.state, TurnState::Completed);
    assert_eq!(
        read.response,
        Some(json!({"message": "answer", "extra": {"kept": [1, 2, 3]}}))
    );
    assert_eq!(read.completed_at.as_deref(), Some(r.completed_at.as_str()));
    assert!(read.claimed_at.is_some());
    assert_eq!(read.text, "question");
}

#[tokio::test]
async fn a_repeated_completion_replays_and_a_changed_one_is_refused() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let turn = enqueue(c, &host, "q").await;
    claim(c, &host, "c1", 0).await;
    let completion = host.completion("c1", "k1", "answer");
    let first = c
        .complete(host.session_id(), &turn.turn_id, &completion)
        .await
        .unwrap();
    let replay = c
        .complete(host.session_id(), &turn.turn_id, &completion)
        .await
        .unwrap();
    assert!(replay.reply.replayed && replay.body.replayed);
    assert_eq!(replay.body.completed_at, first.body.completed_at);
    assert_eq!(replay.body.completion_id, "k1");

    let changed = host.completion("c1", "k1", "another answer");
    assert_eq!(
        code(c.complete(host.session_id(), &turn.turn_id, &changed).await),
        (422, "idempotency_key_reused".into())
    );
    let other_id = host.completion("c1", "k2", "answer");
    assert_eq!(
        code(
            c.complete(host.session_id(), &turn.turn_id, &other_id)
                .await
        ),
        (409, "already_completed".into())
    );
    // The completion id is spent on this session: on another turn it is a reuse.
    let next = enqueue(c, &host, "q2").await;
    claim(c, &host, "c2", 0).await;
    assert_eq!(
        code(
            c.complete(
                host.session_id(),
                &next.turn_id,
                &host.completion("c2", "k1", "answer")
            )
            .await
        ),
        (422, "idempotency_key_reused".into())
    );
    let stored = c.turn(host.session_id(), &turn.turn_id).await.unwrap().body;
    assert_eq!(
        stored.response.unwrap()["message"],
        "answer",
        "nothing overwritten"
    );
}

#[tokio::test]
async fn completions_are_fenced_by_the_claim() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let turn = enqueue(c, &host, "q").await;
    assert_eq!(
        code(
            c.complete(
                host.session_id(),
                &turn.turn_id,
                &host.completion("c1", "k1", "a")
            )
            .await
        ),
        (409, "not_claimed".into())
    );
    claim(c, &host, "c1", 0).await;
    assert_eq!(
        code(
            c.complete(
                host.session_id(),
                &turn.turn_id,
                &host.completion("intruder", "k1", "a")
            )
            .await
        ),
        (409, "claim_mismatch".into())
    );
    assert_eq!(
        code(
            c.complete(
                host.session_id(),
                "turn_nope",
                &host.completion("c1", "k1", "a")
            )
            .await
        ),
        (404, "not_found".into())
    );
    assert_eq!(
        code(
            c.complete("ses_nope", &turn.turn_id, &host.completion("c1", "k1", "a"))
                .await
        ),
        (404, "not_found".into())
    );
}

#[tokio::test]
async fn the_response_needs_a_message_that_is_not_blank_and_fits_in_1_mib() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let turn = enqueue(c, &host, "q").await;
    claim(c, &host, "c1", 0).await;
    let path = format!(
        "/v1/sessions/{}/turns/{}/complete",
        host.session_id(),
        turn.turn_id
    );
    let body = |response: serde_json::Value| {
        json!({"host_surface": HOST_SURFACE, "host_session_id": host.host_session_id,
               "claim_id": "c1", "completion_id": "k1", "response": response})
    };
    for bad in [
        json!({}),
        json!({"message": ""}),
        json!({"message": "  \n\t "}),
        json!({"message": 5}),
        json!("just a string"),
        json!({"message": "x".repeat(1024 * 1024)}),
    ] {
        let reply = c
            .send(Method::POST, &path, Some(&body(bad)), None)
            .await
            .unwrap();
        assert_eq!(reply.status, 400, "{}", reply.text);
        assert_eq!(reply.json()["error"]["code"], "invalid_request");
    }
    let near_limit = json!({"message": "x".repeat(1024 * 1024 - 100)});
    let reply = c
        .send(Method::POST, &path, Some(&body(near_limit)), None)
        .await
        .unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text);
}
