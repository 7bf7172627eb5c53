//! `loopx hook doctor`: what the person at the terminal runs when a message
//! stays queued. It reads the hook entries `install` wrote, checks what they
//! name (the binary, the broker, the token against the broker, the
//! session), shows this project's recent hook refusals, which the agents
//! themselves keep in a debug log nobody reads, and for Codex warns when its
//! shared background server runs the hooks (no idle Codex is typed into
//! then). Content-free like the hooks' own lines.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use serde_json::Value;

use super::install::{Settings, is_ours};
use super::{Agent, UNDER_APP_SERVER, failures};
use crate::client::{Client, ClientError, DEFAULT_BROKER_URL};
use crate::config::{self, TokenSource};
use crate::model::{ListSessions, SessionState};

#[derive(Debug, Args)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub settings: Settings,
    /// The data dir whose owner.token and hook logs the hooks use
    /// [default: $XDG_DATA_HOME/loopx, else ~/.local/share/loopx].
    #[arg(long, env = "LOOPX_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
}

/// What doctor found: each line fine, a warning, or a problem with what to
/// do about it (only problems fail).
struct Findings {
    lines: Vec<String>,
    problems: usize,
}

impl Findings {
    fn ok(&mut self, line: String) {
        self.lines.push(format!("ok: {line}"));
    }

    fn problem(&mut self, line: String) {
        self.problems += 1;
        self.lines.push(format!("problem: {line}"));
    }

    fn warning(&mut self, line: String) {
        self.lines.push(format!("warning: {line}"));
    }
}

/// Exit 0 when nothing is wrong, 1 when something is (each problem says
/// what to do).
pub fn run(args: DoctorArgs) -> ExitCode {
    let mut found = Findings {
        lines: Vec::new(),
        problems: 0,
    };
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(config::default_data_dir);
    match installed(&args) {
        Ok((path, command)) => {
            found.ok(format!("{} has the LoopX hooks", path.display()));
            check_command(&command, &data_dir, &mut found);
        }
        Err(line) => found.problem(line),
    }
    let project = failures::canonical(
        args.settings
            .project_dir
            .clone()
            .or_else(|| std::env::current_dir().ok())
            .unwrap_or_default(),
    );
    let recent = failures::recent(&data_dir, &project, 5);
    let (unwoken, failed): (Vec<String>, Vec<String>) = recent
        .into_iter()
        .partition(|line| line.contains(UNDER_APP_SERVER));
    if failed.is_empty() {
        found.ok(format!(
            "no hook has failed recently in {}",
            project.display()
        ));
    }
    for line in failed {
        found.problem(format!("a hook failed: {line}"));
    }
    if args.settings.agent == Agent::Codex {
        check_app_server(!unwoken.is_empty(), &data_dir, &mut found);
    }
    for line in &found.lines {
        println!("{line}");
    }
    if found.problems == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The settings file and the Stop hook's words, as `install` wrote them.
fn installed(args: &DoctorArgs) -> Result<(PathBuf, Vec<String>), String> {
    let path = args.settings.path()?;
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "cannot read {} ({e}): run `loopx hook install --agent {}`",
            path.display(),
            args.settings.agent.flag()
        )
    })?;
    let command = match args.settings.agent {
        Agent::ClaudeCode => serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|settings| claude_stop_command(&settings)),
        Agent::Codex => text
            .lines()
            .filter_map(|line| line.trim().strip_prefix("command = "))
            .filter_map(|value| serde_json::from_str::<String>(value).ok())
            .find(|command| is_ours(command, "stop")),
    };
    let command = command.ok_or_else(|| {
        format!(
            "{} has no `loopx hook stop` entry: run `loopx hook install --agent {}`",
            path.display(),
            args.settings.agent.flag()
        )
    })?;
    Ok((path, words(&command)))
}

fn claude_stop_command(settings: &Value) -> Option<String> {
    settings["hooks"]["Stop"]
        .as_array()?
        .iter()
        .filter_map(|group| group["hooks"].as_array())
        .flatten()
        .filter_map(|hook| hook["command"].as_str())
        .find(|command| is_ours(command, "stop"))
        .map(str::to_owned)
}

