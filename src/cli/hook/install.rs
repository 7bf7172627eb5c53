//! `loopx hook install`: writes the hook entries into Claude Code's settings
//! (JSON, merged: everything else is kept) or Codex's `config.toml` (the
//! entries appended, the rest of the file untouched), with the absolute path
//! of the running binary. Idempotent: an entry that is already there is left
//! alone, an older `loopx hook` entry for the event is replaced. Prints what
//! it changed. For Codex, `--trust` then writes Codex's own trust of the
//! project and of each hook (codex_trust.rs); without it, how to trust them.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use serde_json::{Value, json};

use super::{Agent, Binding, codex_trust};
use crate::cli::common::local_error;

/// Where the settings go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scope {
    /// This project: `.claude/settings.local.json` or `.codex/config.toml`.
    Project,
    /// The user: `~/.claude/settings.json` or `~/.codex/config.toml`.
    User,
}

/// Which agent's settings, and where (`install` writes them, `doctor`
/// reads them).
#[derive(Debug, Clone, Args)]
pub struct Settings {
    /// The agent whose settings these are.
    #[arg(long, value_enum)]
    pub agent: Agent,
    #[arg(long, value_enum, default_value_t = Scope::Project)]
    pub scope: Scope,
    /// The project directory: where --scope project settings are, and whose
    /// hook refusals doctor shows [default: $CLAUDE_PROJECT_DIR, else the current one].
    #[arg(long, env = "CLAUDE_PROJECT_DIR")]
    pub project_dir: Option<PathBuf>,
}

impl Settings {
    /// The agent's settings file.
    pub fn path(&self) -> Result<PathBuf, String> {
        settings_path(self.agent, self.scope, self.project_dir.as_deref())
    }
}

#[derive(Debug, Args)]
pub struct InstallArgs {
    #[command(flatten)]
    pub settings: Settings,
    /// The broker's URL, written into the commands when given.
    #[arg(long)]
    pub broker_url: Option<String>,
    /// The owner token's file, written into the commands when given.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// The data dir whose owner.token install uses to check --session-id
    /// [default: $XDG_DATA_HOME/loopx, else ~/.local/share/loopx].
    #[arg(long, env = "LOOPX_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// permission-request: seconds to wait for an answer from the Web page
    /// or Lark before the agent asks at its terminal [default: 120]. (The
    /// binding's --wait-seconds is the Stop hook's parked wait only.)
    #[arg(long)]
    pub permission_wait_seconds: Option<u64>,
    #[command(flatten)]
    pub binding: Binding,
    /// Codex: trust the project and the LoopX hooks in Codex's user config,
    /// with the keys and hashes Codex's `codex app-server` gives.
    #[arg(long)]
    pub trust: bool,
    /// The Codex binary that --trust asks [default: `codex` on the PATH].
    #[arg(long, env = "LOOPX_CODEX", default_value = "codex")]
    pub codex: PathBuf,
}

/// The events installed, with each one's timeout in seconds (None: the
/// agent's own budget, for SessionEnd), and whether the agent has it.
const EVENTS: [(&str, &str, Option<u64>); 8] = [
    ("SessionStart", "session-start", Some(30)),
    ("UserPromptSubmit", "user-prompt-submit", Some(30)),
    // Long enough for a question asked on the phone (Claude Code's
    // AskUserQuestion outside `default` mode arrives here).
    ("PreToolUse", "pre-tool-use", Some(300)),
    ("PostToolUse", "post-tool-use", Some(10)),
    ("Stop", "stop", Some(60)),
    ("PermissionRequest", "permission-request", Some(300)),
    ("Notification", "notification", Some(30)),
    ("SessionEnd", "session-end", None),
];

pub fn run(args: InstallArgs) -> ExitCode {
    match install(&args) {
        Ok(lines) => {
            for line in lines {
                println!("{line}");
            }
            ExitCode::SUCCESS
        }
        Err(message) => local_error(&message),
    }
}

