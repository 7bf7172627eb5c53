//! `--reference`: today's broker against reference builds, alternating. Each
//! round runs every build once on a fresh data dir (at full durability, the
//! wake and throughput sections only), the order reversed every other round
//! so that neither build always runs first on a warming or cooling machine;
//! then the storage floors once, so each round says how fast the disk was.
//! The table gives, for each figure, each round's ratio (this build ÷ the
//! reference, paired within the round) and their median: on a shared
//! machine one run's ratio says little, the bytes handed to `write()` per
//! cycle are the steadiest figure, the writer's CPU per cycle next.

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::report::num as cell;
use crate::sys::{self, Result};
use crate::{Metrics, Plan, progress};

/// A figure the comparison reports: its metric key, how the table names it,
/// and whether more is better.
struct Figure {
    key: String,
    name: String,
    more_is_better: bool,
}

/// The figures, in table order: the steady ones first.
fn figures(plan: &Plan) -> Vec<Figure> {
    let mut all = Vec::new();
    let mut add = |key: String, name: String, more_is_better| {
        all.push(Figure {
            key,
            name,
            more_is_better,
        })
    };
    for &k in &plan.tput_levels {
        add(
            format!("cost.loopx.full.{k}.written_kib"),
            format!("KiB handed to write() per cycle, {k} sessions"),
            false,
        );
    }
    for &k in &plan.tput_levels {
        add(
            format!("cost.loopx.full.{k}.writer_us"),
            format!("writer CPU per cycle (µs), {k} sessions"),
            false,
        );
    }
    for &k in &plan.tput_levels {
        add(
            format!("cost.loopx.full.{k}.broker_us"),
            format!("broker CPU per cycle, all threads (µs), {k} sessions"),
            false,
        );
    }
    for &k in &plan.tput_levels {
        add(
            format!("tput.loopx.full.{k}.cycles_per_s"),
            format!("cycles/s, {k} sessions"),
            true,
        );
    }
    for parked in [1, plan.wake_parked] {
        for p in ["p50", "p99"] {
            add(
                format!("wake.loopx.full.{parked}.{p}_us"),
                format!("wake {p} (µs), {parked} parked"),
                false,
            );
        }
    }
    all
}

/// A build's name in the table: its folder's name when the binary is
/// `<name>/loopx` (as `bench/reference.sh` lays them out), else its path.
fn label(path: &Path) -> String {
    path.parent()
        .and_then(Path::file_name)
        .map(|dir| dir.to_string_lossy().into_owned())
        .filter(|dir| !dir.is_empty())
        .unwrap_or_else(|| path.display().to_string())
}

/// Runs `rounds` alternating rounds of `loopx` and every one of `references`
/// and prints the comparison (Markdown) and one `BENCH_JSON ` line.
pub async fn compare(
    plan: &Plan,
    loopx: &Path,
    references: &[PathBuf],
    rounds: usize,
) -> Result<()> {
    let builds: Vec<&Path> = std::iter::once(loopx)
        .chain(references.iter().map(PathBuf::as_path))
        .collect();
    let load_at_start = sys::loadavg();
    let mut runs: Vec<Vec<Metrics>> = vec![Vec::new(); builds.len()];
    let mut fsync_p50 = Vec::new();
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..builds.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            progress(&format!(
                "round {} of {rounds}: {}",
                round + 1,
                builds[i].display()
            ));
            let mut m = Metrics::new();
            crate::loopx_suite(plan, builds[i], "full", &mut m).await?;
            runs[i].push(m);
        }
        let mut floors = Metrics::new();
        crate::storage_floors(plan, &mut floors).await?;
        fsync_p50.push(floors.get("floor.fsync.p50_us").copied());
    }

    let machine = sys::machine();
    let mut out = format!(
        "## loopx-bench{} --reference: {} ÷ each reference, {rounds} alternating round(s), full durability\n\n",
        if plan.quick { " --quick" } else { "" },
        label(loopx),
    );
    out += &format!(
        "Machine: {} cores ({}), temp dir on {}. Load average (1, 5, 15 min): {load_at_start} at start, {} at end.\n",
        machine.cores, machine.cpu_model, machine.tmp_fs, machine.load
    );
    let fsync: Vec<String> = fsync_p50.iter().map(|v| cell(*v)).collect();
    out += &format!("fdatasync p50 (µs) by round: {}.\n\n", fsync.join(", "));
    let figures = figures(plan);
    let mut json_refs = serde_json::Map::new();
    for (r, reference) in references.iter().enumerate() {
        let theirs = &runs[r + 1];
        out += &format!(
            "### {} ÷ {} (below 1.00x is less; a ratio is worse when it is above 1 for a cost, below 1 for cycles/s)\n\n",
            label(loopx),
            label(reference)
        );
        let heads: Vec<String> = (1..=rounds).map(|n| format!("round {n}")).collect();
        out += &format!(
            "| figure | {} (median) | {} (median) | {} | median ratio | rounds worse |\n",
            label(loopx),
            label(reference),
            heads.join(" | ")
        );
        out += &format!("|---|---:|---:|{}---:|---:|\n", "---:|".repeat(rounds));
        let mut json_figures = serde_json::Map::new();
        for figure in &figures {
            let ours = values(&runs[0], &figure.key);
            let base = values(theirs, &figure.key);
            let ratios: Vec<Option<f64>> = ours
                .iter()
                .zip(&base)
                .map(|(a, b)| match (a, b) {
                    (Some(a), Some(b)) if *b > 0.0 => Some(a / b),
                    _ => None,
                })
                .collect();
            let measured: Vec<f64> = ratios.iter().flatten().copied().collect();
            if measured.is_empty() {
                continue;
            }
            let worse = measured
                .iter()
                .filter(|r| {
                    if figure.more_is_better {
                        **r < 1.0
                    } else {
                        **r > 1.0
                    }
                })
                .count();
            let median_ratio = sys::median(&mut measured.clone());
            let cells: Vec<String> = ratios.iter().map(|r| ratio_cell(*r)).collect();
            out += &format!(
                "| {} | {} | {} | {} | {} | {worse} of {} |\n",
                figure.name,
                cell(median(&ours)),
                cell(median(&base)),
                cells.join(" | "),
                ratio_cell(Some(median_ratio)),
                measured.len()
            );
            json_figures.insert(
                figure.key.clone(),
                json!({
                    "build": ours,
                    "reference": base,
                    "ratios": ratios,
                    "median_ratio": median_ratio,
                    "rounds_worse": worse,
                }),
            );
        }
        out.push('\n');
        json_refs.insert(reference.display().to_string(), json_figures.into());
    }
    print!("{out}");
    let json = json!({
        "reference": {
            "quick": plan.quick,
            "rounds": rounds,
            "build": loopx.display().to_string(),
            "fsync_p50_us": fsync_p50,
            "references": json_refs,
        }
    });
    println!("BENCH_JSON {json}");
    Ok(())
}

/// `key` in each round's figures.
fn values(runs: &[Metrics], key: &str) -> Vec<Option<f64>> {
    runs.iter()
        .map(|m| m.get(key).copied().filter(|v| v.is_finite()))
        .collect()
}

fn median(values: &[Option<f64>]) -> Option<f64> {
    let mut measured: Vec<f64> = values.iter().flatten().copied().collect();
    (!measured.is_empty()).then(|| sys::median(&mut measured))
}

fn ratio_cell(r: Option<f64>) -> String {
    r.map_or_else(|| "–".into(), |r| format!("{r:.2}x"))
}
