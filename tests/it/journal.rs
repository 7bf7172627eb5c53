//! The SQLite journal under crashes: the real binary, made to abort (as
//! `kill -9` would) at each step of the journal's path with
//! `LOOPX_TEST_CRASH_AT`, then started again. Nothing acknowledged is lost,
//! nothing is doubled, and replaying the journal gives the same tables
//! however often it is interrupted.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loopx::client::Client;
use loopx::model::{ClaimAnswer, EnqueueRequest, Turn, TurnState};

use crate::support::*;

/// What the clients were told, per session.
#[derive(Default, Clone, Debug)]
struct Told {
    /// client_message_id → (turn_id, seq, text), for every 201.
    enqueued: HashMap<String, (String, i64, String)>,
    /// Every client_message_id sent, answered or not, with its text.
    attempted: Vec<(String, String)>,
    /// turn_id → (claim_id, completion_id, message), for every 200.
    completed: HashMap<String, (String, String, String)>,
}

fn with_id(text: &str, client_message_id: &str) -> EnqueueRequest {
    EnqueueRequest {
        attachments: Vec::new(),
        client_message_id: Some(client_message_id.into()),
        ..web(text)
    }
}

/// Full cycles (enqueue, claim, complete) on each host's session until the
/// broker stops answering.
async fn cycle_until_it_dies(client: &Client, hosts: &[Host]) -> Vec<Told> {
    let told: Vec<Arc<Mutex<Told>>> = hosts.iter().map(|_| Arc::default()).collect();
    let mut workers = Vec::new();
    for (w, host) in hosts.iter().enumerate() {
        let (client, host, told) = (client.clone(), host.clone(), told[w].clone());
        workers.push(tokio::spawn(async move {
            for i in 0.. {
                let (cmid, text) = (format!("m{w}-{i}"), format!("text {w}-{i}"));
                told.lock()
                    .unwrap()
                    .attempted
                    .push((cmid.clone(), text.clone()));
                let Ok(answer) = client
                    .enqueue(host.session_id(), &with_id(&text, &cmid))
                    .await
                else {
                    return;
                };
                let turn = answer.body;
                told.lock()
                    .unwrap()
                    .enqueued
                    .insert(cmid, (turn.turn_id.clone(), turn.seq, text));
                let claim_id = format!("c{w}-{i}");
                let Ok(claimed) = client
                    .claim(host.session_id(), &host.claim_request(&claim_id, 0))
                    .await
                else {
                    return;
                };
                let ClaimAnswer::Claimed(claimed) = claimed.body else {
                    panic!("a queued turn was not claimed: {:?}", claimed.body)
                };
                let (completion_id, message) = (format!("k{w}-{i}"), format!("answer {w}-{i}"));
                let completion = host.completion(&claim_id, &completion_id, &message);
                let turn_id = claimed.turn.turn_id;
                if client
                    .complete(host.session_id(), &turn_id, &completion)
                    .await
                    .is_err()
                {
                    return;
                }
                told.lock()
                    .unwrap()
                    .completed
                    .insert(turn_id, (claim_id, completion_id, message));
            }
        }));
    }
    for worker in workers {
        tokio::time::timeout(Duration::from_secs(60), worker)
            .await
            .expect("the broker crashed within a minute")
            .unwrap();
    }
    told.iter().map(|t| t.lock().unwrap().clone()).collect()
}

/// Everything acknowledged is there as acknowledged; every message sent,
/// sent again with its id, exists exactly once; acknowledged completions
/// replay.
async fn nothing_lost_or_doubled(client: &Client, hosts: &[Host], told: &[Told]) {
    for (host, told) in hosts.iter().zip(told) {
        let turns = all_turns(client, host).await;
        let by_id: HashMap<&str, &Turn> = turns.iter().map(|t| (t.turn_id.as_str(), t)).collect();
        for (cmid, (turn_id, seq, text)) in &told.enqueued {
            let turn = by_id
                .get(turn_id.as_str())
                .unwrap_or_else(|| panic!("acknowledged enqueue {cmid} lost"));
            assert_eq!((turn.seq, &turn.text), (*seq, text), "{cmid} changed");
        }
        for (turn_id, (_, _, message)) in &told.completed {
            let turn = by_id[turn_id.as_str()];
            assert_eq!(
                turn.state,
                TurnState::Completed,
                "acknowledged completion lost"
            );
            assert_eq!(turn.response.as_ref().unwrap()["message"], message.as_str());
        }
        let seqs: Vec<i64> = turns.iter().map(|t| t.seq).collect();
        assert_eq!(seqs, (1..=turns.len() as i64).collect::<Vec<_>>());
        // Every message sent again: the acknowledged ones are duplicates of
        // themselves, the one in flight at the crash is there at most once.
        for (cmid, text) in &told.attempted {
            let again = client
                .enqueue(host.session_id(), &with_id(text, cmid))
                .await
                .unwrap()
                .body;
            if let Some((turn_id, _, _)) = told.enqueued.get(cmid) {
                assert!(again.duplicate, "{cmid} was enqueued twice");
                assert_eq!(&again.turn_id, turn_id);
            }
        }
        let after = all_turns(client, host).await;
        assert_eq!(
            after.len(),
            told.attempted.len(),
            "each message sent exists exactly once"
        );
        for (turn_id, (claim_id, completion_id, message)) in &told.completed {
            let again = client
                .complete(
                    host.session_id(),
                    turn_id,
                    &host.completion(claim_id, completion_id, message),
                )
                .await
                .unwrap();
            assert!(again.body.replayed, "an acknowledged completion replays");
        }
    }
}

