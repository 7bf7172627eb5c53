//! Crash points for the kill tests: `LOOPX_TEST_CRASH_AT=<point>[:<n>]`
//! aborts the process (as `kill -9` would: no unwinding, no clean-up) the
//! `n`-th time (default: the first) the writer reaches that point. Unset,
//! it costs one relaxed load per point.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// Where the writer may be made to crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// A batch that journaled records has committed; nobody is answered yet.
    Journaled,
    /// Halfway through a fold's slice, before its commit.
    Folding,
    /// Start-up replay, before its fold commits.
    Replaying,
}

impl Point {
    fn name(self) -> &'static str {
        match self {
            Point::Journaled => "journaled",
            Point::Folding => "folding",
            Point::Replaying => "replaying",
        }
    }
}

struct Armed {
    point: Option<(String, u64)>,
    reached: AtomicU64,
}

fn armed() -> &'static Armed {
    static ARMED: OnceLock<Armed> = OnceLock::new();
    ARMED.get_or_init(|| {
        let point = std::env::var("LOOPX_TEST_CRASH_AT").ok().map(|spec| {
            let (name, n) = spec.split_once(':').unwrap_or((&spec, "1"));
            (name.to_owned(), n.parse().unwrap_or(1))
        });
        Armed {
            point,
            reached: AtomicU64::new(0),
        }
    })
}

/// Aborts here if the kill tests asked for it.
pub fn at(point: Point) {
    let armed = armed();
    let Some((name, n)) = &armed.point else {
        return;
    };
    if name == point.name() && armed.reached.fetch_add(1, Ordering::Relaxed) + 1 == *n {
        eprintln!(
            "loopx: crashing at `{}` (LOOPX_TEST_CRASH_AT)",
            point.name()
        );
        std::process::abort();
    }
}
