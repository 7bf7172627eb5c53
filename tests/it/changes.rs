//! What the agent changed (HOOKS.md): a host's report of its working tree
//! kept and read back whole and file by file, its refusals and limits, its
//! pruning with the session; the hooks' reading of real git repositories
//! (tracked edits, untracked files, a binary, a huge file, a path with
//! spaces and unicode, a detached HEAD, a directory outside git, 10,000
//! files within the budget); and the real `loopx hook` reporting at
//! PostToolUse and Stop with the turn's files. Runs on SQLite and again on
//! PostgreSQL.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use loopx::cli::hook::worktree;
use loopx::model::{ChangedFile, FileStatus, Origin, ReportChanges};
use serde_json::json;

use crate::hooks::{Agent, Agents};
use crate::support::*;

fn file(path: &str, status: FileStatus, added: u32, removed: u32) -> ChangedFile {
    ChangedFile {
        path: path.into(),
        status,
        added,
        removed,
        binary: false,
        truncated: false,
    }
}

const ODD: &str = "docs/a b \u{e9}t\u{e9} \u{1f600}.md";

fn report(host: &Host, turn_files: &[&str]) -> ReportChanges {
    let diff = format!(
        "diff --git a/src/main.rs b/src/main.rs\n--- a/src/main.rs\n+++ b/src/main.rs\n\
         @@ -1,2 +1,3 @@\n-old\n+new\n+more\n keep\n\
         diff --git a/{ODD} b/{ODD}\nnew file mode 100644\n--- /dev/null\n+++ b/{ODD}\n\
         @@ -0,0 +1 @@\n+hello\n"
    );
    let mut big = file("big.bin", FileStatus::Modified, 0, 0);
    big.binary = true;
    ReportChanges {
        host_surface: HOST_SURFACE.into(),
        host_session_id: host.host_session_id.clone(),
        branch: Some("feature/x".into()),
        head: Some("0123456789abcdef0123456789abcdef01234567".into()),
        ahead: 2,
        behind: 1,
        files: vec![
            file("src/main.rs", FileStatus::Modified, 2, 1),
            file(ODD, FileStatus::Untracked, 1, 0),
            big,
        ],
        diff,
        turn_files: turn_files.iter().map(|p| p.to_string()).collect(),
    }
}

#[tokio::test]
async fn a_report_is_read_back_whole_and_file_by_file_with_its_turns_files() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let sid = host.session_id();
    assert_eq!(code(c.changes(sid).await), (404, "not_found".into()));

    // The turn the host holds a claim on is the one its tools wrote for.
    let turn = enqueue(c, &host, "edit main.rs").await;
    claim(c, &host, "claim-1", 0).await;
    c.report_changes(sid, &report(&host, &["src/main.rs", "gone.rs"]))
        .await
        .unwrap();
    let got = c.changes(sid).await.unwrap().body;
    assert_eq!(got.branch.as_deref(), Some("feature/x"));
    assert_eq!((got.ahead, got.behind), (2, 1));
    assert_eq!(got.files.len(), 3);
    assert_eq!((got.added, got.removed), (3, 1));
    assert!(got.reported_at.ends_with('Z'));
    assert_eq!(got.turns.len(), 1);
    let t = &got.turns[0];
    assert_eq!(t.turn_id, turn.turn_id);
    assert_eq!((t.files.len(), t.added, t.removed), (2, 2, 1));
    assert_eq!(t.files[1].path, "gone.rs");

    // One file: its section of the diff, by its path encoded as one segment.
    let one = c.changed_file(sid, ODD).await.unwrap().body;
    assert_eq!(one.file.path, ODD);
    assert!(
        one.diff
            .starts_with(&format!("diff --git a/{ODD} b/{ODD}\n"))
    );
    assert!(one.diff.ends_with("+hello\n"), "{}", one.diff);
    let main = c.changed_file(sid, "src/main.rs").await.unwrap().body;
    assert!(main.diff.contains("+more\n keep\n") && !main.diff.contains("hello"));
    // Its slashes as they are reach the same file.
    let raw = c
        .send(
            reqwest::Method::GET,
            &format!("/v1/sessions/{sid}/changes/files/src/main.rs"),
            loopx::client::NO_BODY,
            None,
        )
        .await
        .unwrap();
    assert_eq!(raw.status, 200, "{}", raw.text);
    let binary = c.changed_file(sid, "big.bin").await.unwrap().body;
    assert!(binary.file.binary && binary.diff.is_empty());
    assert_eq!(
        code(c.changed_file(sid, "nope.rs").await),
        (404, "not_found".into())
    );
    assert_eq!(
        code(c.changed_file("ses_nope", "src/main.rs").await),
        (404, "not_found".into())
    );

    // A later report replaces the latest; with no current turn, its turn
    // files go nowhere and the earlier turn keeps its own.
    let by_host = loopx::model::ReleaseRequest {
        host_surface: Some(HOST_SURFACE.into()),
        host_session_id: Some(host.host_session_id.clone()),
        by: None,
    };
    c.release(sid, "claim-1", &by_host).await.unwrap();
    let mut later = report(&host, &["other.rs"]);
    later.files.truncate(1);
    later.branch = None;
    c.report_changes(sid, &later).await.unwrap();
    let got = c.changes(sid).await.unwrap().body;
    assert_eq!((got.files.len(), got.branch), (1, None));
    assert_eq!(got.turns.len(), 1);
    assert_eq!(got.turns[0].files[0].path, "src/main.rs");
    assert_eq!(
        code(c.changed_file(sid, ODD).await),
        (404, "not_found".into())
    );
}

