//! Permission requests: create, read, list, answer (first answer wins), the
//! parked wait, expiry on close, the event stream and the metrics; every
//! refusal of the contract. Runs on SQLite and again on PostgreSQL.

use std::time::{Duration, Instant};

use loopx::client::Client;
use loopx::model::{
    Behavior, CreatePermissionRequest, ListPermissions, PermissionState, WaitPermission,
};
use reqwest::Method;
use serde_json::json;

use crate::events::{states, subscribe, take};
use crate::support::*;

pub fn request(host: &Host, request_id: &str, preview: &str) -> CreatePermissionRequest {
    CreatePermissionRequest {
        host_surface: HOST_SURFACE.into(),
        host_session_id: host.host_session_id.clone(),
        request_id: request_id.into(),
        tool_name: "Bash".into(),
        description: "Remove the build directory".into(),
        input_preview: preview.into(),
        ..CreatePermissionRequest::default()
    }
}

fn wait(host: &Host, seconds: u64) -> WaitPermission {
    WaitPermission {
        host_surface: HOST_SURFACE.into(),
        host_session_id: host.host_session_id.clone(),
        wait_seconds: seconds,
    }
}

/// The `state` detail of a `permission_already_answered` refusal.
fn refused_state<T: std::fmt::Debug>(
    result: Result<loopx::client::TypedReply<T>, loopx::client::ClientError>,
) -> (u16, String, serde_json::Value) {
    match result {
        Err(loopx::client::ClientError::Refused { reply, error }) => (
            reply.status.as_u16(),
            error.error.code_str(),
            reply.json()["error"]["state"].clone(),
        ),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

pub async fn created(c: &Client, host: &Host, request_id: &str) {
    let made = c
        .create_permission(
            host.session_id(),
            &request(host, request_id, "rm -rf build"),
        )
        .await
        .unwrap();
    assert_eq!(made.reply.status, 201);
}

#[tokio::test]
async fn a_request_is_created_once_read_back_and_refused_as_the_contract_says() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let sid = host.session_id();
    let made = c
        .create_permission(sid, &request(&host, "abcde", "rm -rf build"))
        .await
        .unwrap();
    assert_eq!(made.reply.status, 201);
    assert!(!made.reply.replayed);
    assert_eq!(made.body.state, PermissionState::Pending);
    assert_eq!(
        (made.body.answered_at.clone(), made.body.answered_via),
        (None, None)
    );
    assert_eq!(made.body.input_preview, "rm -rf build");

    let again = c
        .create_permission(sid, &request(&host, "abcde", "rm -rf build"))
        .await
        .unwrap();
    assert_eq!(
        (again.reply.status.as_u16(), again.reply.replayed),
        (200, true)
    );
    assert_eq!(again.body, made.body);
    let other_body = c
        .create_permission(sid, &request(&host, "abcde", "rm -rf /"))
        .await;
    assert_eq!(code(other_body), (422, "idempotency_key_reused".into()));
    let mut stranger = request(&host, "fghij", "ls");
    stranger.host_session_id = "someone-else".into();
    assert_eq!(
        code(c.create_permission(sid, &stranger).await),
        (403, "host_mismatch".into())
    );
    assert_eq!(
        code(
            c.create_permission("ses_nope", &request(&host, "x", "ls"))
                .await
        ),
        (404, "not_found".into())
    );
    let bad_id = request(&host, "a\nb", "ls");
    assert_eq!(
        code(c.create_permission(sid, &bad_id).await),
        (400, "invalid_request".into())
    );
    let huge = request(&host, "big", &"x".repeat(64 * 1024 + 1));
    assert_eq!(
        code(c.create_permission(sid, &huge).await),
        (400, "invalid_request".into())
    );
    let unknown_field = c
        .send(
            Method::POST,
            &format!("/v1/sessions/{sid}/permission-requests"),
            Some(&json!({"request_id": "q", "surprise": 1})),
            None,
        )
        .await
        .unwrap();
    assert_eq!(unknown_field.status, 400);

    let read = c.permission(sid, "abcde").await.unwrap();
    assert_eq!(read.body, made.body);
    assert_eq!(
        code(c.permission(sid, "zzzzz").await),
        (404, "not_found".into())
    );
    assert_eq!(
        code(c.permission("ses_nope", "abcde").await),
        (404, "not_found".into())
    );
}

#[tokio::test]
async fn the_first_answer_wins_the_same_answer_replays_and_another_is_refused() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let sid = host.session_id();
    created(c, &host, "abcde").await;
    let allowed = c
        .answer_permission(sid, "abcde", Behavior::Allow)
        .await
        .unwrap();
    assert!(!allowed.reply.replayed);
    assert_eq!(allowed.body.state, PermissionState::Allowed);
    assert_eq!(
        allowed.body.answered_via,
        Some(loopx::model::AnsweredVia::Owner)
    );
    assert!(allowed.body.answered_at.is_some());
    let again = c
        .answer_permission(sid, "abcde", Behavior::Allow)
        .await
        .unwrap();
    assert!(again.reply.replayed);
    assert_eq!(again.body, allowed.body);
    assert_eq!(
        refused_state(c.answer_permission(sid, "abcde", Behavior::Deny).await),
        (409, "permission_already_answered".into(), json!("allowed"))
    );
    assert_eq!(
        code(c.answer_permission(sid, "nobody", Behavior::Deny).await),
        (404, "not_found".into())
    );
    assert_eq!(
        code(
            c.answer_permission("ses_nope", "abcde", Behavior::Deny)
                .await
        ),
        (404, "not_found".into())
    );
    let bad = c
        .send(
            Method::POST,
            &format!("/v1/sessions/{sid}/permission-requests/abcde/answer"),
            Some(&json!({"behavior": "maybe"})),
            None,
        )
        .await
        .unwrap();
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json()["error"]["code"], "invalid_request");
}

