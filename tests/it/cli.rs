//! The host-bridge CLI as a user runs it: the real `loopx` binary against an
//! in-process broker, checking stdout, stderr and exit codes (0 success, 1
//! refused, 2 local input error, 3 unreachable), and the example bridge script.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use loopx::model::{ListSessions, TurnState};
use serde_json::{Value, json};

use crate::support::{self, HOST_SURFACE, Host, TOKEN, TestBroker};

/// What one run of the binary printed, and how it exited.
#[derive(Debug)]
pub(crate) struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {self:?}"))
    }

    #[track_caller]
    pub(crate) fn ok(&self) -> &Self {
        assert_eq!(self.code, 0, "expected success: {self:?}");
        self
    }
}

/// Runs `loopx <args> --broker-url <url>` with the owner token in the environment.
pub(crate) async fn loopx_at(url: &str, args: &[&str]) -> Run {
    let output = support::loopx()
        .args(args)
        .args(["--broker-url", url])
        .env("LOOPX_TOKEN", TOKEN)
        .env_remove("LOOPX_BROKER_URL")
        .env_remove("LOOPX_TOKEN_FILE")
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    Run {
        code: output.status.code().expect("loopx exits, not killed"),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

async fn loopx(broker: &TestBroker, args: &[&str]) -> Run {
    loopx_at(&broker.url, args).await
}

/// `--host-surface S --host-session-id H` of a host.
fn host_args(host: &Host) -> [&str; 4] {
    [
        "--host-surface",
        HOST_SURFACE,
        "--host-session-id",
        &host.host_session_id,
    ]
}

/// Claims through the CLI (json) and returns the turn id.
async fn claim_via_cli(broker: &TestBroker, host: &Host, claim_id: &str) -> String {
    let mut args = vec![
        "worker-bridge",
        "attached-session-claim",
        "--session-id",
        host.session_id(),
        "--claim-id",
        claim_id,
        "--format",
        "json",
    ];
    args.extend(host_args(host));
    let claim = loopx(broker, &args).await.ok().json();
    assert_eq!(claim["claimed"], true, "{claim}");
    claim["turn"]["turn_id"].as_str().unwrap().to_owned()
}

async fn complete_via_cli(
    broker: &TestBroker,
    host: &Host,
    turn_id: &str,
    claim_id: &str,
    completion_id: &str,
    file: &Path,
) -> Run {
    let mut args = vec![
        "worker-bridge",
        "attached-session-complete",
        "--session-id",
        host.session_id(),
        "--turn-id",
        turn_id,
        "--claim-id",
        claim_id,
        "--completion-id",
        completion_id,
        "--response-json",
        file.to_str().unwrap(),
    ];
    args.extend(host_args(host));
    loopx(broker, &args).await
}

#[tokio::test]
async fn a_whole_turn_through_the_cli() {
    let broker = TestBroker::start().await;
    let (goal, agent, host_session) = (
        support::unique("goal"),
        support::unique("agent"),
        support::unique("host-secret"),
    );
    let identity = [
        "--goal-id",
        &goal,
        "--agent-id",
        &agent,
        "--host-surface",
        HOST_SURFACE,
        "--host-session-id",
        &host_session,
    ];
    let command = |sub: &'static str, extra: &[&'static str]| {
        let mut args = vec!["worker-bridge", sub];
        args.extend(identity);
        args.extend(extra);
        args
    };

    let registered = loopx(&broker, &command("bind-agent-thread", &[])).await;
    assert!(
        registered
            .ok()
            .stdout
            .starts_with("registered agent thread"),
        "{registered:?}"
    );
    let again = loopx(&broker, &command("bind-agent-thread", &[])).await;
    assert!(
        again.ok().stdout.contains("already registered"),
        "{again:?}"
    );

    // The dry run says what it would do and writes nothing.
    let bind = ["--executor-endpoint-id", "exec-laptop"];
    let dry = loopx(&broker, &command("attached-session-bind", &bind)).await;
    assert!(
        dry.ok().stdout.contains("would create a new session"),
        "{dry:?}"
    );
    assert!(dry.stdout.contains("--execute"), "{dry:?}");
    let list = loopx(
        &broker,
        &["worker-bridge", "attached-session-list", "--format", "json"],
    )
    .await;
    assert_eq!(
        list.ok().json(),
        json!({"sessions": [], "next_cursor": null})
    );

    let executed = [bind[0], bind[1], "--execute", "--format", "json"];
    let bound = loopx(&broker, &command("attached-session-bind", &executed)).await;
    let session = bound.ok().json();
    let session_id = session["session_id"].as_str().unwrap().to_owned();
    assert!(session_id.starts_with("ses_"), "{session}");
    assert!(
        !bound.stdout.contains(&host_session),
        "a projection never shows the host session id"
    );
    let rebound = loopx(
        &broker,
        &command("attached-session-bind", &[bind[0], bind[1], "--execute"]),
    )
    .await;
    assert!(
        rebound
            .ok()
            .stdout
            .starts_with(&format!("reused open session {session_id}")),
        "{rebound:?}"
    );
    let dry = loopx(&broker, &command("attached-session-bind", &bind)).await;
    assert!(
        dry.ok()
            .stdout
            .contains(&format!("would reuse open session {session_id}")),
        "{dry:?}"
    );

    let table = loopx(
        &broker,
        &["worker-bridge", "attached-session-list", "--state", "open"],
    )
    .await;
    assert!(table.ok().stdout.starts_with("SESSION"), "{table:?}");
    assert!(
        table.stdout.contains(&session_id) && table.stdout.contains("exec-laptop"),
        "{table:?}"
    );
    // People read the newest first (issue 55): a session bound after it
    // comes before it.
    let newer = support::bound_host(&broker.client).await;
    let table = loopx(
        &broker,
        &["worker-bridge", "attached-session-list", "--state", "open"],
    )
    .await;
    let at = |id: &str| table.stdout.find(id).unwrap_or(usize::MAX);
    assert!(
        at(newer.session_id()) < at(&session_id),
        "newest first: {table:?}"
    );
    // The agent's presence: away, and no message yet (a leftover, such as a
    // health check's bind, looks like this).
    assert!(
        table.stdout.contains("PRESENCE") && table.stdout.contains("away, empty"),
        "{table:?}"
    );

    let sent = loopx(
        &broker,
        &[
            "chat",
            "send",
            "--session-id",
            &session_id,
            "--text",
            "What broke?",
            "--format",
            "json",
        ],
    )
    .await;
    let enqueued = sent.ok().json();
    assert_eq!(enqueued["seq"], 1);
    let turn_id = enqueued["turn_id"].as_str().unwrap().to_owned();

    // --format json prints exactly the broker's body: one document.
    let claimed = loopx(
        &broker,
        &[
            "worker-bridge",
            "attached-session-claim",
            "--session-id",
            &session_id,
            "--host-surface",
            HOST_SURFACE,
            "--host-session-id",
            &host_session,
            "--claim-id",
            "cli-claim-1",
            "--format",
            "json",
        ],
    )
    .await;
    let claim = claimed.ok().json();
    assert_eq!(claim["claimed"], true);
    assert_eq!(claim["claim_id"], "cli-claim-1");
    assert_eq!(claim["turn"]["turn_id"], turn_id.as_str());
    assert_eq!(claim["turn"]["text"], "What broke?");
    assert_eq!(claim["turn"]["attempt"], 1);
    assert_eq!(claim["turn_state"], "claimed");
    let shown = loopx(
        &broker,
        &[
            "chat",
            "show",
            "--session-id",
            &session_id,
            "--turn-id",
            &turn_id,
        ],
    )
    .await;
    assert!(
        shown.ok().stdout.contains("delivered to the agent"),
        "a claimed turn is shown as delivered: {shown:?}"
    );

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("response.json");
    std::fs::write(
        &file,
        r#"{"message": "The fixture is stale.", "model": "x"}"#,
    )
    .unwrap();
    let completed = loopx(
        &broker,
        &[
            "worker-bridge",
            "attached-session-complete",
            "--session-id",
            &session_id,
            "--turn-id",
            &turn_id,
            "--host-surface",
            HOST_SURFACE,
            "--host-session-id",
            &host_session,
            "--claim-id",
            "cli-claim-1",
            "--completion-id",
            "cli-done-1",
            "--response-json",
            file.to_str().unwrap(),
        ],
    )
    .await;
    assert!(
        completed
            .ok()
            .stdout
            .starts_with(&format!("completed turn {turn_id}")),
        "{completed:?}"
    );
    assert!(!completed.stdout.contains("replay"), "{completed:?}");

    let shown = loopx(
        &broker,
        &[
            "chat",
            "show",
            "--session-id",
            &session_id,
            "--turn-id",
            &turn_id,
        ],
    )
    .await;
    assert!(shown.ok().stdout.contains("completed"), "{shown:?}");
    assert!(shown.stdout.contains("What broke?"), "{shown:?}");
    assert!(shown.stdout.contains("The fixture is stale."), "{shown:?}");
    let shown = loopx(
        &broker,
        &[
            "chat",
            "show",
            "--session-id",
            &session_id,
            "--turn-id",
            &turn_id,
            "--format",
            "json",
        ],
    )
    .await;
    let turn = shown.ok().json();
    assert_eq!(turn["state"], "completed");
    assert_eq!(
        turn["response"],
        json!({"message": "The fixture is stale.", "model": "x"})
    );

    let closed = loopx(
        &broker,
        &[
            "worker-bridge",
            "attached-session-close",
            "--session-id",
            &session_id,
        ],
    )
    .await;
    assert!(
        closed
            .ok()
            .stdout
            .starts_with(&format!("closed session {session_id}")),
        "{closed:?}"
    );
    let session = broker.client.session(&session_id).await.unwrap().body;
    assert_eq!(session.state, loopx::model::SessionState::Closed);
}

#[tokio::test]
async fn a_bad_response_file_exits_2_before_any_request() {
    let broker = TestBroker::start().await;
    let host = support::bound_host(&broker.client).await;
    let turn = support::enqueue(&broker.client, &host, "hello").await;
    let turn_id = claim_via_cli(&broker, &host, "bad-file-claim").await;
    assert_eq!(turn_id, turn.turn_id);

    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, Option<&str>, &str); 6] = [
        ("missing.json", None, "cannot read the response file"),
        ("broken.json", Some("{\"message\": "), "not valid JSON"),
        (
            "array.json",
            Some("[\"message\"]"),
            "must hold a JSON object",
        ),
        ("none.json", Some("{\"text\": \"hi\"}"), "no \"message\""),
        (
            "empty.json",
            Some("{\"message\": \"\"}"),
            "empty \"message\"",
        ),
        ("number.json", Some("{\"message\": 7}"), "a number"),
    ];
    for (name, contents, expected) in cases {
        let file = dir.path().join(name);
        if let Some(contents) = contents {
            std::fs::write(&file, contents).unwrap();
        }
        let run =
            complete_via_cli(&broker, &host, &turn_id, "bad-file-claim", "done-1", &file).await;
        assert_eq!(run.code, 2, "{name}: {run:?}");
        assert!(run.stderr.contains(expected), "{name}: {run:?}");
        assert!(
            run.stderr.contains(name),
            "the message names the file: {run:?}"
        );
        assert!(run.stdout.is_empty(), "{name}: {run:?}");
    }
    // The broker saw none of it: the turn is still claimed and unanswered.
    let now = broker
        .client
        .turn(host.session_id(), &turn_id)
        .await
        .unwrap()
        .body;
    assert_eq!(now.state, TurnState::Claimed);
    assert!(now.response.is_none());
}

