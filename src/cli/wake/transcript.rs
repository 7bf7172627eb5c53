//! An interrupt, read off the agent's own transcript (HOOKS.md "The
//! terminal's real life"): Esc or Ctrl-C mid-turn ends the turn with no
//! Stop hook, but Claude Code writes a user entry `[Request interrupted by
//! user]` (or `… for tool use]`) to its transcript, and Codex an event
//! `turn_aborted` to its rollout file. The hooks leave the file's path for
//! the waker ([`tell`]); the waker reads what is appended to it
//! ([`Watch::interrupted`]), never what was there when it first looked.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The most of the transcript read in one look: an agent writes far less
/// between two looks; what is past it is skipped, not read later.
const MAX_LOOK: u64 = 4 << 20;

/// Where the hooks leave a session's transcript path in `dir` (the waker's
/// records folder, [`super::records_dir`]).
fn path_file(dir: &Path, session_id: &str) -> PathBuf {
    super::text::Record::path(dir, session_id).with_extension("transcript")
}

/// Leaves the agent's transcript path for the session's waker (a private
/// file, written only when it changed).
pub fn tell(dir: &Path, session_id: &str, transcript: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = path_file(dir, session_id);
    if std::fs::read_to_string(&path).ok().as_deref() == Some(transcript) {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    let partial = path.with_extension(format!("{}.part", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&partial)?;
    file.write_all(transcript.as_bytes())?;
    std::fs::rename(&partial, &path)
}

/// A session's transcript, as the waker follows it.
pub struct Watch {
    told: PathBuf,
    /// The transcript and how far it was read, once the hooks named it.
    file: Option<(PathBuf, u64)>,
    /// The end of a line not yet written whole.
    partial: Vec<u8>,
}

impl Watch {
    pub fn new(dir: &Path, session_id: &str) -> Watch {
        Watch {
            told: path_file(dir, session_id),
            file: None,
            partial: Vec::new(),
        }
    }

    /// Whether an interrupt was written to the transcript since the last
    /// look (the first look only finds where the transcript ends).
    pub fn interrupted(&mut self) -> bool {
        // A session's transcript is named once (its waker is the
        // session's): the hooks' file is read until it is.
        let Some((path, offset)) = self.file.take() else {
            if let Ok(named) = std::fs::read_to_string(&self.told) {
                // Named now: what it holds is history.
                let named = PathBuf::from(named);
                let end = std::fs::metadata(&named).map_or(0, |m| m.len());
                self.file = Some((named, end));
            }
            return false;
        };
        let (read, offset) = read_from(&path, offset);
        self.file = Some((path, offset));
        self.partial.extend_from_slice(&read);
        let Some(end) = self.partial.iter().rposition(|b| *b == b'\n') else {
            return false;
        };
        let lines: Vec<u8> = self.partial.drain(..=end).collect();
        lines.split(|b| *b == b'\n').any(is_interrupt)
    }
}

/// What was appended to `path` past `offset`, and the new offset (a file
/// that shrank is read from its start).
fn read_from(path: &Path, offset: u64) -> (Vec<u8>, u64) {
    let Ok(mut file) = std::fs::File::open(path) else {
        return (Vec::new(), offset);
    };
    let len = file.metadata().map_or(0, |m| m.len());
    let from = if len < offset { 0 } else { offset };
    let from = from.max(len.saturating_sub(MAX_LOOK));
    let mut read = Vec::new();
    if file.seek(SeekFrom::Start(from)).is_err()
        || file.take(len - from).read_to_end(&mut read).is_err()
    {
        return (Vec::new(), offset);
    }
    let end = from + read.len() as u64;
    (read, end)
}

/// Whether a transcript line is an interrupt: Claude Code's user entry
/// `[Request interrupted by user…]`, or Codex's `turn_aborted` event.
fn is_interrupt(line: &[u8]) -> bool {
    // Most lines are neither: no parse.
    let window = |needle: &[u8]| line.windows(needle.len()).any(|w| w == needle);
    if !window(b"interrupted by user") && !window(b"turn_aborted") {
        return false;
    }
    let Ok(entry) = serde_json::from_slice::<Value>(line) else {
        return false;
    };
    let claude = entry["type"] == "user"
        && match &entry["message"]["content"] {
            Value::String(text) => interrupt_text(text),
            Value::Array(parts) => parts
                .iter()
                .any(|p| p["type"] == "text" && p["text"].as_str().is_some_and(interrupt_text)),
            _ => false,
        };
    let codex = entry["type"] == "event_msg" && entry["payload"]["type"] == "turn_aborted";
    claude || codex
}

fn interrupt_text(text: &str) -> bool {
    text.starts_with("[Request interrupted by user")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn only_an_interrupt_written_after_the_first_look_counts() {
        let dir = tempfile::tempdir().unwrap();
        let transcript = dir.path().join("t.jsonl");
        let claude = r#"{"type":"user","message":{"role":"user","content":[{"type":"text","text":"[Request interrupted by user]"}]}}"#;
        let append = |line: &str| {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&transcript)
                .unwrap();
            f.write_all(line.as_bytes()).unwrap();
        };
        append(&format!("{claude}\n"));
        let mut watch = Watch::new(dir.path(), "ses_1");
        assert!(!watch.interrupted(), "no path told yet");
        tell(dir.path(), "ses_1", transcript.to_str().unwrap()).unwrap();
        assert!(!watch.interrupted(), "what was there is history");
        append(
            r#"{"type":"user","message":{"role":"user","content":"say [Request interrupted by user]"}}"#,
        );
        append("\n");
        assert!(!watch.interrupted(), "a prompt that quotes it is a prompt");
        // Written in two pieces: counted once the line is whole.
        let (head, tail) = claude.split_at(40);
        append(head);
        assert!(!watch.interrupted());
        append(&format!("{tail}\n"));
        assert!(watch.interrupted());
        assert!(!watch.interrupted(), "seen once");
        append(
            r#"{"timestamp":"2026-12-07T00:00:00Z","type":"event_msg","payload":{"type":"turn_aborted","reason":"interrupted"}}"#,
        );
        append("\n");
        assert!(watch.interrupted(), "Codex's rollout event");
        append(
            r#"{"type":"assistant","message":{"content":[{"type":"text","text":"turn_aborted"}]}}"#,
        );
        append("\n");
        assert!(!watch.interrupted());
    }
}