fn install(args: &InstallArgs) -> Result<Vec<String>, String> {
    if args.trust && args.settings.agent != Agent::Codex {
        return Err("--trust is for --agent codex (Claude Code asks at its first start)".into());
    }
    let exe = std::env::current_exe()
        .and_then(|p| p.canonicalize())
        .map_err(|e| format!("cannot find this binary's path: {e}"))?;
    let path = args.settings.path()?;
    let mut notes = match &args.binding.session_id {
        Some(session_id) => check_session(args, session_id)?,
        None => Vec::new(),
    };
    let commands: Vec<(&str, String, Option<u64>)> = EVENTS
        .iter()
        .filter(|(name, ..)| args.settings.agent == Agent::ClaudeCode || *name != "Notification")
        .map(|(name, event, timeout)| {
            let timeout = match wait_flag(event, args) {
                Some(wait) => Some(wait.min(1800) + 30),
                None => *timeout,
            };
            (*name, command(&exe, event, args), timeout)
        })
        .collect();
    let existing = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let (text, mut lines) = match args.settings.agent {
        Agent::ClaudeCode => merge_claude(&existing, &commands)?,
        Agent::Codex => merge_codex(&existing, &commands),
    };
    if text != existing {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        lines.insert(0, format!("wrote {}", path.display()));
    } else {
        lines.insert(0, format!("{} already has the hooks", path.display()));
    }
    lines.append(&mut notes);
    if args.settings.agent == Agent::Codex {
        let project = match args.settings.scope {
            Scope::Project => Some(project_dir(args.settings.project_dir.as_deref())?),
            Scope::User => None,
        };
        if args.trust {
            let ours = |command: &str, event: &str| is_ours(command, &kebab(event));
            lines.extend(codex_trust::trust(
                &args.codex,
                project.as_deref(),
                &path,
                ours,
            )?);
        } else {
            lines.extend(how_to_trust(project.as_deref()));
        }
    }
    Ok(lines)
}

/// `--session-id`: the session must be open and bound to the surface the
/// hooks attach as, or every hook would be refused (`host_mismatch`) where
/// nobody looks. The hooks attach as the agent's own session id, which
/// install cannot know: the note says so.
fn check_session(args: &InstallArgs, session_id: &str) -> Result<Vec<String>, String> {
    let surface = args
        .binding
        .host_surface
        .clone()
        .unwrap_or_else(|| args.settings.agent.host_surface().to_owned());
    let bind_instead = format!(
        "install with the bind flags instead (loopx hook install --agent {} --goal-id <goal> \
         --agent-id <agent> --executor-endpoint-id <label>): the hooks then bind a session \
         to the agent's own session on its first hook",
        args.settings.agent.flag()
    );
    let connection = crate::cli::common::Connection {
        broker_url: args
            .broker_url
            .clone()
            .unwrap_or_else(|| crate::client::DEFAULT_BROKER_URL.to_owned()),
        token_file: args.token_file.clone(),
        data_dir: args.data_dir.clone(),
    };
    let (client, _) = connection.client()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let session = runtime
        .block_on(
            client
                .with_timeout(super::REQUEST_TIMEOUT)
                .session(session_id),
        )
        .map_err(|e| format!("cannot check session {session_id} ({e}); or {bind_instead}"))?
        .body;
    if session.state != crate::model::SessionState::Open {
        return Err(format!("session {session_id} is closed; {bind_instead}"));
    }
    if session.host_surface != surface {
        return Err(format!(
            "session {session_id} is bound to a {} host, but the hooks attach as {surface}: \
             every hook would be refused (host_mismatch). Bind a session for this agent, or \
             {bind_instead}",
            session.host_surface
        ));
    }
    Ok(vec![format!(
        "session {session_id} answers only the host session it was bound to: start the agent \
         as that session (Claude Code: `claude --session-id <host session id>`, or `--resume` \
         it), or {bind_instead}. `loopx hook doctor --agent {}` shows the hooks' refusals.",
        args.settings.agent.flag()
    )])
}

/// Without --trust: Codex skips the hooks until they are trusted; the two
/// ways to do it.
fn how_to_trust(project: Option<&Path>) -> Vec<String> {
    let again: Vec<String> = std::env::args().map(|w| shell_word(&w)).collect();
    let mut lines = vec![
        "Codex runs these hooks only once they are trusted (again after any change to their \
         commands). Either let loopx ask Codex and write its trust:"
            .to_owned(),
        format!("  {} --trust", again.join(" ")),
    ];
    match project {
        Some(dir) => lines.extend([
            format!(
                "or by hand: trust the project in {} (Codex ignores .codex/config.toml until then)",
                codex_home().join("config.toml").display()
            ),
            format!("  [projects.{}]", toml_string(&dir.display().to_string())),
            "  trust_level = \"trusted\"".to_owned(),
            "then start Codex in the project, open /hooks and trust the LoopX hooks.".to_owned(),
        ]),
        None => {
            lines.push("or by hand: start Codex, open /hooks and trust the LoopX hooks.".to_owned())
        }
    }
    lines
}

