//! The report: medians over runs, the human tables (Markdown, so they paste
//! into BENCHMARKS.md), the ratios, the issue's targets, and one
//! `BENCH_JSON ` line.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::sys::{self, Machine};
use crate::{Metrics, Plan, Skipped};

/// Each metric's median over the runs that measured it.
pub fn medians(runs: &[Metrics]) -> Metrics {
    let mut all: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for run in runs {
        for (key, value) in run {
            all.entry(key.clone()).or_default().push(*value);
        }
    }
    all.into_iter()
        .map(|(key, mut values)| (key, sys::median(&mut values)))
        .collect()
}

/// Every system and durability, how the table names them, and the broker
/// durability it is compared with (like with like).
const SYSTEMS: [(&str, &str, &str, &str); 8] = [
    (
        "loopx.full",
        "loopx broker",
        "full: SQLite WAL, each commit fdatasync'd before it is answered",
        "",
    ),
    (
        "loopx.relaxed",
        "loopx broker",
        "relaxed: synchronous=NORMAL",
        "",
    ),
    (
        "redis.always",
        "Redis Streams",
        "AOF appendfsync always",
        "loopx.full",
    ),
    (
        "redis.everysec",
        "Redis Streams",
        "AOF appendfsync everysec",
        "loopx.relaxed",
    ),
    (
        "redis_http.always",
        "axum over Redis Streams (peer: same 3 HTTP requests)",
        "AOF appendfsync always",
        "loopx.full",
    ),
    (
        "postgres.sync_on",
        "PostgreSQL SKIP LOCKED + LISTEN/NOTIFY",
        "synchronous_commit=on",
        "loopx.full",
    ),
    (
        "postgres.sync_off",
        "PostgreSQL SKIP LOCKED + LISTEN/NOTIFY",
        "synchronous_commit=off",
        "loopx.relaxed",
    ),
    (
        "axum_floor.none",
        "bare axum long-poll (floor)",
        "no store",
        "loopx.full",
    ),
];

struct Report<'a> {
    m: &'a Metrics,
    out: String,
    ratios: BTreeMap<String, f64>,
}

impl Report<'_> {
    fn get(&self, key: &str) -> Option<f64> {
        self.m.get(key).copied().filter(|v| v.is_finite())
    }

    fn line(&mut self, text: &str) {
        self.out.push_str(text);
        self.out.push('\n');
    }

    /// `a ÷ b` as a ratio cell, remembered under `name`.
    fn ratio(&mut self, name: String, a: Option<f64>, b: Option<f64>) -> String {
        match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => {
                let r = a / b;
                self.ratios.insert(name, r);
                format!("{r:.2}x")
            }
            _ => "–".into(),
        }
    }
}

pub fn num(v: Option<f64>) -> String {
    match v {
        None => "–".into(),
        Some(v) if v.abs() >= 100.0 => format!("{v:.0}"),
        Some(v) if v.abs() >= 10.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.2}"),
    }
}

