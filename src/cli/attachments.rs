//! A delivered turn's files saved on the host, for every path that hands a
//! turn to an agent (`loopx hook stop`, the waker's typing, `loopx mcp`,
//! `worker-bridge attached-session-claim --save-attachments`): each into a
//! private folder (`<dir>/<session>/<turn>/`, mode 0700, files 0600) under
//! its safe name, and a line for the agent naming each with its type and
//! size. Names follow `crate::attachments`'s rule; nothing lands outside
//! the folder: the folders below `<dir>` are opened without following a
//! link and only if they are this user's, and no mode is changed on a
//! folder this code did not make (`<dir>` may be `/tmp`).

use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

use sha2::{Digest, Sha256};

use crate::attachments::{human_size, sanitize_name};
use crate::client::Client;
use crate::model::Attachment;

/// A file saved, or why it could not be.
#[derive(Debug, Clone)]
pub struct Saved {
    pub attachment: Attachment,
    pub outcome: Result<PathBuf, String>,
}

/// Where the hooks, the waker and `loopx mcp` save: `<data dir>/attachments`.
pub fn default_root(data_dir: &Path) -> PathBuf {
    data_dir.join("attachments")
}

/// The folder of one turn's files under `root`.
pub fn turn_folder(root: &Path, session_id: &str, turn_id: &str) -> PathBuf {
    root.join(sanitize_name(session_id))
        .join(sanitize_name(turn_id))
}

/// Downloads each of a turn's files and saves it in its private folder
/// under `root`; a file that fails is reported, never fatal. The bytes are
/// checked against the listed sha256.
pub async fn save(
    client: &Client,
    root: &Path,
    session_id: &str,
    turn_id: &str,
    attachments: &[Attachment],
) -> Vec<Saved> {
    if attachments.is_empty() {
        return Vec::new();
    }
    let folder = turn_folder(root, session_id, turn_id);
    let made = open_turn_folder(root, session_id, turn_id);
    let mut names = HashSet::new();
    let mut saved = Vec::new();
    for attachment in attachments {
        let outcome = match &made {
            Err(e) => Err(format!("the folder could not be made: {e}")),
            Ok(dir) => fetch_into(client, attachment, dir, &mut names)
                .await
                .map(|name| folder.join(name)),
        };
        saved.push(Saved {
            attachment: attachment.clone(),
            outcome,
        });
    }
    saved
}

/// The names a turn's file may take, in order: its safe name, then
/// `2-name`, `3-name`, …
fn candidates(name: &str) -> impl Iterator<Item = String> + '_ {
    std::iter::once(name.to_owned())
        .chain((2..=MAX_CANDIDATES).map(move |n| sanitize_name(&format!("{n}-{name}"))))
}

/// How many names a file tries before it is named as not saved.
const MAX_CANDIDATES: usize = 100;

/// Saves `bytes` in `dir` under a name no other file of the turn took
/// (`taken`) and nothing on disk has: never over an existing file. A file
/// already there with these very bytes (the turn delivered again) is
/// taken as saved. The name used.
fn save_unique(
    dir: &OwnedFd,
    taken: &mut HashSet<String>,
    name: &str,
    bytes: &[u8],
) -> std::io::Result<String> {
    for candidate in candidates(name) {
        if taken.contains(&candidate) {
            continue;
        }
        let saved = match write_private(dir, &candidate, bytes) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                holds(dir, &candidate, bytes)
            }
            Err(e) => return Err(e),
        };
        if saved {
            taken.insert(candidate.clone());
            return Ok(candidate);
        }
    }
    Err(std::io::Error::other("every name it could take is taken"))
}

/// Whether `name` in `dir` is a plain file (not followed if a link) holding
/// exactly `bytes`.
fn holds(dir: &OwnedFd, name: &str, bytes: &[u8]) -> bool {
    use std::io::Read;
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let Ok(fd) = rustix::fs::openat(dir, name, flags, Mode::empty()) else {
        return false;
    };
    let mut file = std::fs::File::from(fd);
    let mut held = Vec::new();
    let same_size = file
        .metadata()
        .is_ok_and(|m| m.is_file() && m.len() == bytes.len() as u64);
    same_size && file.read_to_end(&mut held).is_ok() && held == bytes
}

/// Downloads a file, checks its sha256 and saves it in `dir`: the name it
/// took there.
async fn fetch_into(
    client: &Client,
    attachment: &Attachment,
    dir: &OwnedFd,
    taken: &mut HashSet<String>,
) -> Result<String, String> {
    let (bytes, _) = client
        .download(&attachment.download)
        .await
        .map_err(|e| format!("the download failed: {e}"))?;
    if hex::encode(Sha256::digest(&bytes)) != attachment.sha256 {
        return Err("the downloaded bytes do not match their sha256".into());
    }
    save_unique(dir, taken, &sanitize_name(&attachment.name), &bytes)
        .map_err(|e| format!("it could not be written: {e}"))
}

/// `<root>/<session>/<turn>`, opened: `root` made (0700) if missing, else
/// left as it is (never chmod-ed: it may be `/tmp`); the two folders below
/// it made 0700, or opened if they exist, without following a link and
/// only if they are ours. The path [`turn_folder`] names is this folder.
fn open_turn_folder(root: &Path, session_id: &str, turn_id: &str) -> std::io::Result<OwnedFd> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(root)?;
    let flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC;
    let root = rustix::fs::open(root, flags, Mode::empty())?;
    let session = own_folder(&root, &sanitize_name(session_id))?;
    own_folder(&session, &sanitize_name(turn_id))
}

/// A folder of ours in `parent`: made owner-only, or, when it exists,
/// opened without following a link (a link there is refused) and only if
/// this user owns it; its mode is never changed.
fn own_folder(parent: &OwnedFd, name: &str) -> std::io::Result<OwnedFd> {
    match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o700)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(e.into()),
    }
    let flags = OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC;
    let folder = rustix::fs::openat(parent, name, flags, Mode::empty())?;
    if rustix::fs::fstat(&folder)?.st_uid != rustix::process::geteuid().as_raw() {
        return Err(std::io::Error::other(format!(
            "{name} is not this user's folder"
        )));
    }
    Ok(folder)
}

/// A new owner-only file `name` in `dir`: never over anything that has its
/// name (a file, a link: `AlreadyExists`), never through a link.
fn write_private(dir: &OwnedFd, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(0o600))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes)?;
    file.sync_all()
}

/// The lines that name the saved files for the agent, one each:
/// `Attached: /path/shot.png (image/png, 12 KB)`, or why one is missing.
/// Empty when the turn has none.
pub fn describe(saved: &[Saved]) -> String {
    saved
        .iter()
        .map(|s| {
            let a = &s.attachment;
            match &s.outcome {
                Ok(path) => format!(
                    "Attached: {} ({}, {})",
                    path.display(),
                    a.content_type,
                    human_size(a.size)
                ),
                Err(why) => format!(
                    "Attached file {} ({}, {}) could not be saved: {why}",
                    a.name,
                    a.content_type,
                    human_size(a.size)
                ),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `text`, then (after a blank line) the lines naming its saved files.
pub fn with_files(text: &str, saved: &[Saved]) -> String {
    let lines = describe(saved);
    if lines.is_empty() {
        text.to_owned()
    } else {
        format!("{text}\n\n{lines}")
    }
}
