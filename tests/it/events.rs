//! The session event stream, read with a real SSE client.

use std::time::Duration;

use eventsource_stream::{Event, Eventsource};
use futures_util::{Stream, StreamExt};
use loopx::model::{
    AgentEventData, PermissionEventData, ReleaseRequest, SessionEventData, TurnEventData,
};
use serde_json::{Value, json};

use crate::support::*;

pub(crate) type Events = std::pin::Pin<Box<dyn Stream<Item = Event> + Send>>;

/// Opens the session's event stream, optionally resuming after `last_event_id`.
pub(crate) async fn subscribe(
    url: &str,
    token: &str,
    session_id: &str,
    last_event_id: Option<i64>,
) -> Events {
    let mut request = reqwest::Client::new()
        .get(format!("{url}/v1/sessions/{session_id}/events"))
        .bearer_auth(token);
    if let Some(id) = last_event_id {
        request = request.header("last-event-id", id.to_string());
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    Box::pin(
        response
            .bytes_stream()
            .eventsource()
            .map(|e| e.expect("a well-formed event")),
    )
}

/// Takes `n` events, each checked against the document's schema of its
/// `data:` (the model types reject unknown fields).
pub(crate) async fn take(events: &mut Events, n: usize) -> Vec<(i64, String, Value)> {
    let mut taken = Vec::new();
    while taken.len() < n {
        let event = tokio::time::timeout(Duration::from_secs(5), events.next())
            .await
            .unwrap_or_else(|_| panic!("only {} of {n} events arrived: {taken:?}", taken.len()))
            .expect("the stream ended early");
        match event.event.as_str() {
            "turn" => drop(serde_json::from_str::<TurnEventData>(&event.data).unwrap()),
            "permission" => drop(serde_json::from_str::<PermissionEventData>(&event.data).unwrap()),
            "session" => drop(serde_json::from_str::<SessionEventData>(&event.data).unwrap()),
            "agent" => drop(serde_json::from_str::<AgentEventData>(&event.data).unwrap()),
            "notification" => drop(
                serde_json::from_str::<loopx::model::NotificationEventData>(&event.data).unwrap(),
            ),
            other => panic!("an undocumented event: {other}"),
        }
        taken.push((
            event.id.parse().unwrap(),
            event.event,
            serde_json::from_str(&event.data).unwrap(),
        ));
    }
    taken
}

pub(crate) fn states(events: &[(i64, String, Value)]) -> Vec<String> {
    events
        .iter()
        .map(|(_, name, data)| format!("{name}:{}", data["state"].as_str().unwrap()))
        .collect()
}

#[tokio::test]
async fn every_change_is_an_event_in_order_and_a_new_stream_starts_from_now() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let early = enqueue(c, &host, "before anyone listened").await;
    let mut live = subscribe(&broker.url, TOKEN, host.session_id(), None).await;

    let second = enqueue(c, &host, "second").await;
    claim(c, &host, "c1", 0).await;
    c.release(
        host.session_id(),
        "c1",
        &ReleaseRequest::host(HOST_SURFACE, host.host_session_id.clone()),
    )
    .await
    .unwrap();
    claim(c, &host, "c2", 0).await;
    c.complete(
        host.session_id(),
        &early.turn_id,
        &host.completion("c2", "k", "done"),
    )
    .await
    .unwrap();
    c.close(host.session_id()).await.unwrap();

    let seen = take(&mut live, 6).await;
    assert_eq!(
        states(&seen),
        [
            "turn:queued",
            "turn:claimed",
            "turn:released",
            "turn:claimed",
            "turn:completed",
            "turn:cancelled"
        ]
    );
    let ids: Vec<i64> = seen.iter().map(|e| e.0).collect();
    assert_eq!(
        ids,
        [2, 3, 4, 5, 6, 7],
        "starts after the event that came before the stream"
    );
    assert_eq!(
        seen[0].2,
        json!({"turn_id": second.turn_id, "seq": 2, "state": "queued"})
    );
    assert_eq!(seen[1].2["turn_id"], early.turn_id);
    assert_eq!(seen[5].2["turn_id"], second.turn_id);
    let closed = take(&mut live, 1).await;
    assert_eq!(closed[0], (8, "session".into(), json!({"state": "closed"})));
    let end = tokio::time::timeout(Duration::from_secs(5), live.next())
        .await
        .unwrap();
    assert!(end.is_none(), "the stream ends after the session closed");

    // Last-Event-ID: 0 replays the whole log; events carry no content.
    let mut replay = subscribe(&broker.url, TOKEN, host.session_id(), Some(0)).await;
    let all = take(&mut replay, 8).await;
    assert_eq!(
        all[0].2,
        json!({"turn_id": early.turn_id, "seq": 1, "state": "queued"})
    );
    assert_eq!(
        all[1..],
        seen.into_iter().chain(closed).collect::<Vec<_>>()[..]
    );
    for (_, _, data) in &all {
        let text = data.to_string();
        assert!(!text.contains("before anyone listened") && !text.contains("done"));
        assert!(!text.contains(&host.host_session_id));
    }
}

