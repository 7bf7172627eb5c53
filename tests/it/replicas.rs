//! Broker replicas sharing one PostgreSQL database: two real `loopx serve`
//! processes, each with its own data dir and the same owner token, on a fresh
//! database. Every guarantee must hold whichever replica a request reaches,
//! decided by the database: wake-ups, claim ids, fencing, close, kill -9, a
//! lost listening connection, an outage, and the Lark connector.
//!
//! Skipped (with a note) unless `LOOPX_TEST_DATABASE_URL` names a PostgreSQL
//! server (`.ci/run` starts one for its PostgreSQL pass).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use loopx::client::{Client, ClientError};
use loopx::model::{ClaimAnswer, ListTurns, ReplyState, TurnState};
use sqlx::Connection;

use crate::fake_lark::*;
use crate::support::*;

/// Two replicas on one fresh database. Fields drop in order: the processes
/// first, the database last.
struct Replicas {
    a: Spawned,
    b: Spawned,
    _dir: tempfile::TempDir,
    db: TestDatabase,
}

impl Replicas {
    /// `None` (after printing why) when no PostgreSQL server is configured.
    async fn start(extra: &[&str]) -> Option<Replicas> {
        let Some(db) = TestDatabase::create().await else {
            eprintln!(
                "note: replica test skipped: set LOOPX_TEST_DATABASE_URL to a PostgreSQL admin URL to run it"
            );
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let token = unique("replica-token");
        let (a, b) = Self::spawn(&db, &dir, &token, extra).await;
        Some(Replicas {
            a,
            b,
            _dir: dir,
            db,
        })
    }

    /// Replica A gets the URL as `--database-url`, replica B as `LOOPX_DATABASE_URL`.
    async fn spawn(
        db: &TestDatabase,
        dir: &tempfile::TempDir,
        token: &str,
        extra: &[&str],
    ) -> (Spawned, Spawned) {
        let mut flagged = vec!["--database-url", db.url.as_str()];
        flagged.extend_from_slice(extra);
        let (dir_a, dir_b) = (dir.path().join("a"), dir.path().join("b"));
        let env_a = [("LOOPX_TOKEN", token)];
        let env_b = [
            ("LOOPX_TOKEN", token),
            ("LOOPX_DATABASE_URL", db.url.as_str()),
        ];
        tokio::join!(
            Spawned::start_env(&dir_a, &flagged, &env_a),
            Spawned::start_env(&dir_b, extra, &env_b),
        )
    }

    /// An admin connection to the replicas' database server.
    async fn admin(&self) -> sqlx::PgConnection {
        let url = test_database_admin_url().unwrap();
        sqlx::PgConnection::connect(&url).await.unwrap()
    }

    /// The name of the replicas' database.
    fn database_name(&self) -> String {
        url::Url::parse(&self.db.url).unwrap().path()[1..].to_owned()
    }

    /// Ends the replicas' connections with this application_name (`loopx`,
    /// `loopx-listener`, or all of them for `None`); answers how many.
    async fn terminate_connections(&self, application_name: Option<&str>) -> i64 {
        let mut admin = self.admin().await;
        let ended: i64 = sqlx::query_scalar(
            "select count(pg_terminate_backend(pid)) from pg_stat_activity
             where datname = $1 and ($2::text is null or application_name = $2)
               and pid <> pg_backend_pid()",
        )
        .bind(self.database_name())
        .bind(application_name)
        .fetch_one(&mut admin)
        .await
        .unwrap();
        ended
    }

    /// How many connections with this application_name the replicas hold.
    async fn connections(&self, application_name: &str) -> i64 {
        let mut admin = self.admin().await;
        sqlx::query_scalar(
            "select count(*) from pg_stat_activity where datname = $1 and application_name = $2",
        )
        .bind(self.database_name())
        .bind(application_name)
        .fetch_one(&mut admin)
        .await
        .unwrap()
    }
}

/// Parks a claim (up to `wait` seconds) in the background; answers the task.
fn park(
    client: &Client,
    host: &Host,
    claim_id: &str,
    wait: u64,
) -> tokio::task::JoinHandle<(
    Result<loopx::client::TypedReply<ClaimAnswer>, ClientError>,
    Instant,
)> {
    let (client, host, claim_id) = (client.clone(), host.clone(), claim_id.to_owned());
    tokio::spawn(async move {
        let answer = client
            .claim(host.session_id(), &host.claim_request(&claim_id, wait))
            .await;
        (answer, Instant::now())
    })
}

/// Lets a background claim reach the broker and park.
async fn parked() {
    tokio::time::sleep(Duration::from_millis(400)).await;
}

fn claimed_turn_id(answer: &ClaimAnswer) -> String {
    match answer {
        ClaimAnswer::Claimed(claimed) => claimed.turn.turn_id.clone(),
        other => panic!("expected a claimed turn, got {other:?}"),
    }
}

async fn turn_states(client: &Client, host: &Host) -> Vec<(i64, TurnState)> {
    client
        .turns(host.session_id(), &ListTurns::default())
        .await
        .unwrap()
        .body
        .turns
        .iter()
        .map(|t| (t.seq, t.state))
        .collect()
}

#[tokio::test]
async fn a_claim_parked_on_one_replica_is_woken_by_an_enqueue_through_the_other() {
    let Some(r) = Replicas::start(&[]).await else {
        return;
    };
    let host = bound_host(&r.a.client).await;
    let waiting = park(&r.a.client, &host, "c1", 30);
    parked().await;
    let enqueued_at = Instant::now();
    let queued = enqueue(&r.b.client, &host, "through b").await;
    let (answer, answered_at) = waiting.await.unwrap();
    let answer = answer.unwrap();
    assert_eq!(claimed_turn_id(&answer.body), queued.turn_id);
    // The notification, not the 5 s safety re-check, woke it.
    let latency = answered_at - enqueued_at;
    assert!(latency < Duration::from_secs(3), "woken after {latency:?}");

    // And the other way round, for a claim parked on B.
    r.a.client
        .complete(
            host.session_id(),
            &queued.turn_id,
            &host.completion("c1", "k1", "done"),
        )
        .await
        .unwrap();
    let waiting = park(&r.b.client, &host, "c2", 30);
    parked().await;
    let enqueued_at = Instant::now();
    let second = enqueue(&r.a.client, &host, "through a").await;
    let (answer, answered_at) = waiting.await.unwrap();
    assert_eq!(claimed_turn_id(&answer.unwrap().body), second.turn_id);
    let latency = answered_at - enqueued_at;
    assert!(latency < Duration::from_secs(3), "woken after {latency:?}");
}

/// Waits until exactly one loopx connection of `r`'s database waits for a
/// lock.
async fn one_waits_for_a_lock(r: &Replicas) {
    let mut admin = r.admin().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "select count(*) from pg_stat_activity
             where datname = $1 and application_name = 'loopx' and wait_event_type = 'Lock'",
        )
        .bind(r.database_name())
        .fetch_one(&mut admin)
        .await
        .unwrap();
        if waiting == 1 {
            return;
        }
        assert!(Instant::now() < deadline, "nothing waited for the lock");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Another replica's writes, `statements` (each bound the session id, a
/// turn id and the time, `$1` to `$3`), in a transaction left open: the
/// session's row locked until [`commit`].
async fn held(
    r: &Replicas,
    session_id: &str,
    turn_id: &str,
    statements: &[&str],
) -> sqlx::PgConnection {
    let mut other = sqlx::PgConnection::connect(&r.db.url).await.unwrap();
    sqlx::raw_sql("begin").execute(&mut other).await.unwrap();
    let now = loopx::time::now_ms();
    for sql in statements {
        sqlx::query(sql)
            .bind(session_id)
            .bind(turn_id)
            .bind(now)
            .execute(&mut other)
            .await
            .unwrap();
    }
    other
}

async fn commit(mut held: sqlx::PgConnection) {
    sqlx::raw_sql("commit").execute(&mut held).await.unwrap();
}

/// A decision that had to wait for another replica's lock on the session
/// decides on what that replica committed. A close's one statement locks the
/// session and reads its active claim beside it; under READ COMMITTED a wait
/// would pair the newly committed session row (an active claim named) with
/// the claims as they were before the wait (none), and the close would fail
/// with a 503 instead of answering 409 `claim_active`.
#[tokio::test]
async fn a_close_that_waited_for_another_replicas_lock_sees_what_it_committed() {
    let Some(r) = Replicas::start(&[]).await else {
        return;
    };
    let host = bound_host(&r.a.client).await;
    let session_id = host.session_id().to_owned();
    let queued = enqueue(&r.b.client, &host, "one").await;
    // Another replica's claim of it, its transaction held open.
    let other = held(
        &r,
        &session_id,
        &queued.turn_id,
        &[
            "update sessions set active_claim_id = 'c_held', queued_count = queued_count - 1,
                 next_event_no = next_event_no + 1
             where session_id = $1",
            "insert into claims (claim_id, session_id, turn_id, attempt, state, claimed_at)
             values ('c_held', $1, $2, 1, 'active', $3)",
            "update turns set state = 'claimed', current_claim_id = 'c_held', claimed_at = $3,
                 claim_count = 1
             where turn_id = $2",
        ],
    )
    .await;
    let closing = {
        let (client, session_id) = (r.a.client.clone(), session_id.clone());
        tokio::spawn(async move { client.close(&session_id).await })
    };
    one_waits_for_a_lock(&r).await;
    commit(other).await;
    let Err(ClientError::Refused { reply, error }) = closing.await.unwrap() else {
        panic!("a close while a claim is active must be refused");
    };
    assert_eq!(reply.status, 409);
    assert_eq!(error.error.code_str(), "claim_active");
    assert_eq!(error.error.active_claim_id.as_deref(), Some("c_held"));
    let turns = turn_states(&r.b.client, &host).await;
    assert_eq!(turns, vec![(queued.seq, TurnState::Claimed)]);
}

/// A claim never waits behind another replica's open transaction on its
/// session: it reads without the lock, so it answers at once on what is
/// committed (an enqueue not yet committed is not acknowledged either), and
/// the next claim after the commit takes the turn.
#[tokio::test]
async fn a_claim_answers_at_once_beside_another_replicas_open_transaction() {
    let Some(r) = Replicas::start(&[]).await else {
        return;
    };
    let host = bound_host(&r.a.client).await;
    let session_id = host.session_id().to_owned();
    // Another replica's enqueue, its transaction held open.
    let other = held(
        &r,
        &session_id,
        "turn_held",
        &[
            "update sessions set next_seq = next_seq + 1, queued_count = queued_count + 1,
                 next_event_no = next_event_no + 1
             where session_id = $1",
            "insert into turns (turn_id, session_id, seq, origin, text, state, enqueued_at)
             select $2, $1, next_seq - 1, 'web', 'held'::bytea, 'queued', $3
             from sessions where session_id = $1",
            "insert into session_events (session_id, event_no, kind, turn_id, seq, state, at)
             select $1, next_event_no - 1, 'turn', $2, next_seq - 1, 'queued', $3
             from sessions where session_id = $1",
        ],
    )
    .await;
    let (answer, _) = park(&r.a.client, &host, "c1", 0).await.unwrap();
    assert!(
        matches!(answer.unwrap().body, ClaimAnswer::NotClaimed(_)),
        "nothing committed to claim yet"
    );
    commit(other).await;
    let (answer, _) = park(&r.a.client, &host, "c2", 0).await.unwrap();
    assert_eq!(claimed_turn_id(&answer.unwrap().body), "turn_held");
    let turns = turn_states(&r.b.client, &host).await;
    assert_eq!(turns, vec![(1, TurnState::Claimed)]);
}

/// A decision read without the lock is written only if its session has not
/// moved on since: a completion that read the turn still claimed, while
/// another replica was completing it, finds on writing that the session
/// changed, is taken again under the lock, and is refused. The turn keeps
/// the one completion, never two.
#[tokio::test]
async fn a_completion_racing_another_replicas_completion_is_taken_again_and_refused() {
    let Some(r) = Replicas::start(&[]).await else {
        return;
    };
    let host = bound_host(&r.a.client).await;
    let session_id = host.session_id().to_owned();
    let queued = enqueue(&r.b.client, &host, "one").await;
    claim(&r.a.client, &host, "c1", 0).await;
    // Another replica's completion of it, its transaction held open.
    let other = held(
        &r,
        &session_id,
        &queued.turn_id,
        &[
            "update turns set state = 'completed', completion_id = 'k_held', completed_at = $3,
                 response = '{\"held\":true}'
             where turn_id = $2",
            "update claims set state = 'completed' where claim_id = 'c1'",
            "update sessions set active_claim_id = null, next_event_no = next_event_no + 1
             where session_id = $1",
        ],
    )
    .await;
    let completing = {
        let (client, session_id) = (r.a.client.clone(), session_id.clone());
        let (turn_id, completion) = (queued.turn_id.clone(), host.completion("c1", "k1", "mine"));
        tokio::spawn(async move { client.complete(&session_id, &turn_id, &completion).await })
    };
    one_waits_for_a_lock(&r).await;
    commit(other).await;
    let Err(ClientError::Refused { reply, error }) = completing.await.unwrap() else {
        panic!("a second completion of a completed turn must be refused");
    };
    assert_eq!(reply.status, 409);
    assert_eq!(error.error.code_str(), "already_completed");
    let turn =
        r.b.client
            .turn(&session_id, &queued.turn_id)
            .await
            .unwrap()
            .body;
    assert_eq!(turn.state, TurnState::Completed);
    assert_eq!(turn.response, Some(serde_json::json!({"held": true})));
}

#[tokio::test]
async fn one_claim_id_sent_to_both_replicas_at_once_claims_one_turn() {
    let Some(r) = Replicas::start(&[]).await else {
        return;
    };
    let host = bound_host(&r.a.client).await;
    let first = enqueue(&r.a.client, &host, "one").await;
    enqueue(&r.b.client, &host, "two").await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..8 {
        let client = if i % 2 == 0 { &r.a.client } else { &r.b.client }.clone();
        let host = host.clone();
        tasks.spawn(async move {
            client
                .claim(host.session_id(), &host.claim_request("same", 0))
                .await
                .unwrap()
        });
    }
    let answers = tasks.join_all().await;
    let turns: HashSet<String> = answers.iter().map(|a| claimed_turn_id(&a.body)).collect();
    assert_eq!(turns, HashSet::from([first.turn_id.clone()]));
    let fresh = answers.iter().filter(|a| !a.reply.replayed).count();
    assert_eq!(fresh, 1, "exactly one claim was new, the rest replays");
    for answer in &answers {
        let ClaimAnswer::Claimed(claimed) = &answer.body else {
            unreachable!()
        };
        assert_eq!(claimed.turn.attempt, 1);
    }
    assert_eq!(
        turn_states(&r.b.client, &host).await,
        vec![(1, TurnState::Claimed), (2, TurnState::Queued)]
    );
    // One active claim per session, whichever replica asks.
    for client in [&r.a.client, &r.b.client] {
        assert_eq!(
            code(
                client
                    .claim(host.session_id(), &host.claim_request("other", 0))
                    .await
            ),
            (409, "claim_active".into())
        );
    }

    // One claim id on two sessions at the same moment, one through each
    // replica: one claims, the other is claim_id_reused.
    for round in 0..4 {
        let (h1, h2) = (bound_host(&r.a.client).await, bound_host(&r.b.client).await);
        enqueue(&r.a.client, &h1, "x").await;
        enqueue(&r.b.client, &h2, "y").await;
        let claim_id = format!("shared-{round}");
        let (c1, c2) = (
            h1.claim_request(&claim_id, 0),
            h2.claim_request(&claim_id, 0),
        );
        let (one, two) = tokio::join!(
            r.a.client.claim(h1.session_id(), &c1),
            r.b.client.claim(h2.session_id(), &c2),
        );
        let outcomes = [one, two].map(|answer| match answer {
            Ok(answer) => {
                claimed_turn_id(&answer.body);
                "claimed".to_owned()
            }
            refused => code(refused).1,
        });
        let mut sorted = outcomes.to_vec();
        sorted.sort();
        assert_eq!(sorted, ["claim_id_reused", "claimed"], "round {round}");
    }
}

#[tokio::test]
async fn a_tuple_bound_through_both_replicas_at_once_gets_one_session() {
    let Some(r) = Replicas::start(&[]).await else {
        return;
    };
    for round in 0..4 {
        let (goal, agent, host) = (unique("goal"), unique("agent"), unique("host"));
        r.a.client
            .register(&thread(&goal, &agent, &host))
            .await
            .unwrap();
        let bind = bind_request(&goal, &agent, &host);
        let (one, two) = tokio::join!(r.a.client.bind(&bind), r.b.client.bind(&bind));
        let (one, two) = (one.unwrap(), two.unwrap());
        assert_eq!(one.body.session_id, two.body.session_id, "round {round}");
        let mut statuses = [one.reply.status.as_u16(), two.reply.status.as_u16()];
        statuses.sort();
        assert_eq!(statuses, [200, 201], "round {round}");
    }
}

#[tokio::test]
async fn close_through_one_replica_is_refused_while_a_claim_made_through_the_other_is_active() {
    let Some(r) = Replicas::start(&[]).await else {
        return;
    };
    let host = bound_host(&r.a.client).await;
    let turn = enqueue(&r.a.client, &host, "q").await;
    enqueue(&r.a.client, &host, "later").await;
    claim(&r.a.client, &host, "c1", 0).await;
    let refused = r.b.client.close(host.session_id()).await;
    let Err(ClientError::Refused { reply, error }) = refused else {
        panic!("close with an active claim must be refused: {refused:?}");
    };
    assert_eq!(reply.status.as_u16(), 409);
    assert_eq!(error.error.code_str(), "claim_active");
    assert_eq!(error.error.active_claim_id.as_deref(), Some("c1"));
    assert!(error.error.claimed_at.is_some());

    r.b.client
        .complete(
            host.session_id(),
            &turn.turn_id,
            &host.completion("c1", "k1", "answer"),
        )
        .await
        .unwrap();
    let closed = r.b.client.close(host.session_id()).await.unwrap().body;
    assert_eq!(closed.state, loopx::model::SessionState::Closed);
    // Both replicas see it closed, and refuse accordingly.
    assert_eq!(
        code(r.a.client.enqueue(host.session_id(), &web("late")).await),
        (409, "session_closed".into())
    );
    assert_eq!(
        turn_states(&r.a.client, &host).await,
        vec![(1, TurnState::Completed), (2, TurnState::Cancelled)]
    );
}

#[tokio::test]
async fn a_claim_made_through_one_replica_is_completed_through_the_other() {
    let Some(r) = Replicas::start(&[]).await else {
        return;
    };
    let host = bound_host(&r.a.client).await;
    let turn = enqueue(&r.b.client, &host, "q").await;
    claim(&r.a.client, &host, "c1", 0).await;
    // Fenced on B: another claim id, and the turn not yet completed.
    assert_eq!(
        code(
            r.b.client
                .complete(
                    host.session_id(),
                    &turn.turn_id,
                    &host.completion("not-c1", "k0", "no"),
                )
                .await
        ),
        (409, "claim_mismatch".into())
    );
    let receipt =
        r.b.client
            .complete(
                host.session_id(),
                &turn.turn_id,
                &host.completion("c1", "k1", "answer"),
            )
            .await
            .unwrap();
    assert!(!receipt.body.replayed);
    // The same completion through A replays; another completion id is refused.
    let replay =
        r.a.client
            .complete(
                host.session_id(),
                &turn.turn_id,
                &host.completion("c1", "k1", "answer"),
            )
            .await
            .unwrap();
    assert!(replay.body.replayed && replay.reply.replayed);
    assert_eq!(replay.body.completed_at, receipt.body.completed_at);
    assert_eq!(
        code(
            r.a.client
                .complete(
                    host.session_id(),
                    &turn.turn_id,
                    &host.completion("c1", "k1", "another answer"),
                )
                .await
        ),
        (422, "idempotency_key_reused".into())
    );
    assert_eq!(
        code(
            r.a.client
                .complete(
                    host.session_id(),
                    &turn.turn_id,
                    &host.completion("c1", "k2", "answer"),
                )
                .await
        ),
        (409, "already_completed".into())
    );
    let read =
        r.a.client
            .turn(host.session_id(), &turn.turn_id)
            .await
            .unwrap()
            .body;
    assert_eq!(read.state, TurnState::Completed);
    assert_eq!(read.response.unwrap()["message"], "answer");
    // Enqueue idempotency holds across replicas too.
    let keyed = loopx::model::EnqueueRequest {
        attachments: Vec::new(),
        client_message_id: Some("m-1".into()),
        ..web("keyed")
    };
    let first = r.a.client.enqueue(host.session_id(), &keyed).await.unwrap();
    let again = r.b.client.enqueue(host.session_id(), &keyed).await.unwrap();
    assert_eq!(first.body.turn_id, again.body.turn_id);
    assert!(again.body.duplicate && again.reply.replayed);
}

#[tokio::test]
async fn a_replica_killed_with_kill_9_loses_nothing_acknowledged() {
    let Some(r) = Replicas::start(&[]).await else {
        return;
    };
    let Replicas { a, b, _dir, db } = r;
    let host = bound_host(&a.client).await;
    // A claim held through A, and writers on both replicas.
    let held = enqueue(&a.client, &host, "held").await;
    claim(&a.client, &host, "held-claim", 0).await;
    let writer = |client: Client, host: Host, name: &'static str| {
        tokio::spawn(async move {
            let mut acknowledged = Vec::new();
            for i in 0..400 {
                match client
                    .enqueue(host.session_id(), &web(&format!("{name}-{i}")))
                    .await
                {
                    Ok(answer) => acknowledged.push(answer.body.turn_id),
                    // A is gone: what it never answered may or may not exist.
                    Err(ClientError::Unreachable { .. }) => break,
                    Err(e) => panic!("{name}: {e}"),
                }
            }
            acknowledged
        })
    };
    let on_a = writer(a.client.clone(), host.clone(), "a");
    let on_b = writer(b.client.clone(), host.clone(), "b");
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.kill9().await;
    let acknowledged_a = on_a.await.unwrap();
    let acknowledged_b = on_b.await.unwrap();
    assert!(
        !acknowledged_a.is_empty(),
        "A acknowledged some before it died"
    );
    assert_eq!(acknowledged_b.len(), 400, "B kept serving throughout");

