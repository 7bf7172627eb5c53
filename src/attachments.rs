//! Attachments' rules, in one place for every path that takes or gives a
//! file: the limits (per file, per message, per session), a file name made
//! safe, the image types read from magic bytes, the type a file is served
//! as, and the stored form a turn lists. The broker checks an upload here
//! before anything is written, and stores its bytes only with the turn
//! that names them; the client side saves what it downloads
//! under the same name rule. It knows no HTTP, no SQL and no store; the
//! stored form itself ([`Stored`]) sits in `stored.rs`, beneath the wire
//! types that carry it.

use sha2::{Digest, Sha256};

use crate::error::{Error, ErrorCode, Result};
use crate::model::Attachment;

pub mod stored;
pub use stored::{OCTET_STREAM, Stored};

const MIB: u64 = 1024 * 1024;
/// The largest file: 20 MiB.
pub const MAX_FILE_BYTES: u64 = 20 * MIB;
/// The largest message, its files together: 50 MiB.
pub const MAX_MESSAGE_BYTES: u64 = 50 * MIB;
/// The most files one message carries.
pub const MAX_FILES: usize = 10;
/// The most one session holds, all its turns' files together: 500 MiB.
pub const MAX_SESSION_BYTES: u64 = 500 * MIB;
/// A multipart request's body: the files, the message part and the framing.
pub const MAX_UPLOAD_BODY_BYTES: usize = (MAX_MESSAGE_BYTES + 2 * MIB) as usize;
/// A sanitized name's longest form, in bytes (file systems take 255).
const MAX_NAME_BYTES: usize = 200;

impl Stored {
    /// The wire form, with its download route.
    pub fn wire(&self, session_id: &str, turn_id: &str) -> Attachment {
        Attachment {
            position: self.position,
            name: self.name.clone(),
            content_type: self.content_type.clone(),
            declared_type: self.declared_type.clone(),
            size: self.size,
            sha256: self.sha256.clone(),
            download: download_path(session_id, turn_id, self.position),
        }
    }
}

/// `GET` route of an attachment's bytes.
pub fn download_path(session_id: &str, turn_id: &str, position: u32) -> String {
    format!("/v1/sessions/{session_id}/turns/{turn_id}/attachments/{position}")
}

/// A turn's stored list, from its JSON column (none when null or unreadable).
pub fn parse_list(json: Option<&str>) -> Vec<Stored> {
    json.and_then(|j| serde_json::from_str(j).ok())
        .unwrap_or_default()
}

/// A turn's list as its JSON column holds it (null for none).
pub fn list_json(list: &[Stored]) -> Option<String> {
    (!list.is_empty()).then(|| serde_json::to_string(list).unwrap_or_default())
}

/// One file of an upload: its bytes and what is stored about it.
#[derive(Debug, Clone)]
pub struct Upload {
    pub stored: Stored,
    pub bytes: bytes::Bytes,
}

impl Upload {
    /// A received file at `position`, its name sanitized and its type
    /// sniffed. A file of 0 bytes is refused (400).
    pub fn new(
        position: u32,
        name: Option<&str>,
        declared_type: Option<&str>,
        bytes: bytes::Bytes,
    ) -> Result<Self> {
        if bytes.is_empty() {
            return Err(Error::invalid(format!(
                "Attachment {position} is empty: a file of 0 bytes is refused."
            )));
        }
        check_file(bytes.len() as u64)?;
        let sha256 = hex::encode(Sha256::digest(&bytes));
        let declared_type = declared_type
            .map(|t| t.chars().filter(|c| !is_invisible(*c)).take(255).collect())
            .filter(|t: &String| !t.is_empty())
            .unwrap_or_else(|| OCTET_STREAM.to_owned());
        Ok(Upload {
            stored: Stored {
                position,
                name: sanitize_name(name.unwrap_or("")),
                declared_type,
                content_type: served_type(&bytes).to_owned(),
                size: bytes.len() as u64,
                sha256,
            },
            bytes,
        })
    }
}

/// One file's size against the per-file limit (413).
pub fn check_file(size: u64) -> Result<()> {
    if size > MAX_FILE_BYTES {
        return Err(too_large(format!(
            "An attachment is over the limit of {} MiB per file.",
            MAX_FILE_BYTES / MIB
        )));
    }
    Ok(())
}

/// A message's files so far, against the per-message limits (413): at most
/// [`MAX_FILES`] files and [`MAX_MESSAGE_BYTES`] together.
pub fn check_message(files: usize, total: u64) -> Result<()> {
    if files > MAX_FILES {
        return Err(too_large(format!(
            "A message carries at most {MAX_FILES} attachments."
        )));
    }
    if total > MAX_MESSAGE_BYTES {
        return Err(too_large(format!(
            "A message's attachments are over the limit of {} MiB together.",
            MAX_MESSAGE_BYTES / MIB
        )));
    }
    Ok(())
}

/// A session's files with a message's added, against the per-session limit (413).
pub fn check_session(held: u64, adding: u64) -> Result<()> {
    if held.saturating_add(adding) > MAX_SESSION_BYTES {
        return Err(too_large(format!(
            "The session's attachments would be over the limit of {} MiB.",
            MAX_SESSION_BYTES / MIB
        )));
    }
    Ok(())
}

