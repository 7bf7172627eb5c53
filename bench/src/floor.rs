//! The floors: what the broker's work costs at the least. A bare axum
//! long-poll server (`loopx-bench floor-server`, run as its own process so its
//! RSS is measured apart): a handler parked on a tokio `Notify`, woken by
//! another request, no store. And the storage floors: one fdatasync, and a
//! single-row SQLite commit (WAL) at synchronous=FULL and NORMAL.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path as UrlPath, State};
use axum::routing::{get, post};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::loopx::http_client;
use crate::queue::Queue;
use crate::sys::{self, Percentiles, Result};

/// Keys the floor server can park on (its lanes).
const KEYS: usize = 1 << 16;

type Keys = Arc<Vec<Notify>>;

/// Runs the floor server until killed.
pub async fn serve(listen: SocketAddr) -> Result<()> {
    let keys: Keys = Arc::new((0..KEYS).map(|_| Notify::new()).collect());
    let app = Router::new()
        .route("/wait/{key}", post(wait))
        .route("/wake/{key}", post(wake))
        .route("/done/{key}", post(done))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(keys);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    axum::serve(listener, app).await?;
    Ok(())
}

/// Parks until the key is woken (a wake before the wait is kept as a permit).
async fn wait(State(keys): State<Keys>, UrlPath(key): UrlPath<usize>) -> &'static str {
    if let Some(signal) = keys.get(key) {
        signal.notified().await;
    }
    "woken"
}

async fn wake(State(keys): State<Keys>, UrlPath(key): UrlPath<usize>) -> &'static str {
    if let Some(signal) = keys.get(key) {
        signal.notify_one();
    }
    "ok"
}

async fn done(UrlPath(_key): UrlPath<usize>) -> &'static str {
    "ok"
}

/// A server this binary runs as a child process (the floor server, the
/// axum-over-Redis peer), so its RSS and CPU are its own.
pub struct FloorServer {
    child: Child,
    pub pid: u32,
    pub base: String,
}

impl FloorServer {
    pub async fn start() -> Result<Self> {
        Self::spawn("the floor server", &["floor-server"]).await
    }

    /// Runs this binary with `args` and `--listen` on a free loopback port;
    /// answers once its `/healthz` does.
    pub async fn spawn(what: &str, args: &[&str]) -> Result<Self> {
        let port = sys::free_port()?;
        let child = Command::new(std::env::current_exe()?)
            .args(args)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()?;
        let mut server = Self {
            pid: child.id(),
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let http = http_client()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!("{what} exited ({status})").into());
            }
            let health = http.get(format!("{}/healthz", server.base)).send().await;
            if health.is_ok_and(|r| r.status().is_success()) {
                return Ok(server);
            }
            if Instant::now() > deadline {
                return Err(format!("{what} did not start within 10 s").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for FloorServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The floor server as a [`Queue`]: enqueue is a wake, claim a wait,
/// complete a no-op request; nothing is stored.
pub struct FloorQueue {
    http: reqwest::Client,
    base: String,
}

impl FloorQueue {
    pub fn new(server: &FloorServer) -> Result<Self> {
        Ok(Self {
            http: http_client()?,
            base: server.base.clone(),
        })
    }

    async fn post(&self, route: &str, key: usize) -> Result<()> {
        let response = self
            .http
            .post(format!("{}/{route}/{key}", self.base))
            .send()
            .await?;
        if !response.status().is_success() {
            return Err(format!("the floor server answered {}", response.status()).into());
        }
        response.bytes().await?;
        Ok(())
    }
}

impl Queue for FloorQueue {
    type Conn = ();
    type Token = ();

    async fn connect(&self, _listen: Option<usize>) -> Result<()> {
        Ok(())
    }

    async fn enqueue(&self, _: &mut (), lane: usize) -> Result<()> {
        self.post("wake", lane).await
    }

    async fn claim(&self, _: &mut (), lane: usize, _wait: bool) -> Result<Option<()>> {
        self.post("wait", lane).await.map(Some)
    }

    async fn complete(&self, _: &mut (), lane: usize, _: ()) -> Result<()> {
        self.post("done", lane).await
    }
}

/// Single-row autocommit inserts into a WAL SQLite file (sqlx, as the broker).
pub async fn sqlite_commit(dir: &Path, full: bool, commits: usize) -> Result<Percentiles> {
    use sqlx::Connection;
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
    let options = SqliteConnectOptions::new()
        .filename(dir.join(if full { "full.db" } else { "normal.db" }))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(if full {
            SqliteSynchronous::Full
        } else {
            SqliteSynchronous::Normal
        });
    let mut conn = sqlx::SqliteConnection::connect_with(&options).await?;
    sqlx::query("create table t (id integer primary key, v text not null)")
        .execute(&mut conn)
        .await?;
    let mut samples = Vec::with_capacity(commits);
    for i in 0..commits + 20 {
        let start = Instant::now();
        sqlx::query("insert into t (v) values ('hello')")
            .execute(&mut conn)
            .await?;
        if i >= 20 {
            samples.push(start.elapsed());
        }
    }
    conn.close().await?;
    Ok(sys::percentiles(&mut samples))
}

/// A 4 KiB overwrite plus fdatasync, as a commit's last step.
pub async fn fsync(dir: &Path, count: usize) -> Result<Percentiles> {
    let path = dir.join("fsync.bin");
    tokio::task::spawn_blocking(move || -> Result<Percentiles> {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)?;
        let block = [7u8; 4096];
        file.write_all_at(&block, 0)?;
        file.sync_all()?;
        let mut samples = Vec::with_capacity(count);
        for _ in 0..count {
            let start = std::time::Instant::now();
            file.write_all_at(&block, 0)?;
            file.sync_data()?;
            samples.push(start.elapsed());
        }
        Ok(sys::percentiles(&mut samples))
    })
    .await?
}
