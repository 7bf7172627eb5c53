//! The real binary: restarts, kill -9, the data dir's lock, signals, files and logs.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loopx::model::{ClaimAnswer, TurnState};

use crate::support::*;

#[tokio::test]
async fn a_restart_keeps_claim_ids_sequences_and_completions() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let broker = Spawned::start(&data, &[]).await;
    let c = broker.client.clone();
    let host = bound_host(&c).await;
    let first = enqueue(&c, &host, "one").await;
    enqueue(&c, &host, "two").await;
    claim(&c, &host, "c1", 0).await;
    let receipt = c
        .complete(
            host.session_id(),
            &first.turn_id,
            &host.completion("c1", "k1", "answer"),
        )
        .await
        .unwrap()
        .body;
    let held = claim(&c, &host, "c2", 0).await;
    assert!(broker.terminate().await.success());

    let broker = Spawned::start(&data, &[]).await;
    let c = broker.client.clone();
    // Same claim id, same turn, across the restart; the active claim still holds.
    let replay = c
        .claim(host.session_id(), &host.claim_request("c2", 0))
        .await
        .unwrap();
    assert!(replay.reply.replayed);
    let ClaimAnswer::Claimed(replayed) = replay.body else {
        panic!()
    };
    assert_eq!(replayed.turn.turn_id, held.turn.turn_id);
    assert_eq!(
        code(
            c.claim(host.session_id(), &host.claim_request("c3", 0))
                .await
        ),
        (409, "claim_active".into())
    );
    // The completion replays with the same receipt.
    let again = c
        .complete(
            host.session_id(),
            &first.turn_id,
            &host.completion("c1", "k1", "answer"),
        )
        .await
        .unwrap();
    assert!(again.body.replayed);
    assert_eq!(again.body.completed_at, receipt.completed_at);
    // Sequences continue.
    assert_eq!(enqueue(&c, &host, "three").await.seq, 3);
    assert!(broker.terminate().await.success());
}

#[tokio::test]
async fn kill_9_during_a_burst_loses_no_acknowledged_enqueue() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let broker = Spawned::start(&data, &[]).await;
    let host = bound_host(&broker.client).await;
    let acknowledged = Arc::new(Mutex::new(HashMap::new()));
    let mut writers = Vec::new();
    for worker in 0..16 {
        let (client, host, acknowledged) =
            (broker.client.clone(), host.clone(), acknowledged.clone());
        writers.push(tokio::spawn(async move {
            for i in 0.. {
                let text = format!("w{worker}-{i}");
                match client.enqueue(host.session_id(), &web(&text)).await {
                    Ok(answer) => {
                        acknowledged
                            .lock()
                            .unwrap()
                            .insert(answer.body.turn_id, (answer.body.seq, text));
                    }
                    Err(_) => return,
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    broker.kill9().await;
    for writer in writers {
        writer.await.unwrap();
    }
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(
        acknowledged.len() > 50,
        "the burst got going ({} acks)",
        acknowledged.len()
    );

    let broker = Spawned::start(&data, &[]).await;
    let stored: HashMap<String, (i64, String)> = all_turns(&broker.client, &host)
        .await
        .into_iter()
        .map(|turn| (turn.turn_id, (turn.seq, turn.text)))
        .collect();
    for (turn_id, expected) in &acknowledged {
        assert_eq!(
            stored.get(turn_id),
            Some(expected),
            "acknowledged turn {turn_id} lost or changed"
        );
    }
    let mut seqs: Vec<i64> = stored.values().map(|(seq, _)| *seq).collect();
    seqs.sort();
    assert_eq!(
        seqs,
        (1..=seqs.len() as i64).collect::<Vec<_>>(),
        "seq has no gaps or doubles"
    );
    broker.terminate().await;
}

#[tokio::test]
async fn a_second_broker_on_the_same_data_dir_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let broker = Spawned::start(&data, &[]).await;
    let second = loopx()
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{}", free_port()),
            "--data-dir",
        ])
        .arg(&data)
        .output()
        .await
        .unwrap();
    assert!(!second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains("already serving"), "{stderr}");
    broker.terminate().await;
}

#[tokio::test]
async fn a_non_loopback_listen_address_needs_allow_remote() {
    let dir = tempfile::tempdir().unwrap();
    let refused = loopx()
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path())
        .output()
        .await
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--allow-remote"));
    assert!(
        !dir.path().join("broker.db").exists(),
        "refused before touching the data dir"
    );
}

#[tokio::test]
async fn serve_says_where_the_page_is_and_when_the_token_was_just_created() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let token_file = data.join("owner.token");
    let hint = format!(
        "paste the token from {} into the page",
        token_file.display()
    );

    let first = Spawned::start(&data, &[]).await;
    let logs = first.logs();
    assert!(
        logs.contains(&format!("chat page: {}/ ", first.url)),
        "{logs}"
    );
    assert!(logs.contains(&hint), "{logs}");
    assert!(logs.contains("just created"), "{logs}");
    first.terminate().await;

    let again = Spawned::start(&data, &[]).await;
    let logs = again.logs();
    assert!(
        logs.contains(&format!("chat page: {}/ ", again.url)),
        "{logs}"
    );
    assert!(logs.contains(&hint), "{logs}");
    assert!(
        !logs.contains("just created"),
        "only the first start says so: {logs}"
    );
    again.terminate().await;
}

