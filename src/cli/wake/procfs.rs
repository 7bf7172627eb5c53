//! The agent process as Linux's `/proc` shows it: which process the hooks
//! belong to, and whether it is still there and in the foreground of its
//! terminal. Typing goes only into that process: a shell back in the pane,
//! or a program the agent runs in the foreground (an editor), must never
//! get a message as its input.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// A process's identity and terminal, from `/proc/<pid>/stat`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    pub pid: i32,
    pub ppid: i32,
    pub pgid: i32,
    /// The controlling terminal's device number (0: none).
    pub tty: u64,
    /// The foreground process group of that terminal.
    pub tpgid: i32,
    /// Start time in clock ticks since boot: with the pid, the process.
    pub start: u64,
}

/// Reads `/proc/<pid>/stat`; `None` when the process is gone.
pub fn stat(pid: i32) -> Option<Process> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse(&text)
}

fn parse(text: &str) -> Option<Process> {
    // The command name may hold spaces and parentheses: fields follow the last ')'.
    let (head, rest) = text.rsplit_once(')')?;
    let pid = head.split_once(' ')?.0.trim().parse().ok()?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).copied();
    Some(Process {
        pid,
        ppid: field(4)?.parse().ok()?,
        pgid: field(5)?.parse().ok()?,
        tty: field(7)?.parse::<i64>().ok()? as u64,
        tpgid: field(8)?.parse().ok()?,
        start: field(22)?.parse().ok()?,
    })
}

/// The very agent process whose hooks bound a session: its numbers and what
/// it runs. A shell that `exec`s in its place keeps the pid, the start time
/// and the terminal (`claude; exec bash -i`, or bash running the last
/// command of a `-c` list in place), so the program and its command line
/// are checked as well, every time: a message never reaches a shell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Agent {
    pub pid: i32,
    pub start: u64,
    /// The controlling terminal's device number.
    pub tty: u64,
    /// The program it runs (`/proc/<pid>/exe`).
    pub exe: PathBuf,
    /// A digest of its command line (`/proc/<pid>/cmdline`).
    pub argv: String,
}

/// Shells, by the name of their program: never an agent. A hook runs
/// through one (`/bin/sh -c`, `$SHELL -lc`), and a pane or `loopx run` may
/// hold one that started the agent and takes the terminal back after it.
const SHELLS: &[&str] = &[
    "sh", "bash", "dash", "zsh", "fish", "ksh", "ksh93", "mksh", "pdksh", "oksh", "ash", "busybox",
    "yash", "posh", "tcsh", "csh", "nu", "elvish", "xonsh", "pwsh", "rbash",
];

/// Whether `exe` is a shell's program (`bash`, `/usr/bin/zsh-5.9`, …).
pub fn is_shell(exe: &Path) -> bool {
    let name = exe
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = name.trim_end_matches(" (deleted)");
    SHELLS.iter().any(|shell| {
        name == *shell
            || name.strip_prefix(shell).is_some_and(|rest| {
                rest.starts_with(['-', '.']) || rest.chars().all(|c| c.is_ascii_digit())
            })
    })
}

/// What `pid` runs now: its identity, or `None` when it is gone or cannot
/// be read (then nothing is typed).
pub fn identify(pid: i32) -> Option<Agent> {
    read(pid).map(|(_, agent)| agent)
}

/// `pid`'s stat and identity, read together.
fn read(pid: i32) -> Option<(Process, Agent)> {
    let process = stat(pid)?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let argv = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    // Read again: the numbers and the program belong to one process.
    let again = stat(pid)?;
    (again.start == process.start).then(|| {
        let agent = Agent {
            pid,
            start: process.start,
            tty: process.tty,
            exe,
            argv: hex::encode(&Sha256::digest(&argv)[..12]),
        };
        (again, agent)
    })
}

/// Whether `pid`'s command line holds `word` as one of its arguments.
fn has_arg(pid: i32, word: &[u8]) -> bool {
    let argv = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    argv.split(|b| *b == 0).any(|arg| arg == word)
}

/// The agent a hook runs for: the nearest ancestor of `pid` that has a
/// terminal and is no shell. The agents run their hooks in a session of
/// their own, with no terminal, through a shell (Claude Code `/bin/sh -c`,
/// Codex `$SHELL -lc` with the command exec'd); the agent is the process
/// that started that shell, whether or not it leads its process group (a
/// pane's `bash -c "claude; bash"` does not give it a group of its own).
pub fn agent_of(pid: i32) -> Option<Agent> {
    let mut process = stat(pid)?;
    for _ in 0..32 {
        if process.ppid <= 1 {
            return None;
        }
        process = stat(process.ppid)?;
        if process.tty == 0 {
            continue;
        }
        let agent = identify(process.pid)?;
        if !is_shell(&agent.exe) {
            return Some(agent);
        }
    }
    None
}

/// Whether a process above `pid` is Codex's `app-server`. By default the
/// Codex TUI runs its threads in one shared background server, which runs
/// every hook of every Codex on the machine with the environment of the
/// first TUI that started it (its `TMUX_PANE`, its `LOOPX_RUN_DIR`): a hook
/// run there cannot tell which terminal its agent is in.
pub fn under_app_server(pid: i32) -> bool {
    let mut process = stat(pid);
    for _ in 0..32 {
        let Some(p) = process else {
            return false;
        };
        if has_arg(p.pid, b"app-server") {
            return true;
        }
        if p.ppid <= 1 {
            return false;
        }
        process = stat(p.ppid);
    }
    false
}

