//! What the agent changed (HOOKS.md, "What the agent changed"): a host's
//! report of its working tree, checked against its limits, kept as the
//! session's latest, and the files the tools of the turn it works on wrote,
//! kept per turn; one file's section of the report's diff. Content, like
//! message text: it is never logged, and no projection or metric holds it.

use crate::decide::{ClaimRow, Decided, SessionRow, Writes, hosted, open};
use crate::error::{Error, ErrorCode, Result};
use crate::model::{
    ChangedFile, Changes, FileChanges, HostIdentity, ReportChanges, TurnChanges, TurnFile,
};

/// The most files a report lists (and a turn's tools may have written).
pub const MAX_FILES: usize = 1000;
/// The longest path, in bytes.
pub const MAX_PATH_BYTES: usize = 4096;
/// The longest diff a report carries, in bytes.
pub const MAX_DIFF_BYTES: usize = 1024 * 1024;
/// The longest diff of one file; a longer one is listed `truncated`.
pub const MAX_FILE_DIFF_BYTES: usize = 256 * 1024;
/// How many of a session's latest turns a read shows what they changed.
pub const TURNS_SHOWN: u32 = 50;

/// The report's own limits (400 `invalid_request`, saying which).
pub fn check(report: &ReportChanges) -> Result<()> {
    let short = |field: &str, value: &Option<String>, max: usize| match value {
        Some(v) if v.is_empty() || v.len() > max || v.chars().any(char::is_control) => {
            Err(Error::invalid(format!(
                "`{field}` must be 1 to {max} bytes without control characters."
            )))
        }
        _ => Ok(()),
    };
    short("branch", &report.branch, 256)?;
    short("head", &report.head, 64)?;
    if report.files.len() > MAX_FILES || report.turn_files.len() > MAX_FILES {
        return Err(Error::invalid(format!(
            "`files` and `turn_files` list at most {MAX_FILES} paths each."
        )));
    }
    let paths = report.files.iter().map(|f| &f.path);
    if paths.chain(&report.turn_files).any(|p| !is_path(p)) {
        return Err(Error::invalid(format!(
            "A path must be 1 to {MAX_PATH_BYTES} bytes without U+0000."
        )));
    }
    if report.diff.len() > MAX_DIFF_BYTES {
        return Err(Error::invalid(format!(
            "`diff` must be at most {MAX_DIFF_BYTES} bytes."
        )));
    }
    if report.diff.contains('\0') {
        return Err(Error::invalid("`diff` must not hold U+0000."));
    }
    Ok(())
}

fn is_path(path: &str) -> bool {
    !path.is_empty() && path.len() <= MAX_PATH_BYTES && !path.contains('\0')
}

/// What is kept of a report: the session's latest (its JSON, content), and
/// what the current turn's tools wrote, if a turn is current.
#[derive(Debug, Clone)]
pub struct ChangesWrite {
    pub session_id: String,
    /// [`Stored`] as JSON.
    pub body: Vec<u8>,
    pub at: i64,
    pub turn: Option<TurnChangesWrite>,
}

/// A turn's files as written ([`TurnChanges`]'s, as JSON), upserted.
#[derive(Debug, Clone)]
pub struct TurnChangesWrite {
    pub turn_id: String,
    pub session_id: String,
    /// The [`TurnFile`]s, as JSON.
    pub files: Vec<u8>,
    pub at: i64,
}

/// A report as kept (without its host identity).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Stored {
    pub branch: Option<String>,
    pub head: Option<String>,
    pub ahead: u32,
    pub behind: u32,
    pub files: Vec<ChangedFile>,
    pub diff: String,
}

/// The rows a report needs: the session (locked), and its active claim,
/// whose turn may be the current one.
#[derive(Debug, Default)]
pub struct ReportRows {
    pub session: Option<SessionRow>,
    pub claim: Option<ClaimRow>,
}

/// A host's report, in this order: unknown session 404; another host 403
/// `host_mismatch`; closed 409 `session_closed`. It replaces the session's
/// latest; its `turn_files` become the files of the turn the agent works on
/// (the one typed at its terminal, else the one it holds a claim on), with
/// their counts in this report (0 for a file no longer changed: committed or
/// restored); with no such turn, they are dropped.
pub fn report(
    rows: ReportRows,
    host: &HostIdentity,
    report: ReportChanges,
    now: i64,
) -> Result<Decided<()>> {
    let session = hosted(rows.session, host)?;
    open(&session)?;
    let current = session
        .terminal_turn_id
        .clone()
        .or_else(|| rows.claim.map(|c| c.turn_id));
    let turn = current
        .filter(|_| !report.turn_files.is_empty())
        .map(|turn_id| TurnChangesWrite {
            turn_id,
            session_id: session.session_id.clone(),
            files: json(&turn_files(&report.turn_files, &report.files)),
            at: now,
        });
    let stored = Stored {
        branch: report.branch,
        head: report.head,
        ahead: report.ahead,
        behind: report.behind,
        files: report.files,
        diff: report.diff,
    };
    Ok(Decided {
        answer: (),
        writes: Writes {
            changes: Some(ChangesWrite {
                session_id: session.session_id,
                body: json(&stored),
                at: now,
                turn,
            }),
            ..Writes::default()
        },
    })
}

fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

/// A turn's files, each once, with its counts in `files`.
fn turn_files(paths: &[String], files: &[ChangedFile]) -> Vec<TurnFile> {
    let mut seen = std::collections::HashSet::new();
    paths
        .iter()
        .filter(|p| seen.insert(p.as_str()))
        .map(|path| {
            let file = files.iter().find(|f| &f.path == path);
            TurnFile {
                path: path.clone(),
                added: file.map_or(0, |f| f.added),
                removed: file.map_or(0, |f| f.removed),
            }
        })
        .collect()
}

/// A turn's stored files as the read shows them, with their totals.
pub fn turn_changes(turn_id: String, files: &[u8]) -> TurnChanges {
    let files: Vec<TurnFile> = serde_json::from_slice(files).unwrap_or_default();
    TurnChanges {
        turn_id,
        added: files.iter().map(|f| f.added).fold(0, u32::saturating_add),
        removed: files.iter().map(|f| f.removed).fold(0, u32::saturating_add),
        files,
    }
}

/// The session's latest report as a read shows it (`body` and `at` as
/// kept; `turns`, its latest turns' ids and files); 404 when it has none.
pub fn shown(
    session_id: &str,
    kept: Option<(Vec<u8>, i64)>,
    turns: Vec<(String, Vec<u8>)>,
) -> Result<Changes> {
    let (stored, at) = latest(kept)?;
    let total =
        |f: fn(&ChangedFile) -> u32| stored.files.iter().map(f).fold(0, u32::saturating_add);
    Ok(Changes {
        session_id: session_id.to_owned(),
        reported_at: crate::time::rfc3339(at),
        added: total(|f| f.added),
        removed: total(|f| f.removed),
        branch: stored.branch,
        head: stored.head,
        ahead: stored.ahead,
        behind: stored.behind,
        files: stored.files,
        diff: stored.diff,
        turns: turns
            .into_iter()
            .map(|(turn_id, files)| turn_changes(turn_id, &files))
            .collect(),
    })
}

/// One file of the session's latest report, with its section of the diff;
/// 404 when there is no report, or the file is not in it.
pub fn file_shown(kept: Option<(Vec<u8>, i64)>, path: &str) -> Result<FileChanges> {
    let (stored, at) = latest(kept)?;
    let diff = file_diff(&stored.diff, path).unwrap_or_default().to_owned();
    let file = stored.files.into_iter().find(|f| f.path == path);
    Ok(FileChanges {
        file: file.ok_or_else(|| Error::not_found("changed file"))?,
        reported_at: crate::time::rfc3339(at),
        diff,
    })
}

fn latest(kept: Option<(Vec<u8>, i64)>) -> Result<(Stored, i64)> {
    let none = || {
        Error::new(
            ErrorCode::NotFound,
            "No changes were reported for this session.",
        )
    };
    let (body, at) = kept.ok_or_else(none)?;
    let stored = serde_json::from_slice(&body)
        .map_err(|_| Error::store("reading the agent's changes", "a report does not decode"))?;
    Ok((stored, at))
}

/// The sections of a unified diff, each with the path its `diff --git`
/// header names (`a/` and `b/` the same path, as `--no-renames` writes it;
/// quoted as git quotes an unusual path).
pub fn sections(diff: &str) -> Vec<(String, &str)> {
    let mut starts: Vec<usize> = diff
        .match_indices("diff --git ")
        .map(|(i, _)| i)
        .filter(|&i| i == 0 || diff.as_bytes()[i - 1] == b'\n')
        .collect();
    starts.push(diff.len());
    starts
        .windows(2)
        .filter_map(|w| {
            let section = &diff[w[0]..w[1]];
            let header = section.lines().next()?.strip_prefix("diff --git ")?;
            Some((header_path(header)?, section))
        })
        .collect()
}

/// One file's section of `diff`, if it has one.
pub fn file_diff<'d>(diff: &'d str, path: &str) -> Option<&'d str> {
    sections(diff)
        .into_iter()
        .find(|(p, _)| p == path)
        .map(|(_, s)| s)
}

/// The path of a header `a/P b/P`, or `"a/P" "b/P"` quoted.
fn header_path(header: &str) -> Option<String> {
    if let Some(quoted) = header.strip_prefix('"') {
        let (a, rest) = unquote(quoted)?;
        return a.strip_prefix("a/").map(str::to_owned).filter(|_| {
            rest.strip_prefix(" \"")
                .and_then(unquote)
                .is_some_and(|(b, _)| b.strip_prefix("b/") == a.strip_prefix("a/"))
        });
    }
    let rest = header.strip_prefix("a/")?;
    // `P b/P`: P is as long as the rest of the header minus " b/", halved.
    let len = rest.len().checked_sub(3)? / 2;
    let (path, tail) = (rest.get(..len)?, rest.get(len..)?);
    (tail.strip_prefix(" b/")? == path).then(|| path.to_owned())
}