pub fn print(
    plan: &Plan,
    machine: &Machine,
    versions: &BTreeMap<String, String>,
    skipped: &Skipped,
    failed: &[String],
    m: &Metrics,
) {
    let mut r = Report {
        m,
        out: String::new(),
        ratios: BTreeMap::new(),
    };
    r.line(&format!(
        "## loopx-bench{}: median of {} run(s)\n",
        if plan.quick { " --quick" } else { "" },
        plan.runs
    ));
    r.line(&format!(
        "Machine: {} cores ({}), {:.1} GiB RAM, Linux {}, temp dir on {}. Clients, broker and peers share these cores.",
        machine.cores, machine.cpu_model, machine.mem_gib, machine.kernel, machine.tmp_fs
    ));
    r.line(&format!("Load average (1, 5, 15 min): {}.", machine.load));
    for (peer, why) in skipped {
        r.line(&format!("Skipped {peer}: {why}"));
    }
    for failure in failed {
        r.line(&format!("FAILED: {failure}"));
    }
    r.line("");
    wake_table(&mut r, plan);
    throughput_table(&mut r, plan);
    cost_table(&mut r, plan);
    parked_table(&mut r, plan);
    depth_table(&mut r, plan);
    floors_table(&mut r);
    let targets = targets(&mut r, plan);
    let replica_targets = replicas_table(&mut r, plan, versions);
    print!("{}", r.out);

    let json = json!({
        "quick": plan.quick,
        "runs": plan.runs,
        "machine": {
            "cores": machine.cores,
            "cpu": machine.cpu_model,
            "mem_gib": (machine.mem_gib * 10.0).round() / 10.0,
            "kernel": machine.kernel,
            "tmp_fs": machine.tmp_fs,
            "loadavg": machine.load,
        },
        "sizes": {
            "wake_turns": plan.wake_turns,
            "wake_parked": plan.wake_parked,
            "throughput_seconds": plan.tput_time.as_secs_f64(),
            "parked": plan.park_count,
            "parked_window_seconds": plan.park_window.as_secs_f64(),
            "depths": plan.depths,
        },
        "durability": {
            "loopx.full": "SQLite WAL, each commit fdatasync'd before it is answered (default, power-loss safe)",
            "loopx.relaxed": "SQLite WAL synchronous=NORMAL (--durability relaxed)",
            "redis.always": "appendonly yes, appendfsync always",
            "redis.everysec": "appendonly yes, appendfsync everysec",
            "redis_http.always": "axum over Redis Streams, appendonly yes, appendfsync always",
            "postgres.sync_on": "synchronous_commit=on, fsync=on",
            "postgres.sync_off": "synchronous_commit=off",
            "replicas": "the PostgreSQL server's: synchronous_commit=on, fsync=on",
        },
        "versions": versions,
        "skipped": skipped,
        "failed": failed,
        "metrics": m,
        "ratios": r.ratios,
        "targets": targets,
        "replicas": {
            "sizes": {
                "wake_turns": plan.wake_turns,
                "wake_warmup_turns": crate::replicas::WAKE_WARMUP_TURNS,
                "wake_parked": [1, plan.wake_parked],
                "throughput_sessions": plan.replica_tput_levels,
                "throughput_seconds": plan.tput_time.as_secs_f64(),
                "throughput_warmup_seconds": plan.replica_tput_warmup.as_secs_f64(),
            },
            "topologies": {
                "one": "one replica takes every request",
                "cross": "two replicas: claim and complete through A, enqueue through B",
                "two": "two replicas: lane i's requests all through replica i % 2",
            },
            "targets": replica_targets,
        },
    });
    println!("BENCH_JSON {json}");
}

fn wake_table(r: &mut Report, plan: &Plan) {
    if !plan.wake {
        return;
    }
    let n = plan.wake_parked;
    r.line("### Wake latency (µs): enqueue request start → parked claim's answer\n");
    r.line(&format!(
        "{} turns per row. With {n} parked, every lane has a claim parked and turns go to one lane at a time, round robin; each turn is completed before its lane parks again.\n",
        plan.wake_turns
    ));
    r.line(
        "| system | durability | parked | p50 | p99 | max | loopx p50 ÷ this | loopx p99 ÷ this |",
    );
    r.line("|---|---|---:|---:|---:|---:|---:|---:|");
    for (key, system, durability, versus) in SYSTEMS {
        for parked in [1, n] {
            let k = |stat: &str| format!("wake.{key}.{parked}.{stat}_us");
            let p50 = r.get(&k("p50"));
            if p50.is_none() {
                continue;
            }
            let (p99, max) = (r.get(&k("p99")), r.get(&k("max")));
            let (r50, r99) = if versus.is_empty() {
                ("–".into(), "–".into())
            } else {
                let v = |stat: &str| r.get(&format!("wake.{versus}.{parked}.{stat}_us"));
                let (v50, v99) = (v("p50"), v("p99"));
                (
                    r.ratio(format!("wake.{parked}.p50.{versus}/{key}"), v50, p50),
                    r.ratio(format!("wake.{parked}.p99.{versus}/{key}"), v99, p99),
                )
            };
            r.line(&format!(
                "| {system} | {durability} | {parked} | {} | {} | {} | {r50} | {r99} |",
                num(p50),
                num(p99),
                num(max)
            ));
        }
    }
    // The relaxed broker against the floor too.
    for parked in [1, n] {
        let a = r.get(&format!("wake.loopx.relaxed.{parked}.p50_us"));
        let b = r.get(&format!("wake.axum_floor.none.{parked}.p50_us"));
        r.ratio(
            format!("wake.{parked}.p50.loopx.relaxed/axum_floor.none"),
            a,
            b,
        );
    }
    r.line("");
}

