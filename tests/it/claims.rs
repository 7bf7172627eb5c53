//! Claims: ordering, durable duplicate safety, parking, SSE, release.

use std::time::{Duration, Instant};

use loopx::model::{ClaimAnswer, EnqueueRequest, Ingress, TurnState};
use loopx::store::sqlite::Durability;
use reqwest::Method;
use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn claims_take_the_oldest_turn_one_at_a_time() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let first = enqueue(c, &host, "first").await;
    let second = enqueue(c, &host, "second").await;
    let claimed = claim(c, &host, "c1", 0).await;
    assert_eq!(claimed.turn.turn_id, first.turn_id);
    assert_eq!((claimed.turn.seq, claimed.turn.attempt), (1, 1));
    assert_eq!(claimed.turn.text, "first");
    assert_eq!(claimed.turn_state, TurnState::Claimed);

    let busy = c
        .claim(host.session_id(), &host.claim_request("c2", 0))
        .await;
    let Err(loopx::client::ClientError::Refused { reply, error }) = busy else {
        panic!("a second claim must be refused while one is active");
    };
    assert_eq!(reply.status, 409);
    assert_eq!(error.error.code_str(), "claim_active");
    assert_eq!(error.error.active_claim_id.as_deref(), Some("c1"));

    c.complete(
        host.session_id(),
        &first.turn_id,
        &host.completion("c1", "k1", "ok"),
    )
    .await
    .unwrap();
    let next = claim(c, &host, "c2", 0).await;
    assert_eq!(next.turn.turn_id, second.turn_id);
}

#[tokio::test]
async fn a_claim_id_is_durable_and_answers_the_same_turn() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let turn = enqueue(c, &host, "hello").await;
    let first = c
        .claim(host.session_id(), &host.claim_request("c1", 0))
        .await
        .unwrap();
    assert!(!first.reply.replayed);
    let again = c
        .claim(host.session_id(), &host.claim_request("c1", 0))
        .await
        .unwrap();
    assert!(again.reply.replayed);
    assert_eq!(first.reply.json(), again.reply.json());

    c.complete(
        host.session_id(),
        &turn.turn_id,
        &host.completion("c1", "k1", "ok"),
    )
    .await
    .unwrap();
    enqueue(c, &host, "next").await;
    // Still the same turn, now completed, and never a second turn.
    let after = c
        .claim(host.session_id(), &host.claim_request("c1", 0))
        .await
        .unwrap();
    assert!(after.reply.replayed);
    let ClaimAnswer::Claimed(after) = after.body else {
        panic!()
    };
    assert_eq!(after.turn.turn_id, turn.turn_id);
    assert_eq!(after.turn_state, TurnState::Completed);

    // A claim id is global: using it on another session is refused.
    let other = bound_host(c).await;
    enqueue(c, &other, "x").await;
    assert_eq!(
        code(
            c.claim(other.session_id(), &other.claim_request("c1", 0))
                .await
        ),
        (409, "claim_id_reused".into())
    );
}

#[tokio::test]
async fn eight_concurrent_claims_with_one_claim_id_agree() {
    let broker = TestBroker::start().await;
    let host = bound_host(&broker.client).await;
    for i in 0..3 {
        enqueue(&broker.client, &host, &format!("m{i}")).await;
    }
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (client, host) = (broker.client.clone(), host.clone());
        tasks.spawn(async move { claim(&client, &host, "same-claim", 0).await });
    }
    let answers = tasks.join_all().await;
    let turn_ids: std::collections::HashSet<_> =
        answers.iter().map(|a| a.turn.turn_id.clone()).collect();
    assert_eq!(turn_ids.len(), 1, "all eight agree on one turn");
    assert!(
        answers
            .iter()
            .all(|a| a.turn.seq == 1 && a.turn.attempt == 1)
    );
    let list = broker
        .client
        .turns(host.session_id(), &Default::default())
        .await
        .unwrap()
        .body;
    let claimed = list
        .turns
        .iter()
        .filter(|t| t.state == TurnState::Claimed)
        .count();
    assert_eq!(claimed, 1, "exactly one turn was claimed");
}

