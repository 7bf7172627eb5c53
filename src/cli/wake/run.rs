//! `loopx run -- <agent command…>`: the agent in a pseudo-terminal that
//! loopx passes through untouched (raw mode, the window size and every
//! resize, every key, Ctrl-C and Esc included, the agent's colours, its exit
//! status as loopx's), typing queued messages into it while it is idle.
//!
//! loopx installs nothing: the agent's own hooks (`loopx hook install`)
//! report its session and presence. They find `LOOPX_RUN_DIR` in their
//! environment and leave the session there ([`tell`]); the waker then
//! follows that session. loopx sees the person's keys, so "the person at
//! the terminal wins" is exact here: nothing is typed while they have keys
//! in the prompt that Enter or Ctrl-C has not ended, or pressed one in the
//! last 2 s, and the message's paste and its Enter are written in one hold
//! of the pty, never between their keys.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Mutex;

use super::procfs::{self, Agent, Now};
use super::{ENTER_AFTER, Gone, Hold, HostIdentity, Terminal, Waker};
use crate::cli::common::{Connection, local_error};

/// The environment variable that tells the hooks where `loopx run` listens.
pub const RUN_DIR: &str = "LOOPX_RUN_DIR";
/// Key presses this recent hold typing.
const RECENT_KEYS: Duration = Duration::from_secs(2);
/// How often the run dir is looked at for the hooks' session.
const WATCH_EVERY: Duration = Duration::from_millis(250);

/// Runs an agent CLI in a pass-through terminal and types queued messages
/// into it while it is idle (its LoopX hooks must be installed).
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub connection: Connection,
    /// The agent's command line, after `--` (e.g. `-- claude --continue`).
    #[arg(required = true, last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// What the hooks leave in the run dir: the session they attach to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Told {
    pub session_id: String,
    pub host_surface: String,
    pub host_session_id: String,
    /// The agent process whose hooks tell it (none found: nothing is typed).
    #[serde(default)]
    pub agent: Option<Agent>,
}

/// Called by every hook: under `loopx run`, leaves the session there (a
/// private file in a private folder; written only when it changed).
pub fn tell(told: &Told) -> Result<(), String> {
    let Some(dir) = std::env::var_os(RUN_DIR) else {
        return Ok(());
    };
    let path = Path::new(&dir).join("session.json");
    let text = serde_json::to_string(told).map_err(|e| e.to_string())?;
    if std::fs::read_to_string(&path).ok().as_deref() == Some(text.as_str()) {
        return Ok(());
    }
    let partial = Path::new(&dir).join(format!("session.{}.json", std::process::id()));
    std::fs::write(&partial, text)
        .and_then(|()| std::fs::rename(&partial, &path))
        .map_err(|e| format!("cannot tell loopx run the session: {e}"))
}

/// The person's keys as loopx forwards them.
#[derive(Default)]
struct Keys {
    /// Keys in the prompt not yet ended by Enter or Ctrl-C.
    pending: AtomicBool,
    last: std::sync::Mutex<Option<Instant>>,
}

impl Keys {
    /// What came in on stdin. The terminal's own replies to the agent's
    /// queries (its identity, the cursor's place, focus changes) come the
    /// same way, at the agent's start-up among others: they are no keys.
    fn pressed(&self, chunk: &[u8]) {
        let Some(pending) = person_keys(chunk) else {
            return;
        };
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        if let Some(pending) = pending {
            self.pending.store(pending, Ordering::Relaxed);
        }
    }

    fn typing(&self) -> bool {
        let recent = self
            .last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|at| at.elapsed() < RECENT_KEYS);
        recent || self.pending.load(Ordering::Relaxed)
    }
}

/// What a chunk of stdin says of the person: `None` when it holds only the
/// terminal's replies (no person typed it); else whether text is left in the
/// prompt after it (`Some(None)`: keys that move or edit, text unchanged).
fn person_keys(chunk: &[u8]) -> Option<Option<bool>> {
    let (mut person, mut pending, mut at) = (false, None, 0);
    while at < chunk.len() {
        let (len, reply) = match chunk[at] {
            0x1b => escape(&chunk[at..]),
            b'\r' | b'\n' | 0x03 => {
                pending = Some(false);
                (1, false)
            }
            _ => {
                pending = Some(true);
                (1, false)
            }
        };
        person |= !reply;
        at += len;
    }
    person.then_some(pending)
}

