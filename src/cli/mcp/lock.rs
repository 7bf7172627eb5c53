//! One bridge per host identity: a second `loopx mcp` for the same host
//! session (and broker) would take the first one's claims and strand turns,
//! so each run holds an exclusive lock on a file named after the identity,
//! in `<data dir>/mcp/`. The kernel lets the lock go when the process ends,
//! however it ends (a `kill -9` too), so a restart never finds a stale one.
//! A run that finds the lock held waits for it a little (the run before may
//! still be exiting: an agent CLI that reconnects starts the new server
//! before the old one has gone), then refuses to start. The file holds the
//! holder's pid, for the message; its name is a hash, never the host id.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// How long a run waits for the run before it to exit (its bound is 5 s).
pub const WAIT_FOR_HOLDER: Duration = Duration::from_secs(6);

/// The held lock: kept for the life of the process.
pub struct HostLock {
    _file: File,
}

/// The lock file of one host identity at one broker.
pub fn path(dir: &Path, broker_url: &str, host_surface: &str, host_session_id: &str) -> PathBuf {
    let mut hash = Sha256::new();
    for part in [broker_url, host_surface, host_session_id] {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    dir.join(format!("{}.lock", hex::encode(&hash.finalize()[..16])))
}

/// Takes the lock, waiting up to `wait` for a holder to exit. `Err` says why
/// not, for the user.
pub fn take(path: &Path, wait: Duration) -> Result<HostLock, String> {
    if let Some(dir) = path.parent() {
        create_private_dir(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| format!("cannot open the lock file {}: {e}", path.display()))?;
    let deadline = Instant::now() + wait;
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                let pid = if holder.is_empty() { "?" } else { holder };
                return Err(format!(
                    "another loopx mcp (pid {pid}) is already serving this host session for this \
                     broker; run one bridge per host session (stop that one first, or restart the \
                     agent CLI), since two would take each other's messages"
                ));
            }
            Err(TryLockError::Error(e)) => {
                return Err(format!("cannot lock {}: {e}", path.display()));
            }
        }
    }
    // The holder's pid, for the message a second run prints.
    let _ = file.set_len(0);
    let _ = file.rewind();
    let _ = write!(file, "{}", std::process::id());
    Ok(HostLock { _file: file })
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_one_identity_is_refused_until_the_first_goes() {
        let dir = tempfile::tempdir().unwrap();
        let one = path(dir.path(), "http://b", "claude-code", "h1");
        assert_ne!(one, path(dir.path(), "http://b", "claude-code", "h2"));
        // (Its file name only: the temporary folder's random name may hold "h1".)
        let name = one
            .strip_prefix(dir.path())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(
            !name.contains("h1"),
            "the host id is not in the name: {name}"
        );
        let first = take(&one, Duration::ZERO).unwrap();
        let refused = take(&one, Duration::from_millis(200)).err().unwrap();
        assert!(
            refused.contains(&format!("pid {}", std::process::id())),
            "{refused}"
        );
        drop(first);
        take(&one, Duration::ZERO).unwrap();
    }
}
