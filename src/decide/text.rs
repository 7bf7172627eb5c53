//! A message's text: its limit, which every path that takes a text checks
//! (a message, a prompt typed at the terminal, a plan), and a longer text
//! fitted to it where it must be taken anyway (a Lark message, a typed
//! prompt). It imports nothing of the crate.

/// The longest message text, in bytes.
pub const MAX_TEXT_BYTES: usize = 64 * 1024;

/// `text` within [`MAX_TEXT_BYTES`]: a longer one is cut on a character
/// boundary and says so (a Lark message, a prompt typed at the terminal).
pub fn fit_text(text: String) -> String {
    const NOTE: &str = "\n[truncated by LoopX: the message was longer than 64 KiB]";
    if text.len() <= MAX_TEXT_BYTES {
        return text;
    }
    let mut end = MAX_TEXT_BYTES - NOTE.len();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{NOTE}", &text[..end])
}
