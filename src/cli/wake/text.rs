//! What is typed into an agent for a queued turn, and how the agent's
//! `UserPromptSubmit` hook recognises it: one rule, in one place, for both
//! sides (HOOKS.md "Waking an idle agent").
//!
//! The typed text starts with a marker, `[LoopX #<seq> <origin>] `, so a
//! message is always a message: one that starts with `/`, `!`, `#` or `$`
//! is never read as a slash command, a shell command or a memory write,
//! since the prompt no longer starts with it. Control characters and escape
//! sequences never reach the terminal: the text keeps its printable
//! characters, tabs (as spaces) and line breaks (one prompt, pasted).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::model::Origin;

/// A typed turn's marker: `[LoopX #12 web] `.
pub fn marker(seq: i64, origin: Origin) -> String {
    let origin = match origin {
        Origin::Web => "web",
        Origin::Lark => "lark",
        Origin::Terminal => "terminal",
    };
    format!("[LoopX #{seq} {origin}] ")
}

/// The text typed for a turn: its marker, then the message made safe for a
/// terminal.
pub fn typed(seq: i64, origin: Origin, message: &str) -> String {
    marker(seq, origin) + &printable(message)
}

/// The message without what a terminal would act on: C0 and C1 controls
/// (ESC among them, so no escape sequence survives) and DEL are dropped,
/// tabs become spaces, `\r\n` and `\r` become `\n`; trailing blank lines go.
pub fn printable(message: &str) -> String {
    let unified = message.replace("\r\n", "\n").replace('\r', "\n");
    let kept: String = unified
        .chars()
        .filter_map(|c| match c {
            '\n' => Some('\n'),
            '\t' => Some(' '),
            c if c.is_control() => None,
            c => Some(c),
        })
        .collect();
    kept.trim_end().to_owned()
}

/// A submitted prompt as it was typed: Claude Code submits a long or
/// multi-line paste (4 lines or more, or over 800 characters) wrapped in a
/// `<pasted_content id="…">` line and its closing tag.
fn unwrapped(prompt: &str) -> Option<&str> {
    let prompt = prompt.trim();
    match prompt.strip_prefix("<pasted_content") {
        Some(tag) => {
            let inner = tag.split_once('>')?.1;
            Some(
                inner
                    .rsplit_once("</pasted_content")
                    .map_or(inner, |(text, _)| text),
            )
        }
        None => Some(prompt),
    }
}

/// The turn a submitted prompt's marker names: the `seq` of its marker. A
/// prompt the person typed has none. Only a marker the waker typed, with the
/// text it typed after it, delivers a turn ([`Record::delivers`]).
pub fn typed_seq(prompt: &str) -> Option<i64> {
    let prompt = unwrapped(prompt)?.trim_start();
    let rest = prompt.strip_prefix("[LoopX #")?;
    let (seq, rest) = rest.split_once(' ')?;
    let origin = rest.split_once("] ")?.0;
    match origin {
        "web" | "lark" => seq.parse().ok().filter(|seq| *seq > 0),
        _ => None,
    }
}

/// What a waker typed for a turn, left where the agent's hooks look before
/// it types (a private file, one per session): the proof that a marker was
/// typed by the waker for that turn, with that turn's text. A marker typed
/// at the terminal by hand (`[LoopX #3 web] anything`) has no record, or
/// another text, and stays the person's own prompt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub seq: i64,
    pub turn_id: String,
    /// A digest of the typed text's visible characters (the agents change
    /// line breaks and spaces in a paste; they keep every other character).
    pub digest: String,
}

impl Record {
    pub fn of(seq: i64, turn_id: &str, typed: &str) -> Record {
        Record {
            seq,
            turn_id: turn_id.to_owned(),
            digest: visible_digest(typed),
        }
    }

    /// Where a session's record is kept in `dir` (the data dir's `wakers`
    /// folder, or `loopx run`'s private folder).
    pub fn path(dir: &Path, session_id: &str) -> PathBuf {
        let name: String = session_id
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
            .collect();
        dir.join(format!("typed-{name}.json"))
    }