#[tokio::test]
async fn a_refusal_exits_1_with_the_code_on_stderr() {
    let broker = TestBroker::start().await;
    let args = [
        "worker-bridge",
        "attached-session-bind",
        "--goal-id",
        "never-registered",
        "--agent-id",
        "agent-1",
        "--host-surface",
        HOST_SURFACE,
        "--host-session-id",
        "nobody",
        "--executor-endpoint-id",
        "exec-1",
        "--execute",
    ];
    let run = loopx(&broker, &args).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.starts_with("loopx: not_registered: "), "{run:?}");
    assert!(run.stdout.is_empty(), "{run:?}");

    // In json format stdout carries the broker's error body, for scripts.
    let mut json_args = args.to_vec();
    json_args.extend(["--format", "json"]);
    let run = loopx(&broker, &json_args).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert_eq!(run.json()["error"]["code"], "not_registered");

    // A wrong host identity on claim is refused too.
    let host = support::bound_host(&broker.client).await;
    let run = loopx(
        &broker,
        &[
            "worker-bridge",
            "attached-session-claim",
            "--session-id",
            host.session_id(),
            "--host-surface",
            HOST_SURFACE,
            "--host-session-id",
            "someone-else",
            "--claim-id",
            "c-1",
        ],
    )
    .await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("loopx: host_mismatch: "), "{run:?}");

    // A wrong token: refused, and the message says where the token came from.
    let output = support::loopx()
        .args([
            "worker-bridge",
            "attached-session-list",
            "--broker-url",
            &broker.url,
        ])
        .env("LOOPX_TOKEN", "not-the-token")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("loopx: unauthorized: ") && stderr.contains("LOOPX_TOKEN"),
        "{stderr}"
    );
}

