//! Retention: pruning removes exactly the sessions closed before the cutoff,
//! with every row they own, and nothing else, while the broker serves; the
//! one-off `loopx prune` and `serve --retain-closed-days` do the same.

use std::path::Path;
use std::time::Duration;

use loopx::store::retention;

use crate::support::*;

const DAY_MS: i64 = 86_400_000;

/// The tables that hold a session's rows.
const OWNED: [&str; 12] = [
    "turns",
    "claims",
    "session_events",
    "lark_replies",
    "lark_links",
    "permission_requests",
    "lark_permission_messages",
    "lark_pair_codes",
    "lark_notes",
    "lark_sent",
    "session_changes",
    "turn_changes",
];

/// A direct connection to the broker's database, for what the API cannot do
/// (move a session's close into the past) or show (rows left behind).
enum Db {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

impl Db {
    async fn of(broker: &TestBroker) -> Db {
        match &broker.database {
            Some(database) => Db::Postgres(sqlx::PgPool::connect(&database.url).await.unwrap()),
            None => Db::sqlite(&broker.dir.path().join("broker.db")).await,
        }
    }

    async fn sqlite(path: &Path) -> Db {
        let url = format!("sqlite://{}", path.display());
        Db::Sqlite(sqlx::SqlitePool::connect(&url).await.unwrap())
    }

    async fn execute(&self, sql: &str, a: i64, b: &str) {
        match self {
            Db::Sqlite(db) => sqlx::query(sql).bind(a).bind(b).execute(db).await.map(drop),
            Db::Postgres(db) => sqlx::query(sql).bind(a).bind(b).execute(db).await.map(drop),
        }
        .unwrap();
    }

    async fn count(&self, table: &str, session_id: &str) -> i64 {
        let sql = format!("select count(*) from {table} where session_id = $1");
        match self {
            Db::Sqlite(db) => {
                sqlx::query_scalar(&sql)
                    .bind(session_id)
                    .fetch_one(db)
                    .await
            }
            Db::Postgres(db) => {
                sqlx::query_scalar(&sql)
                    .bind(session_id)
                    .fetch_one(db)
                    .await
            }
        }
        .unwrap()
    }

    /// Moves a session's creation, and its close if closed, `days` into the past.
    async fn age(&self, session_id: &str, days: i64) {
        let sql = "update sessions set created_at = created_at - $1, \
                   closed_at = closed_at - $1 where session_id = $2";
        self.execute(sql, days * DAY_MS, session_id).await;
    }

    async fn rows_of(&self, session_id: &str) -> i64 {
        let mut rows = self.count("sessions", session_id).await;
        for table in OWNED {
            rows += self.count(table, session_id).await;
        }
        rows
    }
}

/// A session with a completed turn (a claim, events), a queued one (cancelled
/// at close), a Lark link, a pairing code, a permission request (expired at
/// close) and its message to the chat, closed unless `open` (then its chat
/// has a note saying so).
async fn history(client: &loopx::client::Client, open: bool) -> Host {
    let host = bound_host(client).await;
    client
        .lark_link(host.session_id(), &unique("oc"))
        .await
        .unwrap();
    client.lark_pair_code(host.session_id()).await.unwrap();
    let turn = enqueue(client, &host, "answered").await;
    let claim_id = unique("claim");
    claim(client, &host, &claim_id, 0).await;
    let changes = loopx::model::ReportChanges {
        host_surface: HOST_SURFACE.into(),
        host_session_id: host.host_session_id.clone(),
        branch: Some("main".into()),
        head: None,
        ahead: 0,
        behind: 0,
        files: Vec::new(),
        diff: String::new(),
        turn_files: vec!["a.rs".into()],
    };
    client
        .report_changes(host.session_id(), &changes)
        .await
        .unwrap();
    client
        .complete(
            host.session_id(),
            &turn.turn_id,
            &host.completion(&claim_id, &unique("done"), "ok"),
        )
        .await
        .unwrap();
    enqueue(client, &host, "left queued").await;
    let permission = loopx::model::CreatePermissionRequest {
        host_surface: HOST_SURFACE.into(),
        host_session_id: host.host_session_id.clone(),
        request_id: unique("perm"),
        tool_name: "Bash".into(),
        description: "d".into(),
        input_preview: "ls".into(),
        ..Default::default()
    };
    client
        .create_permission(host.session_id(), &permission)
        .await
        .unwrap();
    if !open {
        client.close(host.session_id()).await.unwrap();
    }
    host
}

#[tokio::test]
async fn pruning_removes_exactly_the_sessions_closed_before_the_cutoff_while_the_broker_serves() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let db = Db::of(&broker).await;
    let (old, older) = (history(c, false).await, history(c, false).await);
    let (recent, open) = (history(c, false).await, history(c, true).await);
    db.age(old.session_id(), 10).await;
    db.age(older.session_id(), 30).await;
    db.age(recent.session_id(), 4).await;
    db.age(open.session_id(), 30).await;
    let before = db.rows_of(old.session_id()).await + db.rows_of(older.session_id()).await;
    assert!(before >= 20, "the old sessions own rows: {before}");