    /// Keeps the record (readable by this user only), replacing the last.
    pub fn keep(&self, dir: &Path, session_id: &str) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::create_dir_all(dir)?;
        let path = Record::path(dir, session_id);
        let partial = path.with_extension(format!("{}.part", std::process::id()));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&partial)?;
        file.write_all(serde_json::to_string(self)?.as_bytes())?;
        std::fs::rename(&partial, &path)
    }

    /// The record kept for the session, if any.
    pub fn read(dir: &Path, session_id: &str) -> Option<Record> {
        let text = std::fs::read_to_string(Record::path(dir, session_id)).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Forgets the session's record (its turn was taken).
    pub fn forget(dir: &Path, session_id: &str) {
        let _ = std::fs::remove_file(Record::path(dir, session_id));
    }

    /// Whether `prompt`, as the agent submitted it, is what was typed for
    /// this record's turn: its marker and every visible character.
    pub fn delivers(&self, prompt: &str) -> bool {
        typed_seq(prompt) == Some(self.seq)
            && unwrapped(prompt).is_some_and(|text| visible_digest(text) == self.digest)
    }
}

fn visible_digest(text: &str) -> String {
    let mut digest = Sha256::new();
    for c in text.chars().filter(|c| !c.is_whitespace()) {
        let mut buf = [0u8; 4];
        digest.update(c.encode_utf8(&mut buf).as_bytes());
    }
    hex::encode(&digest.finalize()[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_a_message_and_its_marker_reads_back() {
        for message in ["/clear everything", "!rm -rf /", "# remember", "$HOME"] {
            let text = typed(7, Origin::Web, message);
            assert!(text.starts_with("[LoopX #7 web] "), "{text}");
            assert!(text.ends_with(message));
            assert_eq!(typed_seq(&text), Some(7));
        }
        assert_eq!(typed_seq(&typed(12, Origin::Lark, "hi")), Some(12));
        assert_eq!(typed_seq("please look at [LoopX #3 web] "), None);
        assert_eq!(typed_seq("[LoopX #3 phone] hi"), None);
        assert_eq!(typed_seq("[LoopX #0 web] hi"), None);
        // Claude Code's wrapper of a long or multi-line paste, as submitted.
        let wrapped = "\n\n<pasted_content id=\"4f99\">\n[LoopX #5 web] a\nb\nc\nd\n</pasted_content id=\"4f99\">\n";
        assert_eq!(typed_seq(wrapped), Some(5));
        assert_eq!(
            typed_seq("<pasted_content id=\"1\">\nmy own paste [LoopX #5 web] x"),
            None
        );
    }

    #[test]
    fn controls_and_escapes_never_reach_the_terminal() {
        let hostile = "a\x1b[201~\x1b]0;title\x07b\x03c\x7f\u{9b}d\te\r\nf\rg\n\n";
        assert_eq!(printable(hostile), "a[201~]0;titlebcd e\nf\ng");
        assert!(
            !typed(1, Origin::Web, hostile)
                .chars()
                .any(|c| c.is_control() && c != '\n')
        );
    }

    #[test]
    fn only_what_the_waker_typed_delivers_its_turn() {
        let typed = typed(3, Origin::Web, "deploy\nis green");
        let record = Record::of(3, "turn_3", &typed);
        assert!(record.delivers(&typed));
        // As Claude Code submits a multi-line paste: wrapped, a line break more.
        let wrapped =
            format!("\n\n<pasted_content id=\"6e90\">\n{typed}\n</pasted_content id=\"6e90\">\n");
        assert!(record.delivers(&wrapped));
        // A marker typed at the terminal by hand: another text, or another turn.
        assert!(!record.delivers("[LoopX #3 web] anything"));
        assert!(!record.delivers(&typed.replace("#3", "#4")));
        assert!(!record.delivers(&format!("{typed} and more")));
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Record::read(dir.path(), "ses_1"), None);
        record.keep(dir.path(), "ses_1").unwrap();
        assert_eq!(Record::read(dir.path(), "ses_1"), Some(record));
        Record::forget(dir.path(), "ses_1");
        assert_eq!(Record::read(dir.path(), "ses_1"), None);
    }
}