/// Codex's home: `$CODEX_HOME`, else `~/.codex` (as Codex reads it).
fn codex_home() -> PathBuf {
    match std::env::var_os("CODEX_HOME").filter(|h| !h.is_empty()) {
        Some(home) => PathBuf::from(home),
        None => std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default()
            .join(".codex"),
    }
}

/// The project directory, absolute (Codex keys its trust by it).
fn project_dir(dir: Option<&Path>) -> Result<PathBuf, String> {
    let dir = match dir {
        Some(dir) => dir.to_owned(),
        None => std::env::current_dir().map_err(|e| format!("no current directory: {e}"))?,
    };
    dir.canonicalize()
        .map_err(|e| format!("cannot find the project directory {}: {e}", dir.display()))
}

/// The agent's settings file for `scope`.
fn settings_path(agent: Agent, scope: Scope, dir: Option<&Path>) -> Result<PathBuf, String> {
    let home = || {
        std::env::var_os("HOME")
            .map(PathBuf::from)
            .ok_or_else(|| "HOME is not set".to_owned())
    };
    Ok(match (agent, scope) {
        (Agent::ClaudeCode, Scope::Project) => {
            project_dir(dir)?.join(".claude/settings.local.json")
        }
        (Agent::ClaudeCode, Scope::User) => home()?.join(".claude/settings.json"),
        (Agent::Codex, Scope::Project) => project_dir(dir)?.join(".codex/config.toml"),
        (Agent::Codex, Scope::User) => codex_home().join("config.toml"),
    })
}