/// The length of the escape sequence `seq` starts with, and whether it is a
/// terminal's reply: a DCS, OSC, APC or PM string, a device-attributes,
/// cursor-position, status or mode report, or a focus change. Keys (arrows,
/// function keys, Alt+key, Esc) are not.
fn escape(seq: &[u8]) -> (usize, bool) {
    let string_end = |from: usize| {
        (from..seq.len())
            .find_map(|i| match seq[i] {
                0x07 => Some(i + 1),
                0x1b if seq.get(i + 1) == Some(&b'\\') => Some(i + 2),
                _ => None,
            })
            .unwrap_or(seq.len())
    };
    match seq.get(1) {
        Some(b'P' | b']' | b'_' | b'^') => (string_end(2), true),
        Some(b'[') => {
            let end = (2..seq.len())
                .find(|&i| (0x40..=0x7e).contains(&seq[i]))
                .map_or(seq.len(), |i| i + 1);
            let body = &seq[2..end];
            let last = body.last().copied().unwrap_or_default();
            let queried = matches!(body.first(), Some(b'?' | b'>'));
            let reply = matches!(last, b'R' | b'n' | b't')
                || (last == b'c' && queried)
                || (last == b'y' && body.contains(&b'$'))
                || body == b"I"
                || body == b"O";
            (end, reply)
        }
        Some(b'O') => (3.min(seq.len()), false),
        Some(_) => (2, false),
        None => (1, false),
    }
}

/// The agent's pseudo-terminal, as the waker types into it.
#[derive(Clone)]
struct Pty {
    writer: Arc<Mutex<pty_process::OwnedWritePty>>,
    /// A second handle on the pty, to ask for its foreground process group.
    master: Arc<OwnedFd>,
    /// The agent the hooks named: the command loopx started, or a program
    /// it started (`bash -c "claude; exec bash -i"`), never a shell.
    agent: Option<Agent>,
    keys: Arc<Keys>,
    /// Whether the agent asked for bracketed paste (`ESC [ ? 2004 h`).
    bracketed: Arc<AtomicBool>,
    exited: Arc<AtomicBool>,
}

impl Terminal for Pty {
    async fn hold(&mut self) -> Result<Option<Hold>, Gone> {
        if let Some(gone) = self.gone() {
            return Err(gone);
        }
        let Some(agent) = &self.agent else {
            return Ok(Some(Hold::NotForeground));
        };
        match procfs::typing_reaches(agent) {
            Now::Gone => return Err(Gone("the agent exited".into())),
            Now::Background => return Ok(Some(Hold::NotForeground)),
            Now::Foreground => {}
        }
        // The agent's group is the foreground of this very pty.
        let foreground = rustix::termios::tcgetpgrp(self.master.as_fd())
            .ok()
            .map(|pid| pid.as_raw_nonzero().get());
        if foreground.is_none() || foreground != procfs::stat(agent.pid).map(|p| p.pgid) {
            return Ok(Some(Hold::NotForeground));
        }
        Ok(self.keys.typing().then_some(Hold::PersonTyping))
    }

    fn gone(&mut self) -> Option<Gone> {
        let agent_gone = self
            .agent
            .as_ref()
            .is_some_and(|agent| procfs::now(agent) == Now::Gone);
        (agent_gone || self.exited.load(Ordering::Relaxed)).then(|| Gone("the agent exited".into()))
    }

    async fn submit(&mut self, text: &str) -> std::io::Result<()> {
        let mut writer = self.writer.lock().await;
        let paste = if self.bracketed.load(Ordering::Relaxed) {
            format!("\x1b[200~{text}\x1b[201~")
        } else {
            text.replace('\n', " ")
        };
        writer.write_all(paste.as_bytes()).await?;
        tokio::time::sleep(ENTER_AFTER).await;
        writer.write_all(b"\r").await
    }

    async fn enter(&mut self) -> std::io::Result<()> {
        self.writer.lock().await.write_all(b"\r").await
    }
}

/// This terminal in raw mode until dropped (restored as it was).
struct RawMode(Option<rustix::termios::Termios>);

