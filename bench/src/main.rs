//! `loopx-bench`: the benchmark of issue #4. It runs the release broker
//! binary on a temp data dir and a free port, drives it from clients in this
//! process, runs the same workloads against Redis Streams, a PostgreSQL table
//! queue and bare floors, and prints a table and one `BENCH_JSON ` line.
//! Figures are medians over `--runs` runs. The `replicas` section (issue #7)
//! runs broker replicas on the PostgreSQL peer's server.

mod floor;
mod loopx;
mod peers;
mod queue;
mod redis_http;
mod reference;
mod replicas;
mod report;
mod sys;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use crate::loopx::{Broker, LoopxQueue};
use crate::queue::Queue;
use crate::sys::{Result, TempDir};

/// Benchmarks the LoopX broker against Redis Streams, PostgreSQL and bare floors.
#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Option<Sub>,
    /// The CI smoke run: one run, tiny sizes, no peers, a few seconds.
    #[arg(long)]
    quick: bool,
    /// Runs to take medians over (default 3; 1 with --quick).
    #[arg(long)]
    runs: Option<usize>,
    /// Only these sections (default: all).
    #[arg(long, value_delimiter = ',', value_enum)]
    only: Vec<Section>,
    /// Peers to compare with: redis, postgres, or none (default: both; none with --quick).
    #[arg(long, value_delimiter = ',')]
    peers: Option<Vec<String>>,
    /// The broker binary [default: `loopx` beside this binary, i.e. target/release/loopx].
    #[arg(long)]
    loopx: Option<PathBuf>,
    /// Reference broker binaries (comma-separated) to compare the broker
    /// with: alternating rounds of every build at full durability, the wake
    /// and throughput sections only (`--only` narrows them), and each
    /// figure's ratio per round and median (`bench/reference.sh` builds
    /// round 1's reference and runs this).
    #[arg(long, value_delimiter = ',')]
    reference: Vec<PathBuf>,
    /// Rounds of the --reference comparison (default 5; 1 with --quick).
    #[arg(long)]
    rounds: Option<usize>,
}

#[derive(Subcommand)]
enum Sub {
    /// The bare axum long-poll floor server (run by the benchmark itself).
    #[command(hide = true)]
    FloorServer {
        #[arg(long)]
        listen: SocketAddr,
    },
    /// The axum-over-Redis-Streams peer server (run by the benchmark itself).
    #[command(hide = true)]
    RedisHttpServer {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long)]
        redis_url: String,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Section {
    Wake,
    Throughput,
    Parked,
    Depth,
    /// Broker replicas on PostgreSQL (needs the postgres peer).
    Replicas,
}

/// What one run measures, and how much.
pub struct Plan {
    pub quick: bool,
    pub runs: usize,
    pub wake: bool,
    pub throughput: bool,
    pub parked: bool,
    pub depth: bool,
    pub replicas: bool,
    pub redis: bool,
    pub postgres: bool,
    pub wake_turns: usize,
    /// Claims parked at once in the many-parked wake test.
    pub wake_parked: usize,
    pub tput_levels: Vec<usize>,
    pub tput_time: Duration,
    /// Sessions per throughput cell of the replicas section.
    pub replica_tput_levels: Vec<usize>,
    /// Untimed throughput before each replicas cell (fresh pools warm up).
    pub replica_tput_warmup: Duration,
    pub park_count: usize,
    pub park_window: Duration,
    pub depths: Vec<u64>,
    pub depth_cycles: usize,
    pub floor_samples: usize,
}

