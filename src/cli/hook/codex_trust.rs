//! `loopx hook install --agent codex --trust`: Codex's own trust, persisted
//! in the user's `config.toml` in Codex's home (`$CODEX_HOME`, else
//! `~/.codex`, as `codex app-server` itself reports it). The project is
//! trusted with `[projects."<dir>"] trust_level = "trusted"` (Codex ignores a
//! project's `.codex/config.toml` until then), each LoopX hook with
//! `[hooks.state."<key>"] trusted_hash = "<hash>"`, the key and the hash being
//! what Codex answers to `hooks/list`: Codex's hash is never re-derived here.
//! Everything else in the user config is kept as it is.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};
use toml_edit::{DocumentMut, Item, Table, value};

use super::capitalized;

/// How long Codex's app-server gets for each answer (its first start
/// unpacks helpers and reads every config layer).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// One hook as `hooks/list` describes it (the fields used here).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListedHook {
    key: String,
    event_name: String,
    #[serde(default)]
    command: Option<String>,
    source_path: PathBuf,
    current_hash: String,
    trust_status: String,
}

/// Trusts the project (when given) and every LoopX hook that Codex reads
/// from `config` (`is_ours(command, eventName)`), asking `codex` (its
/// `app-server`) for the hooks' keys and hashes. The lines say what changed.
pub fn trust(
    codex: &Path,
    project: Option<&Path>,
    config: &Path,
    is_ours: impl Fn(&str, &str) -> bool,
) -> Result<Vec<String>, String> {
    let mut server = AppServer::start(codex)?;
    let hello = server.request(
        "initialize",
        json!({"clientInfo": {"name": "loopx", "title": "LoopX", "version": env!("CARGO_PKG_VERSION")}}),
    )?;
    server.notify("initialized")?;
    let home = hello["codexHome"]
        .as_str()
        .map(PathBuf::from)
        .ok_or("codex app-server did not say where its home is")?;
    let user_config = home.join("config.toml");
    let mut lines = Vec::new();
    if let Some(dir) = project {
        let changed = edit(&user_config, |doc| trust_project(doc, dir))?;
        let state = if changed {
            "trusted"
        } else {
            "unchanged (trusted)"
        };
        lines.push(format!("project {}: {state}", dir.display()));
    }
    let cwd = match project {
        Some(dir) => dir.to_path_buf(),
        None => std::env::current_dir().map_err(|e| format!("no current directory: {e}"))?,
    };
    let config = config
        .canonicalize()
        .map_err(|e| format!("cannot find {}: {e}", config.display()))?;
    let ours = |server: &mut AppServer| -> Result<Vec<ListedHook>, String> {
        let hooks = list(server, &cwd)?;
        Ok(hooks
            .into_iter()
            .filter(|h| h.source_path == config)
            .filter(|h| {
                h.command
                    .as_deref()
                    .is_some_and(|c| is_ours(c, &h.event_name))
            })
            .collect())
    };
    let hooks = ours(&mut server)?;
    if hooks.is_empty() {
        return Err(format!(
            "Codex lists no LoopX hook from {} (is the project trusted?)",
            config.display()
        ));
    }
    edit(&user_config, |doc| {
        for hook in &hooks {
            let event = capitalized(&hook.event_name);
            if hook.trust_status == "trusted" {
                lines.push(format!("{event} hook: unchanged (trusted)"));
            } else {
                trust_hook(doc, &hook.key, &hook.current_hash)?;
                lines.push(format!("{event} hook: trusted ({})", hook.key));
            }
        }
        Ok(())
    })?;
    let untrusted: Vec<String> = ours(&mut server)?
        .into_iter()
        .filter(|h| h.trust_status != "trusted")
        .map(|h| format!("{} ({})", h.key, h.trust_status))
        .collect();
    if !untrusted.is_empty() {
        return Err(format!(
            "Codex still does not trust {} after writing {}",
            untrusted.join(", "),
            user_config.display()
        ));
    }
    lines.insert(0, format!("Codex's user config: {}", user_config.display()));
    Ok(lines)
}

/// `hooks/list` for one working directory: the hooks Codex would run there.
fn list(server: &mut AppServer, cwd: &Path) -> Result<Vec<ListedHook>, String> {
    let answer = server.request("hooks/list", json!({"cwds": [cwd]}))?;
    let entry = answer["data"]
        .as_array()
        .and_then(|entries| entries.first())
        .ok_or("codex app-server answered hooks/list with no entry")?;
    if let Some(error) = entry["errors"].as_array().and_then(|e| e.first()) {
        return Err(format!("Codex cannot read its hooks: {error}"));
    }
    serde_json::from_value(entry["hooks"].clone())
        .map_err(|e| format!("codex app-server's hooks/list is not what loopx reads: {e}"))
}

/// `[projects."<dir>"] trust_level = "trusted"`.
fn trust_project(doc: &mut DocumentMut, dir: &Path) -> Result<(), String> {
    let dir = dir.to_str().ok_or("the project's path is not UTF-8")?;
    let projects = table(doc.as_table_mut(), "projects")?;
    let project = table(projects, dir)?;
    if project.get("trust_level").and_then(Item::as_str) != Some("trusted") {
        project.insert("trust_level", value("trusted"));
    }
    Ok(())
}