fn throughput_table(r: &mut Report, plan: &Plan) {
    if !plan.throughput {
        return;
    }
    let levels = &plan.tput_levels;
    r.line(&format!(
        "### Turn throughput (full cycles per second; enqueue, claim, complete as three requests; {} s per cell)\n",
        plan.tput_time.as_secs_f64()
    ));
    let heads: Vec<String> = levels.iter().map(|k| format!("{k} sessions")).collect();
    let ratio_heads: Vec<String> = levels
        .iter()
        .map(|k| format!("loopx ÷ this @{k}"))
        .collect();
    r.line(&format!(
        "| system | durability | {} | {} |",
        heads.join(" | "),
        ratio_heads.join(" | ")
    ));
    r.line(&format!("|---|---|{}", "---:|".repeat(levels.len() * 2)));
    for (key, system, durability, versus) in SYSTEMS {
        let rates: Vec<Option<f64>> = levels
            .iter()
            .map(|k| r.get(&format!("tput.{key}.{k}.cycles_per_s")))
            .collect();
        if rates.iter().all(Option::is_none) {
            continue;
        }
        let system = if key == "axum_floor.none" {
            "bare axum (floor: 3 requests per cycle, no store)"
        } else {
            system
        };
        let ratios: Vec<String> = levels
            .iter()
            .zip(&rates)
            .map(|(k, rate)| {
                if versus.is_empty() {
                    "–".into()
                } else {
                    let v = r.get(&format!("tput.{versus}.{k}.cycles_per_s"));
                    r.ratio(format!("tput.{k}.{versus}/{key}"), v, *rate)
                }
            })
            .collect();
        let cells: Vec<String> = rates.iter().map(|v| num(*v)).collect();
        r.line(&format!(
            "| {system} | {durability} | {} | {} |",
            cells.join(" | "),
            ratios.join(" | ")
        ));
    }
    // Storage bounds: every request paying one serial SQLite commit (no
    // group commit), and the ceiling of perfect group commit (one commit
    // carries one request of every session).
    for (mode, sqlite) in [("full", "full"), ("relaxed", "normal")] {
        let commit = r.get(&format!("floor.sqlite.{sqlite}.commit_p50_us"));
        let Some(commit) = commit else { continue };
        // Past the fsync, the ceiling is not storage-bound: shown for FULL only.
        let shapes: &[bool] = if sqlite == "full" {
            &[false, true]
        } else {
            &[false]
        };
        for &grouped in shapes {
            let bound = |k: usize| {
                let sessions = if grouped { k as f64 } else { 1.0 };
                sessions * 1e6 / (3.0 * commit)
            };
            let label = if grouped { "grouped" } else { "serial" };
            let ratios: Vec<String> = levels
                .iter()
                .map(|&k| {
                    let v = r.get(&format!("tput.loopx.{mode}.{k}.cycles_per_s"));
                    let name = format!("tput.{k}.loopx.{mode}/sqlite_{label}.{sqlite}");
                    r.ratio(name, v, Some(bound(k)))
                })
                .collect();
            let cells: Vec<String> = levels.iter().map(|&k| num(Some(bound(k)))).collect();
            let system = if grouped {
                "SQLite group-commit ceiling (bound: each commit carries one request of every session)"
            } else {
                "SQLite serial commits (bound: 3 commits per cycle, one at a time)"
            };
            r.line(&format!(
                "| {system} | synchronous={} | {} | {} |",
                sqlite.to_uppercase(),
                cells.join(" | "),
                ratios.join(" | ")
            ));
        }
    }
    r.line("");
}