#[tokio::test]
async fn sigterm_answers_parked_claims_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Spawned::start(&dir.path().join("data"), &[]).await;
    let host = bound_host(&broker.client).await;
    let (client, waiting) = (broker.client.clone(), host.clone());
    let parked = tokio::spawn(async move {
        client
            .claim(waiting.session_id(), &waiting.claim_request("c1", 600))
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let status = broker.terminate().await;
    assert!(status.success(), "exit status {status:?}");
    let answer = parked.await.unwrap().unwrap();
    assert_eq!(answer.reply.json()["claimed"], false);
}

#[tokio::test]
async fn files_are_private_and_logs_carry_no_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Request lines are at debug: turn them on to check them too.
    let broker = Spawned::start_env(
        &data,
        &[],
        &[("LOOPX_LOG", "tower_http=debug,loopx::http=debug,info")],
    )
    .await;
    let token = std::fs::read_to_string(data.join("owner.token")).unwrap();
    let c = broker.client.clone();
    let host = bound_host(&c).await;
    let secret_text = "confidential-message-text-91c2";
    let turn = enqueue(&c, &host, secret_text).await;
    claim(&c, &host, "c1", 0).await;
    c.complete(
        host.session_id(),
        &turn.turn_id,
        &host.completion("c1", "k1", "confidential-answer"),
    )
    .await
    .unwrap();
    assert_eq!(
        c.turn(host.session_id(), &turn.turn_id)
            .await
            .unwrap()
            .body
            .state,
        TurnState::Completed
    );
    let log_path = broker.stderr_log.clone();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&data), 0o700);
    assert_eq!(mode(&data.join("owner.token")), 0o600);
    assert_eq!(mode(&data.join("broker.db")), 0o600);
    broker.terminate().await;

    let logs = std::fs::read_to_string(log_path).unwrap();
    assert!(
        logs.contains("/v1/sessions/{session_id}/messages"),
        "one line per request at debug: {logs}"
    );
    for secret in [
        token.trim(),
        host.host_session_id.as_str(),
        secret_text,
        "confidential-answer",
    ] {
        assert!(!logs.contains(secret), "logs leak {secret}");
    }
}

/// The WAL is copied back into the database file while the broker runs (by
/// the checkpointer, off the writer's path), not only when it grows past the
/// writer's own 4,000-page backstop.
#[tokio::test]
async fn written_turns_reach_the_database_file_while_the_broker_runs() {
    let broker = TestBroker::start().await;
    if broker.database.is_some() {
        return; // PostgreSQL keeps its own WAL.
    }
    let host = bound_host(&broker.client).await;
    let text = "x".repeat(4096);
    for _ in 0..200 {
        enqueue(&broker.client, &host, &text).await;
    }
    let db = broker.dir.path().join("broker.db");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let size = std::fs::metadata(&db).unwrap().len();
        if size > 800 * 1024 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "200 turns of 4 KiB are still only in the WAL: the database file is {size} bytes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Under steady writes the WAL file stays bounded: the passive checkpointer
/// alone never lets the log restart, so the writer completes the checkpoint
/// at 1,000 pages when idle, 1,500 inside a commit (the WAL used to sit at
/// 4,000 pages, ~16 MB).
#[tokio::test]
async fn the_wal_stays_small_under_sustained_writes() {
    let broker = TestBroker::start().await;
    if broker.database.is_some() {
        return; // PostgreSQL has no WAL file of ours to watch.
    }
    let wal = broker.dir.path().join("broker.db-wal");
    let text = "x".repeat(60 * 1024);
    let mut writers = Vec::new();
    for _ in 0..8 {
        let (client, text) = (broker.client.clone(), text.clone());
        let host = bound_host(&client).await;
        writers.push(tokio::spawn(async move {
            for _ in 0..60 {
                enqueue(&client, &host, &text).await;
            }
        }));
    }
    let mut largest = 0;
    while writers.iter().any(|w| !w.is_finished()) {
        largest = largest.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for writer in writers {
        writer.await.unwrap();
    }
    // 480 turns of 60 KiB: about 29 MB went through the WAL.
    assert!(largest < 9 * 1024 * 1024, "the WAL reached {largest} bytes");
}