impl Plan {
    fn new(cli: &Cli) -> std::result::Result<Self, String> {
        let q = cli.quick;
        let has = |s| cli.only.is_empty() || cli.only.contains(&s);
        let peers = match &cli.peers {
            None if q => vec![],
            None => vec!["redis".into(), "postgres".into()],
            Some(p) => p.clone(),
        };
        for p in &peers {
            if !["redis", "postgres", "none"].contains(&p.as_str()) {
                return Err(format!("unknown peer `{p}`: use redis, postgres or none"));
            }
        }
        Ok(Self {
            quick: q,
            runs: cli.runs.unwrap_or(if q { 1 } else { 3 }).max(1),
            wake: has(Section::Wake),
            throughput: has(Section::Throughput),
            parked: has(Section::Parked),
            depth: has(Section::Depth),
            replicas: has(Section::Replicas),
            redis: peers.iter().any(|p| p == "redis"),
            postgres: peers.iter().any(|p| p == "postgres"),
            wake_turns: if q { 100 } else { 2_000 },
            wake_parked: if q { 10 } else { 100 },
            tput_levels: vec![1, 16, 128],
            tput_time: Duration::from_secs(if q { 1 } else { 10 }),
            replica_tput_levels: vec![16, 128],
            replica_tput_warmup: Duration::from_millis(if q { 200 } else { 1_000 }),
            park_count: if q { 200 } else { 10_000 },
            park_window: Duration::from_secs(if q { 2 } else { 30 }),
            depths: if q {
                vec![0, 1_000]
            } else {
                vec![0, 10_000, 1_000_000]
            },
            depth_cycles: if q { 100 } else { 2_000 },
            floor_samples: if q { 200 } else { 2_000 },
        })
    }

    /// Lanes one system needs for the wake and throughput tests.
    fn lanes(&self) -> usize {
        1 + self.wake_parked + self.tput_levels.iter().sum::<usize>()
    }
}

pub type Metrics = BTreeMap<String, f64>;

/// Peer name to why it was skipped.
pub type Skipped = BTreeMap<String, String>;

