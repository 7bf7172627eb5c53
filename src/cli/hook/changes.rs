//! What the agent changed (HOOKS.md): at `stop`, and after a tool that
//! writes (at most once per [`EVERY`] per host session), the working tree
//! of the hook's `cwd` is read ([`super::worktree`]) and reported, with the
//! files the current turn's tools wrote. Those are remembered between hook
//! runs in a small file of the data dir (`changes/<digest>.json`, with when
//! the last report went out), forgotten once `stop` has reported them or a
//! new prompt starts a turn. An extra: it never fails the hook.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::worktree::{self, MAX_FILES, Worktree};
use super::{Failure, Hook};
use crate::model::ReportChanges;

/// The shortest time between two reports after tools.
pub const EVERY: Duration = Duration::from_secs(10);
/// How long reading the working tree may take.
pub const BUDGET: Duration = Duration::from_secs(2);

/// The tools that write files: Claude Code's and Codex's.
const WRITERS: &[&str] = &[
    "Edit",
    "Write",
    "MultiEdit",
    "NotebookEdit",
    "Bash",
    "apply_patch",
];

/// What the hooks of one host session remember between runs.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Remembered {
    /// When the last report went out (ms).
    reported_at: i64,
    /// The absolute paths the current turn's tools wrote.
    touched: Vec<String>,
}

/// PostToolUse: remembers what a writing tool wrote, and reports the
/// working tree when the last report is [`EVERY`] old.
pub async fn after_tool(hook: &Hook) -> Result<(), Failure> {
    let tool = hook.field("tool_name").unwrap_or_default();
    if !WRITERS.contains(&tool) {
        return Ok(());
    }
    let file = state_file(hook);
    let mut remembered = load(&file);
    let cwd = cwd(hook);
    for path in written(hook.input.get("tool_input")) {
        let path = cwd.join(path).to_string_lossy().into_owned();
        if !remembered.touched.contains(&path) && remembered.touched.len() < MAX_FILES {
            remembered.touched.push(path);
        }
    }
    let now = crate::time::now_ms();
    if now - remembered.reported_at < EVERY.as_millis() as i64 {
        return save(&file, &remembered);
    }
    remembered.reported_at = now;
    save(&file, &remembered)?;
    report(hook, &remembered.touched).await
}

/// Stop: reports the working tree and the turn's files, then forgets them.
pub async fn at_stop(hook: &Hook) -> Result<(), Failure> {
    let file = state_file(hook);
    let remembered = load(&file);
    let reported = report(hook, &remembered.touched).await;
    let forgotten = Remembered {
        reported_at: crate::time::now_ms(),
        touched: Vec::new(),
    };
    save(&file, &forgotten)?;
    reported
}

/// UserPromptSubmit: a new turn, whose tools have written nothing yet.
pub fn new_turn(hook: &Hook) -> Result<(), Failure> {
    let file = state_file(hook);
    let remembered = load(&file);
    if remembered.touched.is_empty() {
        return Ok(());
    }
    save(
        &file,
        &Remembered {
            touched: Vec::new(),
            ..remembered
        },
    )
}

/// Reads the working tree and reports it (nothing outside a repository).
async fn report(hook: &Hook, touched: &[String]) -> Result<(), Failure> {
    let cwd = cwd(hook);
    let read = tokio::task::spawn_blocking(move || worktree::read(&cwd, BUDGET));
    let Some(tree) = read.await.ok().flatten() else {
        return Ok(());
    };
    let session_id = hook.host.session_id().await?;
    let report = report_of(hook, tree, touched);
    hook.client
        .report_changes(&session_id, &report)
        .await
        .map_err(|e| {
            format!(
                "the changes were not reported: {}",
                super::Problem::from(e).log_line()
            )
        })
}

/// The report of `tree`: its turn files are those under its root.
fn report_of(hook: &Hook, tree: Worktree, touched: &[String]) -> ReportChanges {
    let turn_files = touched
        .iter()
        .filter_map(|p| Path::new(p).strip_prefix(&tree.root).ok())
        .filter_map(|p| p.to_str().map(|p| p.replace('\\', "/")))
        .filter(|p| !p.is_empty())
        .collect();
    let mut report = ReportChanges {
        host_surface: hook.host_surface.clone(),
        host_session_id: hook.host_session_id.clone(),
        branch: tree.branch,
        head: tree.head,
        ahead: tree.ahead,
        behind: tree.behind,
        files: tree.files,
        diff: tree.diff,
        turn_files,
    };
    // Escaped as JSON, a diff may outgrow the body's limit: counts only.
    let too_big =
        serde_json::to_vec(&report).map_or(true, |body| body.len() > crate::broker::MAX_BODY_BYTES);
    if too_big {
        report.diff.clear();
        report
            .files
            .iter_mut()
            .for_each(|f| f.truncated |= !f.binary);
    }
    report
}

/// The paths a tool's input names as written: Claude Code's `file_path`
/// and `notebook_path`, and the files of a Codex patch (`*** Add File:`,
/// `*** Update File:`, `*** Delete File:`, `*** Move to:`) in any of its
/// strings.
fn written(input: Option<&Value>) -> Vec<String> {
    let mut paths = Vec::new();
    let Some(input) = input else { return paths };
    for key in ["file_path", "notebook_path"] {
        if let Some(path) = input.get(key).and_then(Value::as_str) {
            paths.push(path.to_owned());
        }
    }
    patch_paths(input, &mut paths);
    paths
}

fn patch_paths(value: &Value, paths: &mut Vec<String>) {
    const MARKS: [&str; 4] = [
        "*** Add File: ",
        "*** Update File: ",
        "*** Delete File: ",
        "*** Move to: ",
    ];
    match value {
        Value::String(text) => {
            for line in text.lines() {
                if let Some(path) = MARKS.iter().find_map(|m| line.strip_prefix(m)) {
                    paths.push(path.trim().to_owned());
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| patch_paths(v, paths)),
        Value::Object(map) => map.values().for_each(|v| patch_paths(v, paths)),
        _ => {}
    }
}

/// The hook's directory (`cwd` of its document, else its own).
fn cwd(hook: &Hook) -> PathBuf {
    hook.field("cwd")
        .filter(|c| !c.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::current_dir().ok())
        .unwrap_or_default()
}

/// The host session's file of what it remembers (named by a digest: no
/// host id in a file name).
fn state_file(hook: &Hook) -> PathBuf {
    let digest = Sha256::digest(format!("{}\n{}", hook.host_surface, hook.host_session_id));
    let name: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    hook.connection
        .data_dir()
        .join("changes")
        .join(format!("{name}.json"))
}

fn load(file: &Path) -> Remembered {
    std::fs::read(file)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

fn save(file: &Path, remembered: &Remembered) -> Result<(), Failure> {
    let written = file
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| {
            let temp = file.with_extension("tmp");
            std::fs::write(&temp, serde_json::to_vec(remembered).unwrap_or_default())?;
            std::fs::rename(&temp, file)
        });
    written.map_err(|e| format!("cannot remember the turn's files: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn written_paths_come_from_claude_codes_fields_and_codex_patches() {
        let edit = json!({"file_path": "/r/a.rs", "old_string": "x"});
        assert_eq!(written(Some(&edit)), ["/r/a.rs"]);
        let patch = json!({"input": "*** Begin Patch\n*** Add File: b c.md\n+x\n*** Update File: d.rs\n*** Move to: e.rs\n*** End Patch"});
        assert_eq!(written(Some(&patch)), ["b c.md", "d.rs", "e.rs"]);
        assert!(written(Some(&json!({"command": "ls"}))).is_empty());
    }
}
