//! The working tree of the agent's directory, read with git for the
//! broker's "what the agent changed" (HOOKS.md): its branch and upstream,
//! the changed files against `HEAD` with their lines added and removed
//! (untracked files as added), and the unified diff, within a deadline and
//! [`MAX_DIFF_BYTES`]. A file whose diff is over [`MAX_FILE_DIFF_BYTES`],
//! or a binary one, is listed with its counts only. Outside a git
//! repository, or without git, there is nothing to read. It only reads: git
//! runs with `GIT_OPTIONAL_LOCKS=0`, so it never takes the index's lock
//! from under the agent's own git.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub use crate::decide::changes::{MAX_DIFF_BYTES, MAX_FILE_DIFF_BYTES, MAX_FILES};
use crate::model::{ChangedFile, FileStatus};

/// git's object id of the empty tree: what a repository before its first
/// commit is compared with.
const EMPTY_TREE: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";

/// What the working tree holds, as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Worktree {
    /// The repository's top directory.
    pub root: PathBuf,
    pub branch: Option<String>,
    pub head: Option<String>,
    pub ahead: u32,
    pub behind: u32,
    pub files: Vec<ChangedFile>,
    pub diff: String,
}

/// Reads the working tree `cwd` is in, within `budget`: `None` outside a
/// git repository (or when git cannot run). What the budget leaves unread
/// is listed `truncated`.
pub fn read(cwd: &Path, budget: Duration) -> Option<Worktree> {
    let deadline = Instant::now() + budget;
    let top = git(cwd, &["rev-parse", "--show-toplevel"], deadline)?;
    let root = PathBuf::from(String::from_utf8(top).ok()?.trim_end_matches('\n'));
    let status = git(
        &root,
        &[
            "status",
            "--porcelain=v2",
            "--branch",
            "-z",
            "--untracked-files=all",
            "--no-renames",
        ],
        deadline,
    )?;
    let mut tree = Worktree {
        root,
        ..Worktree::default()
    };
    let untracked = parse_status(&status, &mut tree);
    let base = tree.head.clone().unwrap_or_else(|| EMPTY_TREE.to_owned());
    let mut budget = DiffBudget::default();
    let (tracked, complete) = tree_diff(&tree.root, &base, deadline, &mut budget);
    for file in &mut tree.files {
        match tracked.get(&file.path) {
            Some(section) => section.describe(file),
            // Not reached in time.
            None => file.truncated = !complete,
        }
    }
    let mut diff: Vec<&Section> = tracked.values().filter(|s| s.kept()).collect();
    diff.sort_by_key(|s| s.order);
    tree.diff = diff.iter().map(|s| s.text.as_str()).collect();
    for path in untracked {
        if tree.files.len() >= MAX_FILES {
            break;
        }
        let (file, text) = untracked_file(&tree.root, path, deadline, &mut budget);
        tree.diff.push_str(&text);
        tree.files.push(file);
    }
    Some(tree)
}

/// Runs git in `dir` to its end or `deadline`: its stdout, if it
/// succeeded.
fn git(dir: &Path, args: &[&str], deadline: Instant) -> Option<Vec<u8>> {
    let mut child = spawn(dir, args)?;
    let mut stdout = child.stdout.take()?;
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        stdout.read_to_end(&mut out).map(|_| out)
    });
    let status = wait(&mut child, deadline)?;
    let out = reader.join().ok()?.ok()?;
    status.then_some(out)
}