#[tokio::test]
async fn a_client_that_reconnects_with_last_event_id_gets_exactly_what_it_missed() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let mut first = subscribe(&broker.url, TOKEN, host.session_id(), None).await;
    for i in 0..3 {
        enqueue(c, &host, &format!("m{i}")).await;
    }
    let got = take(&mut first, 2).await;
    drop(first);
    for i in 3..6 {
        enqueue(c, &host, &format!("m{i}")).await;
    }
    let mut resumed = subscribe(&broker.url, TOKEN, host.session_id(), Some(got[1].0)).await;
    let rest = take(&mut resumed, 4).await;
    let seqs: Vec<i64> = got
        .iter()
        .chain(&rest)
        .map(|e| e.2["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5, 6], "nothing missed, nothing twice");
}

#[tokio::test]
async fn many_subscribers_see_the_same_sequence() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let mut streams = Vec::new();
    for _ in 0..25 {
        streams.push(subscribe(&broker.url, TOKEN, host.session_id(), None).await);
    }
    for i in 0..10 {
        enqueue(c, &host, &format!("m{i}")).await;
    }
    let mut first: Option<Vec<(i64, String, Value)>> = None;
    for mut stream in streams {
        let seen = take(&mut stream, 10).await;
        match &first {
            None => first = Some(seen),
            Some(expected) => assert_eq!(&seen, expected),
        }
    }
}

#[tokio::test]
async fn bad_last_event_ids_and_unknown_sessions_are_json_errors() {
    let broker = TestBroker::start().await;
    let host = bound_host(&broker.client).await;
    for bad in ["abc", "-1", "1.5"] {
        let reply = reqwest::Client::new()
            .get(format!(
                "{}/v1/sessions/{}/events",
                broker.url,
                host.session_id()
            ))
            .bearer_auth(TOKEN)
            .header("last-event-id", bad)
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status(), 400, "{bad}");
    }
    let unknown = reqwest::Client::new()
        .get(format!("{}/v1/sessions/ses_nope/events", broker.url))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    let anonymous = reqwest::get(format!(
        "{}/v1/sessions/{}/events",
        broker.url,
        host.session_id()
    ))
    .await
    .unwrap();
    assert_eq!(anonymous.status(), 401);
}

#[tokio::test]
async fn shutdown_ends_event_streams_cleanly() {
    let mut broker = TestBroker::start().await;
    let host = bound_host(&broker.client).await;
    let mut stream = subscribe(&broker.url, TOKEN, host.session_id(), None).await;
    broker.stop().await; // would hang if the stream held the server open
    let end = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .unwrap();
    assert!(end.is_none());
}

#[tokio::test]
async fn events_survive_a_restart_and_resume_across_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let broker = Spawned::start(&data, &[]).await;
    let host = bound_host(&broker.client).await;
    let token = std::fs::read_to_string(data.join("owner.token"))
        .unwrap()
        .trim()
        .to_owned();
    let mut stream = subscribe(&broker.url, &token, host.session_id(), None).await;
    enqueue(&broker.client, &host, "one").await;
    let before = take(&mut stream, 1).await;
    enqueue(&broker.client, &host, "two").await;
    assert!(broker.terminate().await.success());

    let broker = Spawned::start(&data, &[]).await;
    enqueue(&broker.client, &host, "three").await;
    let mut resumed = subscribe(&broker.url, &token, host.session_id(), Some(before[0].0)).await;
    let after = take(&mut resumed, 2).await;
    let seqs: Vec<i64> = after.iter().map(|e| e.2["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, [2, 3]);
    assert_eq!(after[0].0, before[0].0 + 1);
    broker.terminate().await;
}

/// A subscriber that stops reading: the broker serves the log at the client's
/// pace, so its memory does not grow with the backlog, and once the client
/// reads again it gets every event, in order.
#[tokio::test]
async fn a_stalled_subscriber_does_not_grow_the_broker_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Spawned::start(&dir.path().join("data"), &["--durability", "relaxed"]).await;
    let host = bound_host(&broker.client).await;
    let token = std::fs::read_to_string(dir.path().join("data/owner.token"))
        .unwrap()
        .trim()
        .to_owned();
    let pid = broker.child.id().unwrap();
    let rss = || {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .unwrap()
            .to_owned();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 1024
    };
    // Warm up, then stall a subscriber from the first event.
    for i in 0..200 {
        enqueue(&broker.client, &host, &format!("warm {i}")).await;
    }
    let mut stalled = subscribe(&broker.url, &token, host.session_id(), Some(0)).await;
    let baseline = rss();
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..8 {
        let (client, host) = (broker.client.clone(), host.clone());
        tasks.spawn(async move {
            for i in 0..500 {
                enqueue(
                    &client,
                    &host,
                    &format!("w{worker} {i} {}", "x".repeat(100)),
                )
                .await;
            }
        });
    }
    tasks.join_all().await;
    let grown = rss().saturating_sub(baseline);
    assert!(
        grown < 24 * 1024 * 1024,
        "the broker grew {grown} bytes behind a stalled subscriber"
    );
    let all = take(&mut stalled, 4200).await;
    let ids: Vec<i64> = all.iter().map(|e| e.0).collect();
    assert_eq!(ids, (1..=4200).collect::<Vec<_>>());
    broker.terminate().await;
}

#[tokio::test]
async fn a_closed_sessions_stream_ends_once_its_log_is_seen() {
    let broker = TestBroker::start().await;
    let host = bound_host(&broker.client).await;
    enqueue(&broker.client, &host, "x").await;
    broker.client.close(host.session_id()).await.unwrap();
    // From now: nothing more will ever happen, so the stream ends at once.
    let mut now = subscribe(&broker.url, TOKEN, host.session_id(), None).await;
    let end = tokio::time::timeout(Duration::from_secs(5), now.next())
        .await
        .unwrap();
    assert!(end.is_none());
    // A resume before the end replays the rest, then ends.
    let mut resumed = subscribe(&broker.url, TOKEN, host.session_id(), Some(1)).await;
    let rest = take(&mut resumed, 2).await;
    assert_eq!(states(&rest), ["turn:cancelled", "session:closed"]);
    let end = tokio::time::timeout(Duration::from_secs(5), resumed.next())
        .await
        .unwrap();
    assert!(end.is_none());
}
