//! The one shape every system under test takes (the broker, Redis Streams,
//! PostgreSQL, the bare axum floor), and the measurements driven through it:
//! wake latency, cycle throughput and parked capacity. A *lane* is one
//! independent queue: a broker session, a Redis stream, a PostgreSQL queue id.

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::sys::{self, Result};

pub trait Queue: Send + Sync + 'static {
    /// One client connection (peers block one connection per parked waiter;
    /// the HTTP systems share a keep-alive pool and use `()`).
    type Conn: Send + 'static;
    /// What a claim hands to its completion.
    type Token: Send + 'static;

    /// A connection; `listen` names the lane a parked consumer will wait on.
    fn connect(&self, listen: Option<usize>) -> impl Future<Output = Result<Self::Conn>> + Send;
    fn enqueue(
        &self,
        conn: &mut Self::Conn,
        lane: usize,
    ) -> impl Future<Output = Result<()>> + Send;
    /// The lane's oldest message; with `wait`, parks until there is one.
    fn claim(
        &self,
        conn: &mut Self::Conn,
        lane: usize,
        wait: bool,
    ) -> impl Future<Output = Result<Option<Self::Token>>> + Send;
    fn complete(
        &self,
        conn: &mut Self::Conn,
        lane: usize,
        token: Self::Token,
    ) -> impl Future<Output = Result<()>> + Send;
}

/// How long after a consumer re-issues its parked claim the next enqueue may
/// go to its lane, so the claim has reached the server and parked.
const PARK_GUARD: Duration = Duration::from_millis(2);

/// Wake latency: one consumer parked per lane; turns go to one lane at a
/// time, round robin; each sample runs from the enqueue request's start to
/// the parked claim's answer. A consumer completes its turn before it parks
/// again (one active claim per lane).
pub async fn wake_latency<Q: Queue>(
    q: Arc<Q>,
    lanes: Range<usize>,
    turns: usize,
) -> Result<Vec<Duration>> {
    let width = lanes.len();
    // One extra round wakes every consumer once more, so each can stop
    // after a known number of turns.
    let total = turns + width;
    let mut arrivals = Vec::new();
    let mut ready = Vec::new();
    let mut consumers = tokio::task::JoinSet::new();
    for (k, lane) in lanes.clone().enumerate() {
        let (arrival_tx, arrival_rx) = mpsc::unbounded_channel::<Instant>();
        let (ready_tx, ready_rx) = mpsc::unbounded_channel::<Instant>();
        arrivals.push(arrival_rx);
        ready.push(ready_rx);
        let q = q.clone();
        let mine = total / width + usize::from(k < total % width);
        consumers.spawn(async move {
            let mut conn = q.connect(Some(lane)).await?;
            for _ in 0..mine {
                let _ = ready_tx.send(Instant::now());
                let token = loop {
                    if let Some(token) = q.claim(&mut conn, lane, true).await? {
                        break token;
                    }
                };
                let _ = arrival_tx.send(Instant::now());
                q.complete(&mut conn, lane, token).await?;
            }
            Ok::<_, sys::Error>(())
        });
    }
    let mut producer = q.connect(None).await?;
    let mut samples = Vec::with_capacity(turns);
    for i in 0..total {
        let k = i % width;
        let Some(parked_at) = ready[k].recv().await else {
            return Err(failure(&mut consumers).await);
        };
        tokio::time::sleep_until(parked_at + PARK_GUARD).await;
        let start = Instant::now();
        q.enqueue(&mut producer, lanes.start + k).await?;
        let Some(arrived) = arrivals[k].recv().await else {
            return Err(failure(&mut consumers).await);
        };
        if i < turns {
            samples.push(arrived.saturating_duration_since(start));
        }
    }
    while let Some(joined) = consumers.join_next().await {
        joined??;
    }
    Ok(samples)
}

/// Why a consumer stopped early.
async fn failure(tasks: &mut tokio::task::JoinSet<Result<()>>) -> sys::Error {
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Err(e)) => return e,
            Err(e) => return e.into(),
            Ok(Ok(())) => {}
        }
    }
    "a consumer stopped early".into()
}