#[tokio::test]
async fn concurrent_parked_claims_with_distinct_ids_get_one_turn_and_the_rest_claim_active() {
    let broker = TestBroker::start().await;
    let host = bound_host(&broker.client).await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..4 {
        let (client, host) = (broker.client.clone(), host.clone());
        tasks.spawn(async move {
            client
                .claim(host.session_id(), &host.claim_request(&format!("w{i}"), 10))
                .await
        });
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    enqueue(&broker.client, &host, "only one").await;
    let results = tasks.join_all().await;
    let won = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(won, 1);
    for r in results.into_iter().filter(|r| r.is_err()) {
        assert_eq!(code(r), (409, "claim_active".into()));
    }
}

#[tokio::test]
async fn a_parked_claim_wakes_with_the_turn_enqueued_later() {
    let broker = TestBroker::start().await;
    let host = bound_host(&broker.client).await;
    let (client, waiting_host) = (broker.client.clone(), host.clone());
    let parked = tokio::spawn(async move { claim(&client, &waiting_host, "c1", 30).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !parked.is_finished(),
        "the claim parks while the queue is empty"
    );
    let started = Instant::now();
    let turn = enqueue(&broker.client, &host, "wake up").await;
    let claimed = parked.await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(2), "woken promptly");
    assert_eq!(claimed.turn.turn_id, turn.turn_id);
    assert_eq!(claimed.turn.text, "wake up");
}

#[tokio::test]
async fn a_parked_claim_whose_client_hung_up_takes_nothing() {
    let broker = TestBroker::start().await;
    let host = bound_host(&broker.client).await;
    let (client, waiting_host) = (broker.client.clone(), host.clone());
    let gone = tokio::spawn(async move { claim(&client, &waiting_host, "gone", 30).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    gone.abort();
    // The broker notices the closed connection and drops the parked claim.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let turn = enqueue(&broker.client, &host, "for whoever is still here").await;
    let claimed = claim(&broker.client, &host, "present", 0).await;
    assert_eq!(claimed.turn.turn_id, turn.turn_id);
    assert_eq!(claimed.turn.attempt, 1, "nobody claimed it before");
}

#[tokio::test]
async fn a_replayed_or_refused_enqueue_leaves_a_parked_claim_parked() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let first = EnqueueRequest {
        attachments: Vec::new(),
        client_message_id: Some("m1".into()),
        ..web("first")
    };
    c.enqueue(host.session_id(), &first).await.unwrap();
    let done = claim(c, &host, "c1", 0).await;
    c.complete(
        host.session_id(),
        &done.turn.turn_id,
        &host.completion("c1", "k1", "ok"),
    )
    .await
    .unwrap();

    let (client, waiting_host) = (c.clone(), host.clone());
    let parked = tokio::spawn(async move { claim(&client, &waiting_host, "c2", 30).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let replay = c.enqueue(host.session_id(), &first).await.unwrap();
    assert!(replay.body.duplicate);
    let steering = EnqueueRequest {
        attachments: Vec::new(),
        ingress: Ingress::LiveSteering,
        ..web("steer")
    };
    assert_eq!(
        code(c.enqueue(host.session_id(), &steering).await),
        (409, "live_steering_unavailable".into())
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!parked.is_finished(), "nothing claimable arrived yet");
    let second = enqueue(c, &host, "second").await;
    let claimed = parked.await.unwrap();
    assert_eq!(claimed.turn.turn_id, second.turn_id);
    assert_eq!(claimed.turn.text, "second");
}

/// Two claims parked on one session, one turn: one gets it, the other 409
/// `claim_active`. On SQLite the enqueue hands the turn to the claim parked
/// first; on PostgreSQL (no hand-off: waiters may sit on other replicas) both
/// wake and the first to claim wins.
#[tokio::test]
async fn parked_claims_get_one_turn_each_the_oldest_first_on_sqlite() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let mut waiters = Vec::new();
    for claim_id in ["older", "newer"] {
        let (client, waiting_host) = (c.clone(), host.clone());
        waiters.push(tokio::spawn(async move {
            client
                .claim(
                    waiting_host.session_id(),
                    &waiting_host.claim_request(claim_id, 30),
                )
                .await
        }));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let turn = enqueue(c, &host, "one turn").await;
    let mut answers = Vec::new();
    for waiter in waiters {
        answers.push(waiter.await.unwrap());
    }
    let winners: Vec<usize> = (0..2).filter(|&i| answers[i].is_ok()).collect();
    assert_eq!(winners.len(), 1, "exactly one parked claim gets the turn");
    let winner = winners[0];
    if broker.database.is_none() {
        assert_eq!(winner, 0, "SQLite hands the turn to the claim parked first");
    }
    let loser = answers.remove(1 - winner);
    let won = answers.remove(0);
    match won.unwrap().body {
        ClaimAnswer::Claimed(claimed) => assert_eq!(claimed.turn.turn_id, turn.turn_id),
        other => panic!("expected the turn, got {other:?}"),
    }
    assert_eq!(code(loser), (409, "claim_active".into()));
}

#[tokio::test]
async fn a_parked_claim_times_out_with_claimed_false_and_stores_nothing() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let started = Instant::now();
    let answer = c
        .claim(host.session_id(), &host.claim_request("c1", 1))
        .await
        .unwrap();
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(950) && waited < Duration::from_secs(5));
    let body = answer.reply.json();
    assert_eq!(body["claimed"], false);
    assert_eq!(body["session_id"], host.session_id());
    assert!(body["waited_ms"].as_u64().unwrap() >= 950);
    // The claim id is still unused.
    let turn = enqueue(c, &host, "now").await;
    let claimed = claim(c, &host, "c1", 0).await;
    assert_eq!(claimed.turn.turn_id, turn.turn_id);
    // wait_seconds 0 on an empty queue answers at once.
    let other = bound_host(c).await;
    let quick = c
        .claim(other.session_id(), &other.claim_request("q", 0))
        .await
        .unwrap();
    assert_eq!(quick.reply.json()["claimed"], false);
}

#[tokio::test]
async fn waits_above_the_cap_are_accepted_and_negative_waits_refused() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let (client, waiting_host) = (c.clone(), host.clone());
    let parked =
        tokio::spawn(async move { claim(&client, &waiting_host, "long", 1_000_000).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    enqueue(c, &host, "x").await;
    assert_eq!(parked.await.unwrap().claim_id, "long");
    let mut body = serde_json::to_value(host.claim_request("neg", 0)).unwrap();
    body["wait_seconds"] = json!(-1);
    let reply = c
        .send(
            Method::POST,
            &format!("/v1/sessions/{}/claims", host.session_id()),
            Some(&body),
            None,
        )
        .await
        .unwrap();
    assert_eq!(reply.status, 400);
}

#[tokio::test]
async fn closing_a_session_wakes_its_parked_claims_with_session_closed() {
    let broker = TestBroker::start().await;
    let host = bound_host(&broker.client).await;
    let (client, waiting_host) = (broker.client.clone(), host.clone());
    let parked = tokio::spawn(async move {
        client
            .claim(
                waiting_host.session_id(),
                &waiting_host.claim_request("c1", 30),
            )
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    broker.client.close(host.session_id()).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(2), parked)
        .await
        .expect("close wakes the parked claim")
        .unwrap();
    assert_eq!(code(answer), (409, "session_closed".into()));
}

#[tokio::test]
async fn shutdown_answers_parked_claims_claimed_false() {
    let mut broker = TestBroker::start().await;
    let host = bound_host(&broker.client).await;
    let (client, waiting_host) = (broker.client.clone(), host.clone());
    let parked = tokio::spawn(async move {
        client
            .claim(
                waiting_host.session_id(),
                &waiting_host.claim_request("c1", 600),
            )
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    broker.stop().await;
    let answer = parked.await.unwrap().unwrap();
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(answer.reply.json()["claimed"], false);
}

#[tokio::test]
async fn host_identity_is_exact_on_claim_complete_and_release() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let turn = enqueue(c, &host, "x").await;
    let mut wrong = host.clone();
    wrong.host_session_id = format!("{} ", host.host_session_id);
    assert_eq!(
        code(
            c.claim(host.session_id(), &wrong.claim_request("c1", 0))
                .await
        ),
        (403, "host_mismatch".into())
    );
    let mut other_surface = host.claim_request("c1", 0);
    other_surface.host_surface = "claude-code".into();
    assert_eq!(
        code(c.claim(host.session_id(), &other_surface).await),
        (403, "host_mismatch".into())
    );
    claim(c, &host, "c1", 0).await;
    assert_eq!(
        code(
            c.complete(
                host.session_id(),
                &turn.turn_id,
                &wrong.completion("c1", "k", "m")
            )
            .await
        ),
        (403, "host_mismatch".into())
    );
    let release = loopx::model::ReleaseRequest::host(HOST_SURFACE, "someone-else");
    assert_eq!(
        code(c.release(host.session_id(), "c1", &release).await),
        (403, "host_mismatch".into())
    );
    // 404 wins over 403.
    assert_eq!(
        code(c.claim("ses_nope", &wrong.claim_request("c1", 0)).await),
        (404, "not_found".into())
    );
}

fn release_body(host: &Host) -> loopx::model::ReleaseRequest {
    loopx::model::ReleaseRequest::host(HOST_SURFACE, host.host_session_id.clone())
}

#[tokio::test]
async fn release_requeues_at_the_head_and_fences_the_released_claim() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let first = enqueue(c, &host, "first").await;
    enqueue(c, &host, "second").await;
    claim(c, &host, "c1", 0).await;
    let released = c
        .release(host.session_id(), "c1", &release_body(&host))
        .await
        .unwrap()
        .body;
    assert!(released.released);
    assert_eq!(released.turn_id, first.turn_id);
    // Idempotent.
    let again = c
        .release(host.session_id(), "c1", &release_body(&host))
        .await
        .unwrap()
        .body;
    assert_eq!(again.turn_id, first.turn_id);
    let queued = c
        .turn(host.session_id(), &first.turn_id)
        .await
        .unwrap()
        .body;
    assert_eq!(queued.state, TurnState::Queued);

    // A late completion from the released claim, while the turn is queued.
    assert_eq!(
        code(
            c.complete(
                host.session_id(),
                &first.turn_id,
                &host.completion("c1", "late", "stale")
            )
            .await
        ),
        (409, "not_claimed".into())
    );
    // The released claim id is spent.
    assert_eq!(
        code(
            c.claim(host.session_id(), &host.claim_request("c1", 0))
                .await
        ),
        (409, "claim_released".into())
    );
    let second_try = claim(c, &host, "c2", 0).await;
    assert_eq!(
        second_try.turn.turn_id, first.turn_id,
        "same turn, same seq, head of the queue"
    );
    assert_eq!((second_try.turn.seq, second_try.turn.attempt), (1, 2));
    // The late completion now meets another claim.
    assert_eq!(
        code(
            c.complete(
                host.session_id(),
                &first.turn_id,
                &host.completion("c1", "late", "stale")
            )
            .await
        ),
        (409, "claim_mismatch".into())
    );
    c.complete(
        host.session_id(),
        &first.turn_id,
        &host.completion("c2", "k2", "fresh"),
    )
    .await
    .unwrap();
    let done = c
        .turn(host.session_id(), &first.turn_id)
        .await
        .unwrap()
        .body;
    assert_eq!(done.response.unwrap()["message"], "fresh");
    assert_eq!(
        code(
            c.release(host.session_id(), "c2", &release_body(&host))
                .await
        ),
        (409, "already_completed".into())
    );
    assert_eq!(
        code(
            c.release(host.session_id(), "nope", &release_body(&host))
                .await
        ),
        (404, "not_found".into())
    );
}

#[tokio::test]
async fn a_release_wakes_a_parked_claim() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let turn = enqueue(c, &host, "x").await;
    claim(c, &host, "c1", 0).await;
    c.release(host.session_id(), "c1", &release_body(&host))
        .await
        .unwrap();
    let (client, waiting_host) = (c.clone(), host.clone());
    let next = tokio::spawn(async move { claim(&client, &waiting_host, "c2", 5).await });
    let claimed = tokio::time::timeout(Duration::from_secs(2), next)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.turn.turn_id, turn.turn_id);
}

/// Reads a whole SSE answer as raw text.
async fn sse(broker: &TestBroker, host: &Host, claim_id: &str, wait: u64) -> (u16, String, String) {
    let response = reqwest::Client::new()
        .post(format!(
            "{}/v1/sessions/{}/claims",
            broker.url,
            host.session_id()
        ))
        .bearer_auth(TOKEN)
        .header("accept", "text/event-stream")
        .json(&host.claim_request(claim_id, wait))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    (status, content_type, response.text().await.unwrap())
}

fn event_data(stream: &str, event: &str) -> serde_json::Value {
    let mut lines = stream
        .lines()
        .skip_while(|l| *l != format!("event: {event}"));
    lines
        .next()
        .unwrap_or_else(|| panic!("no `event: {event}` in {stream:?}"));
    let data = lines.next().unwrap().strip_prefix("data: ").unwrap();
    serde_json::from_str(data).unwrap()
}

#[tokio::test]
async fn sse_claims_keep_alive_then_send_one_claim_event() {
    let broker = TestBroker::start_with(Durability::Relaxed, Duration::from_millis(200)).await;
    let host = bound_host(&broker.client).await;
    let (client, enqueuing_host) = (broker.client.clone(), host.clone());
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        enqueue(&client, &enqueuing_host, "streamed").await;
    });
    let (status, content_type, stream) = sse(&broker, &host, "s1", 10).await;
    assert_eq!(status, 200);
    assert!(content_type.starts_with("text/event-stream"));
    assert!(
        stream.lines().any(|l| l.starts_with(':')),
        "keep-alive comments while parked: {stream:?}"
    );
    assert_eq!(stream.matches("event: claim").count(), 1);
    let data = event_data(&stream, "claim");
    assert_eq!(data["claimed"], true);
    assert_eq!(data["turn"]["text"], "streamed");

    // Reconnecting with the same claim id gets the same turn at once.
    let (_, _, replay) = sse(&broker, &host, "s1", 10).await;
    assert_eq!(event_data(&replay, "claim")["turn"], data["turn"]);
}