/// A change made to a report.
type Change = dyn Fn(&mut ReportChanges);

#[tokio::test]
async fn a_report_is_the_hosts_within_its_limits_and_never_a_5xx() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let sid = host.session_id();
    let refused = |r: Result<(), loopx::client::ClientError>| match r {
        Err(loopx::client::ClientError::Refused { reply, error }) => (
            reply.status.as_u16(),
            error.error.code_str(),
            error.error.message,
        ),
        other => panic!("expected a refusal, got {other:?}"),
    };
    let mut stranger = report(&host, &[]);
    stranger.host_session_id = "someone-else".into();
    assert_eq!(
        refused(c.report_changes(sid, &stranger).await).1,
        "host_mismatch"
    );
    let (status, code_, _) = refused(c.report_changes("ses_none", &report(&host, &[])).await);
    assert_eq!((status, code_.as_str()), (404, "not_found"));

    let limits: Vec<(&str, Box<Change>)> = vec![
        (
            "files",
            Box::new(|r| r.files = vec![file("a", FileStatus::Added, 1, 0); 1001]),
        ),
        (
            "turn_files",
            Box::new(|r| r.turn_files = vec!["a".into(); 1001]),
        ),
        ("path", Box::new(|r| r.files[0].path = "a\0b".into())),
        ("path", Box::new(|r| r.files[0].path = String::new())),
        ("path", Box::new(|r| r.turn_files = vec!["x".repeat(4097)])),
        ("diff", Box::new(|r| r.diff = "+".repeat(1024 * 1024 + 1))),
        ("branch", Box::new(|r| r.branch = Some("a\nb".into()))),
        ("head", Box::new(|r| r.head = Some("f".repeat(65)))),
    ];
    for (what, change) in limits {
        let mut r = report(&host, &[]);
        change(&mut r);
        let (status, code_, message) = refused(c.report_changes(sid, &r).await);
        assert_eq!((status, code_.as_str()), (400, "invalid_request"), "{what}");
        assert!(message.contains(what), "{what}: {message}");
    }
    // Unknown fields and a body over 2 MiB, as JSON errors.
    let path = &format!("/v1/sessions/{sid}/changes");
    let raw = |body: serde_json::Value| async move {
        c.send(reqwest::Method::POST, path, Some(&body), None)
            .await
            .unwrap()
    };
    let hs = &host.host_session_id;
    let reply =
        raw(json!({"host_surface": HOST_SURFACE, "host_session_id": hs, "secret": 1})).await;
    assert_eq!(reply.status, 400, "{}", reply.text);
    let big = "x".repeat(3 << 20);
    let reply =
        raw(json!({"host_surface": HOST_SURFACE, "host_session_id": hs, "diff": big})).await;
    assert_eq!(reply.status, 413, "{}", reply.text);
    assert_eq!(reply.json()["error"]["code"], "payload_too_large");
    // Odd paths read as 404, never a failure.
    for path in ["%00", "..%2F..%2Fetc%2Fpasswd", "%FF%FE", "a/../../b"] {
        let reply = c
            .send(
                reqwest::Method::GET,
                &format!("/v1/sessions/{sid}/changes/files/{path}"),
                loopx::client::NO_BODY,
                None,
            )
            .await
            .unwrap();
        assert!(reply.status.as_u16() < 500, "{path}: {}", reply.status);
    }
    c.report_changes(sid, &report(&host, &[])).await.unwrap();
    c.close(sid).await.unwrap();
    let (status, code_, _) = refused(c.report_changes(sid, &report(&host, &[])).await);
    assert_eq!((status, code_.as_str()), (409, "session_closed"));
    // Read after close, as a closed session's turns are.
    c.changes(sid).await.unwrap();
}