/// The broker's threads, by the start of the name the kernel shows (15
/// characters at most), and the column each is counted in. `loopx` is the
/// main thread (it runs the accept loop), `sqlx-sqlite-wor` the read pool's.
pub const BROKER_THREADS: [(&str, &str); 6] = [
    ("loopx-sqlite-wr", "writer"),
    ("tokio-", "workers"),
    ("loopx-sqlite-fl", "flusher"),
    ("loopx-sqlite-ck", "checkpointer"),
    ("sqlx-sqlite-wor", "reads"),
    ("loopx", "main"),
];

/// A broker thread's column: its [`BROKER_THREADS`] label, or `other`.
pub fn thread_label(thread: &str) -> &'static str {
    BROKER_THREADS
        .iter()
        .find(|(name, _)| thread.starts_with(name))
        .map_or("other", |(_, label)| label)
}

/// What a cycle cost the broker in each throughput cell (`cost.*`, from
/// `/proc`): CPU by thread and bytes written. A run-to-run steadier
/// measure of the write path than cycles/s on a shared machine.
fn cost_table(r: &mut Report, plan: &Plan) {
    if !plan.throughput {
        return;
    }
    let labels: Vec<&str> = BROKER_THREADS
        .iter()
        .map(|(_, label)| *label)
        .chain(["other"])
        .collect();
    let mut rows = Vec::new();
    for durability in ["full", "relaxed"] {
        for k in &plan.tput_levels {
            let key = format!("loopx.{durability}.{k}");
            let Some(written) = r.get(&format!("cost.{key}.written_kib")) else {
                continue;
            };
            let cpu: Vec<String> = labels
                .iter()
                .map(|label| {
                    num(Some(
                        r.get(&format!("cost.{key}.{label}_us")).unwrap_or(0.0),
                    ))
                })
                .collect();
            rows.push(format!(
                "| {durability} | {k} | {} | {} | {} |",
                num(r.get(&format!("tput.{key}.cycles_per_s"))),
                cpu.join(" | "),
                num(Some(written))
            ));
        }
    }
    if rows.is_empty() {
        return;
    }
    r.line("### The broker's cost per cycle (throughput cells; CPU from /proc by thread, the cell's warm-up included)\n");
    r.line(&format!(
        "| durability | sessions | cycles/s | {} CPU (µs) | KiB handed to write() |",
        labels.join(" CPU (µs) | ")
    ));
    r.line(&format!(
        "|---|---:|---:|{}---:|",
        "---:|".repeat(labels.len())
    ));
    for row in rows {
        r.line(&row);
    }
    r.line("");
}