impl RawMode {
    fn enter() -> Self {
        let stdin = std::io::stdin();
        let Ok(saved) = rustix::termios::tcgetattr(&stdin) else {
            return RawMode(None); // not a terminal: nothing to set
        };
        let mut raw = saved.clone();
        raw.make_raw();
        let set = rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, &raw);
        RawMode(set.ok().map(|()| saved))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let stdin = std::io::stdin();
            let _ =
                rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, saved);
        }
    }
}

/// This terminal's size, for the agent's.
fn window_size() -> Option<pty_process::Size> {
    let size = rustix::termios::tcgetwinsize(std::io::stdout()).ok()?;
    (size.ws_row > 0).then(|| pty_process::Size::new(size.ws_row, size.ws_col))
}

pub fn run(args: RunArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return local_error(&format!("cannot start the runtime: {e}")),
    };
    let client = match args.connection.client() {
        Ok((client, _)) => client,
        Err(message) => return local_error(&message),
    };
    let dir = match private_dir() {
        Ok(dir) => dir,
        Err(e) => return local_error(&format!("cannot make loopx run's folder: {e}")),
    };
    let saves = crate::cli::attachments::default_root(&args.connection.data_dir());
    let status = runtime.block_on(pass_through(&args.command, &dir, client, saves));
    let _ = std::fs::remove_dir_all(&dir);
    match status {
        Ok(code) => ExitCode::from(code),
        Err(message) => local_error(&message),
    }
}

/// A folder only this user can read, for the hooks' session.
fn private_dir() -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!(
        "loopx-run-{}-{}",
        std::process::id(),
        ulid::Ulid::new()
    ));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

/// Runs the agent to its exit; its exit code (128 + the signal if killed).
async fn pass_through(
    command: &[String],
    dir: &Path,
    client: crate::client::Client,
    saves: PathBuf,
) -> Result<u8, String> {
    let (pty, pts) = pty_process::open().map_err(|e| format!("cannot open a pty: {e}"))?;
    if let Some(size) = window_size() {
        let _ = pty.resize(size);
    }
    let master = pty
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| format!("cannot share the pty: {e}"))?;
    let mut child = pty_process::Command::new(&command[0])
        .args(&command[1..])
        .env(RUN_DIR, dir)
        .spawn(pts)
        .map_err(|e| format!("cannot start {}: {e}", command[0]))?;
    let raw = RawMode::enter();
    let (mut reader, writer) = pty.into_split();
    let writer = Arc::new(Mutex::new(writer));
    let keys = Arc::new(Keys::default());
    let bracketed = Arc::new(AtomicBool::new(false));
    let exited = Arc::new(AtomicBool::new(false));

    // A task of its own: the agent's last output is read to the end after
    // it exits.
    let output = tokio::spawn({
        let bracketed = bracketed.clone();
        async move {
            let mut stdout = tokio::io::stdout();
            let mut buf = vec![0u8; 16 * 1024];
            let mut tail = Vec::new();
            while let Ok(n) = reader.read(&mut buf).await {
                if n == 0 || stdout.write_all(&buf[..n]).await.is_err() {
                    break;
                }
                let _ = stdout.flush().await;
                note_paste_mode(&mut tail, &buf[..n], &bracketed);
            }
        }
    });
    let input = forward_keys(writer.clone(), keys.clone());
    let resize = follow_resizes(writer.clone());
    let terminal = Pty {
        writer,
        master: Arc::new(master),
        agent: None,
        keys,
        bracketed,
        exited: exited.clone(),
    };
    let waker = wake_when_told(dir.to_owned(), client, terminal, saves);
    let status = tokio::select! {
        status = child.wait() => status,
        () = async { tokio::join!(waker, input, resize); std::future::pending().await } => unreachable!(),
    };
    exited.store(true, Ordering::Relaxed);
    let _ = tokio::time::timeout(Duration::from_secs(1), output).await;
    drop(raw);
    let status = status.map_err(|e| format!("cannot wait for the agent: {e}"))?;
    use std::os::unix::process::ExitStatusExt;
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => 128 + signal as u8,
        _ => 1,
    })
}