#[tokio::test]
async fn racing_answers_give_one_final_answer() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    created(c, &host, "race").await;
    let answers = futures_util::future::join_all((0..16).map(|i| {
        let behavior = if i % 2 == 0 {
            Behavior::Allow
        } else {
            Behavior::Deny
        };
        let (c, sid) = (c.clone(), host.session_id().to_owned());
        async move { (behavior, c.answer_permission(&sid, "race", behavior).await) }
    }))
    .await;
    let final_state = c
        .permission(host.session_id(), "race")
        .await
        .unwrap()
        .body
        .state;
    let mut firsts = 0;
    for (behavior, answer) in answers {
        let wanted = loopx::decide::permission::answered_state(behavior);
        match answer {
            Ok(a) if !a.reply.replayed => {
                firsts += 1;
                assert_eq!(a.body.state, final_state);
            }
            Ok(a) => assert_eq!((a.body.state, wanted), (final_state, final_state)),
            Err(e) => {
                assert_ne!(wanted, final_state);
                assert_eq!(refused_state::<()>(Err(e)).1, "permission_already_answered");
            }
        }
    }
    assert_eq!(firsts, 1, "exactly one answer is the first");
}

#[tokio::test]
async fn list_is_pending_first_then_newest_and_filters_by_state() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let sid = host.session_id();
    for id in ["r1", "r2", "r3"] {
        created(c, &host, id).await;
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    c.answer_permission(sid, "r3", Behavior::Deny)
        .await
        .unwrap();
    let all = c
        .permissions(sid, &ListPermissions::default())
        .await
        .unwrap();
    let ids: Vec<_> = all
        .body
        .permission_requests
        .iter()
        .map(|r| r.request_id.as_str())
        .collect();
    assert_eq!(ids, ["r2", "r1", "r3"]);
    let pending = c
        .permissions(
            sid,
            &ListPermissions {
                state: Some(PermissionState::Pending),
            },
        )
        .await
        .unwrap();
    assert_eq!(pending.body.permission_requests.len(), 2);
    let bad = c
        .send(
            Method::GET,
            &format!("/v1/sessions/{sid}/permission-requests?state=nope"),
            loopx::client::NO_BODY,
            None,
        )
        .await
        .unwrap();
    assert_eq!(bad.status, 400);
    assert_eq!(
        code(c.permissions("ses_nope", &ListPermissions::default()).await),
        (404, "not_found".into())
    );
}