/// A running Codex shared background server of this user (`codex app-server
/// --managed-daemon`, which Codex's TUI starts unless run with
/// `--no-daemon`): its pid. Every Codex TUI of the user then runs its hooks
/// there, where they cannot type into an idle agent.
pub fn managed_app_server() -> Option<i32> {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::getuid().as_raw();
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.metadata().is_ok_and(|m| m.uid() == me))
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| has_arg(*pid, b"app-server") && has_arg(*pid, b"--managed-daemon"))
}

/// Where the agent is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Now {
    /// In the foreground of its terminal: typing reaches it.
    Foreground,
    /// Alive, but something else has the terminal's foreground.
    Background,
    /// Exited (or its pid is another process now).
    Gone,
}

/// Checks the agent again (every time before typing, not once): the same
/// process running the same program with the same command line.
pub fn now(agent: &Agent) -> Now {
    match read(agent.pid) {
        Some((p, seen)) if &seen == agent => {
            if p.tpgid == p.pgid {
                Now::Foreground
            } else {
                Now::Background
            }
        }
        _ => Now::Gone,
    }
}

/// Whether typing into the agent's terminal now reaches the agent and only
/// it: the agent is there ([`now`]) and in the terminal's foreground group,
/// and no other process of that group reads the terminal (an editor or a
/// pager the agent started, a shell it left behind). The agent's own
/// ancestors (the shell that started it, waiting for it) do not read.
pub fn typing_reaches(agent: &Agent) -> Now {
    match now(agent) {
        Now::Foreground if other_reader(agent).is_none() => Now::Foreground,
        Now::Foreground => Now::Background,
        other => other,
    }
}

/// A process of the agent's foreground group, other than the agent and its
/// ancestors, whose standard input is the agent's terminal.
fn other_reader(agent: &Agent) -> Option<i32> {
    let mut at = stat(agent.pid)?;
    let group = at.tpgid;
    let mut ancestors = vec![agent.pid];
    while at.ppid > 1 && ancestors.len() < 64 {
        ancestors.push(at.ppid);
        at = stat(at.ppid)?;
    }
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| !ancestors.contains(pid))
        .filter_map(stat)
        .filter(|p| p.pgid == group && p.tty == agent.tty)
        .find(|p| {
            std::fs::read_link(format!("/proc/{}/fd/0", p.pid))
                .ok()
                .and_then(|path| tty_of(&path))
                == Some(agent.tty)
        })
        .map(|p| p.pid)
}

/// The device number of a terminal's path (`/dev/pts/3`), as `stat` gives a
/// process's controlling terminal.
pub fn tty_of(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let rdev = std::fs::metadata(path).ok()?.rdev();
    let (major, minor) = (
        rustix::fs::major(rdev) as u64,
        rustix::fs::minor(rdev) as u64,
    );
    // The kernel's encoding of tty_nr in /proc/<pid>/stat.
    Some((minor & 0xff) | (major << 8) | ((minor & !0xff) << 12))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_reads_a_name_with_spaces_and_parentheses() {
        let line = "4242 (node (claude) x) S 4200 4242 4200 34817 4242 4194560 1 0 0 0 \
                    5 1 0 0 20 0 11 0 987654 1000 100 18446744073709551615";
        let p = parse(line).unwrap();
        assert_eq!(
            (p.pid, p.ppid, p.pgid, p.tty, p.tpgid, p.start),
            (4242, 4200, 4242, 34817, 4242, 987654)
        );
    }

    #[test]
    fn this_process_is_found_and_checked() {
        let me = identify(std::process::id() as i32).unwrap();
        let seen = stat(me.pid).unwrap();
        assert_eq!(
            now(&me),
            if seen.tpgid == seen.pgid {
                Now::Foreground
            } else {
                Now::Background
            }
        );
        let restarted = Agent {
            start: me.start + 1,
            ..me.clone()
        };
        assert_eq!(now(&restarted), Now::Gone);
    }

    #[test]
    fn a_program_execd_in_the_agents_place_is_not_the_agent() {
        use std::io::Write;
        // The same pid and start time, another program: what a pane's
        // `claude; exec bash -i` leaves after the agent.
        let mut child = std::process::Command::new("/bin/sh")
            .args(["-c", "read line; exec sleep 5"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        std::thread::sleep(std::time::Duration::from_millis(100));
        let before = identify(pid).unwrap();
        assert_ne!(now(&before), Now::Gone);
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let started = std::time::Instant::now();
        while identify(pid).is_some_and(|seen| seen == before) {
            assert!(started.elapsed().as_secs() < 5, "sh never exec'd sleep");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let after = identify(pid).unwrap();
        assert_eq!((after.pid, after.start), (before.pid, before.start));
        assert_eq!(now(&before), Now::Gone);
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn shells_are_known_by_their_program() {
        for shell in [
            "/bin/sh",
            "/usr/bin/bash",
            "/bin/dash",
            "/usr/bin/zsh-5.9",
            "/usr/bin/fish",
            "/bin/bash (deleted)",
        ] {
            assert!(is_shell(Path::new(shell)), "{shell}");
        }
        for agent in [
            "/usr/bin/node",
            "/opt/claude/claude",
            "/usr/local/bin/codex",
            "/usr/bin/shellcheck",
            "/usr/bin/bashful",
        ] {
            assert!(!is_shell(Path::new(agent)), "{agent}");
        }
    }
}
