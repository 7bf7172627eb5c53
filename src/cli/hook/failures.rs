//! The hooks' refusals since the last hook that did its work, kept where
//! `loopx hook doctor` finds them: `<data dir>/hooks.log`, one line each
//! (time, agent, event, why), the newest 50; a hook that succeeds removes it. The agents show a hook's stderr only in their debug logs, so a
//! hook refused on every turn (`host_mismatch`, a closed session) would
//! otherwise go unseen. The lines are the hooks' own stderr lines: no message
//! text, no host session id.

use std::io::Write;
use std::path::{Path, PathBuf};

/// The most lines kept.
const KEPT: usize = 50;

fn log_path(data_dir: &Path) -> PathBuf {
    data_dir.join("hooks.log")
}

/// Appends a refusal; a log that cannot be written is let be (the hook
/// never fails the agent over it).
pub fn record(data_dir: &Path, agent: &str, event: &str, why: &str) {
    let path = log_path(data_dir);
    let line = format!(
        "{} {agent} {event}: {why}\n",
        crate::time::rfc3339(crate::time::now_ms())
    );
    let mut lines: Vec<String> = std::fs::read_to_string(&path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    if lines.len() >= KEPT {
        lines.drain(..=lines.len() - KEPT);
        let _ = std::fs::write(&path, lines.join("\n") + "\n");
    }
    let _ = std::fs::create_dir_all(data_dir);
    let _ = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| file.write_all(line.as_bytes()));
}

/// The newest `count` refusals, oldest first.
pub fn recent(data_dir: &Path, count: usize) -> Vec<String> {
    let text = std::fs::read_to_string(log_path(data_dir)).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
    lines[lines.len().saturating_sub(count)..]
        .iter()
        .map(|l| l.to_string())
        .collect()
}

/// Forgets them: a hook did its work.
pub fn clear(data_dir: &Path) {
    let _ = std::fs::remove_file(log_path(data_dir));
}
