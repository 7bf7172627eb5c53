//! A delivered turn's files saved on the host, for every path that hands a
//! turn to an agent (`loopx hook stop`, the waker's typing, `loopx mcp`,
//! `worker-bridge attached-session-claim --save-attachments`): each into a
//! private folder (`<dir>/<session>/<turn>/`, mode 0700, files 0600) under
//! its safe name, and a line for the agent naming each with its type and
//! size. Names follow `crate::attachments`'s rule; nothing lands outside
//! the folder.

use std::collections::HashSet;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

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
    let made = private_folder(root).and_then(|()| private_folder(&folder));
    let mut names = HashSet::new();
    let mut saved = Vec::new();
    for attachment in attachments {
        let outcome = match &made {
            Err(e) => Err(format!("the folder could not be made: {e}")),
            Ok(()) => {
                let name = unique_name(&mut names, attachment);
                fetch_into(client, attachment, &folder.join(name)).await
            }
        };
        saved.push(Saved {
            attachment: attachment.clone(),
            outcome,
        });
    }
    saved
}

/// A name of its own in the folder: the safe name, or `<position>-name`
/// when an earlier file of the turn has it.
fn unique_name(taken: &mut HashSet<String>, attachment: &Attachment) -> String {
    let name = sanitize_name(&attachment.name);
    let name = if taken.contains(&name) {
        sanitize_name(&format!("{}-{name}", attachment.position))
    } else {
        name
    };
    taken.insert(name.clone());
    name
}

async fn fetch_into(
    client: &Client,
    attachment: &Attachment,
    path: &Path,
) -> Result<PathBuf, String> {
    let (bytes, _) = client
        .download(&attachment.download)
        .await
        .map_err(|e| format!("the download failed: {e}"))?;
    if hex::encode(Sha256::digest(&bytes)) != attachment.sha256 {
        return Err("the downloaded bytes do not match their sha256".into());
    }
    write_private(path, &bytes).map_err(|e| format!("it could not be written: {e}"))?;
    Ok(path.to_owned())
}

/// A folder (and its parents) made owner-only.
fn private_folder(folder: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(folder)?;
    std::fs::set_permissions(folder, std::fs::Permissions::from_mode(0o700))
}

/// A new owner-only file; whatever had its name (a file, a link) is
/// removed first, so a link planted there is never followed.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
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