/// The binary, the broker and the session the command names.
fn check_command(command: &[String], data_dir: &Path, found: &mut Findings) {
    let flag = |name: &str| {
        command
            .iter()
            .position(|word| word == name)
            .and_then(|at| command.get(at + 1))
            .cloned()
    };
    match command.first() {
        Some(exe) if Path::new(exe).is_file() => found.ok(format!("the hooks run {exe}")),
        Some(exe) => found.problem(format!(
            "the hooks run {exe}, which is not there: run `loopx hook install` again"
        )),
        None => found.problem("the Stop hook's command is empty".into()),
    }
    let url = flag("--broker-url")
        .or_else(|| std::env::var("LOOPX_BROKER_URL").ok())
        .unwrap_or_else(|| DEFAULT_BROKER_URL.to_owned());
    let token_file = flag("--token-file")
        .or_else(|| std::env::var("LOOPX_TOKEN_FILE").ok())
        .map(PathBuf::from);
    let (token, source) = match config::owner_token(token_file.as_deref(), data_dir, false) {
        Ok(found) => found,
        Err(reason) => {
            return found.problem(format!("the hooks find no owner token: {reason}"));
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return found.problem(format!("cannot start the runtime: {e}")),
    };
    let client = Client::new(&url, Some(token)).with_timeout(super::REQUEST_TIMEOUT);
    runtime.block_on(async {
        if let Err(e) = client.healthz().await {
            return found.problem(format!(
                "the broker at {url} does not answer ({e}): start it with `loopx serve`"
            ));
        }
        found.ok(format!("the broker at {url} answers"));
        if !check_token(&client, &url, &source, found).await {
            return;
        }
        match flag("--session-id") {
            Some(session_id) => check_session(&client, &session_id, found).await,
            None => found.ok("the hooks bind a session on the agent's first hook".into()),
        }
    });
}

/// Whether the broker takes the token the hooks use: an authenticated read
/// (a page of one session), since `/healthz` asks for none.
async fn check_token(
    client: &Client,
    url: &str,
    source: &TokenSource,
    found: &mut Findings,
) -> bool {
    let one = ListSessions {
        limit: Some(1),
        ..ListSessions::default()
    };
    match client.sessions(&one).await {
        Ok(_) => {
            found.ok(format!("the broker takes the owner token from {source}"));
            true
        }
        Err(ClientError::Refused { reply, .. }) if reply.status.as_u16() == 401 => {
            found.problem(format!(
                "the broker at {url} refused the owner token from {source} (401 unauthorized): \
                 the hooks must use the token of the broker's data dir, the owner.token that \
                 `loopx serve` keeps there (by default {}; or the LOOPX_TOKEN / --token-file \
                 it was started with): set LOOPX_DATA_DIR to that data dir, or run \
                 `loopx hook install` again with --token-file <its owner.token>",
                config::default_data_dir().join("owner.token").display()
            ));
            false
        }
        Err(e) => {
            found.problem(format!(
                "the broker at {url} did not take the owner token from {source}: {e}"
            ));
            false
        }
    }
}

/// Codex: which way messages reach it. Plain `codex` runs its hooks in its
/// shared background server, where the Codex bridge delivers (CODEX.md);
/// with no bridge there, nothing reaches an idle Codex but through
/// `--no-daemon` and typing.
fn check_app_server(hook_saw_it: bool, data_dir: &std::path::Path, found: &mut Findings) {
    let socket = crate::cli::codex::default_socket();
    if crate::cli::codex::runs(data_dir, &socket) {
        found.ok(format!(
            "the Codex bridge runs for Codex's shared server ({}): plain `codex` gets \
             the phone's messages through it, nothing typed",
            socket.display()
        ));
        return;
    }
    // Issue 55 (5): said where the person looks.
    let fix = "install the hooks with the bind flags (--goal-id, --agent-id, \
               --executor-endpoint-id): the first hook that runs in the shared server \
               starts the Codex bridge, which delivers into plain `codex` without typing; \
               or start Codex with --no-daemon (`loopx run -- codex --no-daemon`, or \
               `codex --no-daemon` in a tmux pane). Either way a Codex binds its LoopX \
               session only at its first prompt (SessionStart runs then), so one just \
               started is reachable from the phone after someone types a first prompt";
    if let Some(pid) = crate::cli::wake::procfs::managed_app_server() {
        found.warning(format!(
            "Codex's shared background server runs for this user (`codex app-server \
             --managed-daemon`, pid {pid}): a Codex TUI started without --no-daemon runs \
             its hooks there, where no message is typed into the idle agent: {fix}"
        ));
    } else if hook_saw_it {
        found.warning(format!(
            "this project's last hooks ran in Codex's shared app-server, where no message \
             is typed into the idle agent: {fix}"
        ));
    }
}

async fn check_session(client: &Client, session_id: &str, found: &mut Findings) {
    match client.session(session_id).await {
        Ok(reply) if reply.body.state == SessionState::Open => found.ok(format!(
            "session {session_id} is open ({}, agent {})",
            reply.body.host_surface,
            crate::model::wire(&reply.body.agent.state)
        )),
        Ok(_) => found.problem(format!(
            "session {session_id} is closed: install with another session, or with the bind flags"
        )),
        Err(e) => found.problem(format!("session {session_id}: {e}")),
    }
}

/// A command line split as a POSIX shell reads the words `install` writes
/// (plain, or single-quoted with `'\''` for a quote).
fn words(command: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let (mut quoted, mut escaped, mut started) = (false, false, false);
    for c in command.chars() {
        match c {
            c if escaped => {
                word.push(c);
                escaped = false;
            }
            '\'' => {
                quoted = !quoted;
                started = true;
            }
            '\\' if !quoted => {
                escaped = true;
                started = true;
            }
            ' ' if !quoted => {
                if started {
                    words.push(std::mem::take(&mut word));
                }
                started = false;
            }
            c => {
                word.push(c);
                started = true;
            }
        }
    }
    if started {
        words.push(word);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::words;

    #[test]
    fn words_read_back_what_install_quotes() {
        let line = "'/opt/my tools/loopx' hook stop --agent codex --goal-id 'it'\\''s'";
        assert_eq!(
            words(line),
            [
                "/opt/my tools/loopx",
                "hook",
                "stop",
                "--agent",
                "codex",
                "--goal-id",
                "it's"
            ]
        );
    }
}