/// A C-quoted string's value (its opening quote gone) and what follows its
/// closing quote.
fn unquote(quoted: &str) -> Option<(String, &str)> {
    let bytes = quoted.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => return Some((String::from_utf8(out).ok()?, &quoted[i + 1..])),
            b'\\' => {
                let next = *bytes.get(i + 1)?;
                let (byte, used) = match next {
                    b'n' => (b'\n', 2),
                    b't' => (b'\t', 2),
                    b'r' => (b'\r', 2),
                    b'a' => (7, 2),
                    b'b' => (8, 2),
                    b'f' => (12, 2),
                    b'v' => (11, 2),
                    b'0'..=b'7' => {
                        let digits = quoted.get(i + 1..i + 4)?;
                        (u8::from_str_radix(digits, 8).ok()?, 4)
                    }
                    other => (other, 2),
                };
                out.push(byte);
                i += used;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::tests::{host, session};
    use crate::model::{FileStatus, SessionState};

    fn file(path: &str, added: u32) -> ChangedFile {
        ChangedFile {
            path: path.into(),
            status: FileStatus::Modified,
            added,
            removed: 1,
            binary: false,
            truncated: false,
        }
    }

    fn report_of(files: Vec<ChangedFile>, turn_files: &[&str]) -> ReportChanges {
        ReportChanges {
            host_surface: "claude-code".into(),
            host_session_id: "h".into(),
            branch: Some("main".into()),
            head: None,
            ahead: 0,
            behind: 0,
            files,
            diff: String::new(),
            turn_files: turn_files.iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn sections_name_plain_quoted_and_spaced_paths() {
        let diff = "diff --git a/x y b/x y\n+1\ndiff --git \"a/t\\tab\" \"b/t\\tab\"\n+2\n\
                    diff --git a/caf\u{e9}.md b/caf\u{e9}.md\n+3\ndiff --git \"a/\\303\\251\" \"b/\\303\\251\"\n";
        let paths: Vec<String> = sections(diff).into_iter().map(|(p, _)| p).collect();
        assert_eq!(paths, ["x y", "t\tab", "caf\u{e9}.md", "\u{e9}"]);
        assert_eq!(file_diff(diff, "x y"), Some("diff --git a/x y b/x y\n+1\n"));
        assert_eq!(file_diff(diff, "nothing"), None);
        // A line of a file's content that looks like a header is not one.
        assert_eq!(sections("+diff --git a/a b/a\n").len(), 0);
        assert_eq!(header_path("a/x b/y"), None);
    }

    #[test]
    fn a_report_is_the_hosts_and_names_the_current_turn() {
        let mut open = session(SessionState::Open);
        open.terminal_turn_id = Some("trn_t".into());
        let rows = |s: SessionRow| ReportRows {
            session: Some(s),
            claim: None,
        };
        let r = report_of(vec![file("a", 3), file("b", 2)], &["a", "c", "a"]);
        let decided = report(rows(open.clone()), &host("h"), r.clone(), 5).unwrap();
        assert!(!decided.writes.journaled());
        let written = decided.writes.changes.unwrap();
        let turn = written.turn.unwrap();
        assert_eq!(turn.turn_id, "trn_t");
        let shown = turn_changes(turn.turn_id, &turn.files);
        assert_eq!((shown.files.len(), shown.added, shown.removed), (2, 3, 1));
        let stranger = report(rows(open.clone()), &host("x"), r.clone(), 5);
        assert_eq!(stranger.unwrap_err().code, ErrorCode::HostMismatch);
        let closed = report(
            rows(session(SessionState::Closed)),
            &host("h"),
            r.clone(),
            5,
        );
        assert_eq!(closed.unwrap_err().code, ErrorCode::SessionClosed);
        // No current turn: the report is kept, its turn files dropped.
        let idle = report(rows(session(SessionState::Open)), &host("h"), r, 5).unwrap();
        assert!(idle.writes.changes.unwrap().turn.is_none());
    }

    #[test]
    fn limits_say_which() {
        let mut r = report_of(vec![file("", 1)], &[]);
        assert!(check(&r).is_err());
        r.files = vec![file("a", 1)];
        assert!(check(&r).is_ok());
        r.diff = "x".repeat(MAX_DIFF_BYTES + 1);
        assert!(check(&r).unwrap_err().message.contains("diff"));
        r.diff.clear();
        r.turn_files = vec!["p".into(); MAX_FILES + 1];
        assert!(check(&r).is_err());
        r.turn_files.clear();
        r.branch = Some("b\n".into());
        assert!(check(&r).unwrap_err().message.contains("branch"));
    }
}
