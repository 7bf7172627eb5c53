//! What the benchmark reads from the machine and its processes (/proc), plus
//! the small shared tools: temp dirs, free ports, percentiles, a bounded
//! parallel map.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

pub type Error = Box<dyn std::error::Error + Send + Sync>;
pub type Result<T> = std::result::Result<T, Error>;

/// An error with its chain of causes ("a: b: c").
pub fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(label: &str) -> Result<Self> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("loopx-bench-{}-{n}-{label}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)?;
        Ok(Self(path))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A loopback port nobody listens on now.
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Resident memory of a process, in KiB (VmRSS).
pub fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| "no VmRSS in /proc/<pid>/status".into())
}

/// User + system CPU time of a process (all its threads), in clock ticks.
pub fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    Ok(parse_stat(&stat)?.1)
}

/// A `stat` file's command name and user + system CPU time in clock ticks.
fn parse_stat(stat: &str) -> Result<(String, u64)> {
    let bad = "bad /proc/.../stat";
    // The command name may hold spaces: fields are counted after its ')'.
    let close = stat.rfind(')').ok_or(bad)?;
    let name = stat[stat.find('(').ok_or(bad)? + 1..close].to_owned();
    let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    let utime: u64 = fields.get(11).ok_or("short stat")?.parse()?;
    let stime: u64 = fields.get(12).ok_or("short stat")?.parse()?;
    Ok((name, utime + stime))
}

/// What a process has used so far: CPU clock ticks by thread name (threads
/// of one name, tokio's workers, summed) and bytes handed to `write()`.
#[derive(Default)]
pub struct Usage {
    pub ticks_by_thread: std::collections::BTreeMap<String, u64>,
    pub written_bytes: u64,
}

impl Usage {
    pub fn of(pid: u32) -> Result<Self> {
        let mut usage = Usage::default();
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
            // A thread that ended meanwhile has no stat file any more.
            let Ok(stat) = std::fs::read_to_string(task?.path().join("stat")) else {
                continue;
            };
            let (name, ticks) = parse_stat(&stat)?;
            *usage.ticks_by_thread.entry(name).or_default() += ticks;
        }
        let io = std::fs::read_to_string(format!("/proc/{pid}/io"))?;
        usage.written_bytes = io
            .lines()
            .find_map(|l| l.strip_prefix("wchar:"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or("no wchar in /proc/<pid>/io")?;
        Ok(usage)
    }
}

/// How many file descriptors a process holds (its accepted connections among them).
pub fn open_fds(pid: u32) -> Result<usize> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?.count())
}

/// Clock ticks per second (`getconf CLK_TCK`, 100 on Linux in practice).
pub fn clock_ticks_per_second() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

/// The effective user id of this process.
pub fn uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Raises the open-files limit as far as allowed: 10,000 parked claims need
/// 10,000 connections on each side. Children inherit it.
pub fn raise_open_files(want: u64) -> u64 {
    use rlimit::Resource;
    if let Ok((soft, hard)) = Resource::NOFILE.get()
        && soft < want
    {
        // Root may raise the hard limit too; others raise the soft one to the hard.
        let _ = Resource::NOFILE
            .set(want.max(hard), want.max(hard))
            .or_else(|_| Resource::NOFILE.set(want.min(hard), hard));
    }
    Resource::NOFILE.get().map(|(soft, _)| soft).unwrap_or(0)
}

/// The machine, as the report states it.
pub struct Machine {
    pub cores: usize,
    pub cpu_model: String,
    pub mem_gib: f64,
    pub kernel: String,
    pub tmp_fs: String,
    /// The 1, 5 and 15 minute load averages when the run started and ended:
    /// other work on the machine shows here.
    pub load: String,
}

/// The load averages (`/proc/loadavg`'s first three fields).
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cores = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count()
        .max(std::thread::available_parallelism().map_or(1, |n| n.get()));
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_owned())
        .unwrap_or_else(|| "unknown".into());
    let mem_kib: f64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_owned();
    let tmp_fs = Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(std::env::temp_dir())
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|| "unknown".into());
    Machine {
        cores,
        cpu_model,
        mem_gib: mem_kib / (1024.0 * 1024.0),
        kernel,
        tmp_fs,
        load: loadavg(),
    }
}

/// Sends SIGTERM and waits up to `grace` for the exit; then SIGKILL.
pub async fn terminate(child: &mut Child, grace: Duration) {
    if matches!(child.try_wait(), Ok(Some(_))) {
        return;
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = tokio::time::Instant::now() + grace;
    while tokio::time::Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The last lines of a log file, for error messages.
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

/// Percentiles of a set of durations, in microseconds.
#[derive(Debug, Clone, Copy)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

pub fn percentiles(samples: &mut [Duration]) -> Percentiles {
    samples.sort_unstable();
    let at = |q: f64| -> f64 {
        if samples.is_empty() {
            return f64::NAN;
        }
        let rank = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
        samples[rank - 1].as_secs_f64() * 1e6
    };
    Percentiles {
        p50: at(0.50),
        p99: at(0.99),
        max: at(1.0),
    }
}

pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Runs `f(0..n)` with at most `concurrency` at once; results in index order.
pub async fn par_map<T, F, Fut>(n: usize, concurrency: usize, f: F) -> Result<Vec<T>>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T>> + Send,
{
    let f = Arc::new(f);
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency.clamp(1, n.max(1)) {
        let (f, next) = (f.clone(), next.clone());
        tasks.spawn(async move {
            let mut done = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok::<_, Error>(done);
                }
                done.push((i, f(i).await?));
            }
        });
    }
    let mut all = Vec::with_capacity(n);
    while let Some(joined) = tasks.join_next().await {
        all.extend(joined??);
    }
    all.sort_by_key(|(i, _)| *i);
    Ok(all.into_iter().map(|(_, t)| t).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_the_thread_name_and_its_cpu_even_with_parentheses_in_the_name() {
        // pid (comm) state ppid … utime (14th field) stime (15th)
        let stat = "42 (a (b) c) S 1 1 1 0 -1 4194304 10 0 0 0 7 5 0 0 20 0 4 0 100";
        assert_eq!(parse_stat(stat).unwrap(), ("a (b) c".to_owned(), 12));
        assert!(parse_stat("42 no parens").is_err());
    }

    #[test]
    fn usage_counts_this_process_threads_and_the_bytes_it_writes() {
        let before = Usage::of(std::process::id()).unwrap();
        assert!(!before.ticks_by_thread.is_empty(), "a process has a thread");
        let dir = TempDir::new("usage").unwrap();
        std::fs::write(dir.path().join("f"), vec![0u8; 64 * 1024]).unwrap();
        let after = Usage::of(std::process::id()).unwrap();
        assert!(after.written_bytes - before.written_bytes >= 64 * 1024);
    }
}