/// `[hooks.state."<key>"] trusted_hash = "<hash>"`.
fn trust_hook(doc: &mut DocumentMut, key: &str, hash: &str) -> Result<(), String> {
    let hooks = table(doc.as_table_mut(), "hooks")?;
    let state = table(hooks, "state")?;
    table(state, key)?.insert("trusted_hash", value(hash));
    Ok(())
}

/// The sub-table `name` of `parent`, created (implicit: no header of its
/// own unless it gets keys) when missing.
fn table<'a>(parent: &'a mut Table, name: &str) -> Result<&'a mut Table, String> {
    let item = parent.entry(name).or_insert_with(|| {
        let mut table = Table::new();
        table.set_implicit(true);
        Item::Table(table)
    });
    item.as_table_mut()
        .ok_or_else(|| format!("`{name}` in Codex's user config is not a table"))
}

/// Reads the TOML file (missing: empty), applies `change`, writes it back if
/// the text changed; whether it did.
fn edit(
    path: &Path,
    change: impl FnOnce(&mut DocumentMut) -> Result<(), String>,
) -> Result<bool, String> {
    let before = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let mut doc: DocumentMut = before
        .parse()
        .map_err(|e| format!("{} is not TOML: {e}", path.display()))?;
    change(&mut doc)?;
    let after = doc.to_string();
    if after == before {
        return Ok(false);
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    std::fs::write(path, after).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(true)
}

/// `codex app-server`: JSON-RPC lines over its stdin and stdout. Killed when
/// dropped.
struct AppServer {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    stderr: Option<JoinHandle<String>>,
    next_id: u64,
}

impl AppServer {
    fn start(codex: &Path) -> Result<Self, String> {
        let mut child = Command::new(codex)
            .arg("app-server")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot start `{} app-server`: {e} (name Codex with --codex or LOOPX_CODEX)",
                    codex.display()
                )
            })?;
        let stdin = child.stdin.take().ok_or("no stdin for codex app-server")?;
        let stdout = child
            .stdout
            .take()
            .ok_or("no stdout for codex app-server")?;
        let mut stderr = child
            .stderr
            .take()
            .ok_or("no stderr for codex app-server")?;
        let (sender, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        Ok(AppServer {
            child,
            stdin,
            lines,
            stderr: Some(stderr),
            next_id: 1,
        })
    }

    fn send(&mut self, message: &Value) -> Result<(), String> {
        writeln!(self.stdin, "{message}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| self.failed(&format!("cannot write to codex app-server: {e}")))
    }

    fn notify(&mut self, method: &str) -> Result<(), String> {
        self.send(&json!({"method": method}))
    }

    /// Sends a request and waits for its answer, passing over notifications.
    fn request(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"id": id, "method": method, "params": params}))?;
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match self.lines.recv_timeout(left) {
                Ok(line) => line,
                Err(RecvTimeoutError::Timeout) => {
                    return Err(self.failed(&format!("codex app-server did not answer {method}")));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(
                        self.failed(&format!("codex app-server ended before answering {method}"))
                    );
                }
            };
            let Ok(mut message) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if message.get("method").is_some() || message["id"] != json!(id) {
                continue;
            }
            if let Some(error) = message.get("error") {
                return Err(format!("codex app-server refused {method}: {error}"));
            }
            return Ok(message["result"].take());
        }
    }

    /// The message, with the last line Codex wrote on stderr.
    fn failed(&mut self, message: &str) -> String {
        let _ = self.child.kill();
        let said = self
            .stderr
            .take()
            .and_then(|thread| thread.join().ok())
            .unwrap_or_default();
        match said.lines().rev().find(|l| !l.trim().is_empty()) {
            Some(last) => format!("{message}; it said: {}", last.trim()),
            None => message.to_owned(),
        }
    }
}

impl Drop for AppServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trust_keeps_the_user_config_and_is_idempotent() {
        let mine = "# mine\nmodel = \"o4\"\n\n[projects.\"/other\"]\ntrust_level = \"untrusted\"\n";
        let mut doc: DocumentMut = mine.parse().unwrap();
        trust_project(&mut doc, Path::new("/repo")).unwrap();
        trust_hook(&mut doc, "/repo/.codex/config.toml:stop:0:0", "sha256:ab").unwrap();
        let once = doc.to_string();
        assert!(once.starts_with(mine), "{once}");
        assert!(
            once.ends_with(
                "[projects.\"/repo\"]\ntrust_level = \"trusted\"\n\n\
                 [hooks.state.\"/repo/.codex/config.toml:stop:0:0\"]\ntrusted_hash = \"sha256:ab\"\n"
            ),
            "{once}"
        );
        trust_project(&mut doc, Path::new("/repo")).unwrap();
        trust_hook(&mut doc, "/repo/.codex/config.toml:stop:0:0", "sha256:ab").unwrap();
        assert_eq!(doc.to_string(), once);
    }
}