fn parked_table(r: &mut Report, plan: &Plan) {
    if !plan.parked {
        return;
    }
    r.line(&format!(
        "### Parked capacity: {} claims parked at once (one per session / key), CPU over {} s parked\n",
        plan.park_count,
        plan.park_window.as_secs_f64()
    ));
    r.line("| system | parked | RSS before (MiB) | RSS parked (MiB) | bytes per parked claim | CPU while parked (ms) | wake all (ms) | claims resent after a transport error | loopx bytes ÷ this |");
    r.line("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (key, system) in [
        ("loopx", "loopx broker (full)"),
        ("axum_floor", "bare axum long-poll (floor)"),
    ] {
        let m = r.m;
        let g = |s: &str| m.get(&format!("parked.{key}.{s}")).copied();
        let Some(count) = g("count") else { continue };
        let mib = |v: Option<f64>| num(v.map(|k| k / 1024.0));
        let ratio = if key == "loopx" {
            "–".into()
        } else {
            let a = r.get("parked.loopx.bytes_per_claim");
            r.ratio(
                "parked.bytes_per_claim.loopx/axum_floor".into(),
                a,
                g("bytes_per_claim"),
            )
        };
        r.line(&format!(
            "| {system} | {count:.0} | {} | {} | {} | {} | {} | {} | {ratio} |",
            mib(g("rss_before_kib")),
            mib(g("rss_parked_kib")),
            num(g("bytes_per_claim")),
            num(g("cpu_ms")),
            num(g("wake_all_ms")),
            num(g("retries")),
        ));
    }
    r.line("");
}

fn depth_table(r: &mut Report, plan: &Plan) {
    if !plan.depth {
        return;
    }
    r.line("### Depth: claim latency with completed turns already stored in the session (full durability)\n");
    r.line(&format!(
        "{} timed cycles per row (enqueue untimed, then claim + complete timed). Turns (and their claims) inserted straight into the stopped broker's SQLite file.\n",
        plan.depth_cycles
    ));
    r.line("| stored turns | claim+complete p50 (µs) | p99 | claim alone p50 | fill (s) | p50 ÷ p50 at 0 |");
    r.line("|---:|---:|---:|---:|---:|---:|");
    let base = r.get("depth.loopx.0.cycle_p50_us");
    for &d in &plan.depths {
        let m = r.m;
        let g = |s: &str| m.get(&format!("depth.loopx.{d}.{s}")).copied();
        let p50 = g("cycle_p50_us");
        let ratio = r.ratio(format!("depth.{d}/0.cycle_p50"), p50, base);
        r.line(&format!(
            "| {d} | {} | {} | {} | {} | {ratio} |",
            num(p50),
            num(g("cycle_p99_us")),
            num(g("claim_p50_us")),
            num(g("fill_s")),
        ));
    }
    r.line("");
}

fn floors_table(r: &mut Report) {
    r.line("### Storage floors (µs per commit, one at a time)\n");
    r.line("| floor | p50 | p99 |");
    r.line("|---|---:|---:|");
    for (key, name) in [
        ("floor.fsync.", "4 KiB overwrite + fdatasync"),
        (
            "floor.sqlite.full.commit_",
            "SQLite single-row commit, WAL, synchronous=FULL",
        ),
        (
            "floor.sqlite.normal.commit_",
            "SQLite single-row commit, WAL, synchronous=NORMAL",
        ),
    ] {
        let (p50, p99) = (
            r.get(&format!("{key}p50_us")),
            r.get(&format!("{key}p99_us")),
        );
        r.line(&format!("| {name} | {} | {} |", num(p50), num(p99)));
    }
    r.line("");
}

