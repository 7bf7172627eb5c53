//! The peers a user would pick instead of the broker, run on this machine
//! from Debian's packages: Redis Streams (XADD / XREADGROUP BLOCK / XACK,
//! append-only file) and a PostgreSQL table queue (FOR UPDATE SKIP LOCKED
//! with LISTEN/NOTIFY wake-ups, the pattern of River and Oban).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use redis::{AsyncConnectionConfig, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_postgres::{AsyncMessage, NoTls, Statement};

use crate::queue::Queue;
use crate::sys::{self, Result, TempDir};

// ---------------------------------------------------------------- Redis

pub struct RedisServer {
    child: Child,
    client: redis::Client,
    _dir: TempDir,
    pub version: String,
    /// `redis://127.0.0.1:<port>/`.
    pub url: String,
}

impl RedisServer {
    /// `redis-server` on a free loopback port, AOF on (`appendfsync always`).
    pub async fn start() -> Result<Self> {
        let version = Command::new("redis-server")
            .arg("--version")
            .output()
            .map_err(|e| {
                format!("redis-server not runnable ({e}); install Debian's redis-server")
            })?;
        let version = String::from_utf8_lossy(&version.stdout)
            .split_whitespace()
            .find_map(|w| w.strip_prefix("v="))
            .unwrap_or("unknown")
            .to_owned();
        let dir = TempDir::new("redis")?;
        let port = sys::free_port()?;
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(dir.path())
            .args(["--appendonly", "yes", "--appendfsync", "always"])
            .args(["--save", "", "--daemonize", "no", "--protected-mode", "yes"])
            .arg("--logfile")
            .arg(dir.path().join("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let url = format!("redis://127.0.0.1:{port}/");
        let client = redis::Client::open(url.as_str())?;
        let mut server = Self {
            child,
            client,
            _dir: dir,
            version,
            url,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!("redis-server exited ({status}) while starting").into());
            }
            if let Ok(mut conn) = server.connect().await
                && redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .is_ok()
            {
                return Ok(server);
            }
            if Instant::now() > deadline {
                return Err("redis-server did not answer PING within 10 s".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A connection of its own, without a response timeout (BLOCK 0 waits).
    async fn connect(&self) -> Result<redis::aio::MultiplexedConnection> {
        let config = AsyncConnectionConfig::new()
            .set_response_timeout(None)
            .set_connection_timeout(Some(Duration::from_secs(5)));
        Ok(self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?)
    }

    /// A queue whose lanes are streams `{prefix}:{lane}` with group `g`,
    /// under `appendfsync` `fsync` (`always` or `everysec`).
    pub async fn queue(&self, prefix: &str, lanes: usize, fsync: &str) -> Result<RedisQueue> {
        self.streams(prefix, lanes, fsync).await?;
        Ok(RedisQueue {
            client: self.client.clone(),
            prefix: prefix.to_owned(),
        })
    }

    /// Creates the streams `{prefix}:{lane}` with group `g`, and sets
    /// `appendfsync` to `fsync`.
    pub async fn streams(&self, prefix: &str, lanes: usize, fsync: &str) -> Result<()> {
        let mut conn = self.connect().await?;
        words(&["CONFIG", "SET", "appendfsync", fsync])
            .query_async::<()>(&mut conn)
            .await?;
        for lane in 0..lanes {
            words(&[
                "XGROUP",
                "CREATE",
                &format!("{prefix}:{lane}"),
                "g",
                "$",
                "MKSTREAM",
            ])
            .query_async::<()>(&mut conn)
            .await?;
        }
        Ok(())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct RedisQueue {
    client: redis::Client,
    prefix: String,
}

impl Queue for RedisQueue {
    type Conn = redis::aio::MultiplexedConnection;
    /// The entry id, for XACK.
    type Token = Vec<u8>;

    async fn connect(&self, _listen: Option<usize>) -> Result<Self::Conn> {
        let config = AsyncConnectionConfig::new().set_response_timeout(None);
        Ok(self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?)
    }

    async fn enqueue(&self, conn: &mut Self::Conn, lane: usize) -> Result<()> {
        words(&[
            "XADD",
            &format!("{}:{lane}", self.prefix),
            "*",
            "m",
            "hello",
        ])
        .query_async::<Value>(conn)
        .await?;
        Ok(())
    }

    async fn claim(
        &self,
        conn: &mut Self::Conn,
        lane: usize,
        wait: bool,
    ) -> Result<Option<Vec<u8>>> {
        let stream = format!("{}:{lane}", self.prefix);
        let cmd = read_group(&stream, wait.then_some(0));
        Ok(first_entry(cmd.query_async::<Value>(conn).await?).map(|(id, _)| id))
    }

    async fn complete(&self, conn: &mut Self::Conn, lane: usize, id: Vec<u8>) -> Result<()> {
        redis::cmd("XACK")
            .arg(format!("{}:{lane}", self.prefix))
            .arg("g")
            .arg(id)
            .query_async::<i64>(conn)
            .await?;
        Ok(())
    }
}

/// A command from its words.
fn words(words: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd(words[0]);
    for word in &words[1..] {
        cmd.arg(*word);
    }
    cmd
}

/// `XREADGROUP` of one new entry of `stream` for consumer `c` of group `g`;
/// with `block`, waits up to that many milliseconds (0: for ever).
pub fn read_group(stream: &str, block: Option<u64>) -> redis::Cmd {
    let mut cmd = words(&["XREADGROUP", "GROUP", "g", "c", "COUNT", "1"]);
    if let Some(ms) = block {
        cmd.arg("BLOCK").arg(ms);
    }
    cmd.arg("STREAMS").arg(stream).arg(">");
    cmd
}

/// The first entry of an XREADGROUP reply, its id and its fields, from
/// `[[stream, [[id, fields]]]]` (RESP2) or a map of stream to entries
/// (RESP3); none when the reply is nil or empty.
pub fn first_entry(reply: Value) -> Option<(Vec<u8>, Value)> {
    let entries = match reply {
        Value::Array(mut streams) if !streams.is_empty() => match streams.swap_remove(0) {
            Value::Array(mut pair) if pair.len() == 2 => pair.pop()?,
            _ => return None,
        },
        Value::Map(mut streams) if !streams.is_empty() => streams.swap_remove(0).1,
        _ => return None,
    };
    let Value::Array(mut entries) = entries else {
        return None;
    };
    if entries.is_empty() {
        return None;
    }
    match entries.swap_remove(0) {
        Value::Array(mut entry) if entry.len() == 2 => {
            let fields = entry.pop()?;
            match entry.pop()? {
                Value::BulkString(id) => Some((id, fields)),
                _ => None,
            }
        }
        _ => None,
    }
}

// ----------------------------------------------------------- PostgreSQL

pub struct PgServer {
    bin: PathBuf,
    dir: TempDir,
    port: u16,
    pub version: String,
}

/// Runs a PostgreSQL tool as the `postgres` user when we are root (initdb
/// refuses root), else as ourselves.
fn pg_tool(bin: &Path, tool: &str) -> Command {
    let program = bin.join(tool);
    if sys::uid() == Some(0) {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

fn run(mut command: Command, what: &str) -> Result<()> {
    let out = command.stdin(Stdio::null()).output()?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    Ok(())
}

impl PgServer {
    /// initdb into a temp folder, then pg_ctl start on a free loopback port
    /// with the unix socket in that folder; `LOOPX_BENCH_PG_OPTIONS` adds
    /// server options (e.g. `-c shared_preload_libraries=pg_stat_statements`,
    /// to profile the statements while a run goes on).
    pub async fn start() -> Result<Self> {
        let bin = ["15", "16", "17", "14"]
            .iter()
            .map(|v| PathBuf::from(format!("/usr/lib/postgresql/{v}/bin")))
            .find(|p| p.join("initdb").exists())
            .ok_or("no /usr/lib/postgresql/<version>/bin/initdb; install Debian's postgresql-15")?;
        let version = bin
            .parent()
            .and_then(|p| p.file_name())
            .map_or("unknown".into(), |v| v.to_string_lossy().into_owned());
        let dir = TempDir::new("postgres")?;
        if sys::uid() == Some(0) {
            let mut chown = Command::new("chown");
            chown.arg("postgres:postgres").arg(dir.path());
            run(chown, "chown postgres")?;
        }
        let data = dir.path().join("data");
        let mut initdb = pg_tool(&bin, "initdb");
        initdb.arg("-D").arg(&data).args([
            "--auth=trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--no-sync",
        ]);
        run(initdb, "initdb")?;
        let port = sys::free_port()?;
        let mut start = pg_tool(&bin, "pg_ctl");
        start
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(dir.path().join("postgres.log"))
            .args(["-w", "-t", "60", "-o"])
            .arg(format!(
                "-p {port} -k {} -c listen_addresses=127.0.0.1 -c max_connections=400 {}",
                dir.path().display(),
                std::env::var("LOOPX_BENCH_PG_OPTIONS").unwrap_or_default()
            ))
            .arg("start");
        run(start, "pg_ctl start")?;
        let server = Self {
            bin,
            dir,
            port,
            version,
        };
        let (client, _driver) = server.client(true).await?;
        client
            .batch_execute(
                "create table jobs (
                     id           bigserial primary key,
                     queue        integer not null,
                     state        text not null default 'available',
                     payload      text not null,
                     attempted_at timestamptz,
                     finished_at  timestamptz
                 );
                 create index jobs_fetch on jobs (queue, id) where state = 'available';",
            )
            .await?;
        Ok(server)
    }

    fn config(&self, synchronous_commit: bool) -> tokio_postgres::Config {
        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(self.port)
            .user("postgres")
            .dbname("postgres");
        if !synchronous_commit {
            config.options("-c synchronous_commit=off");
        }
        config
    }

    async fn client(
        &self,
        synchronous_commit: bool,
    ) -> Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>)> {
        let (client, connection) = self.config(synchronous_commit).connect(NoTls).await?;
        Ok((
            client,
            tokio::spawn(async move {
                let _ = connection.await;
            }),
        ))
    }

    /// Creates the empty database `name` (dropped first if a previous run
    /// left it); answers its URL for the broker's `--database-url`.
    pub async fn create_database(&self, name: &str) -> Result<String> {
        let (client, _driver) = self.client(true).await?;
        // Two statements, not one batch: a batch is one transaction, and
        // neither may run inside one.
        client
            .batch_execute(&format!("drop database if exists {name} with (force)"))
            .await?;
        client
            .batch_execute(&format!("create database {name}"))
            .await?;
        Ok(format!(
            "postgres://postgres@127.0.0.1:{}/{name}",
            self.port
        ))
    }

    /// Drops the database `name`, ending any connection still on it.
    pub async fn drop_database(&self, name: &str) -> Result<()> {
        let (client, _driver) = self.client(true).await?;
        client
            .batch_execute(&format!("drop database if exists {name} with (force)"))
            .await?;
        Ok(())
    }

    /// A server setting (`show name`), for the report's conditions.
    pub async fn setting(&self, name: &str) -> Result<String> {
        let (client, _driver) = self.client(true).await?;
        let row = client.query_one(&format!("show {name}"), &[]).await?;
        Ok(row.get(0))
    }

    /// A queue over the `jobs` table (emptied first) with
    /// `synchronous_commit` on or off.
    pub async fn queue(&self, synchronous_commit: bool) -> Result<PgQueue> {
        let (client, _driver) = self.client(true).await?;
        client.batch_execute("truncate jobs").await?;
        Ok(PgQueue {
            config: self.config(synchronous_commit),
        })
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let mut stop = pg_tool(&self.bin, "pg_ctl");
        stop.arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "fast", "-w", "stop"]);
        let _ = run(stop, "pg_ctl stop");
    }
}

pub struct PgQueue {
    config: tokio_postgres::Config,
}

pub struct PgConn {
    client: tokio_postgres::Client,
    notifications: mpsc::UnboundedReceiver<()>,
    enqueue: Statement,
    claim: Statement,
    complete: Statement,
}

impl Queue for PgQueue {
    type Conn = PgConn;
    /// The job id.
    type Token = i64;

    async fn connect(&self, listen: Option<usize>) -> Result<PgConn> {
        let (client, mut connection) = self.config.connect(NoTls).await?;
        let (tx, notifications) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(Ok(message)) =
                std::future::poll_fn(|cx| connection.poll_message(cx)).await
            {
                if let AsyncMessage::Notification(_) = message {
                    let _ = tx.send(());
                }
            }
        });
        if let Some(lane) = listen {
            client.batch_execute(&format!("listen q{lane}")).await?;
        }
        // The insert and its NOTIFY commit together; the notification is
        // delivered at commit.
        let enqueue = client
            .prepare(
                "with job as (insert into jobs (queue, payload) values ($1, 'hello') returning id)
                 select pg_notify($2, job.id::text) from job",
            )
            .await?;
        let claim = client
            .prepare(
                "update jobs set state = 'running', attempted_at = now()
                 where id = (select id from jobs where queue = $1 and state = 'available'
                             order by id limit 1 for update skip locked)
                 returning id",
            )
            .await?;
        let complete = client
            .prepare("update jobs set state = 'completed', finished_at = now() where id = $1")
            .await?;
        Ok(PgConn {
            client,
            notifications,
            enqueue,
            claim,
            complete,
        })
    }

    async fn enqueue(&self, conn: &mut PgConn, lane: usize) -> Result<()> {
        let channel = format!("q{lane}");
        conn.client
            .execute(&conn.enqueue, &[&(lane as i32), &channel])
            .await?;
        Ok(())
    }

    async fn claim(&self, conn: &mut PgConn, lane: usize, wait: bool) -> Result<Option<i64>> {
        loop {
            let row = conn
                .client
                .query_opt(&conn.claim, &[&(lane as i32)])
                .await?;
            if let Some(row) = row {
                return Ok(Some(row.get(0)));
            }
            if !wait {
                return Ok(None);
            }
            conn.notifications
                .recv()
                .await
                .ok_or("the PostgreSQL connection closed")?;
        }
    }

    async fn complete(&self, conn: &mut PgConn, _lane: usize, id: i64) -> Result<()> {
        conn.client.execute(&conn.complete, &[&id]).await?;
        Ok(())
    }
}