fn too_large(message: String) -> Error {
    Error::new(ErrorCode::PayloadTooLarge, message)
}

/// A file name safe to show and to create in a folder: its last path
/// component (`../../.bashrc` is `bashrc`), without invisible characters
/// ([`is_invisible`]: no `evil\u{202E}hs.png` shown as `evilgnp.sh`, no
/// line break in a path) or leading dots, at most 200 bytes (the extension
/// kept), and `file` when nothing is left. The broker stores names this
/// way and the host saves files under it, so the path named to the agent
/// is the path on disk.
pub fn sanitize_name(name: &str) -> String {
    let last = name.rsplit(['/', '\\']).next().unwrap_or("");
    let clean: String = last.chars().filter(|c| !is_invisible(*c)).collect();
    let clean = clean.trim().trim_start_matches('.').trim();
    if clean.is_empty() {
        return "file".to_owned();
    }
    if clean.len() <= MAX_NAME_BYTES {
        return clean.to_owned();
    }
    // Cut the stem, keep a short extension.
    let (stem, ext) = match clean.rfind('.') {
        Some(dot) if clean.len() - dot <= 16 && dot > 0 => (&clean[..dot], &clean[dot..]),
        _ => (clean, ""),
    };
    let mut cut = MAX_NAME_BYTES - ext.len();
    while !stem.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{ext}", &stem[..cut])
}

/// A character a name drops: a control (Unicode category Cc, NUL
/// included), a format character (Cf: zero-width ones, the bidi overrides
/// and isolates such as U+202E), a line or paragraph separator (Zl, Zp).
pub fn is_invisible(c: char) -> bool {
    use unicode_general_category::{GeneralCategory as G, get_general_category};
    matches!(
        get_general_category(c),
        G::Control | G::Format | G::LineSeparator | G::ParagraphSeparator
    )
}

/// The image type the bytes start with (PNG, JPEG, GIF, WebP), if any.
pub fn sniff_image(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(b"\xff\xd8\xff") {
        Some("image/jpeg")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

/// What a file is served as: its sniffed image type, else
/// `application/octet-stream` (never HTML, whatever it says it is).
pub fn served_type(bytes: &[u8]) -> &'static str {
    sniff_image(bytes).unwrap_or(OCTET_STREAM)
}

/// A size for people: `12 KB`, `3.4 MB`.
pub fn human_size(size: u64) -> String {
    match size {
        s if s < 1024 => format!("{s} B"),
        s if s < 1024 * 1024 => format!("{} KB", s.div_ceil(1024)),
        s => format!("{:.1} MB", s as f64 / (1024.0 * 1024.0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_names_become_plain_names() {
        assert_eq!(sanitize_name("../../.bashrc"), "bashrc");
        assert_eq!(sanitize_name("a\0b.png"), "ab.png");
        assert_eq!(sanitize_name("..\\..\\x.txt"), "x.txt");
        assert_eq!(sanitize_name(""), "file");
        assert_eq!(sanitize_name("../.."), "file");
        assert_eq!(sanitize_name("/"), "file");
        // Issue 53, item 8: nothing invisible, nothing that reorders or
        // breaks the line.
        assert_eq!(sanitize_name("evil\u{202E}hs.png"), "evilhs.png");
        assert_eq!(sanitize_name("report\u{200B}.pdf"), "report.pdf");
        assert_eq!(sanitize_name("a\u{2028}b\u{2029}c.txt"), "abc.txt");
        assert_eq!(
            sanitize_name("x\u{2066}y\u{2069}\u{FEFF}\u{AD}.md"),
            "xy.md"
        );
        assert_eq!(sanitize_name("\u{202E}\u{200B}"), "file");
        assert_eq!(sanitize_name("café 📎.txt"), "café 📎.txt");
        let long = format!("{}.png", "é".repeat(300));
        let cut = sanitize_name(&long);
        assert!(cut.len() <= 200 && cut.ends_with(".png"), "{cut}");
    }

    #[test]
    fn images_are_sniffed_and_the_rest_is_octet_stream() {
        assert_eq!(served_type(b"\x89PNG\r\n\x1a\nxxxx"), "image/png");
        assert_eq!(served_type(b"\xff\xd8\xff\xe0"), "image/jpeg");
        assert_eq!(served_type(b"GIF89a.."), "image/gif");
        assert_eq!(served_type(b"RIFF\0\0\0\0WEBPVP8 "), "image/webp");
        assert_eq!(served_type(b"<html><script>"), OCTET_STREAM);
    }

    #[test]
    fn limits() {
        assert!(check_file(MAX_FILE_BYTES).is_ok());
        assert_eq!(
            check_file(MAX_FILE_BYTES + 1).unwrap_err().code,
            ErrorCode::PayloadTooLarge
        );
        assert!(check_message(MAX_FILES + 1, 1).is_err());
        assert!(check_message(2, MAX_MESSAGE_BYTES + 1).is_err());
        assert!(check_session(MAX_SESSION_BYTES, 1).is_err());
        assert!(Upload::new(0, None, None, bytes::Bytes::new()).is_err());
        assert_eq!(human_size(12 * 1024), "12 KB");
    }
}
