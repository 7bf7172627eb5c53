//! The tmux waker: an agent already running in a tmux pane, with the hooks
//! installed, is reachable as it is. Its hooks see `TMUX` and `TMUX_PANE`;
//! each hook makes sure one waker runs for the pane ([`ensure`]), a small
//! process of its own that types queued messages into the pane while the
//! agent is idle, and ends with the agent (its process gone, the pane
//! closed, `session-end`, the session closed).
//!
//! The person at the terminal wins: nothing is typed while the agent's
//! prompt holds text, however it got there (read off the pane: [`screen`]),
//! nor while a client looking at the agent's pane had a key or mouse event
//! in the last 2 s (tmux's `client_activity`; keys in other windows are not
//! the agent's). Typing goes only into the agent process whose hooks bound
//! the session ([`procfs::Agent`]), checked before every message.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use clap::Args;
use sha2::{Digest, Sha256};

use super::procfs::{self, Agent, Now};
use super::screen::{self, Prompt};
use super::{Gone, Hold, HostIdentity, Terminal, Waker};
use crate::cli::common::Connection;

/// Key activity this recent holds typing (seconds).
const RECENT_KEYS: i64 = 2;
/// How many times a typist that died is replaced within [`RESTARTS_WITHIN`].
const RESTARTS: usize = 5;
const RESTARTS_WITHIN: Duration = Duration::from_secs(600);
/// How long a new waker waits for the one it replaces to let go of the pane.
const LOCK_WAIT: Duration = Duration::from_secs(3);

/// `loopx hook tmux-waker`: started by the hooks, not by hand.
#[derive(Debug, Args)]
pub struct WakerArgs {
    /// The tmux server's socket (from `TMUX`).
    #[arg(long)]
    pub tmux_socket: PathBuf,
    /// The agent's pane (`TMUX_PANE`, e.g. `%3`).
    #[arg(long)]
    pub pane: String,
    /// The agent process whose hooks bound the session (its pid, its start
    /// time, its program and a digest of its command line: `procfs::Agent`).
    #[arg(long)]
    pub agent_pid: i32,
    #[arg(long)]
    pub agent_start: u64,
    #[arg(long)]
    pub agent_exe: PathBuf,
    #[arg(long)]
    pub agent_argv: String,
    /// The process that types, started and replaced by the waker.
    #[arg(long)]
    pub typist: bool,
    /// The LoopX session the agent's hooks attach to.
    #[arg(long)]
    pub session_id: String,
    #[command(flatten)]
    pub connection: Connection,
}

/// One tmux pane holding the agent.
pub struct Pane {
    socket: PathBuf,
    pane: String,
    agent: Agent,
}

impl Pane {
    fn tmux(&self) -> Command {
        let mut command = Command::new("tmux");
        command.arg("-S").arg(&self.socket);
        command
    }

    /// A tmux command's output, or `None` when it failed.
    fn ask(&self, args: &[&str]) -> Option<String> {
        let output = self.tmux().args(args).stderr(Stdio::null()).output().ok()?;
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }

    fn run(&self, args: &[&str], stdin: Option<&str>) -> std::io::Result<()> {
        let mut child = self
            .tmux()
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        if let (Some(text), Some(mut input)) = (stdin, child.stdin.take()) {
            input.write_all(text.as_bytes())?;
        }
        match child.wait()? {
            status if status.success() => Ok(()),
            status => Err(std::io::Error::other(format!("tmux {}: {status}", args[0]))),
        }
    }
}

impl Terminal for Pane {
    async fn hold(&mut self) -> Result<Option<Hold>, Gone> {
        match procfs::typing_reaches(&self.agent) {
            Now::Gone => return Err(Gone("the agent exited".into())),
            Now::Background => return Ok(Some(Hold::NotForeground)),
            Now::Foreground => {}
        }
        let format = "#{pane_tty}\t#{pane_in_mode}\t#{session_id}";
        let shown = self
            .ask(&["display-message", "-p", "-t", &self.pane, format])
            .ok_or_else(|| Gone("the pane closed".into()))?;
        let mut fields = shown.split('\t');
        let (tty, in_mode, session) = (fields.next(), fields.next(), fields.next());
        if tty.and_then(|tty| procfs::tty_of(Path::new(tty))) != Some(self.agent.tty) {
            return Err(Gone("the pane holds another terminal".into()));
        }
        if in_mode != Some("0") {
            return Ok(Some(Hold::PaneInMode));
        }
        // A draft in the prompt, however it got there (keys typed before
        // the agent went idle, `send-keys`, a paste): never merged with.
        let shown = self
            .ask(&["capture-pane", "-p", "-e", "-t", &self.pane])
            .ok_or_else(|| Gone("the pane closed".into()))?;
        if screen::prompt(&shown) == Prompt::NotEmpty {
            return Ok(Some(Hold::PromptHoldsText));
        }
        // Keys of a client looking at the agent's pane, moments ago: the
        // person is at it. Keys in another window or pane are not theirs.
        let activity = self
            .ask(&[
                "list-clients",
                "-t",
                session.unwrap_or_default(),
                "-F",
                "#{client_activity}\t#{pane_id}",
            ])
            .unwrap_or_default()
            .lines()
            .filter_map(|line| line.split_once('\t'))
            .filter(|(_, pane)| *pane == self.pane)
            .filter_map(|(at, _)| at.parse::<i64>().ok())
            .max();
        let now = chrono::Utc::now().timestamp();
        match activity {
            Some(at) if now - at < RECENT_KEYS => Ok(Some(Hold::PersonTyping)),
            _ => Ok(None),
        }
    }

