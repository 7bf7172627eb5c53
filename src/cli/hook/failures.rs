//! The hooks' refusals since the last hook that did its work, kept per
//! project where `loopx hook doctor` finds them: `<data dir>/hooks/<key>.log`,
//! the key a short digest of the project directory, one line each (time,
//! agent, event, why), the newest 50; a hook of that project that succeeds
//! removes it. One data dir serves every project on the machine, so one
//! project's refusals must neither show in nor be cleared by another's. The
//! agents show a hook's stderr only in their debug logs, so a hook refused
//! on every turn (`host_mismatch`, a closed session) would otherwise go
//! unseen. The lines are the hooks' own stderr lines: no message text, no
//! host session id.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The most lines kept.
const KEPT: usize = 50;

/// The project a hook runs for: `CLAUDE_PROJECT_DIR` when set (Claude Code's
/// project, whatever directory its shell has moved to), else the agent's
/// `cwd` from stdin, else this process's directory (both agents start their
/// hooks there); canonical, so that `doctor` run in the same place finds it.
pub fn project_of(cwd: Option<&str>) -> PathBuf {
    let dir = std::env::var_os("CLAUDE_PROJECT_DIR")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .or_else(|| cwd.filter(|cwd| !cwd.is_empty()).map(PathBuf::from))
        .or_else(|| std::env::current_dir().ok())
        .unwrap_or_default();
    canonical(dir)
}

/// The directory as the file system names it, or as given when it is gone.
pub fn canonical(dir: PathBuf) -> PathBuf {
    std::fs::canonicalize(&dir).unwrap_or(dir)
}

/// `<data dir>/hooks/<first 16 hex digits of the directory's sha256>.log`.
fn log_path(data_dir: &Path, project: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let digest = Sha256::digest(project.as_os_str().as_bytes());
    data_dir
        .join("hooks")
        .join(format!("{}.log", hex::encode(&digest[..8])))
}

/// Appends a refusal to the project's log; a log that cannot be written is
/// let be (the hook never fails the agent over it).
pub fn record(data_dir: &Path, project: &Path, agent: &str, event: &str, why: &str) {
    let path = log_path(data_dir, project);
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
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let _ = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| file.write_all(line.as_bytes()));
}

/// The project's newest `count` refusals, oldest first.
pub fn recent(data_dir: &Path, project: &Path, count: usize) -> Vec<String> {
    let text = std::fs::read_to_string(log_path(data_dir, project)).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
    lines[lines.len().saturating_sub(count)..]
        .iter()
        .map(|l| l.to_string())
        .collect()
}

/// Forgets the project's refusals: one of its hooks did its work.
pub fn clear(data_dir: &Path, project: &Path) {
    let _ = std::fs::remove_file(log_path(data_dir, project));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_project_keeps_and_clears_its_own_refusals() {
        let data = tempfile::tempdir().unwrap();
        let (a, b) = (Path::new("/work/a"), Path::new("/work/b"));
        record(data.path(), a, "codex", "stop", "refused in a");
        assert_eq!(recent(data.path(), b, 5), Vec::<String>::new());
        record(data.path(), b, "codex", "stop", "refused in b");
        clear(data.path(), b);
        let left = recent(data.path(), a, 5);
        assert!(
            left.len() == 1 && left[0].ends_with("codex stop: refused in a"),
            "{left:?}"
        );
    }
}
