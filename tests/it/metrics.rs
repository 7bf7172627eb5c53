//! `GET /metrics`: the contract's series, content-free.

use std::time::Duration;

use reqwest::Method;

use crate::support::*;

async fn scrape(broker: &TestBroker) -> String {
    let reply = broker
        .client_with_token(None)
        .send(Method::GET, "/metrics", loopx::client::NO_BODY, None)
        .await
        .unwrap();
    assert_eq!(reply.status, 200);
    assert!(reply.content_type.starts_with("text/plain"));
    reply.text
}

fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn metrics_count_turns_requests_parked_claims_and_name_no_client_id() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let first = enqueue(c, &host, "one").await;
    enqueue(c, &host, "two").await;
    claim(c, &host, "claim-private", 0).await;
    c.complete(
        host.session_id(),
        &first.turn_id,
        &host.completion("claim-private", "done-private", "a"),
    )
    .await
    .unwrap();

    let other = bound_host(c).await;
    let (client, waiting) = (c.clone(), other.clone());
    let parked = tokio::spawn(async move { claim(&client, &waiting, "parked-private", 30).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let text = scrape(&broker).await;
    assert_eq!(value(&text, "loopx_parked_claims"), 1.0);
    assert_eq!(value(&text, r#"loopx_turns_total{event="enqueued"}"#), 2.0);
    assert_eq!(value(&text, r#"loopx_turns_total{event="claimed"}"#), 1.0);
    assert_eq!(value(&text, r#"loopx_turns_total{event="completed"}"#), 1.0);
    assert_eq!(value(&text, "loopx_queued_turns"), 1.0);
    assert!(value(&text, "loopx_oldest_queued_age_seconds") >= 0.0);
    assert_eq!(
        value(
            &text,
            r#"loopx_http_requests_total{method="POST",route="/v1/sessions/{session_id}/messages",status="201"}"#
        ),
        2.0
    );

    enqueue(c, &other, "wake").await;
    parked.await.unwrap();
    c.close(host.session_id()).await.unwrap(); // cancels the second turn
    let text = scrape(&broker).await;
    assert_eq!(value(&text, r#"loopx_turns_total{event="cancelled"}"#), 1.0);
    assert_eq!(value(&text, "loopx_queued_turns"), 0.0);
    assert_eq!(value(&text, "loopx_parked_claims"), 0.0);
    assert_eq!(value(&text, "loopx_claim_wake_seconds_count"), 1.0);
    for private in [
        host.session_id(),
        other.session_id(),
        host.host_session_id.as_str(),
        "claim-private",
        "parked-private",
        "done-private",
        first.turn_id.as_str(),
    ] {
        assert!(!text.contains(private), "metrics name {private}");
    }
}