    fn gone(&mut self) -> Option<Gone> {
        (procfs::now(&self.agent) == Now::Gone).then(|| Gone("the agent exited".into()))
    }

    async fn submit(&mut self, text: &str) -> std::io::Result<()> {
        // Checked once more at the last moment: the agent, nothing else.
        if procfs::typing_reaches(&self.agent) != Now::Foreground {
            return Err(std::io::Error::other("the agent is not in the foreground"));
        }
        // One tmux command list, run by the server as a whole: a waker
        // killed meanwhile leaves the text either unsent and out of the
        // prompt, or submitted, never half typed. A buffer of its own,
        // pasted bracketed (-p) when the agent asked for it, deleted after
        // (-d), then Enter (both agents submit a bracketed paste and the
        // Enter that follows it at once).
        let buffer = format!("loopx-{}", std::process::id());
        self.run(
            &[
                "load-buffer",
                "-b",
                &buffer,
                "-",
                ";",
                "paste-buffer",
                "-p",
                "-d",
                "-b",
                &buffer,
                "-t",
                &self.pane,
                ";",
                "send-keys",
                "-t",
                &self.pane,
                "Enter",
            ],
            Some(text),
        )
    }

    async fn enter(&mut self) -> std::io::Result<()> {
        self.run(&["send-keys", "-t", &self.pane, "Enter"], None)
    }
}

/// The lock file one waker per pane holds (its pid and session inside).
fn lock_path(data_dir: &Path, socket: &Path, pane: &str) -> PathBuf {
    let mut key = Sha256::new();
    key.update(socket.as_os_str().as_encoded_bytes());
    key.update([0]);
    key.update(pane.as_bytes());
    data_dir
        .join("wakers")
        .join(format!("{}.lock", hex::encode(&key.finalize()[..8])))
}

