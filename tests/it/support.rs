//! Shared helpers: start a broker in-process or as the real binary, and set up
//! registered, bound sessions.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use loopx::broker::Broker;
use loopx::client::{Client, ClientError, TypedReply};
use loopx::lark::LarkConfig;
use loopx::model::{
    BindRequest, ClaimAnswer, ClaimRequest, Claimed, CompleteRequest, EnqueueRequest, Enqueued,
    Origin, RegisterAgentThread, Session,
};
use loopx::serve;
use loopx::store::sqlite::Durability;
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const TOKEN: &str = "test-owner-token-0123456789abcdef";
pub const HOST_SURFACE: &str = "codex-cli";

/// A broker served in this process on 127.0.0.1:0 over a temporary data dir:
/// its SQLite store there, or, when `LOOPX_TEST_DATABASE_URL` names a
/// PostgreSQL server, a PostgreSQL store on a fresh database of its own.
/// `loopx serve`'s own wiring builds it ([`serve::App`]).
pub struct TestBroker {
    pub url: String,
    pub client: Client,
    pub dir: tempfile::TempDir,
    pub shutdown: CancellationToken,
    pub server: Option<JoinHandle<std::io::Result<()>>>,
    /// The broker's PostgreSQL database, dropped with it.
    pub database: Option<TestDatabase>,
    /// The broker core, for what the HTTP API does not reach (its store).
    pub broker: Arc<Broker>,
}

/// The admin URL of the PostgreSQL server the suite runs against
/// (`LOOPX_TEST_DATABASE_URL`, e.g. postgres://postgres@127.0.0.1:5432/postgres),
/// if any.
pub fn test_database_admin_url() -> Option<String> {
    std::env::var("LOOPX_TEST_DATABASE_URL")
        .ok()
        .filter(|url| !url.trim().is_empty())
}

/// A fresh, empty database on the test PostgreSQL server, dropped (best
/// effort, with whatever is still connected to it) when this goes.
pub struct TestDatabase {
    pub url: String,
    admin_url: String,
    name: String,
}

impl TestDatabase {
    /// `None` when the suite runs on SQLite (`LOOPX_TEST_DATABASE_URL` unset).
    pub async fn create() -> Option<TestDatabase> {
        use sqlx::Connection;
        let admin_url = test_database_admin_url()?;
        let name = format!(
            "loopx_test_{}",
            ulid::Ulid::new().to_string().to_lowercase()
        );
        let mut admin = sqlx::PgConnection::connect(&admin_url)
            .await
            .expect("LOOPX_TEST_DATABASE_URL reaches a PostgreSQL server");
        sqlx::query(&format!("create database {name}"))
            .execute(&mut admin)
            .await
            .unwrap();
        let _ = admin.close().await;
        let mut url = url::Url::parse(&admin_url).expect("LOOPX_TEST_DATABASE_URL is a URL");
        url.set_path(&format!("/{name}"));
        Some(TestDatabase {
            url: url.to_string(),
            admin_url,
            name,
        })
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let (admin_url, name) = (self.admin_url.clone(), self.name.clone());
        // Its own thread and runtime: this may run inside a test's runtime.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                use sqlx::Connection;
                if let Ok(mut admin) = sqlx::PgConnection::connect(&admin_url).await {
                    let sql = format!("drop database if exists {name} with (force)");
                    let _ = sqlx::query(&sql).execute(&mut admin).await;
                    let _ = admin.close().await;
                }
            });
        });
        let _ = dropped.join();
    }
}

impl TestBroker {
    pub async fn start() -> Self {
        Self::start_with(Durability::Relaxed, Duration::from_secs(15)).await
    }

    pub async fn start_with(durability: Durability, keep_alive: Duration) -> Self {
        Self::start_full(durability, keep_alive, None, None).await
    }

    /// A broker that releases the turn of a holder silent for `silence`.
    pub async fn start_holder_silence(silence: Duration) -> Self {
        Self::start_full(
            Durability::Relaxed,
            Duration::from_secs(15),
            None,
            Some(silence),
        )
        .await
    }

    /// A broker with the Lark connector on and its reply dispatcher running.
    pub async fn start_lark(config: LarkConfig) -> Self {
        Self::start_full(
            Durability::Relaxed,
            Duration::from_secs(15),
            Some(config),
            None,
        )
        .await
    }

    async fn start_full(
        durability: Durability,
        keep_alive: Duration,
        lark: Option<LarkConfig>,
        holder_silence: Option<Duration>,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let database = TestDatabase::create().await;
        let database_url = database.as_ref().map(|database| database.url.as_str());
        let store = serve::open_store(dir.path(), database_url, durability)
            .await
            .unwrap();
        let shutdown = CancellationToken::new();
        let app = serve::App::new(
            serve::AppConfig {
                keep_alive,
                lark,
                holder_silence: holder_silence.unwrap_or(loopx::broker::DEFAULT_HOLDER_SILENCE),
                ..serve::AppConfig::new(store, TOKEN.into())
            },
            shutdown.clone(),
        );
        let broker = app.broker().clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(app.serve(listener));
        TestBroker {
            client: Client::new(&url, Some(TOKEN.into())),
            url,
            dir,
            shutdown,
            server: Some(server),
            database,
            broker,
        }
    }