/// Runs git in `dir`, as a person would; panics when it fails.
fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args([
            "-c",
            "init.defaultBranch=main",
            "-c",
            "commit.gpgsign=false",
        ])
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
}

/// A repository with one commit of `files` (path, content).
fn repository(files: &[(&str, &[u8])]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    git(dir.path(), &["init", "-q"]);
    for (path, content) in files {
        write(dir.path(), path, content);
    }
    git(dir.path(), &["add", "-A"]);
    git(dir.path(), &["commit", "-qm", "first"]);
    dir
}

fn write(root: &Path, path: &str, content: &[u8]) {
    let full = root.join(path);
    std::fs::create_dir_all(full.parent().unwrap()).unwrap();
    std::fs::write(full, content).unwrap();
}

fn find<'t>(tree: &'t worktree::Worktree, path: &str) -> &'t ChangedFile {
    tree.files
        .iter()
        .find(|f| f.path == path)
        .unwrap_or_else(|| panic!("{path} in {:?}", tree.files))
}

#[test]
fn the_hooks_read_a_real_repository() {
    let lines: String = (1..=10).map(|n| format!("line {n}\n")).collect();
    let repo = repository(&[
        ("src/lib.rs", lines.as_bytes()),
        ("gone.txt", b"bye\n"),
        ("img.png", b"\x89PNG\0\0\x01"),
    ]);
    let root = repo.path();
    write(
        root,
        "src/lib.rs",
        lines.replace("line 5\n", "five\nsix\n").as_bytes(),
    );
    std::fs::remove_file(root.join("gone.txt")).unwrap();
    write(root, "img.png", b"\x89PNG\0\0\x02\x03");
    write(root, ODD, "h\u{e9}llo\nw\u{f6}rld".as_bytes());
    write(root, "new bin", b"\0\x01\x02");
    // A huge file: listed with its counts, its text not in the diff.
    let huge: String = (0..40_000).map(|n| format!("row {n}\n")).collect();
    write(root, "huge.txt", huge.as_bytes());
    write(root, "src/huge.rs", b"");
    git(root, &["add", "src/huge.rs"]);
    write(root, "src/huge.rs", huge.as_bytes());

    // From a subdirectory: the repository's root is found.
    let tree = worktree::read(&root.join("src"), Duration::from_secs(2)).unwrap();
    assert_eq!(tree.branch.as_deref(), Some("main"));
    assert_eq!(tree.head.as_ref().map(String::len), Some(40));
    let lib = find(&tree, "src/lib.rs");
    assert_eq!(
        (lib.status, lib.added, lib.removed),
        (FileStatus::Modified, 2, 1)
    );
    let gone = find(&tree, "gone.txt");
    assert_eq!((gone.status, gone.removed), (FileStatus::Deleted, 1));
    assert!(find(&tree, "img.png").binary);
    let odd = find(&tree, ODD);
    assert_eq!(
        (odd.status, odd.added, odd.truncated),
        (FileStatus::Untracked, 2, false)
    );
    assert!(find(&tree, "new bin").binary);
    let huge_new = find(&tree, "huge.txt");
    assert_eq!((huge_new.added, huge_new.truncated), (40_000, true));
    let huge_tracked = find(&tree, "src/huge.rs");
    assert_eq!(
        (huge_tracked.status, huge_tracked.added),
        (FileStatus::Added, 40_000)
    );
    assert!(huge_tracked.truncated);
    // The diff holds exactly the shown files, each found by its path.
    let sections = loopx::decide::changes::sections(&tree.diff);
    let mut shown: Vec<&str> = sections.iter().map(|(p, _)| p.as_str()).collect();
    shown.sort();
    assert_eq!(shown, [ODD, "gone.txt", "src/lib.rs"]);
    let odd_diff = loopx::decide::changes::file_diff(&tree.diff, ODD).unwrap();
    assert!(odd_diff.contains("+h\u{e9}llo\n+w\u{f6}rld\n\\ No newline at end of file\n"));
    assert!(tree.diff.len() < worktree::MAX_DIFF_BYTES);

    // A detached HEAD: no branch, its commit.
    git(root, &["stash", "-q", "--include-untracked"]);
    git(root, &["checkout", "-q", "--detach"]);
    let tree = worktree::read(root, Duration::from_secs(2)).unwrap();
    assert_eq!((tree.branch, tree.files.len()), (None, 0));
    assert!(tree.head.is_some() && tree.diff.is_empty());

    // Outside git, nothing.
    let outside = tempfile::tempdir().unwrap();
    assert_eq!(worktree::read(outside.path(), Duration::from_secs(2)), None);
    assert_eq!(
        worktree::read(Path::new("/no/such/dir"), Duration::from_secs(2)),
        None
    );

    // Before the first commit: everything is new.
    let fresh = tempfile::tempdir().unwrap();
    git(fresh.path(), &["init", "-q"]);
    write(fresh.path(), "a.txt", b"a\n");
    git(fresh.path(), &["add", "a.txt"]);
    let tree = worktree::read(fresh.path(), Duration::from_secs(2)).unwrap();
    assert_eq!(tree.head, None);
    let a = find(&tree, "a.txt");
    assert_eq!((a.status, a.added), (FileStatus::Added, 1));
}

