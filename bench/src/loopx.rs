//! The broker under test: the release `loopx serve` on a temp data dir and a
//! free port, driven over HTTP/1.1 keep-alive through one shared reqwest pool,
//! plus the direct SQLite fill for the depth test.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::queue::Queue;
use crate::sys::{self, Percentiles, Result};

const HOST_SURFACE: &str = "bench";

/// One running broker process.
pub struct Broker {
    child: Child,
    pub pid: u32,
    pub base: String,
    pub token: String,
    pub data_dir: PathBuf,
    /// Its stderr (the tracing log).
    pub log_path: PathBuf,
}

/// The HTTP client every measurement uses: keep-alive, no idle limit, no
/// proxy, Nagle off (as any latency-minded client sets it).
pub fn http_client() -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .pool_max_idle_per_host(usize::MAX)
        .tcp_nodelay(true)
        .no_proxy()
        .build()?)
}

impl Broker {
    /// Starts `loopx serve` with its data dir under `dir` and waits for /healthz.
    pub async fn start(loopx: &Path, dir: &Path, durability: &str) -> Result<Self> {
        Self::spawn(loopx, dir, &["--durability", durability], None).await
    }

    /// Starts a replica on the PostgreSQL database `database_url` with the
    /// shared owner `token` (passed as `LOOPX_TOKEN`), its own data dir under
    /// `dir`. No `--durability`: on PostgreSQL durability is the server's.
    pub async fn start_pg(
        loopx: &Path,
        dir: &Path,
        database_url: &str,
        token: &str,
    ) -> Result<Self> {
        Self::spawn(loopx, dir, &["--database-url", database_url], Some(token)).await
    }