    /// Runs `sql` on the broker's store behind its back (what the API
    /// cannot do: move an expiry into the past).
    pub async fn execute_sql(&self, sql: &str) {
        match &self.database {
            Some(database) => {
                let db = sqlx::PgPool::connect(&database.url).await.unwrap();
                sqlx::query(sql).execute(&db).await.unwrap();
            }
            None => {
                let url = format!("sqlite://{}", self.dir.path().join("broker.db").display());
                let db = sqlx::SqlitePool::connect(&url).await.unwrap();
                sqlx::query(sql).execute(&db).await.unwrap();
            }
        }
    }

    /// A client with another (or no) token.
    pub fn client_with_token(&self, token: Option<&str>) -> Client {
        Client::new(&self.url, token.map(str::to_owned))
    }

    /// Stops the broker and starts it again on the same store (data dir or
    /// database), with the Lark connector configured as `lark`.
    pub async fn restart(&mut self, lark: Option<LarkConfig>) {
        self.stop().await;
        let database_url = self.database.as_ref().map(|database| database.url.as_str());
        let store = serve::open_store(self.dir.path(), database_url, Durability::Relaxed)
            .await
            .unwrap();
        self.shutdown = CancellationToken::new();
        let app = serve::App::new(
            serve::AppConfig {
                lark,
                ..serve::AppConfig::new(store, TOKEN.into())
            },
            self.shutdown.clone(),
        );
        self.broker = app.broker().clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        self.url = format!("http://{}", listener.local_addr().unwrap());
        self.client = Client::new(&self.url, Some(TOKEN.into()));
        self.server = Some(tokio::spawn(app.serve(listener)));
    }

    /// Stops the server and waits until it has finished.
    pub async fn stop(&mut self) {
        self.shutdown.cancel();
        if let Some(server) = self.server.take() {
            tokio::time::timeout(Duration::from_secs(10), server)
                .await
                .expect("the server stops within 10 s")
                .unwrap()
                .unwrap();
        }
    }
}

/// A host session: its identity and the session bound to it.
#[derive(Clone)]
pub struct Host {
    pub goal_id: String,
    pub agent_id: String,
    pub host_session_id: String,
    pub session: Session,
}

impl Host {
    pub fn session_id(&self) -> &str {
        &self.session.session_id
    }

    pub fn claim_request(&self, claim_id: &str, wait_seconds: u64) -> ClaimRequest {
        ClaimRequest {
            host_surface: HOST_SURFACE.into(),
            host_session_id: self.host_session_id.clone(),
            claim_id: claim_id.into(),
            wait_seconds,
        }
    }

    pub fn completion(
        &self,
        claim_id: &str,
        completion_id: &str,
        message: &str,
    ) -> CompleteRequest {
        CompleteRequest {
            host_surface: HOST_SURFACE.into(),
            host_session_id: self.host_session_id.clone(),
            claim_id: claim_id.into(),
            completion_id: completion_id.into(),
            response: json!({"message": message}).as_object().unwrap().clone(),
        }
    }
}

/// A unique suffix for ids in one test.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", ulid::Ulid::new())
}

pub fn thread(goal_id: &str, agent_id: &str, host_session_id: &str) -> RegisterAgentThread {
    RegisterAgentThread {
        goal_id: goal_id.into(),
        agent_id: agent_id.into(),
        host_surface: HOST_SURFACE.into(),
        host_session_id: host_session_id.into(),
    }
}

pub fn bind_request(goal_id: &str, agent_id: &str, host_session_id: &str) -> BindRequest {
    BindRequest {
        goal_id: goal_id.into(),
        agent_id: agent_id.into(),
        host_surface: HOST_SURFACE.into(),
        host_session_id: host_session_id.into(),
        executor_endpoint_id: "exec-laptop".into(),
        terminal: None,
        dry_run: false,
    }
}

/// Registers and binds a fresh host session.
pub async fn bound_host(client: &Client) -> Host {
    let (goal_id, agent_id, host_session_id) =
        (unique("goal"), unique("agent"), unique("host-secret"));
    client
        .register(&thread(&goal_id, &agent_id, &host_session_id))
        .await
        .unwrap();
    let session = client
        .bind(&bind_request(&goal_id, &agent_id, &host_session_id))
        .await
        .unwrap()
        .body;
    Host {
        goal_id,
        agent_id,
        host_session_id,
        session,
    }
}

pub fn web(text: &str) -> EnqueueRequest {
    EnqueueRequest {
        attachments: Vec::new(),
        origin: Origin::Web,
        text: text.into(),
        client_message_id: None,
        ingress: Default::default(),
        lark: None,
    }
}