#[tokio::test]
async fn sse_claims_time_out_error_before_the_stream_and_report_a_close_in_stream() {
    let broker = TestBroker::start_with(Durability::Relaxed, Duration::from_millis(200)).await;
    let host = bound_host(&broker.client).await;
    let (_, _, timeout) = sse(&broker, &host, "s1", 1).await;
    assert_eq!(event_data(&timeout, "claim")["claimed"], false);

    // Errors found before the stream starts are plain JSON errors.
    let mut impostor = host.clone();
    impostor.host_session_id = "not-the-host".into();
    let (status, content_type, body) = sse(&broker, &impostor, "s1", 1).await;
    assert_eq!((status, content_type.as_str()), (403, "application/json"));
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["error"]["code"],
        "host_mismatch"
    );

    let (client, closing_host) = (broker.client.clone(), host.clone());
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        client.close(closing_host.session_id()).await.unwrap();
    });
    let (status, _, stream) = sse(&broker, &host, "s2", 10).await;
    assert_eq!(status, 200);
    assert_eq!(
        event_data(&stream, "error")["error"]["code"],
        "session_closed"
    );
}

/// The hand-off's two decisions in one commit (`Store::together`), on the
/// store itself and on either backend: the claim takes the turn its enqueue
/// brought; a claim refused after an enqueue (another claim is active)
/// keeps the enqueue, and a refused enqueue (a closed session) writes nothing.
#[tokio::test]
async fn two_decisions_in_one_commit_keep_the_first_when_the_second_is_refused() {
    use loopx::model::HostIdentity;
    use loopx::store::{Command, Done};

    let dir = tempfile::tempdir().unwrap();
    let database = TestDatabase::create().await;
    let url = database.as_ref().map(|database| database.url.as_str());
    let store = loopx::serve::open_store(dir.path(), url, Durability::Relaxed)
        .await
        .unwrap();
    let (goal, agent, host_session) = (unique("goal"), unique("agent"), unique("host"));
    store
        .register(thread(&goal, &agent, &host_session))
        .await
        .unwrap();
    let session = match store
        .bind(bind_request(&goal, &agent, &host_session))
        .await
        .unwrap()
    {
        loopx::decide::session::Bound::Created(session) => session,
        loopx::decide::session::Bound::Existing(session) => session,
    };
    let id = session.session_id.clone();
    let enqueue = |text: &str| Command::Enqueue {
        session_id: id.clone(),
        message: web(text),
        blobs: Vec::new(),
    };
    let claim = |claim_id: &str| Command::Claim {
        session_id: id.clone(),
        host: HostIdentity {
            host_surface: HOST_SURFACE.into(),
            host_session_id: host_session.clone(),
        },
        claim_id: claim_id.into(),
    };

    let (first, claimed) = store.together(enqueue("one"), claim("c1")).await.unwrap();
    let first = first.enqueued().unwrap();
    match claimed.and_then(Done::claimed).unwrap() {
        loopx::decide::turn::ClaimOutcome::Claimed { turn, replayed, .. } => {
            assert_eq!(turn.turn_id, first.turn.turn_id);
            assert!(!replayed);
        }
        other => panic!("the claim found nothing: {other:?}"),
    }

    let (second, refused) = store.together(enqueue("two"), claim("c2")).await.unwrap();
    let second = second.enqueued().unwrap();
    let refused = refused.err().expect("a second claim while c1 is active");
    assert_eq!(refused.code, loopx::error::ErrorCode::ClaimActive);
    let kept = store.turn(&id, &second.turn.turn_id).await.unwrap();
    assert_eq!(kept.state, TurnState::Queued);

    store
        .close(
            id.clone(),
            loopx::model::CloseRequest {
                release_active_claim: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let closed = store.together(enqueue("three"), claim("c3")).await;
    assert!(closed.is_err(), "an enqueue on a closed session is refused");
    let turns = store.session(&id).await.unwrap().unwrap();
    assert_eq!(
        turns.next_seq,
        session.next_seq + 2,
        "nothing more was written"
    );
}
