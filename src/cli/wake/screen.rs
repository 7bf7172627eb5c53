//! What an agent's screen says of its prompt: whether it holds text that a
//! typed message would be merged with. Under tmux the waker does not see
//! the keys that put a draft there (typed before the agent went idle, sent
//! with `send-keys`, pasted), so it reads the pane, with its colours
//! (`capture-pane -e`), before every message.
//!
//! The prompt is the last line that starts with the agent's prompt sign
//! (Claude Code `❯` between two rules; Codex `›`, its placeholder drawn
//! faint; a plain `>` elsewhere), and the lines after it up to a blank line
//! or a rule (a draft's further lines). Faint text there is a placeholder
//! or a suggestion, not the person's; anything else that is not blank is a
//! draft. No prompt on the screen (a dialog, a menu, another program): in
//! doubt, the prompt is taken as not empty.

/// The prompt signs of the agents we type into.
const SIGNS: &[char] = &['❯', '›', '>'];

/// What the prompt holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prompt {
    /// The prompt is on the screen, with nothing typed in it.
    Empty,
    /// Text is in the prompt (a draft), or no prompt is to be seen.
    NotEmpty,
}

/// One screen cell's character and whether it is drawn faint.
struct Cell {
    c: char,
    faint: bool,
}

/// A line of `capture-pane -e` as cells: SGR sequences set and clear
/// faintness; every other escape sequence is dropped.
fn cells(line: &str) -> Vec<Cell> {
    let mut out = Vec::new();
    let mut faint = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\x1b' {
            out.push(Cell { c, faint });
            continue;
        }
        match chars.next() {
            Some('[') => {
                let mut params = String::new();
                let mut last = None;
                for c in chars.by_ref() {
                    if ('\x40'..='\x7e').contains(&c) {
                        last = Some(c);
                        break;
                    }
                    params.push(c);
                }
                if last == Some('m') {
                    faint = sgr_faint(&params, faint);
                }
            }
            // OSC and other strings end with BEL or ST.
            Some(']' | 'P' | '_' | '^') => {
                while let Some(c) = chars.next() {
                    if c == '\x07' || (c == '\x1b' && chars.next_if_eq(&'\\').is_some()) {
                        break;
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// Faintness after an SGR sequence's parameters.
fn sgr_faint(params: &str, mut faint: bool) -> bool {
    let mut parts = params.split([';', ':']).peekable();
    while let Some(part) = parts.next() {
        match part {
            "" | "0" | "22" => faint = false,
            "2" => faint = true,
            // Colours' own parameters are not attributes.
            "38" | "48" | "58" => match parts.next() {
                Some("5") => {
                    parts.next();
                }
                Some("2") => {
                    parts.next();
                    parts.next();
                    parts.next();
                }
                _ => {}
            },
            _ => {}
        }
    }
    faint
}

fn is_rule(cells: &[Cell]) -> bool {
    let drawn: Vec<char> = cells
        .iter()
        .map(|c| c.c)
        .filter(|c| !c.is_whitespace())
        .collect();
    drawn.len() >= 3 && drawn.iter().all(|c| matches!(c, '─' | '━' | '═' | '-'))
}

fn blank(cells: &[Cell]) -> bool {
    cells.iter().all(|c| c.c.is_whitespace())
}

/// What the prompt on `screen` (`capture-pane -p -e` output) holds. A
/// screen that says the agent works (both agents show "esc to interrupt"
/// while a turn or a hook runs) has no prompt to type into.
pub fn prompt(screen: &str) -> Prompt {
    if screen.contains("esc to interrupt") {
        return Prompt::NotEmpty;
    }
    let lines: Vec<Vec<Cell>> = screen.lines().map(cells).collect();
    let Some(at) = lines.iter().rposition(|line| {
        line.iter()
            .find(|c| !c.c.is_whitespace())
            .is_some_and(|c| SIGNS.contains(&c.c))
    }) else {
        return Prompt::NotEmpty;
    };
    let sign = lines[at]
        .iter()
        .position(|c| !c.c.is_whitespace())
        .unwrap_or(0);
    let first = &lines[at][sign + 1..];
    let rest = lines[at + 1..]
        .iter()
        .take_while(|line| !blank(line) && !is_rule(line));
    let typed = std::iter::once(first)
        .chain(rest.map(Vec::as_slice))
        .flatten()
        .any(|cell| !cell.c.is_whitespace() && !cell.faint);
    if typed {
        Prompt::NotEmpty
    } else {
        Prompt::Empty
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: &str = "\x1b[38;5;244m────────────────────────────────────────";

    #[test]
    fn claude_codes_empty_prompt_and_its_drafts() {
        // As captured from Claude Code 2.1.332 in tmux 3.3a.
        let empty = format!(
            "{RULE}\n\x1b[39m❯\u{a0}\x1b[7m \x1b[0m\x1b[39m\x1b[49m\n{RULE}\n  ⏵⏵ auto mode on"
        );
        assert_eq!(prompt(&empty), Prompt::Empty);
        let draft =
            format!("{RULE}\n\x1b[39m❯\u{a0}my half typed draft\n{RULE}\n  ⏵⏵ auto mode on");
        assert_eq!(prompt(&draft), Prompt::NotEmpty);
        let second_line = format!("{RULE}\n❯\u{a0}\n  second line\n{RULE}\n");
        assert_eq!(prompt(&second_line), Prompt::NotEmpty);
        let suggestion = format!("{RULE}\n❯\u{a0}\x1b[2mrun the tests\x1b[22m\n{RULE}\n");
        assert_eq!(prompt(&suggestion), Prompt::Empty);
    }

    #[test]
    fn codexs_placeholder_is_no_draft() {
        // As captured from Codex 0.171.0: the placeholder is faint.
        let empty = "\x1b[1m›\x1b[0m\x1b[39m\x1b[49m \x1b[2mAsk Codex to do anything\n\n  \x1b[38;5;223mstub-model default";
        assert_eq!(prompt(empty), Prompt::Empty);
        let draft =
            "\x1b[1m›\x1b[0m\x1b[39m\x1b[49m draft for codex\n  line2\n\n  stub-model default";
        assert_eq!(prompt(draft), Prompt::NotEmpty);
        let coloured = "\x1b[1m›\x1b[0m \x1b[38;5;2;1mgreen but typed";
        assert_eq!(prompt(coloured), Prompt::NotEmpty);
    }

    #[test]
    fn no_prompt_on_the_screen_is_never_empty() {
        assert_eq!(prompt("Allow this? [y/n] "), Prompt::NotEmpty);
        assert_eq!(prompt("shell$ "), Prompt::NotEmpty);
        assert_eq!(prompt(""), Prompt::NotEmpty);
        let working = format!("✻ Cooking… (esc to interrupt)\n{RULE}\n❯\u{a0}\n{RULE}\n");
        assert_eq!(prompt(&working), Prompt::NotEmpty);
    }
}
