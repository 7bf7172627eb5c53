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

/// The turn a submitted prompt was typed for: the `seq` of its marker.
/// A prompt the person typed has none. Claude Code submits a long or
/// multi-line paste (4 lines or more, or over 800 characters) wrapped in a
/// `<pasted_content id="…">` line; the marker is the first thing inside it.
pub fn typed_seq(prompt: &str) -> Option<i64> {
    let prompt = prompt.trim_start();
    let prompt = match prompt.strip_prefix("<pasted_content") {
        Some(tag) => tag.split_once('>')?.1.trim_start(),
        None => prompt,
    };
    let rest = prompt.strip_prefix("[LoopX #")?;
    let (seq, rest) = rest.split_once(' ')?;
    let origin = rest.split_once("] ")?.0;
    match origin {
        "web" | "lark" => seq.parse().ok().filter(|seq| *seq > 0),
        _ => None,
    }
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
}