/// The issue's targets: each measured, and whether it was met (null when a
/// figure it needs is missing).
fn targets(r: &mut Report, plan: &Plan) -> Value {
    let n = plan.wake_parked;
    let wake = |r: &Report, key: &str, stat: &str| r.get(&format!("wake.{key}.{n}.{stat}_us"));
    let lx50 = wake(r, "loopx.full", "p50");
    let lx99 = wake(r, "loopx.full", "p99");
    let floor50 = wake(r, "axum_floor.none", "p50");
    let pg50 = wake(r, "postgres.sync_on", "p50");
    let redis50 = wake(r, "redis.always", "p50");
    let tput16 = r.get("tput.loopx.full.16.cycles_per_s");
    let bytes = r.get("parked.loopx.bytes_per_claim");
    let floor_bytes = r.get("parked.axum_floor.bytes_per_claim");
    let cpu = r.get("parked.loopx.cpu_ms");
    let deepest = plan.depths.last().copied().unwrap_or(0);
    let depth0 = r.get("depth.loopx.0.cycle_p50_us");
    let depth_max = r.get(&format!("depth.loopx.{deepest}.cycle_p50_us"));
    let div = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
    let mut rows: Vec<(String, String, Option<f64>, Option<bool>)> = vec![
        (
            format!("wake p50, {n} parked (full)"),
            "< 1000 µs".into(),
            lx50,
            lx50.map(|v| v < 1000.0),
        ),
        (
            format!("wake p99, {n} parked (full)"),
            "< 5000 µs".into(),
            lx99,
            lx99.map(|v| v < 5000.0),
        ),
        (
            "wake p50 ÷ bare axum floor p50".into(),
            "≤ 1.5x".into(),
            div(lx50, floor50),
            div(lx50, floor50).map(|v| v <= 1.5),
        ),
        (
            "wake p50 ÷ PostgreSQL LISTEN/NOTIFY p50 (sync on)".into(),
            "< 1x (faster)".into(),
            div(lx50, pg50),
            div(lx50, pg50).map(|v| v < 1.0),
        ),
        (
            "wake p50 ÷ Redis Streams BLOCK p50 (always)".into(),
            "≤ 1x (no slower)".into(),
            div(lx50, redis50),
            div(lx50, redis50).map(|v| v <= 1.0),
        ),
        (
            "throughput, 16 sessions, full durability".into(),
            "≥ 8000 cycles/s".into(),
            tput16,
            tput16.map(|v| v >= 8000.0),
        ),
        (
            "bytes per parked claim ÷ bare axum parked connection".into(),
            "≤ 1.25x".into(),
            div(bytes, floor_bytes),
            div(bytes, floor_bytes).map(|v| v <= 1.25),
        ),
        (
            format!(
                "broker CPU while parked over {} s (ms)",
                plan.park_window.as_secs_f64()
            ),
            "none measurable (≤ 1 clock tick, 10 ms)".into(),
            cpu,
            cpu.map(|v| v <= 10.0),
        ),
        (
            format!("claim+complete p50 at {deepest} stored turns ÷ at 0"),
            "≤ 1.2x".into(),
            div(depth_max, depth0),
            div(depth_max, depth0).map(|v| v <= 1.2),
        ),
    ];
    rows.extend(issue17_targets(r, n, lx50, floor50));
    r.line("### Targets from issues #4 and 17\n");
    r.line("| target | goal | measured | met |");
    r.line("|---|---|---:|---|");
    let mut json = serde_json::Map::new();
    for (name, goal, value, met) in rows {
        let verdict = match met {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "not measured",
        };
        r.line(&format!("| {name} | {goal} | {} | {verdict} |", num(value)));
        json.insert(name, json!({"goal": goal, "measured": value, "met": met}));
    }
    r.line("");
    Value::Object(json)
}

/// Issue 17's targets: throughput against the bare axum floor and the
/// axum-over-Redis peer at 16 and 128 sessions, wake against the floor.
fn issue17_targets(
    r: &Report,
    n: usize,
    lx50: Option<f64>,
    floor50: Option<f64>,
) -> Vec<(String, String, Option<f64>, Option<bool>)> {
    let mut rows = Vec::new();
    for k in [16, 128] {
        let lx = r.get(&format!("tput.loopx.full.{k}.cycles_per_s"));
        for (versus, name, goal) in [
            ("axum_floor.none", "bare axum floor", 0.5),
            ("redis_http.always", "axum over Redis Streams (always)", 1.0),
        ] {
            let other = r.get(&format!("tput.{versus}.{k}.cycles_per_s"));
            let ratio = lx.zip(other).map(|(a, b)| a / b);
            rows.push((
                format!("cycles/s ÷ {name}, {k} sessions (full)"),
                format!("≥ {goal:.1}x"),
                ratio,
                ratio.map(|v| v >= goal),
            ));
        }
    }
    let ratio = lx50.zip(floor50).map(|(a, b)| a / b);
    rows.push((
        format!("wake p50 ÷ bare axum floor p50, {n} parked (issue 17)"),
        "≤ 3x".into(),
        ratio,
        ratio.map(|v| v <= 3.0),
    ));
    rows
}