#[test]
fn ten_thousand_files_are_read_within_the_budget() {
    let repo = tempfile::tempdir().unwrap();
    let root = repo.path();
    git(root, &["init", "-q"]);
    for n in 0..10_000 {
        write(
            root,
            &format!("d{}/f{n}.txt", n % 100),
            format!("{n}\n").as_bytes(),
        );
    }
    git(root, &["add", "-A"]);
    git(root, &["commit", "-qm", "many"]);
    for n in (0..10_000).step_by(10) {
        write(root, &format!("d{}/f{n}.txt", n % 100), b"changed\n");
    }
    for n in 0..2_000 {
        write(root, &format!("new/u{n}.txt"), b"new\n");
    }
    let started = Instant::now();
    let tree = worktree::read(root, Duration::from_secs(2)).unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_millis(2500), "{took:?}");
    assert_eq!(
        tree.files.len(),
        worktree::MAX_FILES,
        "at most 1,000 listed"
    );
    assert!(tree.files.iter().all(|f| f.status == FileStatus::Modified));
    assert!(tree.diff.len() <= worktree::MAX_DIFF_BYTES);
    // A budget too short for it: what was not read is listed truncated.
    let tree = worktree::read(root, Duration::from_millis(1));
    assert!(tree.is_none_or(|t| t.files.iter().all(|f| f.truncated || f.added > 0)));
}