fn spawn(dir: &Path, args: &[&str]) -> Option<std::process::Child> {
    Command::new("git")
        .args(["-c", "core.quotePath=false", "-C"])
        .arg(dir)
        .args(args)
        .env("GIT_OPTIONAL_LOCKS", "0")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

/// Whether the child succeeded by `deadline` (killed, and `None`, after).
fn wait(child: &mut std::process::Child, deadline: Instant) -> Option<bool> {
    loop {
        if let Some(status) = child.try_wait().ok()? {
            return Some(status.success());
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Reads `git status --porcelain=v2 --branch -z` into `tree` (branch,
/// head, ahead, behind, tracked files); answers the untracked paths.
fn parse_status(status: &[u8], tree: &mut Worktree) -> Vec<String> {
    let mut untracked = Vec::new();
    for record in status.split(|b| *b == 0).filter(|r| !r.is_empty()) {
        let record = String::from_utf8_lossy(record);
        let mut words = record.splitn(3, ' ');
        match (words.next(), words.next(), words.next()) {
            (Some("#"), Some("branch.oid"), Some(oid)) if oid != "(initial)" => {
                tree.head = Some(oid.to_owned());
            }
            (Some("#"), Some("branch.head"), Some(head)) if head != "(detached)" => {
                tree.branch = Some(head.to_owned());
            }
            (Some("#"), Some("branch.ab"), Some(ab)) => {
                let count = |n: &str| n.get(1..).and_then(|d| d.parse().ok()).unwrap_or(0);
                let mut counts = ab.split(' ').map(count);
                tree.ahead = counts.next().unwrap_or(0);
                tree.behind = counts.next().unwrap_or(0);
            }
            (Some("?"), Some(_), _) => untracked.push(record[2..].to_owned()),
            (Some(kind @ ("1" | "u")), Some(xy), Some(_)) if tree.files.len() < MAX_FILES => {
                // The path follows 8 fields (`1`) or 10 (`u`, unmerged).
                let fields = if kind == "1" { 9 } else { 11 };
                if let Some(path) = record.splitn(fields, ' ').nth(fields - 1) {
                    tree.files.push(ChangedFile {
                        path: path.to_owned(),
                        status: status_of(kind, xy),
                        added: 0,
                        removed: 0,
                        binary: false,
                        truncated: false,
                    });
                }
            }
            _ => {}
        }
    }
    untracked
}

fn status_of(kind: &str, xy: &str) -> FileStatus {
    if kind == "u" {
        return FileStatus::Unmerged;
    }
    match (xy.as_bytes().first(), xy.as_bytes().get(1)) {
        (Some(b'D'), _) | (_, Some(b'D')) => FileStatus::Deleted,
        (Some(b'A'), _) => FileStatus::Added,
        (Some(b'T'), _) | (_, Some(b'T')) => FileStatus::TypeChanged,
        _ => FileStatus::Modified,
    }
}

/// What is left of the report's diff.
#[derive(Default)]
struct DiffBudget {
    used: usize,
}

impl DiffBudget {
    /// Takes `len` bytes if the report has room for them.
    fn take(&mut self, len: usize) -> bool {
        let fits = len <= MAX_FILE_DIFF_BYTES && self.used + len <= MAX_DIFF_BYTES;
        if fits {
            self.used += len;
        }
        fits
    }
}

/// One file's section of the diff, as read.
#[derive(Default)]
struct Section {
    order: usize,
    text: String,
    added: u32,
    removed: u32,
    binary: bool,
    /// Over a file's limit (its text dropped), or beyond the report's.
    dropped: bool,
    in_hunk: bool,
}

impl Section {
    fn line(&mut self, line: &[u8]) {
        if line.starts_with(b"@@") {
            self.in_hunk = true;
        } else if self.in_hunk && line.starts_with(b"+") {
            self.added += 1;
        } else if self.in_hunk && line.starts_with(b"-") {
            self.removed += 1;
        } else if !self.in_hunk
            && (line.starts_with(b"Binary files ") || line.starts_with(b"GIT binary patch"))
        {
            self.binary = true;
        }
        if !self.dropped {
            self.text.push_str(&String::from_utf8_lossy(line));
            self.dropped = self.text.len() > MAX_FILE_DIFF_BYTES;
        }
    }

    fn kept(&self) -> bool {
        !self.dropped && !self.binary
    }

    fn describe(&self, file: &mut ChangedFile) {
        file.added = self.added;
        file.removed = self.removed;
        file.binary = self.binary;
        file.truncated = self.dropped && !self.binary;
    }
}

/// `git diff <base>` of the tracked files, each file's section counted and
/// kept within its limit and the report's, by path; and whether git ended
/// (what `deadline` leaves unread is missing).
fn tree_diff(
    root: &Path,
    base: &str,
    deadline: Instant,
    budget: &mut DiffBudget,
) -> (HashMap<String, Section>, bool) {
    let args = [
        "diff",
        "--no-color",
        "--no-ext-diff",
        "--no-textconv",
        "--no-renames",
        "--src-prefix=a/",
        "--dst-prefix=b/",
        "--unified=3",
        base,
        "--",
    ];
    let Some(mut child) = spawn(root, &args) else {
        return (HashMap::new(), false);
    };
    let Some(stdout) = child.stdout.take() else {
        return (HashMap::new(), false);
    };
    let reader = std::thread::spawn(move || sections_of(stdout));
    // Killed at the deadline, git ends its output: the reader ends too.
    let complete = wait(&mut child, deadline).is_some();
    let mut sections = reader.join().unwrap_or_default();
    sections.sort_by_key(|(_, s)| s.order);
    let mut by_path = HashMap::new();
    for (path, mut section) in sections {
        if !section.dropped && !section.binary && !budget.take(section.text.len()) {
            section.dropped = true;
        }
        if section.dropped {
            section.text.clear();
        }
        by_path.insert(path, section);
    }
    (by_path, complete)
}

/// The sections of a diff as it streams in, each with its path.
fn sections_of(stdout: impl Read) -> Vec<(String, Section)> {
    let mut reader = BufReader::new(stdout);
    let mut sections: Vec<(String, Section)> = Vec::new();
    let mut line = Vec::new();
    while matches!(reader.read_until(b'\n', &mut line), Ok(n) if n > 0) {
        if line.starts_with(b"diff --git ") {
            let header = String::from_utf8_lossy(&line).into_owned();
            let path = crate::decide::changes::sections(&header)
                .into_iter()
                .next()
                .map(|(p, _)| p)
                .unwrap_or_default();
            let order = sections.len();
            sections.push((
                path,
                Section {
                    order,
                    ..Section::default()
                },
            ));
        }
        if let Some((_, section)) = sections.last_mut() {
            section.line(&line);
        }
        line.clear();
    }
    sections
}

/// An untracked file as added: its lines, as a section of its own (a file
/// over its limit, or beyond the report's, or binary, counted only).
fn untracked_file(
    root: &Path,
    path: String,
    deadline: Instant,
    budget: &mut DiffBudget,
) -> (ChangedFile, String) {
    let mut file = ChangedFile {
        path,
        status: FileStatus::Untracked,
        added: 0,
        removed: 0,
        binary: false,
        truncated: false,
    };
    let full = root.join(&file.path);
    // Only a plain file is read: a fifo would never end.
    let plain = std::fs::symlink_metadata(&full).is_ok_and(|m| m.is_file());
    let bytes = match plain && Instant::now() < deadline {
        true => std::fs::File::open(&full).and_then(|f| {
            let mut bytes = Vec::new();
            f.take(MAX_FILE_DIFF_BYTES as u64 + 1)
                .read_to_end(&mut bytes)
                .map(|_| bytes)
        }),
        false => Err(std::io::ErrorKind::TimedOut.into()),
    };
    let Ok(bytes) = bytes else {
        file.truncated = true;
        return (file, String::new());
    };
    file.binary = bytes[..bytes.len().min(8000)].contains(&0);
    if file.binary {
        return (file, String::new());
    }
    if bytes.len() > MAX_FILE_DIFF_BYTES {
        file.truncated = true;
        file.added = count_lines(&full, deadline);
        return (file, String::new());
    }
    let text = String::from_utf8_lossy(&bytes);
    file.added = text.lines().count() as u32;
    let section = added_section(&file.path, &text);
    if !budget.take(section.len()) {
        file.truncated = true;
        return (file, String::new());
    }
    (file, section)
}

/// The lines of a file too long to show, counted until `deadline`.
fn count_lines(path: &Path, deadline: Instant) -> u32 {
    let Ok(file) = std::fs::File::open(path) else {
        return 0;
    };
    let mut reader = BufReader::with_capacity(1 << 16, file);
    let mut lines = 0u32;
    let mut last = b'\n';
    while Instant::now() < deadline {
        let Ok(chunk) = reader.fill_buf() else { break };
        if chunk.is_empty() {
            break;
        }
        lines += chunk.iter().filter(|b| **b == b'\n').count() as u32;
        last = chunk[chunk.len() - 1];
        let n = chunk.len();
        reader.consume(n);
    }
    lines + u32::from(last != b'\n')
}

/// A new file's section, as `git diff` writes one.
fn added_section(path: &str, text: &str) -> String {
    let quoted = |prefix: &str| quote(&format!("{prefix}{path}"));
    let mut out = format!(
        "diff --git {} {}\nnew file mode 100644\n--- /dev/null\n+++ {}\n",
        quoted("a/"),
        quoted("b/"),
        quoted("b/")
    );
    let lines: Vec<&str> = text.lines().collect();
    if lines.is_empty() {
        return out;
    }
    out.push_str(&format!("@@ -0,0 +1,{} @@\n", lines.len()));
    for line in lines {
        out.push('+');
        out.push_str(line);
        out.push('\n');
    }
    if !text.ends_with('\n') {
        out.push_str("\\ No newline at end of file\n");
    }
    out
}

/// A path as git's headers write it: quoted when it holds a quote, a
/// backslash or a control character.
fn quote(path: &str) -> String {
    if !path
        .chars()
        .any(|c| c == '"' || c == '\\' || c.is_control())
    {
        return path.to_owned();
    }
    let mut out = String::from("\"");
    for c in path.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let mut buf = [0; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.push_str(&format!("\\{b:03o}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
