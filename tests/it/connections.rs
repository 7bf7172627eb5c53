//! The connection lifecycle of the real binary, as a hostile or careless
//! client meets it: slow, idle and silent connections closed on time while
//! answering ones (parked claims, event streams) are never cut, half-sent
//! bodies answered 408, the connection cap's fast JSON 503 under a default
//! file limit, and a shutdown bounded even with a half-sent request.

use std::time::{Duration, Instant};

use loopx::client::{Client, ClientError, NO_BODY, TypedReply};
use loopx::model::ClaimAnswer;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::*;

async fn connect(url: &str) -> TcpStream {
    TcpStream::connect(url.trim_start_matches("http://"))
        .await
        .unwrap()
}

/// Reads until the broker closes the connection; what it sent, and when it closed.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> (String, Instant) {
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    tokio::time::timeout(within, async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the connection is still open after {within:?}"));
    (
        String::from_utf8_lossy(&received).into_owned(),
        Instant::now(),
    )
}

/// A raw request head for `path` with a JSON body of `length` bytes.
fn post_head(path: &str, token: &str, length: usize) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: loopx\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    )
}

async fn scrape(broker: &Spawned) -> String {
    Client::new(&broker.url, None)
        .send(reqwest::Method::GET, "/metrics", NO_BODY, None)
        .await
        .unwrap()
        .text
}

/// A claim parked in the background; its answer when it ends.
fn park(
    broker: &Spawned,
    host: &Host,
    claim_id: &str,
    wait_seconds: u64,
) -> tokio::task::JoinHandle<Result<TypedReply<ClaimAnswer>, ClientError>> {
    let (client, host) = (broker.client.clone(), host.clone());
    let request = host.claim_request(claim_id, wait_seconds);
    tokio::spawn(async move { client.claim(host.session_id(), &request).await })
}

fn token_of(spawned: &Spawned) -> String {
    std::fs::read_to_string(spawned.data_dir.join("owner.token"))
        .unwrap()
        .trim()
        .to_owned()
}

/// The JSON error body of a raw HTTP answer, with its status line checked.
fn error_of(answer: &str, status: &str) -> Value {
    assert!(
        answer.starts_with(&format!("HTTP/1.1 {status}")),
        "expected {status}: {answer:?}"
    );
    let body = &answer[answer.find("\r\n\r\n").expect("a whole answer") + 4..];
    serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {answer:?}"))
}

#[tokio::test]
async fn slow_idle_and_silent_connections_close_on_time_and_answering_ones_are_never_cut() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let broker = Spawned::start(
        &data_dir,
        &[
            "--header-timeout-seconds",
            "2",
            "--sse-keep-alive-seconds",
            "1",
        ],
    )
    .await;
    let host = bound_host(&broker.client).await;
    let opened = Instant::now();

    let mut silent = connect(&broker.url).await;
    let mut idle = connect(&broker.url).await;
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: loopx\r\n\r\n")
        .await
        .unwrap();
    let mut slow = connect(&broker.url).await;
    let dripping = tokio::spawn(async move {
        for byte in b"GET /healthz HTTP/1.1\r\nHost: loopx\r\nX-Slow: aaaaaaaaaaaaaaaa" {
            if slow.write_all(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        slow
    });
    // A claim parked longer than the head timeout, and an event stream.
    let parked = park(&broker, &host, "long", 5);
    let stream = reqwest::Client::new()
        .get(format!(
            "{}/v1/sessions/{}/events",
            broker.url,
            host.session_id()
        ))
        .bearer_auth(token_of(&broker))
        .header("last-event-id", "0")
        .send()
        .await
        .unwrap();

    // A normal client keeps its normal latency meanwhile.
    let mut worst = Duration::ZERO;
    while opened.elapsed() < Duration::from_millis(2500) {
        let started = Instant::now();
        broker.client.healthz().await.unwrap();
        worst = worst.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Generous: CI shares two cores with the rest of the suite.
    assert!(worst < Duration::from_secs(1), "healthz took {worst:?}");

    for (name, connection) in [("silent", &mut silent), ("idle", &mut idle)] {
        let (_, closed) = read_until_closed(connection, Duration::from_secs(3)).await;
        let after = closed - opened;
        assert!(
            after >= Duration::from_millis(1500) && after < Duration::from_millis(4000),
            "the {name} connection closed after {after:?}"
        );
    }
    let mut slow = dripping.await.unwrap();
    let (answer, closed) = read_until_closed(&mut slow, Duration::from_secs(3)).await;
    assert!(
        answer.is_empty(),
        "a head that never ends is not answered: {answer:?}"
    );
    assert!(closed - opened < Duration::from_millis(4000));

    // The parked claim was answering, not reading: it ends at its own deadline.
    let answer = parked.await.unwrap().unwrap();
    assert!(opened.elapsed() >= Duration::from_secs(5));
    assert_eq!(answer.reply.status.as_u16(), 200);
    // The event stream lives on past the head timeout, with its keep-alives.
    let mut bytes = stream.bytes_stream();
    use futures_util::StreamExt;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    let chunk = tokio::time::timeout_at(deadline, bytes.next())
        .await
        .unwrap();
    assert!(chunk.is_some_and(|c| c.is_ok()), "the stream is still open");
}

#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_is_answered_408_json_and_closed() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let broker = Spawned::start(&data_dir, &["--body-timeout-seconds", "1"]).await;
    let host = bound_host(&broker.client).await;
    let body = serde_json::to_string(&web("hello")).unwrap();
    let path = format!("/v1/sessions/{}/messages", host.session_id());
    let mut stream = connect(&broker.url).await;
    let started = Instant::now();
    stream
        .write_all(post_head(&path, &token_of(&broker), body.len()).as_bytes())
        .await
        .unwrap();
    stream.write_all(&body.as_bytes()[..5]).await.unwrap();
    let (answer, closed) = read_until_closed(&mut stream, Duration::from_secs(4)).await;
    let error = error_of(&answer, "408");
    assert_eq!(error["error"]["code"], "request_timeout");
    let after = closed - started;
    assert!(
        after >= Duration::from_millis(900) && after < Duration::from_secs(3),
        "{after:?}"
    );
    // Nothing was queued.
    let turns = broker
        .client
        .turns(host.session_id(), &Default::default())
        .await
        .unwrap();
    assert!(turns.body.turns.is_empty());
}

#[tokio::test]
async fn sigterm_with_half_sent_requests_exits_0_within_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let broker = Spawned::start(&data_dir, &["--shutdown-grace-seconds", "2"]).await;
    let host = bound_host(&broker.client).await;
    let token = token_of(&broker);
    // A head without its final CRLF, and a body shorter than its length.
    let mut half_head = connect(&broker.url).await;
    half_head
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: loopx\r\n")
        .await
        .unwrap();
    let mut short_body = connect(&broker.url).await;
    let path = format!("/v1/sessions/{}/messages", host.session_id());
    short_body
        .write_all(format!("{}{{\"origin\"", post_head(&path, &token, 100)).as_bytes())
        .await
        .unwrap();
    let parked = park(&broker, &host, "c", 60);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let started = Instant::now();
    let status = broker.terminate().await;
    let took = started.elapsed();
    assert!(status.success(), "exit status {status:?}");
    assert!(took < Duration::from_secs(4), "shutdown took {took:?}");
    let answer = parked.await.unwrap().unwrap();
    assert_eq!(
        serde_json::to_value(&answer.body).unwrap()["claimed"],
        false
    );
    for connection in [&mut half_head, &mut short_body] {
        read_until_closed(connection, Duration::from_secs(1)).await;
    }
}

