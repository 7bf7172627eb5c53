//! Answers as Lark Markdown: a Lark turn's answer goes back as a schema 2.0
//! interactive card with one `markdown` element (it renders headings, lists,
//! code blocks and tables; a `post` with `md` renders neither headings nor
//! tables). Raw HTML is escaped, and a long answer is split below Lark's 30 KB
//! card limit on block boundaries, closing and reopening a code fence at a
//! cut, the parts numbered ("(1/3)").

use serde_json::{Value, json};

/// The bytes a char takes in a request body where the text is escaped twice
/// (`content` is a JSON string holding JSON): `"` becomes four bytes, a
/// newline three.
pub(super) fn body_bytes(c: char) -> usize {
    match c {
        '"' | '\\' => 4,
        '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 3,
        c if (c as u32) < 0x20 => 7,
        c => c.len_utf8(),
    }
}

fn str_bytes(text: &str) -> usize {
    text.chars().map(body_bytes).sum()
}

/// Raw HTML never reaches Lark as HTML: `<` and `>` become entities.
pub fn escape_html(text: &str) -> String {
    text.replace('<', "&lt;").replace('>', "&gt;")
}

/// How much of a session's name an answer's header shows.
const TITLE_CHARS: usize = 120;

/// The card that carries one part of an answer, its header naming the
/// session that answered (goal · agent), when known.
pub fn card(markdown: &str, title: Option<&str>) -> Value {
    let mut card = json!({
        "schema": "2.0",
        "body": {"elements": [{"tag": "markdown", "content": markdown}]},
    });
    if let Some(title) = title {
        // Ids are up to 256 bytes each: a title cut this short stays well
        // inside the room the parts leave for the rest of the card.
        let title: String = title.chars().take(TITLE_CHARS).collect();
        card["header"] =
            json!({"title": {"tag": "plain_text", "content": title}, "template": "blue"});
    }
    card
}

/// A code fence: its char and length (a closing fence uses at least as many).
#[derive(Clone, Copy)]
struct Fence<'a> {
    line: &'a str,
    ch: char,
    len: usize,
}

impl Fence<'_> {
    fn parse(line: &str) -> Option<Fence<'_>> {
        let rest = line.trim_start_matches(' ');
        if line.len() - rest.len() > 3 {
            return None;
        }
        let ch = rest.chars().next().filter(|c| *c == '`' || *c == '~')?;
        let len = rest.chars().take_while(|c| *c == ch).count();
        (len >= 3).then_some(Fence { line, ch, len })
    }

    fn closes(&self, line: &str) -> bool {
        Fence::parse(line).is_some_and(|f| {
            f.ch == self.ch
                && f.len >= self.len
                && f.line.trim()[f.len * f.ch.len_utf8()..].trim().is_empty()
        })
    }

    fn closer(&self) -> String {
        self.ch.to_string().repeat(self.len)
    }
}

/// A piece of the answer: a line, or a slice of an overlong line.
struct Segment<'a> {
    text: &'a str,
    /// A newline follows it in the answer.
    newline: bool,
    /// The fence open where it starts, if any.
    open: Option<Fence<'a>>,
    /// A block ends after it (a blank line or a closing fence, outside a fence).
    boundary: bool,
}

fn segments(text: &str, limit: usize) -> Vec<Segment<'_>> {
    let mut segments = Vec::new();
    let mut open: Option<Fence> = None;
    let mut lines = text.split('\n').peekable();
    while let Some(line) = lines.next() {
        let newline = lines.peek().is_some();
        let at_start = open;
        let mut boundary = false;
        if str_bytes(line) <= limit / 4 {
            match open {
                Some(fence) if fence.closes(line) => {
                    open = None;
                    boundary = true;
                }
                Some(_) => {}
                None => {
                    open = Fence::parse(line);
                    boundary = open.is_none() && line.trim().is_empty();
                }
            }
        }
        // An overlong line is cut on char boundaries.
        let mut chunks = Vec::new();
        let (mut start, mut size) = (0, 0);
        for (at, c) in line.char_indices() {
            if size + body_bytes(c) > limit / 4 {
                chunks.push(&line[start..at]);
                (start, size) = (at, 0);
            }
            size += body_bytes(c);
        }
        chunks.push(&line[start..]);
        let last = chunks.len() - 1;
        for (i, chunk) in chunks.into_iter().enumerate() {
            segments.push(Segment {
                text: chunk,
                newline: newline && i == last,
                open: at_start,
                boundary: boundary && i == last,
            });
        }
    }
    segments
}

/// The Markdown of segments `from..to`: a fence open at the start reopened, one
/// open at the end closed.
fn render(segments: &[Segment], from: usize, to: usize) -> String {
    let mut out = String::new();
    if let Some(fence) = segments[from].open {
        out.push_str(fence.line);
        out.push('\n');
    }
    for segment in &segments[from..to] {
        out.push_str(segment.text);
        if segment.newline {
            out.push('\n');
        }
    }
    if let Some(fence) = segments.get(to).and_then(|s| s.open) {
        let kept = out.trim_end_matches('\n').len();
        out.truncate(kept);
        out.push('\n');
        out.push_str(&fence.closer());
    } else if to < segments.len() {
        let kept = out.trim_end_matches('\n').len();
        out.truncate(kept);
    }
    out
}

/// Room kept in each part for the part number ("\n\n(12/34)").
const NUMBER_BYTES: usize = 32;