    /// `loopx serve` with `args` on a free port; the owner token is `token`
    /// (as `LOOPX_TOKEN`) or, without one, read from the data dir.
    async fn spawn(loopx: &Path, dir: &Path, args: &[&str], token: Option<&str>) -> Result<Self> {
        let port = sys::free_port()?;
        let data_dir = dir.join("data");
        let log_path = dir.join("broker.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        let mut command = Command::new(loopx);
        command
            .arg("serve")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--data-dir")
            .arg(&data_dir)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        for var in [
            "LOOPX_TOKEN",
            "LOOPX_TOKEN_FILE",
            "LOOPX_DATABASE_URL",
            "LOOPX_LISTEN",
            "LOOPX_DATA_DIR",
            "LOOPX_DURABILITY",
            "LOOPX_LOG",
            "RUST_LOG",
        ] {
            command.env_remove(var);
        }
        if let Some(token) = token {
            command.env("LOOPX_TOKEN", token);
        }
        // The parked section holds 10,000 claims plus its own connections,
        // past the broker's default cap of 10,000 (set through the
        // environment, which builds older than the cap ignore).
        command.env("LOOPX_MAX_CONNECTIONS", "20000");
        let child = command
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", loopx.display()))?;
        let mut broker = Self {
            pid: child.id(),
            child,
            base: format!("http://127.0.0.1:{port}"),
            token: String::new(),
            data_dir,
            log_path: log_path.clone(),
        };
        let http = http_client()?;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = broker.child.try_wait() {
                return Err(format!(
                    "the broker exited ({status}) while starting:\n{}",
                    sys::log_tail(&log_path)
                )
                .into());
            }
            let health = http.get(format!("{}/healthz", broker.base)).send().await;
            if health.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            if Instant::now() > deadline {
                return Err("the broker did not answer /healthz within 20 s".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        broker.token = match token {
            Some(token) => token.to_owned(),
            None => std::fs::read_to_string(broker.data_dir.join("owner.token"))?
                .trim()
                .to_owned(),
        };
        Ok(broker)
    }

    /// SIGTERM, as an operator stops it, and waits for the exit.
    pub async fn stop(mut self) {
        sys::terminate(&mut self.child, Duration::from_secs(15)).await;
    }

    /// Registers and binds `n` sessions; lane `i` is bound to host session `h{i}`.
    pub async fn create_sessions(&self, n: usize) -> Result<Vec<String>> {
        let http = http_client()?;
        let (base, auth) = (self.base.clone(), format!("Bearer {}", self.token));
        sys::par_map(n, 32, move |i| {
            let (http, base, auth) = (http.clone(), base.clone(), auth.clone());
            async move {
                let tuple = json!({
                    "goal_id": "bench-goal",
                    "agent_id": "bench-agent",
                    "host_surface": HOST_SURFACE,
                    "host_session_id": format!("h{i}"),
                });
                let url = format!("{base}/v1/agent-threads");
                let r = http
                    .post(url)
                    .header("authorization", &auth)
                    .json(&tuple)
                    .send()
                    .await?;
                expect(r, &[StatusCode::CREATED, StatusCode::OK]).await?;
                let mut bind = tuple;
                bind["executor_endpoint_id"] = json!("bench-exec");
                bind["dry_run"] = json!(false);
                let r = http
                    .post(format!("{base}/v1/sessions"))
                    .header("authorization", &auth)
                    .json(&bind)
                    .send()
                    .await?;
                let session = expect(r, &[StatusCode::CREATED]).await?;
                Ok(session["session_id"]
                    .as_str()
                    .ok_or("no session_id")?
                    .to_owned())
            }
        })
        .await
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

async fn expect(response: reqwest::Response, ok: &[StatusCode]) -> Result<Value> {
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    if ok.contains(&status) {
        Ok(body)
    } else {
        Err(format!("the broker answered {status}: {body}").into())
    }
}

/// Which broker (replica) each request of a lane goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Every request to the first broker.
    One,
    /// Enqueues to the second broker; claims and completions to the first.
    EnqueueElsewhere,
    /// All of lane `i`'s requests to broker `i % brokers`.
    ByLane,
}

/// The broker as a [`Queue`]: lane `i` is session `sessions[i]`.
pub struct LoopxQueue {
    http: reqwest::Client,
    /// The brokers' base URLs (replicas of one database when more than one).
    bases: Vec<String>,
    route: Route,
    auth: String,
    sessions: Vec<String>,
    /// `wait_seconds` of a parked claim.
    wait_seconds: u64,
    next_id: AtomicU64,
}

/// A claimed turn.
pub struct Claimed {
    turn_id: String,
    claim_id: String,
}

impl LoopxQueue {
    /// A queue over the broker's sessions with a fresh connection pool.
    pub fn new(broker: &Broker, sessions: Vec<String>, wait_seconds: u64) -> Result<Self> {
        Self::routed(&[broker], Route::One, sessions, wait_seconds)
    }

    /// A queue over replicas sharing one database (and one owner token),
    /// each request sent to the replica `route` picks.
    pub fn routed(
        brokers: &[&Broker],
        route: Route,
        sessions: Vec<String>,
        wait_seconds: u64,
    ) -> Result<Self> {
        let first = brokers.first().ok_or("no broker")?;
        if route != Route::One && brokers.len() < 2 {
            return Err(format!("route {route:?} needs two brokers").into());
        }
        Ok(Self {
            http: http_client()?,
            bases: brokers.iter().map(|b| b.base.clone()).collect(),
            route,
            auth: format!("Bearer {}", first.token),
            sessions,
            wait_seconds,
            next_id: AtomicU64::new(0),
        })
    }

    /// The base URL of the broker this lane's enqueue (or other request) goes to.
    fn base(&self, lane: usize, enqueue: bool) -> &str {
        let i = match self.route {
            Route::One => 0,
            Route::EnqueueElsewhere => usize::from(enqueue),
            Route::ByLane => lane % self.bases.len(),
        };
        &self.bases[i]
    }

    async fn post(&self, base: &str, path: String, body: Value, ok: StatusCode) -> Result<Value> {
        let response = self
            .http
            .post(format!("{base}{path}"))
            .header("authorization", &self.auth)
            .json(&body)
            .send()
            .await?;
        expect(response, &[ok]).await
    }

    fn id(&self, prefix: &str) -> String {
        format!("{prefix}{}", self.next_id.fetch_add(1, Ordering::Relaxed))
    }
}

impl Queue for LoopxQueue {
    type Conn = ();
    type Token = Claimed;

    async fn connect(&self, _listen: Option<usize>) -> Result<()> {
        Ok(())
    }

    async fn enqueue(&self, _: &mut (), lane: usize) -> Result<()> {
        let path = format!("/v1/sessions/{}/messages", self.sessions[lane]);
        self.post(
            self.base(lane, true),
            path,
            json!({"origin": "web", "text": "hello"}),
            StatusCode::CREATED,
        )
        .await?;
        Ok(())
    }

    async fn claim(&self, _: &mut (), lane: usize, wait: bool) -> Result<Option<Claimed>> {
        let claim_id = self.id("c");
        let body = json!({
            "host_surface": HOST_SURFACE,
            "host_session_id": format!("h{lane}"),
            "claim_id": claim_id,
            "wait_seconds": if wait { self.wait_seconds } else { 0 },
        });
        let path = format!("/v1/sessions/{}/claims", self.sessions[lane]);
        let answer = self
            .post(self.base(lane, false), path, body, StatusCode::OK)
            .await?;
        if answer["claimed"] != json!(true) {
            return Ok(None);
        }
        let turn_id = answer["turn"]["turn_id"].as_str().ok_or("no turn_id")?;
        Ok(Some(Claimed {
            turn_id: turn_id.to_owned(),
            claim_id,
        }))
    }

    async fn complete(&self, _: &mut (), lane: usize, claimed: Claimed) -> Result<()> {
        let body = json!({
            "host_surface": HOST_SURFACE,
            "host_session_id": format!("h{lane}"),
            "claim_id": claimed.claim_id,
            "completion_id": self.id("k"),
            "response": {"message": "ok"},
        });
        let session = &self.sessions[lane];
        let path = format!("/v1/sessions/{session}/turns/{}/complete", claimed.turn_id);
        self.post(self.base(lane, false), path, body, StatusCode::OK)
            .await?;
        Ok(())
    }
}

/// Claim latency on one lane: enqueue (not timed), then claim + complete
/// timed; answers (claim+complete, claim alone) percentiles.
pub async fn claim_latency(
    q: Arc<LoopxQueue>,
    lane: usize,
    warmup: usize,
    cycles: usize,
) -> Result<(Percentiles, Percentiles)> {
    let mut cycle = Vec::with_capacity(cycles);
    let mut claim = Vec::with_capacity(cycles);
    for i in 0..warmup + cycles {
        q.enqueue(&mut (), lane).await?;
        let start = Instant::now();
        let token = q
            .claim(&mut (), lane, false)
            .await?
            .ok_or("nothing to claim")?;
        let claimed = start.elapsed();
        q.complete(&mut (), lane, token).await?;
        if i >= warmup {
            cycle.push(start.elapsed());
            claim.push(claimed);
        }
    }
    Ok((sys::percentiles(&mut cycle), sys::percentiles(&mut claim)))
}

/// Stores `count` completed turns (each with its completed claim) in one
/// session, straight into the stopped broker's SQLite file, keeping
/// `next_seq` and `queued_count` consistent. Answers the seconds it took.
pub async fn fill_turns(db: &Path, session_id: &str, count: u64) -> Result<f64> {
    use sqlx::Connection;
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
    let started = Instant::now();
    let options = SqliteConnectOptions::new()
        .filename(db)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal);
    let mut conn = sqlx::SqliteConnection::connect_with(&options).await?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    let mut tx = conn.begin().await?;
    sqlx::query(
        "with recursive n(i) as (select 1 union all select i + 1 from n where i < ?1)
         insert into turns (turn_id, session_id, seq, origin, text, state, enqueued_at,
             claimed_at, completed_at, claim_count, current_claim_id, completion_id, response)
         select printf('turn_fill%010d', i), ?2, i, 'web', 'hello', 'completed', ?3,
             ?3, ?3, 1, printf('fill-c%010d', i), printf('fill-k%010d', i), '{\"message\":\"ok\"}'
         from n",
    )
    .bind(count as i64)
    .bind(session_id)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "with recursive n(i) as (select 1 union all select i + 1 from n where i < ?1)
         insert into claims (claim_id, session_id, turn_id, attempt, state, claimed_at)
         select printf('fill-c%010d', i), ?2, printf('turn_fill%010d', i), 1, 'completed', ?3
         from n",
    )
    .bind(count as i64)
    .bind(session_id)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    let updated = sqlx::query(
        "update sessions set next_seq = ?1 + 1, queued_count = 0, active_claim_id = null
         where session_id = ?2",
    )
    .bind(count as i64)
    .bind(session_id)
    .execute(&mut *tx)
    .await?;
    if updated.rows_affected() != 1 {
        return Err("the session to fill is not in the database".into());
    }
    tx.commit().await?;
    sqlx::query("pragma wal_checkpoint(truncate)")
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    Ok(started.elapsed().as_secs_f64())
}