/// The command line an agent runs: the absolute binary, the event, the agent
/// and the binding flags given to `install`.
fn command(exe: &Path, event: &str, args: &InstallArgs) -> String {
    let mut words = vec![
        exe.display().to_string(),
        "hook".into(),
        event.into(),
        "--agent".into(),
        args.settings.agent.flag().into(),
    ];
    let b = &args.binding;
    let flags = [
        ("--session-id", b.session_id.clone()),
        ("--goal-id", b.goal_id.clone()),
        ("--agent-id", b.agent_id.clone()),
        ("--executor-endpoint-id", b.executor_endpoint_id.clone()),
        ("--host-surface", b.host_surface.clone()),
        ("--broker-url", args.broker_url.clone()),
        (
            "--token-file",
            args.token_file.as_ref().map(|p| p.display().to_string()),
        ),
    ];
    for (flag, value) in flags {
        if let Some(value) = value {
            words.extend([flag.to_owned(), value]);
        }
    }
    if let Some(wait) = wait_flag(event, args) {
        words.extend(["--wait-seconds".into(), wait.to_string()]);
    }
    words
        .iter()
        .map(|w| shell_word(w))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The `--wait-seconds` an event's command gets: stop's parked wait from
/// `--wait-seconds`, permission-request's from `--permission-wait-seconds`.
fn wait_flag(event: &str, args: &InstallArgs) -> Option<u64> {
    match event {
        "stop" => args.binding.wait_seconds,
        "permission-request" => args.permission_wait_seconds,
        _ => None,
    }
}

/// A word as a POSIX shell reads it back.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=@%+,".contains(&b));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// Whether a configured command is a `loopx hook <event>` entry.
pub fn is_ours(command: &str, event: &str) -> bool {
    command.contains(&format!(" hook {event} --agent "))
}

/// Claude Code: `hooks.<Event>` gains one matcher group with the command,
/// or has its older `loopx hook` command replaced; the rest is kept.
fn merge_claude(
    existing: &str,
    commands: &[(&str, String, Option<u64>)],
) -> Result<(String, Vec<String>), String> {
    let mut settings: Value = if existing.trim().is_empty() {
        json!({})
    } else {
        serde_json::from_str(existing).map_err(|e| format!("the settings are not JSON: {e}"))?
    };
    let root = settings
        .as_object_mut()
        .ok_or("the settings are not a JSON object")?;
    let hooks = root
        .entry("hooks")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .ok_or("`hooks` in the settings is not an object")?;
    let mut lines = Vec::new();
    for (name, command, timeout) in commands {
        let event = kebab(name);
        let mut entry = json!({"type": "command", "command": command});
        if let Some(timeout) = timeout {
            entry["timeout"] = json!(timeout);
        }
        let groups = hooks
            .entry(name.to_string())
            .or_insert_with(|| json!([]))
            .as_array_mut()
            .ok_or_else(|| format!("`hooks.{name}` is not an array"))?;
        let ours = groups.iter_mut().find_map(|group| {
            group["hooks"].as_array_mut().and_then(|list| {
                list.iter_mut()
                    .find(|h| h["command"].as_str().is_some_and(|c| is_ours(c, &event)))
            })
        });
        match ours {
            Some(found) if *found == entry => lines.push(format!("{name}: unchanged")),
            Some(found) => {
                *found = entry;
                lines.push(format!("{name}: updated"));
            }
            None => {
                let mut group = json!({"hooks": [entry]});
                // Tool events match on the tool's name: every tool.
                if matches!(*name, "PermissionRequest" | "PreToolUse" | "PostToolUse") {
                    group["matcher"] = json!("*");
                }
                groups.push(group);
                lines.push(format!("{name}: added"));
            }
        }
    }
    let text = serde_json::to_string_pretty(&settings).map_err(|e| e.to_string())? + "\n";
    Ok((text, lines))
}

/// Codex: each event's `[[hooks.<Event>]]` entry appended to `config.toml`,
/// or the `command = …` line of an older `loopx hook` entry replaced; every
/// other line is kept as it is.
fn merge_codex(existing: &str, commands: &[(&str, String, Option<u64>)]) -> (String, Vec<String>) {
    let mut text = existing.to_owned();
    let mut lines = Vec::new();
    for (name, command, timeout) in commands {
        let event = kebab(name);
        let wanted = format!("command = {}", toml_string(command));
        let found = text
            .lines()
            .find(|line| line.trim_start().starts_with("command") && is_ours(line, &event))
            .map(str::to_owned);
        match found {
            Some(line) if line.trim() == wanted => lines.push(format!("{name}: unchanged")),
            Some(line) => {
                text = text.replacen(&line, &wanted, 1);
                lines.push(format!("{name}: updated"));
            }
            None => {
                if !text.is_empty() && !text.ends_with("\n\n") {
                    text.push_str(if text.ends_with('\n') { "\n" } else { "\n\n" });
                }
                text.push_str(&format!(
                    "[[hooks.{name}]]\n[[hooks.{name}.hooks]]\ntype = \"command\"\n{wanted}\n"
                ));
                if let Some(timeout) = timeout {
                    text.push_str(&format!("timeout = {timeout}\n"));
                }
                lines.push(format!("{name}: added"));
            }
        }
    }
    (text, lines)
}

/// A TOML basic string.
fn toml_string(value: &str) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// `PermissionRequest` → `permission-request`.
fn kebab(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('-');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commands() -> Vec<(&'static str, String, Option<u64>)> {
        vec![
            (
                "Stop",
                "/opt/loopx hook stop --agent codex".into(),
                Some(60),
            ),
            (
                "SessionEnd",
                "/opt/loopx hook session-end --agent codex".into(),
                None,
            ),
        ]
    }

    #[test]
    fn codex_entries_are_appended_once_and_other_lines_kept() {
        let mine = "# my settings\nmodel = \"o4\"\n";
        let (once, lines) = merge_codex(mine, &commands());
        assert!(once.starts_with(mine), "{once}");
        assert!(once.contains("[[hooks.Stop]]\n[[hooks.Stop.hooks]]\ntype = \"command\"\ncommand = \"/opt/loopx hook stop --agent codex\"\ntimeout = 60\n"), "{once}");
        assert_eq!(lines, ["Stop: added", "SessionEnd: added"]);
        let (twice, lines) = merge_codex(&once, &commands());
        assert_eq!(twice, once);
        assert_eq!(lines, ["Stop: unchanged", "SessionEnd: unchanged"]);
        assert_eq!(kebab("UserPromptSubmit"), "user-prompt-submit");
        assert_eq!(shell_word("/a b/loopx"), "'/a b/loopx'");
    }
}
