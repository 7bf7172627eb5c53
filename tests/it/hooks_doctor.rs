//! `loopx hook doctor` as a new user meets it (issue 53, item 12): the real
//! binary against a real broker. It checks the token against the broker,
//! shows only the current project's hook refusals, and warns when Codex
//! runs its hooks in its shared background server.

use std::path::Path;
use std::process::Stdio;

use serde_json::json;
use tokio::io::AsyncWriteExt;

use crate::support::*;

/// A run's exit code, stdout and stderr.
type Ran = (i32, String, String);

/// Runs `command` (a `loopx` or a wrapper around one) in `cwd` with
/// `LOOPX_DATA_DIR=data`, `stdin` written and closed, to its exit. The
/// token is the caller's to give.
async fn ran(mut command: tokio::process::Command, data: &Path, stdin: &str) -> Ran {
    let mut child = command
        .env("LOOPX_DATA_DIR", data)
        .env_remove("LOOPX_SESSION_ID")
        .env_remove("LOOPX_TOKEN_FILE")
        .env_remove("TMUX")
        .env_remove("TMUX_PANE")
        .env_remove("LOOPX_RUN_DIR")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    let output = child.wait_with_output().await.unwrap();
    (
        output.status.code().expect("exits, not killed"),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

/// `loopx hook <words…>` with the test token, in `cwd`.
async fn loopx_hook(words: &str, cwd: &Path, data: &Path, stdin: &str) -> Ran {
    let mut command = loopx();
    command
        .arg("hook")
        .args(words.split(' '))
        .current_dir(cwd)
        .env("HOME", cwd)
        .env("LOOPX_TOKEN", TOKEN);
    ran(command, data, stdin).await
}

/// Writes Codex hooks into `project`'s `.codex/config.toml`, for `binding`
/// (`--session-id S` or the bind flags).
async fn install(url: &str, binding: &str, project: &Path, data: &Path) {
    let words = format!("install --agent codex {binding} --broker-url {url}");
    let (code, out, err) = loopx_hook(&words, project, data, "").await;
    assert_eq!(code, 0, "{out}{err}");
}

/// Codex's Stop document for `host_session_id`, run in `cwd`.
fn stop(host_session_id: &str, cwd: &Path) -> String {
    json!({
        "session_id": host_session_id,
        "cwd": cwd,
        "hook_event_name": "Stop",
        "transcript_path": null,
        "permission_mode": "default",
        "turn_id": unique("turn"),
        "stop_hook_active": false,
        "last_assistant_message": null,
    })
    .to_string()
}

/// Runs Codex's Stop hook of `session_id` for `host_session_id`; the hook
/// itself always exits 0 with nothing on stdout.
async fn stop_hook(
    url: &str,
    session_id: &str,
    host_session_id: &str,
    cwd: &Path,
    data: &Path,
) -> String {
    let words = format!("stop --agent codex --session-id {session_id} --broker-url {url}");
    let (code, out, err) = loopx_hook(&words, cwd, data, &stop(host_session_id, cwd)).await;
    assert_eq!((code, out.as_str()), (0, ""), "{err}");
    err
}

/// A wrong token was "all well" until a hook failed; now doctor asks the
/// broker, says the token was refused and where the right one is, and says
/// a broker that is down is down.
#[tokio::test]
async fn doctor_checks_the_token_against_the_broker() {
    let broker = TestBroker::start().await;
    let project = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let binding = "--goal-id g --agent-id codex --executor-endpoint-id laptop";
    install(&broker.url, binding, project.path(), data.path()).await;
    let doctor = |token: &'static str| {
        let mut command = loopx();
        command
            .args(["hook", "doctor", "--agent", "codex"])
            .current_dir(project.path())
            .env("HOME", project.path())
            .env("LOOPX_TOKEN", token);
        ran(command, data.path(), "")
    };

    let (code, out, _) = doctor("a-wrong-token").await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("problem: the broker at")
            && out.contains("refused the owner token from LOOPX_TOKEN (401 unauthorized)")
            && out.contains("owner.token"),
        "{out}"
    );
    assert!(!out.contains("a-wrong-token"), "never the token: {out}");

    let (code, out, _) = doctor(TOKEN).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("ok: the broker takes the owner token from LOOPX_TOKEN")
            && out.contains("bind a session"),
        "{out}"
    );

    // The broker gone: said so, not the token.
    let gone = format!("http://127.0.0.1:{}", free_port());
    install(&gone, binding, project.path(), data.path()).await;
    let (code, out, _) = doctor(TOKEN).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("problem: the broker at {gone} does not answer"))
            && out.contains("loopx serve")
            && !out.contains("token"),
        "{out}"
    );
}