/// Takes the pane's lock, waiting a little for a waker being replaced.
fn take_lock(path: &Path) -> Option<std::fs::File> {
    std::fs::create_dir_all(path.parent()?).ok()?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .ok()?;
    let started = std::time::Instant::now();
    while started.elapsed() < LOCK_WAIT {
        if rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok() {
            return Some(file);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// Called by every hook (`session-start`, `user-prompt-submit`, `stop`):
/// in a tmux pane, makes sure a waker types into it for `session_id`,
/// starting one (or replacing one that serves another session). Quick and
/// silent: a hook never waits for the waker.
pub fn ensure(
    session_id: &str,
    host: &HostIdentity,
    agent: Option<&Agent>,
    connection: &Connection,
) -> Result<(), String> {
    let (Ok(tmux), Ok(pane)) = (std::env::var("TMUX"), std::env::var("TMUX_PANE")) else {
        return Ok(());
    };
    if std::env::var_os(super::run::RUN_DIR).is_some() {
        return Ok(()); // `loopx run` types into this agent itself.
    }
    let socket = PathBuf::from(tmux.split(',').next().unwrap_or_default());
    let data_dir = connection.data_dir();
    let lock = lock_path(&data_dir, &socket, &pane);
    if let Some(file) = std::fs::File::open(&lock).ok().filter(|f| {
        rustix::fs::flock(f, rustix::fs::FlockOperation::NonBlockingLockShared).is_err()
    }) {
        drop(file);
        let held = std::fs::read_to_string(&lock).unwrap_or_default();
        let mut words = held.split_whitespace();
        let (pid, session) = (words.next(), words.next());
        if session == Some(session_id) {
            return Ok(());
        }
        if let Some(pid) = pid
            .and_then(|p| p.parse().ok())
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
    }
    let agent =
        agent.ok_or("no agent process with a terminal runs this hook: not typing into the pane")?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let mut command = Command::new(exe);
    command
        .args([
            "hook",
            "tmux-waker",
            "--pane",
            &pane,
            "--session-id",
            session_id,
        ])
        .arg("--tmux-socket")
        .arg(&socket)
        .args(["--agent-pid", &agent.pid.to_string()])
        .args(["--agent-start", &agent.start.to_string()])
        .arg("--agent-exe")
        .arg(&agent.exe)
        .args(["--agent-argv", &agent.argv])
        .args(["--broker-url", &connection.broker_url])
        .arg("--data-dir")
        .arg(&data_dir)
        .env("LOOPX_HOST_SURFACE", &host.host_surface)
        .env("LOOPX_HOST_SESSION_ID", &host.host_session_id)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    if let Some(file) = &connection.token_file {
        command.arg("--token-file").arg(file);
    }
    command
        .spawn()
        .map(drop)
        .map_err(|e| format!("cannot start the waker: {e}"))
}

/// The waker process: holds the pane's lock and keeps a typist running
/// until the agent or the session is over. A typist that dies (killed, or a
/// panic) is replaced within a second, at most [`RESTARTS`] times in
/// [`RESTARTS_WITHIN`]; one that ends on its own (the agent or the session
/// is over) ends the waker. The typist dies with the waker (its parent's
/// death signal), so a pane never has two. A message is neither lost nor
/// typed twice across a replacement: typed text and its Enter are one tmux
/// command, and a turn leaves the queue only when its hook takes it.
pub fn run_waker(args: WakerArgs) -> std::process::ExitCode {
    if args.typist {
        let _ =
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM));
        // The waker may have died before the death signal was set.
        if rustix::process::getppid().is_none_or(|p| p.as_raw_nonzero().get() == 1) {
            return std::process::ExitCode::SUCCESS;
        }
        return type_in(args);
    }
    let data_dir = args.connection.data_dir();
    let lock = lock_path(&data_dir, &args.tmux_socket, &args.pane);
    let Some(mut file) = take_lock(&lock) else {
        return std::process::ExitCode::SUCCESS; // another waker serves the pane
    };
    let _ = file.set_len(0);
    let _ = writeln!(file, "{} {}", std::process::id(), args.session_id);
    let Ok(exe) = std::env::current_exe() else {
        return std::process::ExitCode::SUCCESS;
    };
    let mut restarts = std::collections::VecDeque::new();
    loop {
        let typist = Command::new(&exe)
            .args(std::env::args_os().skip(1))
            .arg("--typist")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let died = typist.is_ok_and(|status| !status.success());
        restarts.retain(|at: &std::time::Instant| at.elapsed() < RESTARTS_WITHIN);
        if !died || restarts.len() >= RESTARTS {
            break;
        }
        restarts.push_back(std::time::Instant::now());
        std::thread::sleep(Duration::from_secs(1));
    }
    drop(file); // the lock file stays: a waker waiting on it holds its inode
    std::process::ExitCode::SUCCESS
}

/// The typist: types into the pane until the agent or the session is over.
fn type_in(args: WakerArgs) -> std::process::ExitCode {
    let data_dir = args.connection.data_dir();
    // The agent as the hook saw it, still the same process running the
    // same program: else it is gone, and nothing is typed.
    let Some(agent) = procfs::identify(args.agent_pid).filter(|seen| {
        (seen.start, &seen.exe, &seen.argv) == (args.agent_start, &args.agent_exe, &args.agent_argv)
    }) else {
        return std::process::ExitCode::SUCCESS;
    };
    let (Ok(host_surface), Ok(host_session_id)) = (
        std::env::var("LOOPX_HOST_SURFACE"),
        std::env::var("LOOPX_HOST_SESSION_ID"),
    ) else {
        return std::process::ExitCode::SUCCESS;
    };
    let Ok((client, _)) = args.connection.client() else {
        return std::process::ExitCode::SUCCESS;
    };
    let pane = Pane {
        socket: args.tmux_socket,
        pane: args.pane,
        agent,
    };
    let host = HostIdentity {
        host_surface,
        host_session_id,
    };
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return std::process::ExitCode::SUCCESS;
    };
    let saves = crate::cli::attachments::default_root(&data_dir);
    runtime.block_on(
        Waker::new(
            client,
            args.session_id,
            host,
            pane,
            super::records_dir(&data_dir),
        )
        .saving_files_in(saves)
        .run(),
    );
    std::process::ExitCode::SUCCESS
}