#[tokio::test]
async fn the_hooks_report_at_post_tool_use_and_stop_with_the_turns_files() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let sid = host.session_id();
    let repo = repository(&[("a.txt", b"one\n")]);
    let root = repo.path();
    let cwd = root.display().to_string();
    let agents = Agents::new(&broker, &host, Agent::ClaudeCode);
    let prompt = json!({"prompt": "write the files", "cwd": cwd});
    agents
        .run("user-prompt-submit", "UserPromptSubmit", prompt, &[])
        .await;

    write(root, "b c.txt", b"new\nfile\n");
    let tool = |name: &str, path: &str| json!({"tool_name": name, "tool_input": {"file_path": root.join(path)}, "cwd": cwd});
    let run = agents
        .run(
            "post-tool-use",
            "PostToolUse",
            tool("Write", "b c.txt"),
            &[],
        )
        .await;
    assert_eq!((run.code, run.stdout.as_str()), (0, ""), "{run:?}");
    let got = c.changes(sid).await.unwrap().body;
    assert_eq!(got.files.len(), 1, "{got:?}");
    assert_eq!(got.files[0].status, FileStatus::Untracked);

    // Within 10 s: remembered, not reported; Stop reports it all.
    write(root, "a.txt", b"two\n");
    agents
        .run("post-tool-use", "PostToolUse", tool("Edit", "a.txt"), &[])
        .await;
    assert_eq!(c.changes(sid).await.unwrap().body.files.len(), 1);
    let stop = json!({"stop_hook_active": false, "last_assistant_message": "done", "cwd": cwd});
    let run = agents.run("stop", "Stop", stop, &[]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let got = c.changes(sid).await.unwrap().body;
    assert_eq!(got.files.len(), 2, "{got:?}");
    assert_eq!((got.added, got.removed), (3, 1));
    let turns = all_turns(c, &host).await;
    let typed = turns.iter().find(|t| t.origin == Origin::Terminal).unwrap();
    assert_eq!(got.turns.len(), 1);
    assert_eq!(got.turns[0].turn_id, typed.turn_id);
    let paths: Vec<&str> = got.turns[0].files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["b c.txt", "a.txt"]);
    let a = c.changed_file(sid, "a.txt").await.unwrap().body;
    assert!(a.diff.contains("-one\n+two\n"), "{}", a.diff);

    // The next turn starts with nothing written.
    let prompt = json!({"prompt": "look only", "cwd": cwd});
    agents
        .run("user-prompt-submit", "UserPromptSubmit", prompt, &[])
        .await;
    let stop = json!({"stop_hook_active": false, "last_assistant_message": "ok", "cwd": cwd});
    agents.run("stop", "Stop", stop, &[]).await;
    assert_eq!(c.changes(sid).await.unwrap().body.turns.len(), 1);
}

#[tokio::test]
async fn lark_changes_answers_a_card_with_the_files_and_the_totals() {
    use crate::lark_pairing::{answer_to, code_for, connected, deliver, said};
    let (fake, broker) = connected().await;
    let host = bound_host(&broker.client).await;
    let code = code_for(&broker, &host).await;
    deliver(
        &fake,
        &said("ev_cl", "oc_changes", "om_cl", &format!("/link {code}")),
    )
    .await;
    answer_to(&fake, "om_cl").await;

    deliver(&fake, &said("ev_c0", "oc_changes", "om_c0", "/changes")).await;
    let (title, text) = answer_to(&fake, "om_c0").await;
    assert!(title.starts_with("Changes"), "{title}");
    assert!(text.contains("reported no changes"), "{text}");

    broker
        .client
        .report_changes(host.session_id(), &report(&host, &[]))
        .await
        .unwrap();
    deliver(&fake, &said("ev_c1", "oc_changes", "om_c1", "/changes")).await;
    let (title, text) = answer_to(&fake, "om_c1").await;
    assert!(
        title.starts_with("Changes") && title.contains(&host.goal_id),
        "{title}"
    );
    assert!(text.contains("feature/x"), "{text}");
    assert!(text.contains("3 files changed (+3 −1)"), "{text}");
    assert!(text.contains("`src/main.rs` modified +2 −1"), "{text}");
    assert!(text.contains(&format!("`{ODD}` untracked +1 −0")), "{text}");
    assert!(text.contains("`big.bin` modified (binary)"), "{text}");
    // The diff itself stays on the Web page; the command is never a turn.
    assert!(!text.contains("+more"), "{text}");
    assert!(all_turns(&broker.client, &host).await.is_empty());
}
