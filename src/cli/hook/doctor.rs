//! `loopx hook doctor`: what the person at the terminal runs when a message
//! stays queued. It reads the hook entries `install` wrote, checks what they
//! name (the binary, the broker, the token, the session), and shows the
//! hooks' recent refusals, which the agents themselves keep in a debug log
//! nobody reads. Content-free like the hooks' own lines.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use serde_json::Value;

use super::install::{Settings, is_ours};
use super::{Agent, failures};
use crate::client::{Client, DEFAULT_BROKER_URL};
use crate::config;
use crate::model::SessionState;

#[derive(Debug, Args)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub settings: Settings,
    /// The data dir whose owner.token and hooks.log the hooks use
    /// [default: $XDG_DATA_HOME/loopx, else ~/.local/share/loopx].
    #[arg(long, env = "LOOPX_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
}

/// One finding: fine, or a problem with what to do about it.
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
    let recent = failures::recent(&data_dir, 5);
    if recent.is_empty() {
        found.ok("no hook has failed recently".into());
    }
    for line in recent {
        found.problem(format!("a hook failed: {line}"));
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
    let token_file = flag("--token-file").map(PathBuf::from);
    let token = match config::owner_token(token_file.as_deref(), data_dir, false) {
        Ok((token, _)) => token,
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
        match flag("--session-id") {
            Some(session_id) => check_session(&client, &session_id, found).await,
            None => found.ok("the hooks bind a session on the agent's first hook".into()),
        }
    });
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