/// The data dir's database, read-only.
fn database(data: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open_with_flags(
        data.join("broker.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap()
}

fn journal_records(data: &Path) -> i64 {
    database(data)
        .query_row("select count(*) from journal", [], |row| row.get(0))
        .unwrap()
}

/// The cycle's tables, row by row, as text.
fn tables(data: &Path) -> BTreeMap<&'static str, Vec<String>> {
    let db = database(data);
    let mut dump = BTreeMap::new();
    for table in ["sessions", "turns", "claims", "session_events", "journal"] {
        let mut rows = db
            .prepare(&format!("select * from {table} order by 1, 2"))
            .unwrap();
        let columns = rows.column_count();
        let rows: Vec<String> = rows
            .query_map([], |row| {
                Ok((0..columns)
                    .map(|i| format!("{:?}", row.get_ref(i).unwrap()))
                    .collect::<Vec<_>>()
                    .join("|"))
            })
            .unwrap()
            .map(Result::unwrap)
            .collect();
        dump.insert(table, rows);
    }
    dump
}

async fn hosts(client: &Client, n: usize) -> Vec<Host> {
    let mut hosts = Vec::new();
    for _ in 0..n {
        hosts.push(bound_host(client).await);
    }
    hosts
}

/// Starts a broker on `data` that crashes at `crash_at`, runs full cycles
/// on 4 sessions until it has, and answers the sessions' hosts and what
/// their clients were told.
async fn cycles_until_crash(data: &Path, crash_at: &str) -> (Vec<Host>, Vec<Told>) {
    let mut broker = Spawned::start_env(data, &[], &[("LOOPX_TEST_CRASH_AT", crash_at)]).await;
    let client = broker.client.clone();
    let hosts = hosts(&client, 4).await;
    let told = cycle_until_it_dies(&client, &hosts).await;
    let status = tokio::time::timeout(Duration::from_secs(60), broker.child.wait())
        .await
        .expect("the broker crashed")
        .unwrap();
    assert!(!status.success(), "it crashed: {}", broker.logs());
    (hosts, told)
}

#[tokio::test]
async fn a_crash_after_the_journal_commits_before_the_answers_loses_and_doubles_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (hosts, told) = cycles_until_crash(&data, "journaled:400").await;
    assert!(
        told.iter().map(|t| t.completed.len()).sum::<usize>() > 20,
        "the cycles got going"
    );
    assert!(
        journal_records(&data) > 0,
        "the crash left records to replay"
    );

    let broker = Spawned::start(&data, &[]).await;
    nothing_lost_or_doubled(&broker.client, &hosts, &told).await;
    assert!(broker.terminate().await.success());
}

#[tokio::test]
async fn a_crash_mid_fold_then_mid_replay_loses_and_doubles_nothing_and_replays_alike() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (hosts, told) = cycles_until_crash(&data, "folding:3").await;
    let left = journal_records(&data);
    assert!(left > 0, "the fold that crashed left its records");

    // A copy, replayed once without a crash.
    let copy = dir.path().join("copy");
    std::fs::create_dir(&copy).unwrap();
    // The files (the database, its WAL, the token); not the uploads folder.
    for file in std::fs::read_dir(&data).unwrap() {
        let file = file.unwrap();
        if file.file_type().unwrap().is_file() {
            std::fs::copy(file.path(), copy.join(file.file_name())).unwrap();
        }
    }

    // Start-up replay, crashing before its commit: the records stay.
    let mut replaying = loopx();
    replaying
        .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port())])
        .arg("--data-dir")
        .arg(&data)
        .env("LOOPX_TEST_CRASH_AT", "replaying")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let status = tokio::time::timeout(Duration::from_secs(30), replaying.status())
        .await
        .unwrap()
        .unwrap();
    assert!(!status.success(), "the replay crashed");
    assert_eq!(
        journal_records(&data),
        left,
        "a crashed replay folds nothing"
    );

    // Replayed after a crashed replay, and replayed once: the same tables.
    for dir in [&data, &copy] {
        let broker = Spawned::start(dir, &[]).await;
        assert!(broker.terminate().await.success());
    }
    let (replayed, once) = (tables(&data), tables(&copy));
    assert!(
        replayed["journal"].is_empty(),
        "the replay folded everything"
    );
    assert!(replayed["turns"].len() > 20);
    assert_eq!(replayed, once, "replay gives the same tables");

    let broker = Spawned::start(&data, &[]).await;
    nothing_lost_or_doubled(&broker.client, &hosts, &told).await;
    assert!(broker.terminate().await.success());
}

/// The tables catch up behind the answers: with the writes paused, the
/// journal is folded and a plain SQL look at the database sees every turn.
#[tokio::test]
async fn the_tables_catch_up_when_writes_pause() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let broker = Spawned::start(&data, &[]).await;
    let client = broker.client.clone();
    let host = bound_host(&client).await;
    for i in 0..5 {
        client
            .enqueue(host.session_id(), &with_id("hello", &format!("m{i}")))
            .await
            .unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while journal_records(&data) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the journal was never folded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let turns = tables(&data)["turns"].len();
    assert_eq!(turns, 5);
    assert!(broker.terminate().await.success());
}