/// Past `--max-connections`, a connection gets a fast JSON 503 with
/// `Retry-After`; started under a default soft file limit of 1,024, the broker
/// raises it and holds more parked claims than that.
#[tokio::test]
async fn under_ulimit_1024_the_broker_holds_more_than_1024_claims_and_refuses_past_its_cap_fast() {
    const PARKED: usize = 1_060;
    const CAP: usize = 1_100;
    let hard = rlimit::increase_nofile_limit(u64::MAX).unwrap();
    if hard < 2 * CAP as u64 + 200 {
        eprintln!("skipped: the hard open-file limit ({hard}) cannot hold this test's connections");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let cap = CAP.to_string();
    let broker = Spawned::start_under_ulimit(
        &data_dir,
        1024,
        &["--max-connections", &cap, "--connection-reserve", "10"],
    )
    .await;
    let logs = broker.logs();
    assert!(
        logs.contains(&format!("file_limit={hard}")) && logs.contains("raised_from=1024"),
        "the broker says it raised its limit: {logs}"
    );
    let host = bound_host(&broker.client).await;
    let token = token_of(&broker);
    let path = format!("/v1/sessions/{}/claims", host.session_id());
    let mut parked = Vec::with_capacity(PARKED);
    for n in 0..PARKED {
        let request = serde_json::to_string(&host.claim_request(&format!("c{n}"), 60)).unwrap();
        let mut stream = connect(&broker.url).await;
        stream
            .write_all(format!("{}{request}", post_head(&path, &token, request.len())).as_bytes())
            .await
            .unwrap();
        parked.push(stream);
    }
    let metrics = loop {
        let text = scrape(&broker).await;
        if text.contains(&format!("loopx_parked_claims {PARKED}")) {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(metrics.contains("loopx_connections "), "{metrics}");
    // Fill the cap with bare connections, then one more.
    let mut bare = Vec::new();
    for _ in PARKED..CAP {
        bare.push(connect(&broker.url).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let mut refused = connect(&broker.url).await;
    refused
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: loopx\r\n\r\n")
        .await
        .unwrap();
    let (answer, _) = read_until_closed(&mut refused, Duration::from_secs(2)).await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    let error = error_of(&answer, "503");
    assert_eq!(error["error"]["code"], "overloaded");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1\r\n"),
        "{answer}"
    );

    // Load drops: the broker answers again at once.
    drop(bare);
    drop(parked);
    let started = Instant::now();
    loop {
        if broker.client.healthz().await.is_ok() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "healthz within 1 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let metrics = scrape(&broker).await;
    // The one above, and maybe a health check sent before the closes landed.
    let refused = metrics
        .lines()
        .find_map(|l| l.strip_prefix("loopx_connections_refused_total{reason=\"cap\"} "))
        .and_then(|n| n.parse::<u64>().ok());
    assert!(refused.is_some_and(|n| n >= 1), "{metrics}");
    assert!(broker.terminate().await.success());
}

#[tokio::test]
async fn the_default_log_level_writes_no_line_per_request() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let broker = Spawned::start(&data_dir, &[]).await;
    let host = bound_host(&broker.client).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = broker.logs();
    for n in 0..20 {
        let turn = enqueue(&broker.client, &host, &format!("message {n}")).await;
        let claim_id = format!("c{n}");
        claim(&broker.client, &host, &claim_id, 1).await;
        broker
            .client
            .complete(
                host.session_id(),
                &turn.turn_id,
                &host.completion(&claim_id, &format!("done-{n}"), "ok"),
            )
            .await
            .unwrap();
        let _ = broker.client.healthz().await;
        let _ = Client::new(&broker.url, Some("wrong".into()))
            .session(host.session_id())
            .await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = broker.logs();
    assert_eq!(
        after.lines().count(),
        before.lines().count(),
        "new lines: {}",
        &after[before.len()..]
    );
}