#[tokio::test]
async fn an_unreachable_broker_exits_3_naming_the_url() {
    let url = format!("http://127.0.0.1:{}", support::free_port());
    let run = loopx_at(&url, &["worker-bridge", "attached-session-list"]).await;
    assert_eq!(run.code, 3, "{run:?}");
    assert!(run.stderr.contains(&url), "{run:?}");
    assert!(run.stdout.is_empty(), "{run:?}");
    let run = loopx_at(
        &url,
        &[
            "chat",
            "send",
            "--session-id",
            "ses_x",
            "--text",
            "hi",
            "--format",
            "json",
        ],
    )
    .await;
    assert_eq!(run.code, 3, "{run:?}");
    assert!(run.stdout.is_empty(), "{run:?}");
}

#[tokio::test]
async fn local_usage_errors_exit_2() {
    // No token anywhere: the message names where it looked.
    let dir = tempfile::tempdir().unwrap();
    let output = support::loopx()
        .args([
            "worker-bridge",
            "attached-session-list",
            "--broker-url",
            "http://127.0.0.1:9",
        ])
        .env("LOOPX_DATA_DIR", dir.path())
        .env_remove("LOOPX_TOKEN_FILE")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("LOOPX_TOKEN"), "{stderr}");
    assert!(
        stderr.contains(&dir.path().join("owner.token").display().to_string()),
        "{stderr}"
    );

    // A token file works as well as the environment.
    let broker = TestBroker::start().await;
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let output = support::loopx()
        .args([
            "worker-bridge",
            "attached-session-list",
            "--broker-url",
            &broker.url,
            "--token-file",
        ])
        .arg(&token_file)
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "no sessions"
    );

    // Clap's own usage errors, and a broker URL that is not one.
    for args in [
        &[
            "worker-bridge",
            "attached-session-claim",
            "--session-id",
            "ses_x",
        ][..],
        &["worker-bridge", "attached-session-list", "--limit", "0"],
        &["worker-bridge", "attached-session-list", "--format", "yaml"],
        &[
            "chat",
            "show",
            "--session-id",
            "s",
            "--turn-id",
            "t",
            "--broker-url",
            "localhost:7317",
        ],
    ] {
        let output = support::loopx()
            .args(args)
            .env("LOOPX_TOKEN", TOKEN)
            .output()
            .await
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
        assert!(output.stdout.is_empty(), "{args:?}: {output:?}");
    }
}

