//! The agent process as Linux's `/proc` shows it: which process the hooks
//! belong to, and whether it is still there and in the foreground of its
//! terminal. Typing goes only into that process: a shell back in the pane,
//! or a program the agent runs in the foreground (an editor), must never
//! get a message as its input.

use std::path::Path;

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

/// The agent a hook runs for: the nearest ancestor of `pid` that leads the
/// foreground process group of a terminal (the agent started at a shell
/// prompt, as a pane's program, or by `loopx run`). The shells the agents
/// run hooks through lead no foreground group.
pub fn agent_of(pid: i32) -> Option<Process> {
    let mut process = stat(pid)?;
    for _ in 0..32 {
        process = stat(process.ppid)?;
        if process.tty != 0 && process.pid == process.pgid && process.pgid == process.tpgid {
            return Some(process);
        }
        if process.ppid <= 1 {
            return None;
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
        let argv = std::fs::read(format!("/proc/{}/cmdline", p.pid)).unwrap_or_default();
        if argv.split(|b| *b == 0).any(|arg| arg == b"app-server") {
            return true;
        }
        if p.ppid <= 1 {
            return false;
        }
        process = stat(p.ppid);
    }
    false
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

/// Checks the agent again (every time before typing, not once).
pub fn now(agent: &Process) -> Now {
    match stat(agent.pid) {
        Some(p) if p.start != agent.start || p.tty != agent.tty => Now::Gone,
        Some(p) if p.tpgid == agent.pgid => Now::Foreground,
        Some(_) => Now::Background,
        None => Now::Gone,
    }
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
        let me = stat(std::process::id() as i32).unwrap();
        assert_eq!(
            now(&me),
            if me.tpgid == me.pgid {
                Now::Foreground
            } else {
                Now::Background
            }
        );
        let gone = Process {
            start: me.start + 1,
            ..me
        };
        assert_eq!(now(&gone), Now::Gone);
    }
}