/// Full cycles (enqueue, claim, complete: separate requests) per second,
/// one worker per lane, each on its own connection, for `duration`.
pub async fn throughput<Q: Queue>(
    q: Arc<Q>,
    lanes: Range<usize>,
    duration: Duration,
) -> Result<f64> {
    let cycles = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + duration;
    let mut workers = tokio::task::JoinSet::new();
    for lane in lanes {
        let (q, cycles) = (q.clone(), cycles.clone());
        workers.spawn(async move {
            let mut conn = q.connect(None).await?;
            while Instant::now() < deadline {
                q.enqueue(&mut conn, lane).await?;
                let token = q
                    .claim(&mut conn, lane, false)
                    .await?
                    .ok_or("a claim right after an enqueue found nothing")?;
                q.complete(&mut conn, lane, token).await?;
                if Instant::now() <= deadline {
                    cycles.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok::<_, sys::Error>(())
        });
    }
    while let Some(joined) = workers.join_next().await {
        joined??;
    }
    Ok(cycles.load(Ordering::Relaxed) as f64 / duration.as_secs_f64())
}

/// What parking many claims at once cost a server process.
#[derive(Debug, Clone, Copy)]
pub struct Parked {
    pub count: usize,
    pub rss_before_kib: u64,
    pub rss_parked_kib: u64,
    pub cpu_ms: f64,
    pub window: Duration,
    pub wake_all: Duration,
    /// Parked claims that failed in transport and were sent again.
    pub retries: u64,
}

impl Parked {
    pub fn bytes_per_claim(&self) -> f64 {
        (self.rss_parked_kib as f64 - self.rss_before_kib as f64) * 1024.0 / self.count as f64
    }
}

/// Parks one claim per lane in the server `pid`, waits until all are parked
/// (its fds hold every connection and its CPU is idle), measures RSS and CPU
/// over `window`, then enqueues to every lane and times until all answered.
pub async fn parked<Q: Queue>(
    q: Arc<Q>,
    pid: u32,
    lanes: Range<usize>,
    window: Duration,
) -> Result<Parked> {
    let count = lanes.len();
    // Idle first: connections of earlier requests closed, nothing in flight.
    settle(pid, 0).await?;
    let rss_before_kib = sys::rss_kib(pid)?;
    let fds_before = sys::open_fds(pid)?;
    let (arrival_tx, mut arrival_rx) = mpsc::unbounded_channel::<Instant>();
    let retries = Arc::new(AtomicU64::new(0));
    let mut waiters = tokio::task::JoinSet::new();
    for (n, lane) in lanes.clone().enumerate() {
        let (q, arrival_tx, retries) = (q.clone(), arrival_tx.clone(), retries.clone());
        waiters.spawn(async move {
            let mut conn = q.connect(Some(lane)).await?;
            let mut failures = 0;
            loop {
                match q.claim(&mut conn, lane, true).await {
                    Ok(Some(_)) => {
                        let _ = arrival_tx.send(Instant::now());
                        return Ok::<_, sys::Error>(());
                    }
                    Ok(None) => {}
                    // A long-poll client reconnects; a claim that ended
                    // unanswered stored nothing. Counted in the report.
                    Err(e) if failures < 3 => {
                        failures += 1;
                        retries.fetch_add(1, Ordering::Relaxed);
                        if failures == 1 {
                            eprintln!("[loopx-bench] parked claim retried: {}", sys::describe(&*e));
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(e) => return Err(e),
                }
            }
        });
        // Staggered (2,000 a second), so the listen backlog never overflows.
        if n % 100 == 99 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    drop(arrival_tx);
    settle(pid, fds_before + count).await?;
    let rss_parked_kib = sys::rss_kib(pid)?;
    let ticks_before = sys::cpu_ticks(pid)?;
    tokio::time::sleep(window).await;
    let ticks = sys::cpu_ticks(pid)? - ticks_before;
    let cpu_ms = ticks as f64 * 1000.0 / sys::clock_ticks_per_second() as f64;

    let start = Instant::now();
    let q2 = q.clone();
    let first = lanes.start;
    sys::par_map(count, 64, move |i| {
        let q = q2.clone();
        async move {
            let mut conn = q.connect(None).await?;
            q.enqueue(&mut conn, first + i).await
        }
    })
    .await?;
    let mut last = start;
    for _ in 0..count {
        let arrived = tokio::time::timeout(Duration::from_secs(120), arrival_rx.recv())
            .await
            .map_err(|_| "woken claims did not all answer within 120 s")?;
        let Some(arrived) = arrived else {
            return Err(format!("a parked claim failed: {}", failure(&mut waiters).await).into());
        };
        last = last.max(arrived);
    }
    while let Some(joined) = waiters.join_next().await {
        joined??;
    }
    Ok(Parked {
        count,
        rss_before_kib,
        rss_parked_kib,
        cpu_ms,
        window,
        wake_all: last - start,
        retries: retries.load(Ordering::Relaxed),
    })
}

/// Waits until the server holds `fds` descriptors and its CPU time stops
/// moving for 600 ms: every parked claim has arrived and gone to sleep.
async fn settle(pid: u32, fds: usize) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = sys::cpu_ticks(pid)?;
    let mut quiet = 0;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = sys::cpu_ticks(pid)?;
        quiet = if now == last { quiet + 1 } else { 0 };
        last = now;
        if quiet >= 3 && sys::open_fds(pid)? >= fds {
            return Ok(());
        }
    }
    Err(format!(
        "the server did not settle with {fds} open files within 120 s (it holds {})",
        sys::open_fds(pid)?
    )
    .into())
}