pub async fn enqueue(client: &Client, host: &Host, text: &str) -> Enqueued {
    client
        .enqueue(host.session_id(), &web(text))
        .await
        .unwrap()
        .body
}

/// Every turn of the host's session, page by page, in seq order.
pub async fn all_turns(client: &Client, host: &Host) -> Vec<loopx::model::Turn> {
    let mut turns = Vec::new();
    let mut after = 0;
    loop {
        let page = client
            .turns(
                host.session_id(),
                &loopx::model::ListTurns {
                    after_seq: Some(after),
                    limit: Some(200),
                    ..Default::default()
                },
            )
            .await
            .unwrap()
            .body;
        after = page.turns.last().map_or(after, |t| t.seq);
        turns.extend(page.turns);
        if !page.has_more {
            return turns;
        }
    }
}

/// Claims and expects a turn.
pub async fn claim(client: &Client, host: &Host, claim_id: &str, wait: u64) -> Claimed {
    match client
        .claim(host.session_id(), &host.claim_request(claim_id, wait))
        .await
        .unwrap()
        .body
    {
        ClaimAnswer::Claimed(claimed) => claimed,
        other => panic!("expected a claimed turn, got {other:?}"),
    }
}

/// The error code of a refused call.
pub fn code<T: std::fmt::Debug>(result: Result<TypedReply<T>, ClientError>) -> (u16, String) {
    match result {
        Err(ClientError::Refused { reply, error }) => {
            (reply.status.as_u16(), error.error.code_str())
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The real `loopx` binary, serving a data dir.
pub struct Spawned {
    pub child: tokio::process::Child,
    pub url: String,
    pub client: Client,
    pub data_dir: PathBuf,
    pub stderr_log: PathBuf,
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn loopx() -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_loopx"));
    command
        .env_remove("LOOPX_TOKEN")
        .env_remove("LOOPX_DATA_DIR")
        .env_remove("LOOPX_DATABASE_URL")
        .env_remove("CLAUDE_PROJECT_DIR");
    command
}

impl Spawned {
    /// Starts `loopx serve` on a free port and waits until it answers.
    pub async fn start(data_dir: &Path, extra: &[&str]) -> Spawned {
        Self::start_env(data_dir, extra, &[]).await
    }

    /// As [`Spawned::start`], with more environment for the child. With
    /// `LOOPX_TOKEN` among it, that is the client's token (replicas share
    /// one); else the data dir's `owner.token`. Replicas also pass
    /// `--database-url` in `extra`.
    pub async fn start_env(data_dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Spawned {
        Self::start_command(loopx(), data_dir, extra, env).await
    }

    /// As [`Spawned::start`], from a shell that set the soft open-file limit
    /// to `soft` first (as a default login shell does).
    pub async fn start_under_ulimit(data_dir: &Path, soft: u64, extra: &[&str]) -> Spawned {
        let mut command = tokio::process::Command::new("sh");
        command
            .arg("-c")
            .arg(format!("ulimit -Sn {soft} && exec \"$0\" \"$@\""))
            .arg(env!("CARGO_BIN_EXE_loopx"))
            .env_remove("LOOPX_TOKEN")
            .env_remove("LOOPX_DATA_DIR")
            .env_remove("LOOPX_DATABASE_URL");
        Self::start_command(command, data_dir, extra, &[]).await
    }

    async fn start_command(
        mut command: tokio::process::Command,
        data_dir: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Spawned {
        let port = free_port();
        let url = format!("http://127.0.0.1:{port}");
        let stderr_log = data_dir.with_extension(format!("{port}.log"));
        let log = std::fs::File::create(&stderr_log).unwrap();
        let child = command
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--data-dir",
            ])
            .arg(data_dir)
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let anonymous = Client::new(&url, None);
        for _ in 0..200 {
            if anonymous.healthz().await.is_ok() {
                let token = match env.iter().find(|(name, _)| *name == "LOOPX_TOKEN") {
                    Some((_, token)) => token.to_string(),
                    None => std::fs::read_to_string(data_dir.join("owner.token")).unwrap(),
                };
                return Spawned {
                    child,
                    client: Client::new(&url, Some(token.trim().to_owned())),
                    url,
                    data_dir: data_dir.to_owned(),
                    stderr_log,
                };
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "loopx serve did not start: {}",
            std::fs::read_to_string(&stderr_log).unwrap_or_default()
        );
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.stderr_log).unwrap_or_default()
    }

    /// SIGTERM, then the exit status.
    pub async fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().unwrap() as i32;
        std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .expect("the broker exits within 10 s of SIGTERM")
            .unwrap()
    }

    /// SIGKILL: no chance to flush anything.
    pub async fn kill9(mut self) {
        self.child.start_kill().unwrap();
        self.child.wait().await.unwrap();
    }
}