/// Tracks the agent's bracketed-paste mode across output chunks.
fn note_paste_mode(tail: &mut Vec<u8>, chunk: &[u8], bracketed: &AtomicBool) {
    const ON: &[u8] = b"\x1b[?2004h";
    const OFF: &[u8] = b"\x1b[?2004l";
    tail.extend_from_slice(chunk);
    let last = |needle: &[u8]| tail.windows(needle.len()).rposition(|w| w == needle);
    match (last(ON), last(OFF)) {
        (Some(on), Some(off)) => bracketed.store(on > off, Ordering::Relaxed),
        (Some(_), None) => bracketed.store(true, Ordering::Relaxed),
        (None, Some(_)) => bracketed.store(false, Ordering::Relaxed),
        (None, None) => {}
    }
    let keep = tail.len().saturating_sub(ON.len() - 1);
    tail.drain(..keep);
}

/// The person's keys to the agent, as they come (a thread reads stdin: a
/// blocking read that nothing else waits on).
async fn forward_keys(writer: Arc<Mutex<pty_process::OwnedWritePty>>, keys: Arc<Keys>) {
    let (sender, mut receiver) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
    std::thread::spawn(move || {
        use std::io::Read;
        let mut stdin = std::io::stdin();
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdin.read(&mut buf) {
            if n == 0 || sender.blocking_send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    while let Some(chunk) = receiver.recv().await {
        keys.pressed(&chunk);
        if writer.lock().await.write_all(&chunk).await.is_err() {
            break;
        }
    }
}

/// Every resize of this terminal, to the agent's.
async fn follow_resizes(writer: Arc<Mutex<pty_process::OwnedWritePty>>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut resized) = signal(SignalKind::window_change()) else {
        return;
    };
    while resized.recv().await.is_some() {
        if let Some(size) = window_size() {
            let _ = writer.lock().await.resize(size);
        }
    }
}

/// Waits for the hooks to say which session the agent is on, then types
/// into it; follows the agent to another session when the hooks say so
/// (`/clear` starts one), and ends with the agent.
async fn wake_when_told(
    dir: PathBuf,
    client: crate::client::Client,
    terminal: Pty,
    saves: PathBuf,
) {
    let path = dir.join("session.json");
    loop {
        let told = loop {
            if let Some(told) = read_told(&path) {
                break told;
            }
            tokio::time::sleep(WATCH_EVERY).await;
        };
        let host = HostIdentity {
            host_surface: told.host_surface.clone(),
            host_session_id: told.host_session_id.clone(),
        };
        let terminal = Pty {
            agent: told.agent.clone(),
            ..terminal.clone()
        };
        let exited = terminal.exited.clone();
        let waker = Waker::new(
            client.clone(),
            told.session_id.clone(),
            host,
            terminal,
            dir.clone(),
        )
        .saving_files_in(saves.clone());
        tokio::select! {
            ended = waker.run() => {
                // The agent gone, its command may start another (whose
                // hooks tell its session): the pty's own end ends typing.
                if matches!(ended, super::Ended::Gone(_)) && exited.load(Ordering::Relaxed) {
                    return;
                }
                until_changed(&path, &told).await;
            }
            () = until_changed(&path, &told) => {}
        }
    }
}

fn read_told(path: &Path) -> Option<Told> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}

/// Returns once the hooks name another session than `told`.
async fn until_changed(path: &Path, told: &Told) {
    loop {
        tokio::time::sleep(WATCH_EVERY).await;
        if read_told(path).is_some_and(|now| &now != told) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::person_keys;

    #[test]
    fn the_terminals_replies_are_no_keys_and_the_persons_are() {
        // What tmux answered Claude Code's start-up queries with.
        assert_eq!(person_keys(b"\x1bP>|tmux 3.3a\x1b\\"), None);
        assert_eq!(person_keys(b"\x1b[?1;2c\x1b[?1;2c"), None);
        assert_eq!(
            person_keys(b"\x1b]11;rgb:0000/0000/0000\x07\x1b[12;40R\x1b[I"),
            None
        );
        assert_eq!(person_keys(b"half a thought"), Some(Some(true)));
        assert_eq!(person_keys(b"sent\r"), Some(Some(false)));
        assert_eq!(person_keys(b"\x03"), Some(Some(false)));
        assert_eq!(
            person_keys(b"\x1b[A"),
            Some(None),
            "an arrow: a key, no text"
        );
        assert_eq!(person_keys(b"\x1b"), Some(None), "Esc");
        assert_eq!(
            person_keys(b"\x1b[?1;2cx"),
            Some(Some(true)),
            "a reply, then a key"
        );
    }
}