pub fn progress(what: &str) {
    eprintln!("[loopx-bench] {what}");
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let server = match &cli.command {
        Some(Sub::FloorServer { listen }) => Some(runtime.block_on(floor::serve(*listen))),
        Some(Sub::RedisHttpServer { listen, redis_url }) => {
            Some(runtime.block_on(redis_http::serve(*listen, redis_url)))
        }
        None => None,
    };
    if let Some(outcome) = server {
        return match outcome {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("loopx-bench server: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match runtime.block_on(bench(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loopx-bench: error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn bench(cli: Cli) -> Result<()> {
    let plan = Plan::new(&cli)?;
    let loopx = match &cli.loopx {
        Some(path) => path.clone(),
        None => std::env::current_exe()?.with_file_name("loopx"),
    };
    if !loopx.exists() {
        return Err(format!(
            "no broker binary at {}: run `cargo build --release -p loopx` first, or pass --loopx",
            loopx.display()
        )
        .into());
    }
    if !cli.reference.is_empty() {
        if let Some(missing) = cli.reference.iter().find(|path| !path.exists()) {
            return Err(format!("no reference broker binary at {}", missing.display()).into());
        }
        let rounds = cli.rounds.unwrap_or(if plan.quick { 1 } else { 5 }).max(1);
        return reference::compare(&plan, &loopx, &cli.reference, rounds).await;
    }
    let open_files = sys::raise_open_files(65_536);
    if plan.parked && (open_files as usize) < plan.park_count + 1_000 {
        progress(&format!(
            "warning: the open-files limit is {open_files}; parking {} claims may fail",
            plan.park_count
        ));
    }
    let load_at_start = sys::loadavg();
    let mut skipped = Skipped::new();
    let mut versions = BTreeMap::new();
    let postgres = if plan.postgres && (plan.wake || plan.throughput || plan.replicas) {
        progress("starting PostgreSQL (initdb, pg_ctl)");
        match peers::PgServer::start().await {
            Ok(server) => {
                versions.insert("postgres".to_owned(), server.version.clone());
                Some(server)
            }
            Err(e) => {
                skip(&mut skipped, "postgres", &sys::describe(&*e));
                None
            }
        }
    } else {
        None
    };
    if plan.replicas && postgres.is_none() {
        let why = if plan.postgres {
            "PostgreSQL did not start (see the postgres peer)"
        } else if plan.quick {
            "it needs the postgres peer, and --quick runs no peers"
        } else {
            "it needs the postgres peer (--peers postgres)"
        };
        skip(&mut skipped, "replicas section", why);
    } else if let Some(server) = &postgres
        && plan.replicas
    {
        for setting in ["synchronous_commit", "fsync", "max_connections"] {
            if let Ok(value) = server.setting(setting).await {
                versions.insert(format!("postgres.{setting}"), value);
            }
        }
    }
    let mut runs = Vec::new();
    let mut failed = Vec::new();
    for run in 0..plan.runs {
        progress(&format!("run {} of {}", run + 1, plan.runs));
        let mut metrics = Metrics::new();
        one_run(
            &plan,
            &loopx,
            postgres.as_ref(),
            &mut metrics,
            &mut skipped,
            &mut versions,
            &mut failed,
        )
        .await;
        runs.push(metrics);
    }
    drop(postgres);
    let metrics = report::medians(&runs);
    let mut machine = sys::machine();
    machine.load = format!("{load_at_start} at start, {} at end", machine.load);
    report::print(&plan, &machine, &versions, &skipped, &failed, &metrics);
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("{} section(s) failed: {}", failed.len(), failed.join("; ")).into())
    }
}

fn skip(skipped: &mut Skipped, peer: &str, why: &str) {
    progress(&format!("skipping {peer}: {why}"));
    skipped
        .entry(peer.to_owned())
        .or_insert_with(|| why.to_owned());
}

/// One run of every section. A section that fails is recorded in `failed`
/// and the run goes on, so one failure never loses the other figures.
async fn one_run(
    plan: &Plan,
    loopx: &Path,
    postgres: Option<&peers::PgServer>,
    m: &mut Metrics,
    skipped: &mut Skipped,
    versions: &mut BTreeMap<String, String>,
    failed: &mut Vec<String>,
) {
    let mut note = |what: &str, outcome: Result<()>| {
        if let Err(e) = outcome {
            let e = sys::describe(&*e);
            progress(&format!("FAILED {what}: {e}"));
            failed.push(format!("{what}: {e}"));
        }
    };
    if plan.wake || plan.throughput {
        for durability in ["full", "relaxed"] {
            let outcome = loopx_suite(plan, loopx, durability, m).await;
            note(&format!("loopx.{durability}"), outcome);
        }
        let outcome = async {
            let server = floor::FloorServer::start().await?;
            let q = Arc::new(floor::FloorQueue::new(&server)?);
            suite(plan, q, "axum_floor.none", None, m).await
        };
        note("axum_floor", outcome.await);
        if plan.redis && !skipped.contains_key("redis") {
            match redis_suites(plan, m).await {
                Ok(version) => {
                    versions.insert("redis".into(), version);
                }
                Err(e) => skip(skipped, "redis", &sys::describe(&*e)),
            }
        }
        if let Some(server) = postgres
            && !skipped.contains_key("postgres")
        {
            for (sync, name) in [(true, "sync_on"), (false, "sync_off")] {
                let outcome = async {
                    let q = Arc::new(server.queue(sync).await?);
                    suite(plan, q, &format!("postgres.{name}"), None, m).await
                };
                if let Err(e) = outcome.await {
                    skip(skipped, "postgres", &sys::describe(&*e));
                    break;
                }
            }
        }
    }
    if plan.replicas
        && let Some(server) = postgres
    {
        note("replicas", replicas::run(plan, loopx, server, m).await);
    }
    if plan.parked {
        note("parked", parked(plan, loopx, m).await);
    }
    if plan.depth {
        note("depth", depth(plan, loopx, m).await);
    }
    note("storage floors", storage_floors(plan, m).await);
}

/// The broker at one durability: a fresh process and data dir.
pub async fn loopx_suite(
    plan: &Plan,
    loopx: &Path,
    durability: &str,
    m: &mut Metrics,
) -> Result<()> {
    let dir = TempDir::new("loopx")?;
    let broker = Broker::start(loopx, dir.path(), durability).await?;
    let sessions = broker.create_sessions(plan.lanes()).await?;
    let q = Arc::new(LoopxQueue::new(&broker, sessions, 120)?);
    suite(plan, q, &format!("loopx.{durability}"), Some(broker.pid), m).await?;
    broker.stop().await;
    Ok(())
}

/// Wake latency (1 and many parked) and cycle throughput for one system;
/// with the broker's `pid`, also what each throughput cycle cost it
/// ([`cycle_cost`]).
async fn suite<Q: Queue>(
    plan: &Plan,
    q: Arc<Q>,
    name: &str,
    broker: Option<u32>,
    m: &mut Metrics,
) -> Result<()> {
    let mut next = 0;
    for parked in [1, plan.wake_parked] {
        let lanes = next..next + parked;
        next += parked;
        if !plan.wake {
            continue;
        }
        progress(&format!("{name}: wake latency, {parked} parked"));
        let mut samples = queue::wake_latency(q.clone(), lanes, plan.wake_turns).await?;
        let p = sys::percentiles(&mut samples);
        m.insert(format!("wake.{name}.{parked}.p50_us"), p.p50);
        m.insert(format!("wake.{name}.{parked}.p99_us"), p.p99);
        m.insert(format!("wake.{name}.{parked}.max_us"), p.max);
    }
    if plan.throughput {
        for &k in &plan.tput_levels {
            progress(&format!("{name}: throughput, {k} sessions"));
            let before = broker.map(sys::Usage::of).transpose()?;
            let rate = queue::throughput(q.clone(), next..next + k, plan.tput_time).await?;
            next += k;
            m.insert(format!("tput.{name}.{k}.cycles_per_s"), rate);
            if let (Some(pid), Some(before)) = (broker, before) {
                let cycles = rate * plan.tput_time.as_secs_f64();
                cycle_cost(
                    &before,
                    &sys::Usage::of(pid)?,
                    cycles,
                    &format!("{name}.{k}"),
                    m,
                );
            }
        }
    }
    Ok(())
}

/// The broker's work per cycle over a throughput cell (its warm-up
/// included, so a little over the true figure, alike for every build): CPU
/// microseconds by thread (`cost.<name>.<k>.<thread>_us`, the threads named
/// as [`report::BROKER_THREADS`] says) and for the whole broker
/// (`cost.<name>.<k>.broker_us`), and KiB handed to `write()` (WAL
/// frames and checkpoints).
fn cycle_cost(before: &sys::Usage, after: &sys::Usage, cycles: f64, key: &str, m: &mut Metrics) {
    if cycles <= 0.0 {
        return;
    }
    let us_per_tick = 1e6 / sys::clock_ticks_per_second() as f64;
    let mut by_label: BTreeMap<&str, u64> = BTreeMap::new();
    for (thread, ticks) in &after.ticks_by_thread {
        let spent = ticks.saturating_sub(before.ticks_by_thread.get(thread).copied().unwrap_or(0));
        *by_label.entry(report::thread_label(thread)).or_default() += spent;
    }
    let all: u64 = by_label.values().sum();
    for (label, ticks) in by_label {
        m.insert(
            format!("cost.{key}.{label}_us"),
            ticks as f64 * us_per_tick / cycles,
        );
    }
    // Every thread's together: a write may run on the writer's thread or on
    // its caller's (a tokio worker), so no one thread's figure is the cost.
    m.insert(
        format!("cost.{key}.broker_us"),
        all as f64 * us_per_tick / cycles,
    );
    let written = after.written_bytes.saturating_sub(before.written_bytes);
    m.insert(
        format!("cost.{key}.written_kib"),
        written as f64 / 1024.0 / cycles,
    );
}

async fn redis_suites(plan: &Plan, m: &mut Metrics) -> Result<String> {
    let server = peers::RedisServer::start().await?;
    for fsync in ["always", "everysec"] {
        let q = Arc::new(server.queue(fsync, plan.lanes(), fsync).await?);
        suite(plan, q, &format!("redis.{fsync}"), None, m).await?;
    }
    // The peer a user would build instead: axum over the same Redis, `always`.
    server.streams("http", plan.lanes(), "always").await?;
    let args = ["redis-http-server", "--redis-url", &server.url];
    let peer = floor::FloorServer::spawn("the axum-over-Redis peer", &args).await?;
    let q = Arc::new(redis_http::RedisHttpQueue::new(&peer, "http", 120)?);
    suite(plan, q, "redis_http.always", None, m).await?;
    Ok(server.version.clone())
}

/// Parked capacity: the broker, then the bare axum floor, each a fresh process.
async fn parked(plan: &Plan, loopx: &Path, m: &mut Metrics) -> Result<()> {
    let n = plan.park_count;
    progress(&format!("loopx.full: {n} sessions for the parked test"));
    let dir = TempDir::new("parked")?;
    let broker = Broker::start(loopx, dir.path(), "full").await?;
    let sessions = broker.create_sessions(n).await?;
    progress(&format!("loopx.full: parking {n} claims"));
    let q = Arc::new(LoopxQueue::new(&broker, sessions, 600)?);
    let p = queue::parked(q, broker.pid, 0..n, plan.park_window).await?;
    record_parked(m, "loopx", &p);
    broker.stop().await;

    progress(&format!("axum_floor: parking {n} requests"));
    let server = floor::FloorServer::start().await?;
    let q = Arc::new(floor::FloorQueue::new(&server)?);
    let p = queue::parked(q, server.pid, 0..n, plan.park_window).await?;
    record_parked(m, "axum_floor", &p);
    Ok(())
}

fn record_parked(m: &mut Metrics, name: &str, p: &queue::Parked) {
    m.insert(format!("parked.{name}.count"), p.count as f64);
    m.insert(
        format!("parked.{name}.rss_before_kib"),
        p.rss_before_kib as f64,
    );
    m.insert(
        format!("parked.{name}.rss_parked_kib"),
        p.rss_parked_kib as f64,
    );
    m.insert(
        format!("parked.{name}.bytes_per_claim"),
        p.bytes_per_claim(),
    );
    m.insert(format!("parked.{name}.cpu_ms"), p.cpu_ms);
    m.insert(format!("parked.{name}.retries"), p.retries as f64);
    m.insert(format!("parked.{name}.window_s"), p.window.as_secs_f64());
    m.insert(
        format!("parked.{name}.wake_all_ms"),
        p.wake_all.as_secs_f64() * 1e3,
    );
}

/// Claim latency with turns already stored in the session, filled straight
/// into the stopped broker's SQLite file.
async fn depth(plan: &Plan, loopx: &Path, m: &mut Metrics) -> Result<()> {
    for &stored in &plan.depths {
        let dir = TempDir::new("depth")?;
        let mut broker = Broker::start(loopx, dir.path(), "full").await?;
        let sessions = broker.create_sessions(1).await?;
        if stored > 0 {
            progress(&format!("depth: filling {stored} completed turns"));
            let db = broker.data_dir.join("broker.db");
            broker.stop().await;
            let took = loopx::fill_turns(&db, &sessions[0], stored).await?;
            m.insert(format!("depth.loopx.{stored}.fill_s"), took);
            broker = Broker::start(loopx, dir.path(), "full").await?;
        }
        progress(&format!("depth: claim latency with {stored} stored turns"));
        let q = Arc::new(LoopxQueue::new(&broker, sessions, 0)?);
        let (cycle, claim) = loopx::claim_latency(q, 0, 50, plan.depth_cycles).await?;
        m.insert(format!("depth.loopx.{stored}.cycle_p50_us"), cycle.p50);
        m.insert(format!("depth.loopx.{stored}.cycle_p99_us"), cycle.p99);
        m.insert(format!("depth.loopx.{stored}.claim_p50_us"), claim.p50);
        broker.stop().await;
    }
    Ok(())
}

pub async fn storage_floors(plan: &Plan, m: &mut Metrics) -> Result<()> {
    progress("floors: fdatasync and single-row SQLite commits");
    let dir = TempDir::new("floors")?;
    let n = plan.floor_samples;
    let f = floor::fsync(dir.path(), n).await?;
    m.insert("floor.fsync.p50_us".into(), f.p50);
    m.insert("floor.fsync.p99_us".into(), f.p99);
    for (full, name) in [(true, "full"), (false, "normal")] {
        let c = floor::sqlite_commit(dir.path(), full, n).await?;
        m.insert(format!("floor.sqlite.{name}.commit_p50_us"), c.p50);
        m.insert(format!("floor.sqlite.{name}.commit_p99_us"), c.p99);
    }
    Ok(())
}