/// Splits Markdown into parts that each take at most `limit` bytes of the
/// request body (escaped twice), preferring block boundaries, never leaving a
/// code fence open; numbered ("(1/3)") when there is more than one.
pub fn split(text: &str, limit: usize) -> Vec<String> {
    let mut parts = unnumbered(text, limit.saturating_sub(NUMBER_BYTES));
    number(&mut parts, "\n\n");
    parts
}

/// The first part of Markdown that takes at most `limit` bytes of the
/// request body, cut as [`split`] cuts (no code fence left open), and
/// whether anything was left out.
pub fn head(text: &str, limit: usize) -> (String, bool) {
    let mut parts = unnumbered(text, limit).into_iter();
    let first = parts.next().unwrap_or_default();
    (first, parts.next().is_some())
}

fn unnumbered(text: &str, limit: usize) -> Vec<String> {
    let limit = limit.max(64);
    let segments = segments(text, limit);
    let mut parts = Vec::new();
    let mut start = 0;
    while start < segments.len() {
        let mut size = segments[start]
            .open
            .map_or(0, |fence| str_bytes(fence.line) + 3);
        let (mut end, mut block_end) = (start, None);
        while end < segments.len() {
            let segment = &segments[end];
            let add = str_bytes(segment.text) + if segment.newline { 3 } else { 0 };
            let close = segments
                .get(end + 1)
                .and_then(|s| s.open)
                .map_or(0, |fence| fence.len * 4 + 3);
            if end > start && size + add + close > limit {
                break;
            }
            size += add;
            end += 1;
            if segment.boundary {
                block_end = Some(end);
            }
        }
        let cut = if end == segments.len() {
            end
        } else {
            block_end.unwrap_or(end)
        };
        parts.push(render(&segments, start, cut));
        start = cut;
    }
    parts
}

/// Numbers parts ("(1/3)", after `separator`) when there is more than one.
pub(super) fn number(parts: &mut [String], separator: &str) {
    let count = parts.len();
    if count > 1 {
        for (i, part) in parts.iter_mut().enumerate() {
            part.push_str(&format!("{separator}({}/{count})", i + 1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{card, escape_html, split, str_bytes};

    fn fences_balanced(part: &str) -> bool {
        part.lines()
            .filter(|l| l.trim_start().starts_with("```"))
            .count()
            % 2
            == 0
    }

    #[test]
    fn short_answers_are_one_part_unchanged() {
        assert_eq!(
            split("4, as plain text.\nSecond line.", 30_000),
            vec!["4, as plain text.\nSecond line.".to_owned()]
        );
        assert_eq!(split("", 30_000), vec![String::new()]);
    }

    #[test]
    fn html_is_escaped() {
        assert_eq!(
            escape_html("<script>alert(1)</script> a > b"),
            "&lt;script&gt;alert(1)&lt;/script&gt; a &gt; b"
        );
    }

    #[test]
    fn a_long_code_block_is_cut_with_its_fence_closed_and_reopened() {
        let code: String = (0..4000)
            .map(|i| format!("let x{i} = \"{i}\";\n"))
            .collect();
        let text = format!(
            "# Title\n\n- one\n- two\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n```rust\n{code}```\n\nThe end."
        );
        let limit = 30 * 1024 - 1024;
        let parts = split(&text, limit);
        assert!(parts.len() >= 3, "{}", parts.len());
        for (i, part) in parts.iter().enumerate() {
            assert!(str_bytes(part) <= limit, "part {i}: {}", str_bytes(part));
            assert!(fences_balanced(part), "part {i}");
            assert!(part.ends_with(&format!("({}/{})", i + 1, parts.len())));
        }
        // The cut before the code block falls on the block boundary.
        assert!(parts[0].starts_with("# Title\n\n- one"));
        assert!(
            parts[1].starts_with("```rust\nlet x0 = "),
            "{}",
            &parts[1][..40]
        );
        assert!(parts[2].starts_with("```rust\n"));
        assert!(parts.last().unwrap().contains("The end."));
        // Nothing lost, nothing doubled.
        let code_lines: usize = parts
            .iter()
            .map(|p| p.lines().filter(|l| l.starts_with("let x")).count())
            .sum();
        assert_eq!(code_lines, 4000);
        // The whole card body stays under the limit.
        for part in &parts {
            let body = serde_json::json!({
                "content": card(part, Some("g · a")).to_string(),
                "msg_type": "interactive",
                "reply_in_thread": false,
                "uuid": format!("lx-{}-{}", "t".repeat(60), 99),
            });
            assert!(body.to_string().len() < 30 * 1024);
        }
    }

    #[test]
    fn overlong_lines_are_cut_on_char_boundaries() {
        let text = "é".repeat(10_000);
        let parts = split(&text, 4096);
        assert!(parts.len() > 1);
        let joined: String = parts
            .iter()
            .map(|p| p.rsplit_once("\n\n(").unwrap().0)
            .collect::<Vec<_>>()
            .join("");
        assert_eq!(joined.replace('\n', ""), text);
    }

    #[test]
    fn tilde_fences_and_longer_closers_count() {
        let body = "x = 1\n".repeat(2000);
        let text = format!("~~~~\n{body}~~~~~\nafter");
        for part in split(&text, 4096) {
            let opens = part.lines().filter(|l| l.starts_with("~~~~")).count();
            assert_eq!(opens % 2, 0, "{part}");
        }
    }
}