#[tokio::test]
async fn a_parked_wait_wakes_on_the_answer_and_times_out_pending() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let sid = host.session_id().to_owned();
    created(c, &host, "abcde").await;

    let started = Instant::now();
    let timed_out = c
        .wait_permission(&sid, "abcde", &wait(&host, 1))
        .await
        .unwrap();
    assert_eq!(timed_out.body.state, PermissionState::Pending);
    assert!(started.elapsed() >= Duration::from_secs(1));

    let waiter = {
        let (c, host, sid) = (c.clone(), host.clone(), sid.clone());
        tokio::spawn(async move { c.wait_permission(&sid, "abcde", &wait(&host, 30)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answered_at = Instant::now();
    c.answer_permission(&sid, "abcde", Behavior::Deny)
        .await
        .unwrap();
    let woken = waiter.await.unwrap().unwrap();
    let latency = answered_at.elapsed();
    assert_eq!(woken.body.state, PermissionState::Denied);
    assert!(latency < Duration::from_secs(2), "woken in {latency:?}");
    println!("permission wait woken {latency:?} after the answer was sent");

    let answered = c
        .wait_permission(&sid, "abcde", &wait(&host, 30))
        .await
        .unwrap();
    assert_eq!(
        answered.body.state,
        PermissionState::Denied,
        "an answered request answers at once"
    );
    let mut stranger = wait(&host, 0);
    stranger.host_session_id = "someone-else".into();
    assert_eq!(
        code(c.wait_permission(&sid, "abcde", &stranger).await),
        (403, "host_mismatch".into())
    );
    assert_eq!(
        code(c.wait_permission(&sid, "nobody", &wait(&host, 0)).await),
        (404, "not_found".into())
    );
}

#[tokio::test]
async fn close_expires_pending_requests_and_the_stream_tells_every_change() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let sid = host.session_id().to_owned();
    let mut events = subscribe(&broker.url, TOKEN, &sid, None).await;
    created(c, &host, "kept").await;
    created(c, &host, "gone").await;
    c.answer_permission(&sid, "kept", Behavior::Allow)
        .await
        .unwrap();
    let waiter = {
        let (c, host, sid) = (c.clone(), host.clone(), sid.clone());
        tokio::spawn(async move { c.wait_permission(&sid, "gone", &wait(&host, 30)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    c.close(&sid).await.unwrap();
    let expired = waiter.await.unwrap().unwrap();
    assert_eq!(expired.body.state, PermissionState::Expired);
    assert_eq!(expired.body.answered_via, None);

    let seen = take(&mut events, 5).await;
    assert_eq!(
        states(&seen),
        [
            "permission:pending",
            "permission:pending",
            "permission:allowed",
            "permission:expired",
            "session:closed"
        ]
    );
    assert_eq!(seen[0].2, json!({"request_id": "kept", "state": "pending"}));
    assert_eq!(seen[3].2, json!({"request_id": "gone", "state": "expired"}));

    assert_eq!(
        refused_state(c.answer_permission(&sid, "gone", Behavior::Allow).await),
        (409, "permission_already_answered".into(), json!("expired"))
    );
    assert_eq!(
        code(
            c.create_permission(&sid, &request(&host, "late", "ls"))
                .await
        ),
        (409, "session_closed".into())
    );
    let replay = c
        .create_permission(&sid, &request(&host, "kept", "rm -rf build"))
        .await
        .unwrap();
    assert!(
        replay.reply.replayed,
        "a replay answers also on a closed session"
    );
    assert_eq!(replay.body.state, PermissionState::Allowed);
}

#[tokio::test]
async fn metrics_count_permission_outcomes_and_name_no_request() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let sid = host.session_id();
    for id in ["secret-one", "secret-two", "secret-three"] {
        created(c, &host, id).await;
    }
    c.answer_permission(sid, "secret-one", Behavior::Allow)
        .await
        .unwrap();
    c.answer_permission(sid, "secret-one", Behavior::Allow)
        .await
        .unwrap();
    c.answer_permission(sid, "secret-two", Behavior::Deny)
        .await
        .unwrap();
    c.close(sid).await.unwrap();
    let text = c
        .send(Method::GET, "/metrics", loopx::client::NO_BODY, None)
        .await
        .unwrap()
        .text;
    for (outcome, count) in [
        ("created", 3),
        ("allowed", 1),
        ("denied", 1),
        ("expired", 1),
    ] {
        let line = format!("loopx_permission_requests_total{{outcome=\"{outcome}\"}} {count}");
        assert!(text.contains(&line), "no {line} in\n{text}");
    }
    assert!(!text.contains("secret"), "no request id in the metrics");
    assert!(!text.contains("rm -rf"), "no preview in the metrics");
}