#[tokio::test]
async fn every_command_has_help_with_an_example() {
    let commands: [&[&str]; 16] = [
        &["health"],
        &["lark"],
        &["lark", "link"],
        &["lark", "unlink"],
        &["lark", "status"],
        &["worker-bridge"],
        &["chat"],
        &["worker-bridge", "bind-agent-thread"],
        &["worker-bridge", "attached-session-bind"],
        &["worker-bridge", "attached-session-claim"],
        &["worker-bridge", "attached-session-complete"],
        &["worker-bridge", "attached-session-release"],
        &["worker-bridge", "attached-session-close"],
        &["worker-bridge", "attached-session-list"],
        &["chat", "send"],
        &["chat", "show"],
    ];
    for command in commands {
        let output = support::loopx()
            .args(command)
            .arg("--help")
            .output()
            .await
            .unwrap();
        let help = String::from_utf8_lossy(&output.stdout);
        assert_eq!(output.status.code(), Some(0), "{command:?}");
        assert!(help.contains("Example:"), "{command:?}: {help}");
        assert!(
            help.contains(&format!("loopx {}", command.join(" "))),
            "{command:?}: {help}"
        );
    }
}

#[tokio::test]
async fn serve_help_names_both_stores() {
    for args in [&["--help"][..], &["serve", "--help"]] {
        let output = support::loopx().args(args).output().await.unwrap();
        let help = String::from_utf8_lossy(&output.stdout);
        assert_eq!(output.status.code(), Some(0), "{args:?}");
        let serve = help
            .lines()
            .skip_while(|line| !line.contains("Run the broker"))
            .take(2)
            .collect::<Vec<_>>()
            .join(" ");
        assert!(serve.contains("SQLite"), "{args:?}: {help}");
        assert!(serve.contains("--database-url"), "{args:?}: {help}");
    }
}