/// One data dir serves every project: project A's refusal shows only in
/// A's doctor (its directory the current one, or --project-dir), and only
/// A's own hook that works clears it.
#[tokio::test]
async fn doctor_shows_only_this_projects_refusals() {
    let broker = TestBroker::start().await;
    let host = bound_host(&broker.client).await;
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let data = tempfile::tempdir().unwrap();
    for project in [&a, &b] {
        let binding = format!("--session-id {}", host.session_id());
        install(&broker.url, &binding, project.path(), data.path()).await;
    }

    // A's hook is refused (another host session): A's doctor says so, B's not.
    let err = stop_hook(
        &broker.url,
        host.session_id(),
        "another-thread",
        a.path(),
        data.path(),
    )
    .await;
    assert!(err.contains("host_mismatch"), "{err}");
    let (code, out, _) = loopx_hook("doctor --agent codex", a.path(), data.path(), "").await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("problem: a hook failed") && out.contains("host_mismatch"),
        "{out}"
    );
    let (code, out, _) = loopx_hook("doctor --agent codex", b.path(), data.path(), "").await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("ok: no hook has failed recently"), "{out}");

    // B's hook works: A's refusal stays (asked with --project-dir from B).
    stop_hook(
        &broker.url,
        host.session_id(),
        &host.host_session_id,
        b.path(),
        data.path(),
    )
    .await;
    let words = format!("doctor --agent codex --project-dir {}", a.path().display());
    let (code, out, _) = loopx_hook(&words, b.path(), data.path(), "").await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("host_mismatch"), "{out}");

    // A's own hook works: cleared.
    stop_hook(
        &broker.url,
        host.session_id(),
        &host.host_session_id,
        a.path(),
        data.path(),
    )
    .await;
    let (code, out, _) = loopx_hook("doctor --agent codex", a.path(), data.path(), "").await;
    assert_eq!(code, 0, "{out}");
}

/// Codex in its shared background server runs every hook there, where no
/// idle Codex is typed into: `doctor --agent codex` warns (exit 0) with the
/// fix, when the project's last hook ran under an `app-server`, and when a
/// `app-server --managed-daemon` process of this user runs.
#[tokio::test]
async fn doctor_warns_when_codex_runs_hooks_in_its_shared_app_server() {
    let broker = TestBroker::start().await;
    let host = bound_host(&broker.client).await;
    let project = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let binding = format!("--session-id {}", host.session_id());
    install(&broker.url, &binding, project.path(), data.path()).await;
    let doctor = || loopx_hook("doctor --agent codex", project.path(), data.path(), "");
    let (code, out, _) = doctor().await;
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("warning:"), "{out}");

    // The Stop hook run by a process whose arguments hold `app-server`, as
    // Codex's server runs it: the hook works, and says it cannot type.
    let mut command = tokio::process::Command::new("sh");
    command
        .args(["-c", "\"$@\"; exit $?", "app-server"])
        .arg(env!("CARGO_BIN_EXE_loopx"))
        .args(["hook", "stop", "--agent", "codex", "--session-id"])
        .arg(host.session_id())
        .args(["--broker-url", &broker.url])
        .current_dir(project.path())
        .env_remove("CLAUDE_PROJECT_DIR")
        .env("LOOPX_TOKEN", TOKEN);
    let input = stop(&host.host_session_id, project.path());
    let (code, out, err) = ran(command, data.path(), &input).await;
    assert_eq!((code, out.as_str()), (0, ""), "{err}");
    assert!(err.contains("shared app-server"), "{err}");
    let (code, out, _) = doctor().await;
    assert_eq!(code, 0, "a warning, not a problem: {out}");
    assert!(
        out.contains("warning: this project's last hooks ran in Codex's shared app-server")
            && out.contains("--no-daemon"),
        "{out}"
    );
    assert!(!out.contains("problem:"), "{out}");

    // A hook outside it: no more warning.
    stop_hook(
        &broker.url,
        host.session_id(),
        &host.host_session_id,
        project.path(),
        data.path(),
    )
    .await;
    let (code, out, _) = doctor().await;
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("warning:"), "{out}");

    // The shared server itself running.
    let mut daemon = tokio::process::Command::new("python3")
        .args([
            "-c",
            "import time; time.sleep(30)",
            "app-server",
            "--managed-daemon",
        ])
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = daemon.id().unwrap();
    // python3 may be a shim that execs the real one: wait for its argv.
    let started = std::time::Instant::now();
    while !std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .any(|arg| arg == b"--managed-daemon")
    {
        assert!(
            started.elapsed().as_secs() < 10,
            "the fake daemon never ran"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (code, out, _) = doctor().await;
    daemon.kill().await.unwrap();
    assert_eq!(code, 0, "a warning, not a problem: {out}");
    assert!(
        out.contains("warning: Codex's shared background server runs for this user")
            && out.contains("--no-daemon"),
        "{out}"
    );
}
