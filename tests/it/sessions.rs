//! Registration, bind, list, enqueue and close.

use loopx::model::{
    ClaimAnswer, EnqueueRequest, Ingress, LarkRef, ListSessions, ListTurns, Origin, SessionState,
    TurnState,
};
use reqwest::Method;
use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn register_answers_201_then_200_without_the_host_session_id() {
    let broker = TestBroker::start().await;
    let t = thread(&unique("g"), &unique("a"), "host-private-1");
    let first = broker.client.register(&t).await.unwrap();
    assert_eq!(first.reply.status, 201);
    assert!(!first.reply.replayed, "a first registration is no replay");
    assert!(!first.reply.text.contains("host-private-1"));
    assert_eq!(first.body.goal_id, t.goal_id);
    let again = broker.client.register(&t).await.unwrap();
    assert_eq!(again.reply.status, 200);
    assert!(
        again.reply.replayed,
        "the 200 carries Idempotent-Replayed: true"
    );
    assert!(again.body.registered);
}

#[tokio::test]
async fn bind_needs_the_exact_registration_and_distinct_identities() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let (g, a, h) = (unique("g"), unique("a"), unique("h"));
    // Nothing is inferred or auto-registered.
    assert_eq!(
        code(c.bind(&bind_request(&g, &a, &h)).await),
        (403, "not_registered".into())
    );
    c.register(&thread(&g, &a, &h)).await.unwrap();
    // Another host session of the same goal and agent is not registered.
    assert_eq!(
        code(c.bind(&bind_request(&g, &a, "other")).await),
        (403, "not_registered".into())
    );
    let mut conflated = bind_request(&g, &a, &h);
    conflated.executor_endpoint_id = a.clone();
    assert_eq!(
        code(c.bind(&conflated).await),
        (400, "identity_conflated".into())
    );

    let created = c.bind(&bind_request(&g, &a, &h)).await.unwrap();
    assert_eq!(created.reply.status, 201);
    let session = created.body;
    assert!(session.session_id.starts_with("ses_"));
    assert_eq!(session.state, SessionState::Open);
    assert!(!session.capabilities.live_steering && session.capabilities.session_queue);

    let same = c.bind(&bind_request(&g, &a, &h)).await.unwrap();
    assert_eq!(same.reply.status, 200);
    assert!(same.reply.replayed);
    assert_eq!(same.body, session);

    let mut other_exec = bind_request(&g, &a, &h);
    other_exec.executor_endpoint_id = "exec-other".into();
    assert_eq!(
        code(c.bind(&other_exec).await),
        (409, "session_exists".into())
    );

    // After close, a new bind makes a new session.
    c.close(&session.session_id).await.unwrap();
    let fresh = c.bind(&other_exec).await.unwrap();
    assert_eq!(fresh.reply.status, 201);
    assert_ne!(fresh.body.session_id, session.session_id);
}

#[tokio::test]
async fn a_dry_run_bind_validates_and_writes_nothing() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let (g, a, h) = (unique("g"), unique("a"), unique("h"));
    assert_eq!(
        code(c.preview_bind(&bind_request(&g, &a, &h)).await),
        (403, "not_registered".into())
    );
    c.register(&thread(&g, &a, &h)).await.unwrap();
    let preview = c.preview_bind(&bind_request(&g, &a, &h)).await.unwrap();
    assert_eq!(preview.reply.status, 200);
    assert!(preview.body.dry_run && preview.body.would_create);
    assert_eq!(preview.body.session.session_id, None);
    assert_eq!(preview.body.session.created_at, None);
    assert_eq!(preview.reply.json()["session"]["session_id"], json!(null));
    let listed = c.sessions(&ListSessions::default()).await.unwrap().body;
    assert!(listed.sessions.is_empty(), "a dry run wrote a session");

    let bound = c.bind(&bind_request(&g, &a, &h)).await.unwrap().body;
    let again = c
        .preview_bind(&bind_request(&g, &a, &h))
        .await
        .unwrap()
        .body;
    assert!(!again.would_create);
    assert_eq!(
        again.session.session_id.as_deref(),
        Some(bound.session_id.as_str())
    );
}