#[tokio::test]
async fn a_claim_wait_on_an_empty_queue_ends_claimed_false_with_exit_0() {
    let broker = TestBroker::start().await;
    let host = support::bound_host(&broker.client).await;
    for format in ["text", "json"] {
        let mut args = vec![
            "worker-bridge",
            "attached-session-claim",
            "--session-id",
            host.session_id(),
            "--claim-id",
            "waiting-claim",
            "--wait-seconds",
            "1",
            "--format",
            format,
        ];
        args.extend(host_args(&host));
        let started = Instant::now();
        let run = loopx(&broker, &args).await;
        run.ok();
        assert!(started.elapsed() >= Duration::from_millis(900), "it waited");
        assert!(started.elapsed() < Duration::from_secs(5), "and no longer");
        if format == "json" {
            let answer = run.json();
            assert_eq!(answer["claimed"], false);
            assert_eq!(answer["session_id"], host.session_id());
        } else {
            assert!(run.stdout.starts_with("no turn queued after "), "{run:?}");
            assert!(run.stdout.contains("claimed=false"), "{run:?}");
            // stderr is not a terminal here: no progress line.
            assert!(run.stderr.is_empty(), "{run:?}");
        }
    }
}

#[tokio::test]
async fn repeated_claims_and_completions_say_replay_and_succeed() {
    let broker = TestBroker::start().await;
    let host = support::bound_host(&broker.client).await;
    support::enqueue(&broker.client, &host, "once").await;
    let turn_id = claim_via_cli(&broker, &host, "replay-claim").await;

    let mut args = vec![
        "worker-bridge",
        "attached-session-claim",
        "--session-id",
        host.session_id(),
        "--claim-id",
        "replay-claim",
    ];
    args.extend(host_args(&host));
    let replayed = loopx(&broker, &args).await;
    assert!(
        replayed
            .ok()
            .stdout
            .starts_with("replayed claim replay-claim"),
        "{replayed:?}"
    );
    assert!(
        replayed.stdout.contains(&turn_id) && replayed.stdout.contains("once"),
        "{replayed:?}"
    );

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("response.json");
    std::fs::write(&file, r#"{"message": "twice?"}"#).unwrap();
    let first = complete_via_cli(
        &broker,
        &host,
        &turn_id,
        "replay-claim",
        "first-done",
        &file,
    )
    .await;
    assert!(!first.ok().stdout.contains("(replay:"), "{first:?}");
    let second = complete_via_cli(
        &broker,
        &host,
        &turn_id,
        "replay-claim",
        "first-done",
        &file,
    )
    .await;
    assert!(second.ok().stdout.contains("(replay:"), "{second:?}");

    // Another completion id for the completed turn is refused.
    let other = complete_via_cli(
        &broker,
        &host,
        &turn_id,
        "replay-claim",
        "other-done",
        &file,
    )
    .await;
    assert_eq!(other.code, 1, "{other:?}");
    assert!(
        other.stderr.contains("loopx: already_completed: "),
        "{other:?}"
    );
}

#[tokio::test]
async fn release_gives_the_turn_back() {
    let broker = TestBroker::start().await;
    let host = support::bound_host(&broker.client).await;
    support::enqueue(&broker.client, &host, "not now").await;
    let turn_id = claim_via_cli(&broker, &host, "release-claim").await;
    let mut args = vec![
        "worker-bridge",
        "attached-session-release",
        "--session-id",
        host.session_id(),
        "--claim-id",
        "release-claim",
    ];
    args.extend(host_args(&host));
    let released = loopx(&broker, &args).await;
    assert!(
        released
            .ok()
            .stdout
            .starts_with(&format!("released turn {turn_id}")),
        "{released:?}"
    );
    let turn = broker
        .client
        .turn(host.session_id(), &turn_id)
        .await
        .unwrap()
        .body;
    assert_eq!(turn.state, TurnState::Queued);
}

/// The example bridge answers a queued message, then stops cleanly on SIGTERM.
#[tokio::test]
async fn the_example_bridge_script_answers_and_stops_on_sigterm() {
    let broker = TestBroker::start().await;
    let goal = support::unique("script-goal");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/host-bridge.sh");
    let mut bridge = tokio::process::Command::new("bash")
        .arg(script)
        .env("LOOPX_BIN", env!("CARGO_BIN_EXE_loopx"))
        .env("LOOPX_BROKER_URL", &broker.url)
        .env("LOOPX_TOKEN", TOKEN)
        .env_remove("LOOPX_TOKEN_FILE")
        .env("LOOPX_GOAL_ID", &goal)
        .env("LOOPX_AGENT_ID", support::unique("script-agent"))
        .env("LOOPX_HOST_SESSION_ID", support::unique("script-host"))
        .env("LOOPX_BRIDGE_WAIT", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    let filter = ListSessions {
        goal_id: Some(goal.clone()),
        ..Default::default()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let session_id = loop {
        let sessions = broker.client.sessions(&filter).await.unwrap().body.sessions;
        if let Some(session) = sessions.first() {
            break session.session_id.clone();
        }
        assert!(Instant::now() < deadline, "the script bound no session");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    let turn = broker
        .client
        .enqueue(&session_id, &support::web("ping from the web"))
        .await
        .unwrap()
        .body;
    let deadline = Instant::now() + Duration::from_secs(10);
    let answered = loop {
        let now = broker
            .client
            .turn(&session_id, &turn.turn_id)
            .await
            .unwrap()
            .body;
        if now.state == TurnState::Completed {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "the script did not answer: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        answered.response,
        Some(json!({"message": "received: ping from the web"}))
    );

    let pid = bridge.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(5), bridge.wait())
        .await
        .expect("the script stops within 5 s of SIGTERM")
        .unwrap();
    let mut stderr = String::new();
    if let Some(mut pipe) = bridge.stderr.take() {
        use tokio::io::AsyncReadExt;
        pipe.read_to_string(&mut stderr).await.unwrap();
    }
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("stopped"), "{stderr}");
}

#[tokio::test]
async fn lark_pair_prints_the_line_to_send_or_the_json() {
    let broker = TestBroker::start().await;
    let host = support::bound_host(&broker.client).await;
    let sid = host.session_id();
    let text = loopx(&broker, &["lark", "pair", "--session-id", sid]).await;
    let line = text.ok().stdout.trim().to_owned();
    assert!(line.starts_with("/link ") && line.len() == 16, "{line}");
    let json = loopx(
        &broker,
        &["lark", "pair", "--session-id", sid, "--format", "json"],
    )
    .await;
    let answer = json.ok().json();
    let code = answer["code"].as_str().unwrap();
    assert_eq!(answer["command"], format!("/link {code}"));
    assert_ne!(format!("/link {code}"), line, "a new code each time");
    let unknown = loopx(&broker, &["lark", "pair", "--session-id", "ses_nope"]).await;
    assert_eq!(unknown.code, 1, "{unknown:?}");
}

#[tokio::test]
async fn lark_link_status_and_unlink_through_the_cli() {
    let broker = TestBroker::start().await;
    let host = support::bound_host(&broker.client).await;
    let sid = host.session_id();
    let linked = loopx(
        &broker,
        &["lark", "link", "--session-id", sid, "--chat-id", "oc_team"],
    )
    .await;
    linked.ok();
    assert!(linked.stdout.contains("oc_team"), "{linked:?}");
    assert!(linked.stdout.contains("nobody"), "{linked:?}");
    let status = loopx(
        &broker,
        &["lark", "status", "--session-id", sid, "--format", "json"],
    )
    .await;
    assert_eq!(
        status.ok().json(),
        serde_json::json!({"session_id": sid, "chat_id": "oc_team", "approvers": [], "terminal_turns": false})
    );
    // docs/lark.md's form: approvers repeat; linking again replaces them.
    let approved = loopx(
        &broker,
        &[
            "lark",
            "link",
            "--session-id",
            sid,
            "--chat-id",
            "oc_team",
            "--approver",
            "ou_ann",
            "--approver",
            "ou_bob",
        ],
    )
    .await;
    assert!(
        approved.ok().stdout.contains("ou_ann, ou_bob"),
        "{approved:?}"
    );
    let status = loopx(
        &broker,
        &["lark", "status", "--session-id", sid, "--format", "json"],
    )
    .await;
    assert_eq!(
        status.ok().json()["approvers"],
        serde_json::json!(["ou_ann", "ou_bob"])
    );
    let bad = loopx(
        &broker,
        &[
            "lark",
            "link",
            "--session-id",
            sid,
            "--chat-id",
            "oc_team",
            "--approver",
            "ann",
        ],
    )
    .await;
    assert_eq!(bad.code, 1, "{bad:?}");
    assert!(bad.stderr.contains("invalid_request"), "{bad:?}");
    let other = support::bound_host(&broker.client).await;
    let joined = loopx(
        &broker,
        &[
            "lark",
            "link",
            "--session-id",
            other.session_id(),
            "--chat-id",
            "oc_team",
        ],
    )
    .await;
    // A chat holds several sessions: the other one joins it.
    assert_eq!(joined.code, 0, "{joined:?}");
    loopx(&broker, &["lark", "unlink", "--session-id", sid])
        .await
        .ok();
    let after = loopx(&broker, &["lark", "status", "--session-id", sid]).await;
    assert!(after.ok().stdout.contains("no Lark chat"), "{after:?}");
}

#[tokio::test]
async fn health_exits_0_for_a_live_broker_and_3_for_none() {
    let broker = TestBroker::start().await;
    let run = loopx(&broker, &["health"]).await;
    run.ok();
    assert!(run.stdout.contains("healthy"), "{run:?}");

    let nobody = format!("http://127.0.0.1:{}", support::free_port());
    let run = loopx_at(&nobody, &["health"]).await;
    assert_eq!(run.code, 3, "{run:?}");
    assert!(
        run.stderr.contains(&nobody),
        "names the URL it tried: {run:?}"
    );
}
