//! Issue #7: several broker replicas on one PostgreSQL database. Each cell
//! (a topology at one size) gets a fresh database on the bench's PostgreSQL
//! server and fresh `loopx serve --database-url …` processes, each with a
//! data dir of its own and one shared owner token (`LOOPX_TOKEN`), and is
//! driven by the same wake and throughput drivers as every other system
//! (`queue.rs`), with each request routed to the replica the topology names.
//!
//! Topologies:
//! - `one`: one replica takes every request (the PostgreSQL baseline).
//! - `cross`: two replicas; claims (and completions) go to A, enqueues to B,
//!   so every wake-up crosses replicas (B's commit, its NOTIFY, A's listener).
//! - `two`: two replicas; lane `i`'s three requests all go to replica `i % 2`
//!   (half the lanes on each, as a load balancer with session affinity would).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::loopx::{Broker, LoopxQueue, Route};
use crate::peers::PgServer;
use crate::queue;
use crate::sys::{self, Result, TempDir};
use crate::{Metrics, Plan, progress};

/// Wake topologies: (name, route, replicas).
pub const WAKE: [(&str, Route, usize); 2] = [
    ("one", Route::One, 1),
    ("cross", Route::EnqueueElsewhere, 2),
];

/// Throughput topologies: (name, route, replicas).
pub const THROUGHPUT: [(&str, Route, usize); 3] = [
    ("one", Route::One, 1),
    ("two", Route::ByLane, 2),
    ("cross", Route::EnqueueElsewhere, 2),
];

/// Untimed turns before each wake cell (pool connections opened, statements
/// prepared), besides the one round every parked lane takes anyway.
pub const WAKE_WARMUP_TURNS: usize = 20;

/// Replicas on one fresh database, and the database's name.
struct Cluster<'a> {
    brokers: Vec<Broker>,
    database: String,
    server: &'a PgServer,
    dir: TempDir,
}

impl<'a> Cluster<'a> {
    async fn start(server: &'a PgServer, loopx: &Path, replicas: usize) -> Result<Self> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let database = format!("loopx_bench_{}_{n}", std::process::id());
        let url = server.create_database(&database).await?;
        let dir = TempDir::new("replicas")?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos();
        let token = format!("bench-replicas-{}-{n}-{nanos}", std::process::id());
        let mut cluster = Cluster {
            brokers: Vec::new(),
            database,
            server,
            dir,
        };
        // One after the other: the first applies the migrations.
        for i in 0..replicas {
            let own = cluster.dir.path().join(format!("replica{i}"));
            std::fs::create_dir_all(&own)?;
            let broker = Broker::start_pg(loopx, &own, &url, &token).await?;
            cluster.brokers.push(broker);
        }
        Ok(cluster)
    }

    fn queue(&self, route: Route, sessions: Vec<String>, wait: u64) -> Result<LoopxQueue> {
        let brokers: Vec<&Broker> = self.brokers.iter().collect();
        LoopxQueue::routed(&brokers, route, sessions, wait)
    }

    /// Warnings and errors the replicas logged so far (first few shown).
    fn log_problems(&self, cell: &str) -> usize {
        let mut count = 0;
        for (i, broker) in self.brokers.iter().enumerate() {
            let text = std::fs::read_to_string(&broker.log_path).unwrap_or_default();
            for line in text.lines().filter(|l| is_problem(l)) {
                if count < 5 {
                    progress(&format!("{cell}: replica {i} logged: {}", line.trim()));
                }
                count += 1;
            }
        }
        count
    }

    /// The replicas' log tails, for an error message.
    fn log_tails(&self) -> String {
        self.brokers
            .iter()
            .enumerate()
            .map(|(i, b)| format!("replica {i} log:\n{}", sys::log_tail(&b.log_path)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    async fn stop(self) -> Result<()> {
        for broker in self.brokers {
            broker.stop().await;
        }
        self.server.drop_database(&self.database).await
    }
}

/// A tracing line at WARN or ERROR (ANSI colour codes and all).
fn is_problem(line: &str) -> bool {
    line.split_whitespace()
        .take(3)
        .any(|w| w.contains("WARN") || w.contains("ERROR"))
}

/// Runs `measure` on a fresh cluster; on failure the replicas' logs are added
/// to the error. Answers the measurement and the warnings/errors logged.
async fn cell<T, F, Fut>(
    server: &PgServer,
    loopx: &Path,
    replicas: usize,
    sessions: usize,
    route: Route,
    name: &str,
    measure: F,
) -> Result<(T, usize)>
where
    F: FnOnce(Arc<LoopxQueue>) -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let cluster = Cluster::start(server, loopx, replicas).await?;
    let outcome = async {
        let sessions = cluster.brokers[0].create_sessions(sessions).await?;
        let q = Arc::new(cluster.queue(route, sessions, 120)?);
        measure(q).await
    }
    .await;
    let problems = cluster.log_problems(name);
    match outcome {
        Ok(value) => {
            cluster.stop().await?;
            Ok((value, problems))
        }
        Err(e) => {
            let tails = cluster.log_tails();
            let _ = cluster.stop().await;
            Err(format!("{}\n{tails}", sys::describe(&*e)).into())
        }
    }
}

/// Every replica measurement of one run, each cell on a fresh database.
pub async fn run(plan: &Plan, loopx: &Path, server: &PgServer, m: &mut Metrics) -> Result<()> {
    let mut problems = 0;
    for (topology, route, replicas) in WAKE {
        for parked in [1, plan.wake_parked] {
            let name = format!("replicas.{topology}");
            progress(&format!(
                "{name}: wake latency on PostgreSQL, {replicas} replica(s), {parked} parked"
            ));
            let turns = plan.wake_turns;
            let (mut samples, logged) = cell(
                server,
                loopx,
                replicas,
                parked,
                route,
                &name,
                |q| async move {
                    queue::wake_latency(q.clone(), 0..parked, WAKE_WARMUP_TURNS).await?;
                    queue::wake_latency(q, 0..parked, turns).await
                },
            )
            .await?;
            problems += logged;
            let slow = samples
                .iter()
                .filter(|d| **d > Duration::from_secs(1))
                .count();
            let p = sys::percentiles(&mut samples);
            let key = |stat: &str| format!("replicas.wake.{topology}.{parked}.{stat}");
            m.insert(key("p50_us"), p.p50);
            m.insert(key("p99_us"), p.p99);
            m.insert(key("max_us"), p.max);
            m.insert(key("over_1s"), slow as f64);
        }
    }
    for (topology, route, replicas) in THROUGHPUT {
        for &k in &plan.replica_tput_levels {
            let name = format!("replicas.{topology}");
            progress(&format!(
                "{name}: throughput on PostgreSQL, {replicas} replica(s), {k} sessions"
            ));
            let (warmup, time) = (plan.replica_tput_warmup, plan.tput_time);
            let (rate, logged) = cell(server, loopx, replicas, k, route, &name, |q| async move {
                queue::throughput(q.clone(), 0..k, warmup).await?;
                queue::throughput(q, 0..k, time).await
            })
            .await?;
            problems += logged;
            m.insert(format!("replicas.tput.{topology}.{k}.cycles_per_s"), rate);
        }
    }
    m.insert("replicas.log_warnings_errors".into(), problems as f64);
    Ok(())
}