#[tokio::test]
async fn sessions_list_filters_pages_oldest_first_and_reads_one() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let mut hosts = Vec::new();
    for _ in 0..5 {
        hosts.push(bound_host(c).await);
    }
    c.close(hosts[1].session_id()).await.unwrap();

    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = c
            .sessions(&ListSessions {
                limit: Some(2),
                cursor: cursor.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .body;
        assert!(page.sessions.len() <= 2);
        seen.extend(page.sessions.into_iter().map(|s| s.session_id));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let created: Vec<String> = hosts.iter().map(|h| h.session_id().to_owned()).collect();
    assert_eq!(seen, created, "oldest first, every session once");

    let open = c
        .sessions(&ListSessions {
            state: Some(SessionState::Open),
            ..Default::default()
        })
        .await
        .unwrap()
        .body;
    assert_eq!(open.sessions.len(), 4);
    let by_goal = c
        .sessions(&ListSessions {
            goal_id: Some(hosts[2].goal_id.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .body;
    assert_eq!(by_goal.sessions, vec![hosts[2].session.clone()]);
    let by_agent = c
        .sessions(&ListSessions {
            agent_id: Some(hosts[3].agent_id.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .body;
    assert_eq!(by_agent.sessions.len(), 1);

    for bad in [
        "limit=0",
        "limit=501",
        "limit=x",
        "state=gone",
        "colour=red",
    ] {
        let reply = c
            .send(
                Method::GET,
                &format!("/v1/sessions?{bad}"),
                loopx::client::NO_BODY,
                None,
            )
            .await
            .unwrap();
        assert_eq!(reply.status, 400, "{bad}");
        assert_eq!(reply.json()["error"]["code"], "invalid_request");
    }

    let one = c.session(hosts[0].session_id()).await.unwrap().body;
    assert_eq!(one, hosts[0].session);
    assert_eq!(
        code(c.session("ses_unknown").await),
        (404, "not_found".into())
    );
}

#[tokio::test]
async fn enqueue_orders_turns_and_is_idempotent_by_client_message_id() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let first = enqueue(c, &host, "one").await;
    let second = enqueue(c, &host, "two").await;
    assert_eq!((first.seq, second.seq), (1, 2));
    assert_eq!(first.state, TurnState::Queued);
    assert!(first.turn_id.starts_with("turn_"));

    let keyed = EnqueueRequest {
        attachments: Vec::new(),
        client_message_id: Some("web-click-1".into()),
        ..web("three")
    };
    let created = c.enqueue(host.session_id(), &keyed).await.unwrap();
    assert_eq!(created.reply.status, 201);
    assert!(!created.reply.replayed && !created.body.duplicate);
    let replay = c.enqueue(host.session_id(), &keyed).await.unwrap();
    assert_eq!(replay.reply.status, 200);
    assert!(replay.reply.replayed && replay.body.duplicate);
    assert_eq!(replay.body.turn_id, created.body.turn_id);
    assert_eq!(replay.body.seq, 3);

    let other_body = EnqueueRequest {
        attachments: Vec::new(),
        text: "something else".into(),
        ..keyed.clone()
    };
    assert_eq!(
        code(c.enqueue(host.session_id(), &other_body).await),
        (422, "idempotency_key_reused".into())
    );
    // The same key on another session is another message.
    let other = bound_host(c).await;
    assert_eq!(
        c.enqueue(other.session_id(), &keyed)
            .await
            .unwrap()
            .reply
            .status,
        201
    );

    let steering = EnqueueRequest {
        attachments: Vec::new(),
        ingress: Ingress::LiveSteering,
        ..web("steer")
    };
    assert_eq!(
        code(c.enqueue(host.session_id(), &steering).await),
        (409, "live_steering_unavailable".into())
    );
    let turns = c
        .turns(host.session_id(), &ListTurns::default())
        .await
        .unwrap()
        .body;
    assert_eq!(
        turns.turns.len(),
        3,
        "live steering was never queued instead"
    );

    let lark = EnqueueRequest {
        attachments: Vec::new(),
        origin: Origin::Lark,
        lark: Some(LarkRef {
            chat_id: "oc_1".into(),
            message_id: "om_1".into(),
        }),
        ..web("from lark")
    };
    let queued = c.enqueue(host.session_id(), &lark).await.unwrap().body;
    assert_eq!((queued.origin, queued.seq), (Origin::Lark, 4));
    let web_with_lark = EnqueueRequest {
        attachments: Vec::new(),
        origin: Origin::Web,
        ..lark.clone()
    };
    assert_eq!(
        code(c.enqueue(host.session_id(), &web_with_lark).await),
        (400, "invalid_request".into())
    );
    assert_eq!(
        code(c.enqueue("ses_nope", &web("x")).await),
        (404, "not_found".into())
    );
}

#[tokio::test]
async fn enqueue_conflicts_come_in_the_contracts_order() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let keyed = EnqueueRequest {
        attachments: Vec::new(),
        client_message_id: Some("k".into()),
        ..web("hello")
    };
    c.enqueue(host.session_id(), &keyed).await.unwrap();
    // 422 (reused key) wins over 409 live steering.
    let reused_and_steering = EnqueueRequest {
        attachments: Vec::new(),
        ingress: Ingress::LiveSteering,
        ..keyed.clone()
    };
    assert_eq!(
        code(c.enqueue(host.session_id(), &reused_and_steering).await),
        (422, "idempotency_key_reused".into())
    );
    c.close(host.session_id()).await.unwrap();
    // Closed wins over everything, also for a replay of the same key and body.
    assert_eq!(
        code(c.enqueue(host.session_id(), &keyed).await),
        (409, "session_closed".into())
    );
    assert_eq!(
        code(c.enqueue(host.session_id(), &reused_and_steering).await),
        (409, "session_closed".into())
    );
}

#[tokio::test]
async fn the_queue_holds_at_most_10000_turns() {
    let broker = TestBroker::start().await;
    let host = bound_host(&broker.client).await;
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..50 {
        let (client, host) = (broker.client.clone(), host.clone());
        tasks.spawn(async move {
            for i in 0..200 {
                enqueue(&client, &host, &format!("{worker}-{i}")).await;
            }
        });
    }
    tasks.join_all().await;
    let full = broker
        .client
        .enqueue(host.session_id(), &web("one too many"))
        .await;
    assert_eq!(code(full), (429, "queue_full".into()));
    // Claiming one frees a place.
    claim(&broker.client, &host, "c-1", 0).await;
    let fits = broker
        .client
        .enqueue(host.session_id(), &web("fits"))
        .await
        .unwrap();
    assert_eq!(fits.body.seq, 10_001);
}

#[tokio::test]
async fn close_cancels_queued_turns_and_refuses_while_a_claim_is_active() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let first = enqueue(c, &host, "one").await;
    let second = enqueue(c, &host, "two").await;
    let claimed = claim(c, &host, "c1", 0).await;
    assert_eq!(claimed.turn.turn_id, first.turn_id);

    let refused = c.close(host.session_id()).await;
    let Err(loopx::client::ClientError::Refused { reply, error }) = refused else {
        panic!("close with an active claim must be refused");
    };
    assert_eq!(reply.status, 409);
    assert_eq!(error.error.code_str(), "claim_active");
    assert_eq!(error.error.active_claim_id.as_deref(), Some("c1"));
    assert!(error.error.claimed_at.is_some());

    c.complete(
        host.session_id(),
        &first.turn_id,
        &host.completion("c1", "k1", "done"),
    )
    .await
    .unwrap();
    let closed = c.close(host.session_id()).await.unwrap();
    assert_eq!(closed.body.state, SessionState::Closed);
    assert!(closed.body.closed_at.is_some());
    let again = c.close(host.session_id()).await.unwrap();
    assert_eq!(
        again.body, closed.body,
        "closing a closed session answers the same"
    );

    let cancelled = c
        .turn(host.session_id(), &second.turn_id)
        .await
        .unwrap()
        .body;
    assert_eq!(cancelled.state, TurnState::Cancelled);
    assert_eq!(
        serde_json::to_value(cancelled.cancel_reason).unwrap(),
        json!("session_closed")
    );
    assert_eq!(
        code(c.enqueue(host.session_id(), &web("late")).await),
        (409, "session_closed".into())
    );
    assert_eq!(
        code(
            c.claim(host.session_id(), &host.claim_request("c2", 0))
                .await
        ),
        (409, "session_closed".into())
    );
    // Reads still work, and the completed turn keeps its response.
    let done = c
        .turn(host.session_id(), &first.turn_id)
        .await
        .unwrap()
        .body;
    assert_eq!(done.response.unwrap()["message"], "done");
    // A replay of the completed claim still answers on a closed session.
    let replay = c
        .claim(host.session_id(), &host.claim_request("c1", 0))
        .await
        .unwrap();
    assert!(replay.reply.replayed);
    assert!(
        matches!(replay.body, ClaimAnswer::Claimed(ref c) if c.turn_state == TurnState::Completed)
    );
    assert_eq!(code(c.close("ses_nope").await), (404, "not_found".into()));
}

#[tokio::test]
async fn turns_page_forward_and_back_by_seq() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    for i in 1..=7 {
        enqueue(c, &host, &format!("m{i}")).await;
    }
    let seqs = |list: &loopx::model::TurnList| list.turns.iter().map(|t| t.seq).collect::<Vec<_>>();
    let first = c
        .turns(
            host.session_id(),
            &ListTurns {
                limit: Some(3),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .body;
    assert_eq!((seqs(&first), first.has_more), (vec![1, 2, 3], true));
    let next = c
        .turns(
            host.session_id(),
            &ListTurns {
                after_seq: Some(3),
                limit: Some(3),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .body;
    assert_eq!((seqs(&next), next.has_more), (vec![4, 5, 6], true));
    let back = c
        .turns(
            host.session_id(),
            &ListTurns {
                before_seq: Some(7),
                limit: Some(4),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .body;
    assert_eq!((seqs(&back), back.has_more), (vec![3, 4, 5, 6], true));
    let oldest = c
        .turns(
            host.session_id(),
            &ListTurns {
                before_seq: Some(3),
                limit: Some(4),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .body;
    assert_eq!((seqs(&oldest), oldest.has_more), (vec![1, 2], false));
    assert_eq!(first.turns[0].text, "m1");
    for bad in ["limit=0", "limit=201", "after_seq=-1", "before_seq=abc"] {
        let reply = c
            .send(
                Method::GET,
                &format!("/v1/sessions/{}/turns?{bad}", host.session_id()),
                loopx::client::NO_BODY,
                None,
            )
            .await
            .unwrap();
        assert_eq!(reply.status, 400, "{bad}");
    }
    assert_eq!(
        code(c.turns("ses_nope", &ListTurns::default()).await),
        (404, "not_found".into())
    );
    assert_eq!(
        code(c.turn(host.session_id(), "turn_nope").await),
        (404, "not_found".into())
    );
}

#[tokio::test]
async fn projections_and_lists_never_carry_host_ids_or_message_text() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let secret_text = "the secret message text 7f3a";
    enqueue(c, &host, secret_text).await;
    let claimed = claim(c, &host, "claim-secret-id", 0).await;
    c.complete(
        host.session_id(),
        &claimed.turn.turn_id,
        &host.completion(
            "claim-secret-id",
            "completion-secret-id",
            "the secret answer",
        ),
    )
    .await
    .unwrap();
    let mut answers = vec![
        c.sessions(&ListSessions::default())
            .await
            .unwrap()
            .reply
            .text,
        c.session(host.session_id()).await.unwrap().reply.text,
        c.bind(&bind_request(
            &host.goal_id,
            &host.agent_id,
            &host.host_session_id,
        ))
        .await
        .unwrap()
        .reply
        .text,
        c.preview_bind(&bind_request(
            &host.goal_id,
            &host.agent_id,
            &host.host_session_id,
        ))
        .await
        .unwrap()
        .reply
        .text,
    ];
    answers.push(c.close(host.session_id()).await.unwrap().reply.text);
    for answer in answers {
        for secret in [
            host.host_session_id.as_str(),
            secret_text,
            "the secret answer",
            "claim-secret-id",
            "completion-secret-id",
        ] {
            assert!(!answer.contains(secret), "{answer} leaks {secret}");
        }
        let projection_keys = [
            "session_id",
            "goal_id",
            "agent_id",
            "executor_endpoint_id",
            "host_surface",
            "capabilities",
            "state",
            "created_at",
            "closed_at",
            // Presence: a state and a time, content-free (HOOKS.md).
            "agent",
        ];
        let value: serde_json::Value = serde_json::from_str(&answer).unwrap();
        let sessions = match &value {
            v if v.get("sessions").is_some() => v["sessions"].as_array().unwrap().clone(),
            v if v.get("session").is_some() => vec![v["session"].clone()],
            v => vec![v.clone()],
        };
        for s in sessions {
            let keys: Vec<&str> = s.as_object().unwrap().keys().map(String::as_str).collect();
            for key in &keys {
                assert!(
                    projection_keys.contains(key),
                    "unexpected projection field {key}"
                );
            }
        }
    }
}