    // Everything acknowledged by either replica is there, in one gapless order.
    let c = &b.client;
    let turns = all_turns(c, &host).await;
    let seqs: Vec<i64> = turns.iter().map(|t| t.seq).collect();
    assert_eq!(seqs, (1..=turns.len() as i64).collect::<Vec<_>>());
    let stored: HashSet<&str> = turns.iter().map(|t| t.turn_id.as_str()).collect();
    for turn_id in acknowledged_a.iter().chain(&acknowledged_b) {
        assert!(
            stored.contains(turn_id.as_str()),
            "{turn_id} was acknowledged and lost"
        );
    }
    // The claim made through A holds on B, and B completes it and serves on.
    assert_eq!(
        code(
            c.claim(host.session_id(), &host.claim_request("new", 0))
                .await
        ),
        (409, "claim_active".into())
    );
    c.complete(
        host.session_id(),
        &held.turn_id,
        &host.completion("held-claim", "k1", "answer"),
    )
    .await
    .unwrap();
    let next = claim(c, &host, "next", 0).await;
    assert_eq!(next.turn.seq, 2);
    drop(b);
    drop(db);
}

#[tokio::test]
async fn a_lost_listening_connection_still_wakes_parked_claims() {
    let Some(r) = Replicas::start(&[]).await else {
        return;
    };
    assert_eq!(
        r.connections("loopx-listener").await,
        2,
        "one listener per replica"
    );
    let host = bound_host(&r.a.client).await;
    let waiting = park(&r.a.client, &host, "c1", 30);
    parked().await;
    assert_eq!(r.terminate_connections(Some("loopx-listener")).await, 2);
    let enqueued_at = Instant::now();
    let queued = enqueue(&r.b.client, &host, "while nobody listens").await;
    let (answer, answered_at) = waiting.await.unwrap();
    assert_eq!(claimed_turn_id(&answer.unwrap().body), queued.turn_id);
    // Within the 5 s safety re-check (usually at once: the reconnect wakes).
    let latency = answered_at - enqueued_at;
    assert!(latency < Duration::from_secs(7), "woken after {latency:?}");

    // Both replicas listen again, and notifications wake at once again.
    let deadline = Instant::now() + Duration::from_secs(10);
    while r.connections("loopx-listener").await < 2 {
        assert!(Instant::now() < deadline, "the listeners did not come back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    r.a.client
        .complete(
            host.session_id(),
            &queued.turn_id,
            &host.completion("c1", "k1", "done"),
        )
        .await
        .unwrap();
    let waiting = park(&r.a.client, &host, "c2", 30);
    parked().await;
    let enqueued_at = Instant::now();
    let second = enqueue(&r.b.client, &host, "heard").await;
    let (answer, answered_at) = waiting.await.unwrap();
    assert_eq!(claimed_turn_id(&answer.unwrap().body), second.turn_id);
    let latency = answered_at - enqueued_at;
    assert!(latency < Duration::from_secs(3), "woken after {latency:?}");
}

#[tokio::test]
async fn a_database_outage_answers_503_and_the_replicas_recover_by_themselves() {
    let Some(r) = Replicas::start(&[]).await else {
        return;
    };
    let host = bound_host(&r.a.client).await;
    let name = r.database_name();
    let mut admin = r.admin().await;
    sqlx::query(&format!("alter database {name} allow_connections false"))
        .execute(&mut admin)
        .await
        .unwrap();
    r.terminate_connections(None).await;
    for client in [&r.a.client, &r.b.client] {
        match client.healthz().await {
            Err(ClientError::Refused { reply, error }) => {
                assert_eq!(reply.status.as_u16(), 503);
                assert!(reply.content_type.starts_with("application/json"));
                assert_eq!(error.error.code_str(), "store_unavailable");
            }
            other => panic!("expected 503 store_unavailable, got {other:?}"),
        }
    }
    assert_eq!(
        code(r.b.client.enqueue(host.session_id(), &web("lost")).await),
        (503, "store_unavailable".into())
    );

    sqlx::query(&format!("alter database {name} allow_connections true"))
        .execute(&mut admin)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    for client in [&r.a.client, &r.b.client] {
        while client.healthz().await.is_err() {
            assert!(Instant::now() < deadline, "the replicas did not recover");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Serving again, listeners included: a claim parked on A is woken by B.
    while r.connections("loopx-listener").await < 2 {
        assert!(Instant::now() < deadline, "the listeners did not come back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let waiting = park(&r.a.client, &host, "c1", 30);
    parked().await;
    let enqueued_at = Instant::now();
    let queued = enqueue(&r.b.client, &host, "after the outage").await;
    let (answer, answered_at) = waiting.await.unwrap();
    assert_eq!(claimed_turn_id(&answer.unwrap().body), queued.turn_id);
    assert_eq!(queued.seq, 1, "the refused enqueue stored nothing");
    let latency = answered_at - enqueued_at;
    assert!(latency < Duration::from_secs(3), "woken after {latency:?}");
}

#[tokio::test]
async fn a_lark_event_delivered_to_both_replicas_is_enqueued_once_and_answered_once() {
    let fake = FakeLark::start().await;
    let flags = fake.flags(None);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let Some(r) = Replicas::start(&flags).await else {
        return;
    };
    let (to_a, to_b) = (
        LarkEvents::new(&r.a.url, None),
        LarkEvents::new(&r.b.url, None),
    );
    let chat = unique("oc");
    let host = bound_host(&r.a.client).await;
    r.b.client
        .lark_link(host.session_id(), &chat)
        .await
        .unwrap();

    // The same delivery (same bytes, same signature) to both at once, then
    // redelivered to each: acknowledged every time, enqueued once.
    for round in 0..3 {
        let event = to_a.text_message(&unique("ev"), &chat, &unique("om"), &format!("q{round}"));
        let delivery = to_a.sign(to_a.body(&event));
        let (one, two) = tokio::join!(to_a.send(&delivery), to_b.send(&delivery));
        assert_eq!((one.status, two.status), (200, 200), "{one:?} {two:?}");
        let again = to_b.sign(to_b.body(&event));
        assert_eq!(to_b.send(&again).await.status, 200);
        assert_eq!(to_a.send(&again).await.status, 200);
    }
    let turns =
        r.a.client
            .turns(host.session_id(), &ListTurns::default())
            .await
            .unwrap()
            .body
            .turns;
    assert_eq!(
        turns.iter().map(|t| t.text.as_str()).collect::<Vec<_>>(),
        ["q0", "q1", "q2"]
    );

    // Each completed Lark turn is answered once, though both replicas run a
    // dispatcher and completions arrive through both.
    let mut answered_turns = Vec::new();
    for (i, turn) in turns.iter().enumerate() {
        let client = if i % 2 == 0 { &r.a.client } else { &r.b.client };
        let claim_id = unique("claim");
        let claimed = claim(client, &host, &claim_id, 0).await;
        assert_eq!(claimed.turn.turn_id, turn.turn_id);
        client
            .complete(
                host.session_id(),
                &turn.turn_id,
                &host.completion(&claim_id, &unique("done"), &format!("answer {i}")),
            )
            .await
            .unwrap();
        answered_turns.push(turn.turn_id.clone());
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    for turn_id in &answered_turns {
        loop {
            let turn =
                r.b.client
                    .turn(host.session_id(), turn_id)
                    .await
                    .unwrap()
                    .body;
            if turn
                .reply
                .as_ref()
                .is_some_and(|reply| reply.state == ReplyState::Sent)
            {
                break;
            }
            assert!(Instant::now() < deadline, "no reply sent: {turn:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let requests = fake.requests();
    assert_eq!(
        requests.len(),
        3,
        "one reply request per turn: {requests:?}"
    );
    assert_eq!(fake.replies().len(), 3);
}

/// A Lark event whose ids hold U+0000 (which PostgreSQL text cannot store)
/// is acknowledged and dropped as seen: no 5xx for Lark to redeliver
/// forever, no turn, and the chat's next event goes through as usual.
#[tokio::test]
async fn a_lark_event_whose_ids_hold_nul_is_acknowledged_and_dropped() {
    let fake = FakeLark::start().await;
    let flags = fake.flags(None);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let Some(r) = Replicas::start(&flags).await else {
        return;
    };
    let lark = LarkEvents::new(&r.a.url, None);
    let chat = unique("oc");
    let host = bound_host(&r.a.client).await;
    r.a.client
        .lark_link(host.session_id(), &chat)
        .await
        .unwrap();
    for (event_id, message_id) in [
        (format!("{}\u{0}", unique("ev")), unique("om")),
        (unique("ev"), format!("{}\u{0}", unique("om"))),
    ] {
        let event = lark.text_message(&event_id, &chat, &message_id, "dropped");
        let answer = lark.send(&lark.sign(lark.body(&event))).await;
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    let event = lark.text_message(&unique("ev"), &chat, &unique("om"), "kept");
    assert_eq!(lark.send(&lark.sign(lark.body(&event))).await.status, 200);
    let turns = all_turns(&r.b.client, &host).await;
    assert_eq!(
        turns.iter().map(|t| t.text.as_str()).collect::<Vec<_>>(),
        ["kept"]
    );
}

/// What PostgreSQL text cannot hold (U+0000) is still client input like any
/// other: a message keeps it exactly, and an id holding it is simply unknown.
#[tokio::test]
async fn a_nul_character_round_trips_and_never_makes_a_5xx() {
    let Some(r) = Replicas::start(&[]).await else {
        return;
    };
    let host = bound_host(&r.a.client).await;
    let text = "before\u{0}after";
    let queued = enqueue(&r.a.client, &host, text).await;
    let claimed = claim(&r.b.client, &host, "c1", 0).await;
    assert_eq!(claimed.turn.text, text);
    r.b.client
        .complete(
            host.session_id(),
            &queued.turn_id,
            &host.completion("c1", "k1", "an\u{0}answer"),
        )
        .await
        .unwrap();
    let read =
        r.a.client
            .turn(host.session_id(), &queued.turn_id)
            .await
            .unwrap()
            .body;
    assert_eq!(read.text, text);
    assert_eq!(read.response.unwrap()["message"], "an\u{0}answer");
    let no_body: Option<&serde_json::Value> = None;
    for path in [
        "/v1/sessions/ses_%00".to_owned(),
        format!("/v1/sessions/{}/turns/turn_%00", host.session_id()),
        "/v1/sessions/ses_%00/turns".to_owned(),
        "/v1/sessions/ses_%00/lark-link".to_owned(),
    ] {
        let reply =
            r.a.client
                .send(reqwest::Method::GET, &path, no_body, None)
                .await
                .unwrap();
        assert_eq!(reply.status.as_u16(), 404, "{path}: {}", reply.text);
    }
    let reply =
        r.b.client
            .send(
                reqwest::Method::POST,
                "/v1/sessions/ses_%00/messages",
                Some(&web("x")),
                None,
            )
            .await
            .unwrap();
    assert_eq!(reply.status.as_u16(), 404, "{}", reply.text);
}

/// `?sslmode=require` in the database URL: the store's connections are
/// encrypted (checked in the server's `pg_stat_ssl`). `.ci/run` starts its
/// PostgreSQL with TLS on and sets `LOOPX_TEST_DATABASE_TLS=1`, which makes
/// a server without TLS a failure here rather than a skip.
#[tokio::test]
async fn the_store_reaches_postgresql_over_tls_when_the_url_requires_it() {
    use loopx::store::Store;
    let Some(db) = TestDatabase::create().await else {
        eprintln!("note: TLS test skipped: set LOOPX_TEST_DATABASE_URL to run it");
        return;
    };
    let admin_url = test_database_admin_url().unwrap();
    let mut admin = sqlx::PgConnection::connect(&admin_url).await.unwrap();
    let ssl: String = sqlx::query_scalar("show ssl")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    if ssl != "on" {
        assert!(
            std::env::var("LOOPX_TEST_DATABASE_TLS").is_err(),
            "LOOPX_TEST_DATABASE_TLS is set but the test server has ssl off"
        );
        eprintln!("note: TLS test skipped: the test server has ssl off");
        return;
    }
    let mut url = url::Url::parse(&db.url).unwrap();
    let name = url.path().trim_start_matches('/').to_owned();
    url.query_pairs_mut().append_pair("sslmode", "require");
    let store = loopx::store::postgres::PgStore::open(url.as_str())
        .await
        .expect("the store connects with sslmode=require");
    store.ping().await.unwrap();
    let (encrypted, plain): (i64, i64) = sqlx::query_as(
        "select count(*) filter (where s.ssl), count(*) filter (where not s.ssl)
         from pg_stat_activity a join pg_stat_ssl s using (pid)
         where a.datname = $1 and a.application_name like 'loopx%'",
    )
    .bind(&name)
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert!(
        encrypted >= 2,
        "the pool's and the listener's connections are encrypted"
    );
    assert_eq!(plain, 0, "no connection of the store is in clear text");
    drop(store);
}