/// The replicas section (issue #7): the broker on PostgreSQL with one and two
/// replicas, beside its SQLite `full` figures and the PostgreSQL SKIP LOCKED
/// peer from the same run; answers the issue's targets for the JSON.
fn replicas_table(r: &mut Report, plan: &Plan, versions: &BTreeMap<String, String>) -> Value {
    if !plan.replicas || !r.m.keys().any(|k| k.starts_with("replicas.")) {
        return Value::Null;
    }
    let n = plan.wake_parked;
    let setting = |name: &str| {
        versions
            .get(&format!("postgres.{name}"))
            .map_or("?", String::as_str)
    };
    r.line("### Replicas on PostgreSQL (issue #7)\n");
    r.line(&format!(
        "The broker with `--database-url` on PostgreSQL {} (synchronous_commit={}, fsync={}), every cell on a fresh database and fresh replicas sharing one owner token. Wake: {} turns per row after {} untimed, as in the wake table (enqueue request start → parked claim's answer). Throughput: {} s per cell after {} s untimed.\n",
        versions.get("postgres").map_or("?", String::as_str),
        setting("synchronous_commit"),
        setting("fsync"),
        plan.wake_turns,
        crate::replicas::WAKE_WARMUP_TURNS,
        plan.tput_time.as_secs_f64(),
        plan.replica_tput_warmup.as_secs_f64(),
    ));
    let wake_rows: [(&str, &str, &str); 4] = [
        (
            "replicas.wake.one",
            "loopx on PostgreSQL, 1 replica",
            "claim and enqueue through A",
        ),
        (
            "replicas.wake.cross",
            "loopx on PostgreSQL, 2 replicas, cross-replica",
            "claim parked on A, enqueue through B",
        ),
        (
            "wake.loopx.full",
            "loopx on SQLite (full)",
            "one process, same run",
        ),
        (
            "wake.postgres.sync_on",
            "PostgreSQL SKIP LOCKED + LISTEN/NOTIFY peer",
            "synchronous_commit=on, same run",
        ),
    ];
    r.line("| system | requests | parked | p50 (µs) | p99 (µs) | max (µs) | samples > 1 s | p50 ÷ 1 replica | p99 ÷ 1 replica |");
    r.line("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for (key, system, how) in wake_rows {
        for parked in [1, n] {
            let g = |r: &Report, stat: &str| r.get(&format!("{key}.{parked}.{stat}"));
            let (p50, p99, max) = (g(r, "p50_us"), g(r, "p99_us"), g(r, "max_us"));
            if p50.is_none() {
                continue;
            }
            let slow = g(r, "over_1s");
            let base =
                |r: &Report, stat: &str| r.get(&format!("replicas.wake.one.{parked}.{stat}_us"));
            let (b50, b99) = (base(r, "p50"), base(r, "p99"));
            let short = key
                .trim_start_matches("replicas.")
                .trim_start_matches("wake.");
            let (r50, r99) = if key == "replicas.wake.one" {
                ("1.00x".into(), "1.00x".into())
            } else {
                (
                    r.ratio(format!("replicas.wake.{parked}.p50.{short}/one"), p50, b50),
                    r.ratio(format!("replicas.wake.{parked}.p99.{short}/one"), p99, b99),
                )
            };
            r.line(&format!(
                "| {system} | {how} | {parked} | {} | {} | {} | {} | {r50} | {r99} |",
                num(p50),
                num(p99),
                num(max),
                slow.map_or("–".into(), |v| format!("{v:.0}")),
            ));
        }
    }
    r.line("");
    let levels = &plan.replica_tput_levels;
    let heads: Vec<String> = levels.iter().map(|k| format!("{k} sessions")).collect();
    let ratio_heads: Vec<String> = levels.iter().map(|k| format!("÷ 1 replica @{k}")).collect();
    r.line(
        "Turn throughput (full cycles per second: enqueue, claim, complete as three requests)\n",
    );
    r.line(&format!(
        "| system | requests | {} | {} |",
        heads.join(" | "),
        ratio_heads.join(" | ")
    ));
    r.line(&format!("|---|---|{}", "---:|".repeat(levels.len() * 2)));
    let tput_rows: [(&str, &str, &str); 5] = [
        (
            "replicas.tput.one",
            "loopx on PostgreSQL, 1 replica",
            "all through A",
        ),
        (
            "replicas.tput.two",
            "loopx on PostgreSQL, 2 replicas",
            "half the sessions on each, all of a session's requests to its replica",
        ),
        (
            "replicas.tput.cross",
            "loopx on PostgreSQL, 2 replicas, cross",
            "enqueue through B, claim and complete through A",
        ),
        (
            "tput.loopx.full",
            "loopx on SQLite (full)",
            "one process, same run",
        ),
        (
            "tput.postgres.sync_on",
            "PostgreSQL SKIP LOCKED peer",
            "synchronous_commit=on, same run",
        ),
    ];
    for (key, system, how) in tput_rows {
        let rates: Vec<Option<f64>> = levels
            .iter()
            .map(|k| r.get(&format!("{key}.{k}.cycles_per_s")))
            .collect();
        if rates.iter().all(Option::is_none) {
            continue;
        }
        let short = key
            .trim_start_matches("replicas.")
            .trim_start_matches("tput.");
        let ratios: Vec<String> = levels
            .iter()
            .zip(&rates)
            .map(|(k, rate)| {
                if key == "replicas.tput.one" {
                    return "1.00x".into();
                }
                let base = r.get(&format!("replicas.tput.one.{k}.cycles_per_s"));
                r.ratio(format!("replicas.tput.{k}.{short}/one"), *rate, base)
            })
            .collect();
        let cells: Vec<String> = rates.iter().map(|v| num(*v)).collect();
        r.line(&format!(
            "| {system} | {how} | {} | {} |",
            cells.join(" | "),
            ratios.join(" | ")
        ));
    }
    r.line("");
    if let Some(problems) = r.get("replicas.log_warnings_errors") {
        r.line(&format!(
            "Warnings and errors the replicas logged (median per run): {problems:.0}.\n"
        ));
    }

    let cross99 = r.get(&format!("replicas.wake.cross.{n}.p99_us"));
    let k = levels.first().copied().unwrap_or(16);
    let one = r.get(&format!("replicas.tput.one.{k}.cycles_per_s"));
    let two = r.get(&format!("replicas.tput.two.{k}.cycles_per_s"));
    let two_over_one = two.zip(one).map(|(a, b)| a / b);
    let rows: Vec<(String, String, Option<f64>, Option<bool>)> = vec![
        (
            format!("cross-replica wake p99, {n} parked (µs)"),
            "< 10000 µs".into(),
            cross99,
            cross99.map(|v| v < 10_000.0),
        ),
        (
            format!("2 replicas ÷ 1 replica throughput, {k} sessions"),
            "≥ 1x".into(),
            two_over_one,
            two_over_one.map(|v| v >= 1.0),
        ),
    ];
    r.line("Targets from issue #7\n");
    r.line("| target | goal | measured | met |");
    r.line("|---|---|---:|---|");
    let mut json = serde_json::Map::new();
    for (name, goal, value, met) in rows {
        let verdict = match met {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "not measured",
        };
        r.line(&format!("| {name} | {goal} | {} | {verdict} |", num(value)));
        json.insert(name, json!({"goal": goal, "measured": value, "met": met}));
    }
    r.line("");
    Value::Object(json)
}