    // A host keeps working meanwhile.
    let working = bound_host(c).await;
    let client = c.clone();
    let traffic = tokio::spawn(async move {
        for n in 0..30 {
            let turn = enqueue(&client, &working, &format!("during {n}")).await;
            let claim_id = format!("during-{n}");
            claim(&client, &working, &claim_id, 0).await;
            let done = working.completion(&claim_id, &format!("done-{n}"), "ok");
            client
                .complete(working.session_id(), &turn.turn_id, &done)
                .await
                .unwrap();
        }
    });
    let cutoff = retention::cutoff_ms(loopx::time::now_ms(), 5);
    let store = broker.broker.store();
    let pruned = retention::prune(store, cutoff, Duration::from_millis(1))
        .await
        .unwrap();
    traffic.await.unwrap();
    assert_eq!(pruned.sessions, 2, "{pruned:?}");
    assert_eq!(
        pruned.rows as i64, before,
        "every row of theirs, nothing else"
    );

    for gone in [&old, &older] {
        assert_eq!(db.rows_of(gone.session_id()).await, 0);
        assert_eq!(
            code(c.session(gone.session_id()).await),
            (404, "not_found".into())
        );
    }
    for kept in [&recent, &open] {
        c.session(kept.session_id()).await.unwrap();
        let turns = c
            .turns(kept.session_id(), &Default::default())
            .await
            .unwrap();
        assert_eq!(turns.body.turns.len(), 2);
        c.lark_link_status(kept.session_id()).await.unwrap();
    }
    // Nothing is left to prune: a second run removes nothing.
    let again = retention::prune(store, cutoff, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(again, retention::Pruned::default());
}

#[tokio::test]
async fn loopx_prune_and_retain_closed_days_prune_old_closed_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let broker = Spawned::start(&data, &[]).await;
    let c = broker.client.clone();
    let (first, second, kept) = (
        history(&c, false).await,
        history(&c, false).await,
        history(&c, false).await,
    );
    // The broker holds the data dir: a one-off prune must wait for it.
    let refused = loopx()
        .args(["prune", "--older-than-days", "5", "--data-dir"])
        .arg(&data)
        .output()
        .await
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--retain-closed-days"));
    assert!(broker.terminate().await.success());

    let db = Db::sqlite(&data.join("broker.db")).await;
    db.age(first.session_id(), 6).await;
    let pruned = loopx()
        .args(["prune", "--older-than-days", "5", "--data-dir"])
        .arg(&data)
        .output()
        .await
        .unwrap();
    assert!(pruned.status.success(), "{pruned:?}");
    let stdout = String::from_utf8_lossy(&pruned.stdout);
    assert!(stdout.starts_with("pruned 1 closed sessions ("), "{stdout}");
    assert_eq!(db.rows_of(first.session_id()).await, 0);

    db.age(second.session_id(), 6).await;
    let broker = Spawned::start(&data, &["--retain-closed-days", "5"]).await;
    let started = std::time::Instant::now();
    while db.rows_of(second.session_id()).await > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "pruned at start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    broker.client.session(kept.session_id()).await.unwrap();
    assert!(broker.terminate().await.success());
}
