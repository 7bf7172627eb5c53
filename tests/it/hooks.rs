//! `loopx hook`: the real binary run as Claude Code and Codex run it (their
//! JSON on stdin, stdout and the exit code checked) against a real broker,
//! for both agents' input shapes (HOOKS.md). Runs on SQLite and again on
//! PostgreSQL.

use std::process::Stdio;
use std::time::{Duration, Instant};

use loopx::model::{AgentState, Behavior, ListPermissions, PermissionState, TurnState};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use crate::events::{states, subscribe, take};
use crate::lark_permissions::{ANN, acked, linked, said};
use crate::support::*;

/// What a hook run left: its exit code, stdout, stderr and how long it took.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    pub(crate) took: Duration,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Agent {
    ClaudeCode,
    Codex,
}

impl Agent {
    fn flag(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "claude-code",
            Agent::Codex => "codex",
        }
    }

    /// The agent's stdin for `event`: the common fields, the agent's own
    /// extras, and `fields`.
    fn input(self, host_session_id: &str, event: &str, fields: Value) -> String {
        let mut input = json!({
            "session_id": host_session_id,
            "cwd": "/work/project",
            "hook_event_name": event,
            "permission_mode": "default",
        });
        match self {
            Agent::ClaudeCode => {
                input["transcript_path"] = json!("/home/u/.claude/projects/p/t.jsonl");
            }
            Agent::Codex => {
                input["transcript_path"] = Value::Null;
                input["model"] = json!("gpt-5-codex");
                if event != "SessionStart" && event != "SessionEnd" {
                    input["turn_id"] = json!(unique("turn"));
                }
            }
        }
        for (key, value) in fields.as_object().unwrap() {
            input[key] = value.clone();
        }
        input.to_string()
    }
}

/// Runs `loopx hook <args…>` with `stdin`, as the agent does.
async fn hook(url: &str, args: &[&str], stdin: &str) -> Run {
    hook_with(url, args, stdin, true).await
}

/// Runs `loopx hook <args…>` with `stdin`, left open when `close` is false
/// (an agent that never ends the hook's input).
async fn hook_with(url: &str, args: &[&str], stdin: &str, close: bool) -> Run {
    let mut command = loopx();
    command
        .arg("hook")
        .args(args)
        .args(["--broker-url", url])
        .env("LOOPX_DATA_DIR", hooks_data_dir());
    spawn(command, stdin, close).await
}

/// Runs a `loopx` command with the owner token and `stdin` (left open when
/// `close` is false), to its exit.
async fn spawn(mut command: tokio::process::Command, stdin: &str, close: bool) -> Run {
    let started = Instant::now();
    let mut child = command
        .env("LOOPX_TOKEN", TOKEN)
        .env_remove("LOOPX_SESSION_ID")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    let _open = (!close).then_some(input);
    let output = child.wait_with_output().await.unwrap();
    Run {
        code: output.status.code().expect("exits, not killed"),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
        took: started.elapsed(),
    }
}

/// Where the hooks of these tests keep their refusals (`hooks.log`), not
/// in the home of whoever runs the tests.
fn hooks_data_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("loopx-it-hooks-{}", std::process::id()))
}

/// One agent's hooks on one bound session, with the agent's transcript (a
/// file that grows by a line each turn, as the agents' transcripts do) and
/// its current turn (Codex's `turn_id`).
pub(crate) struct Agents<'a> {
    broker: &'a TestBroker,
    host: &'a Host,
    agent: Agent,
    transcript: tempfile::NamedTempFile,
    turn: std::cell::Cell<u32>,
}

impl<'a> Agents<'a> {
    pub(crate) fn new(broker: &'a TestBroker, host: &'a Host, agent: Agent) -> Self {
        Agents {
            broker,
            host,
            agent,
            transcript: tempfile::NamedTempFile::new().unwrap(),
            turn: std::cell::Cell::new(0),
        }
    }

    pub(crate) async fn run(
        &self,
        event: &str,
        name: &str,
        mut fields: Value,
        extra: &[&str],
    ) -> Run {
        fields["transcript_path"] = json!(self.transcript.path());
        if self.agent == Agent::Codex && event != "session-start" && event != "session-end" {
            fields["turn_id"] = json!(format!("turn-{}", self.turn.get()));
        }
        let mut args = vec![
            event,
            "--agent",
            self.agent.flag(),
            "--session-id",
            self.host.session_id(),
            "--host-surface",
            HOST_SURFACE,
        ];
        args.extend_from_slice(extra);
        let stdin = self.agent.input(&self.host.host_session_id, name, fields);
        hook(&self.broker.url, &args, &stdin).await
    }

    /// The agent ends a turn: its answer is written to the transcript, then
    /// the Stop hook runs.
    async fn stop(&self, last: Option<&str>, extra: &[&str]) -> Run {
        use std::io::Write;
        self.turn.set(self.turn.get() + 1);
        writeln!(self.transcript.as_file(), "{last:?}").unwrap();
        self.stop_again(last, extra).await
    }

    /// The Stop hook run again with the same input (the transcript and the
    /// turn as they were).
    async fn stop_again(&self, last: Option<&str>, extra: &[&str]) -> Run {
        let fields = match last {
            Some(text) => json!({"stop_hook_active": true, "last_assistant_message": text}),
            None if self.agent == Agent::Codex => {
                json!({"stop_hook_active": false, "last_assistant_message": null})
            }
            None => json!({"stop_hook_active": false}),
        };
        self.run("stop", "Stop", fields, extra).await
    }

    async fn ask(&self, tool_input: Value, extra: &[&str]) -> Run {
        let fields = json!({"tool_name": "Bash", "tool_input": tool_input});
        self.run("permission-request", "PermissionRequest", fields, extra)
            .await
    }
}

/// The block a Stop hook printed: its reason.
fn blocked(run: &Run) -> String {
    assert_eq!(run.code, 0, "{run:?}");
    let out: Value = serde_json::from_str(run.stdout.trim()).unwrap_or_else(|_| panic!("{run:?}"));
    let keys: Vec<&String> = out.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["decision", "reason"], "exactly the documented shape");
    assert_eq!(out["decision"], "block");
    out["reason"].as_str().unwrap().to_owned()
}

/// Every turn of the session with its answer's message (null if none).
async fn answers(c: &loopx::client::Client, host: &Host) -> Vec<(loopx::model::Turn, Value)> {
    all_turns(c, host)
        .await
        .into_iter()
        .map(|turn| {
            let answer = turn.response.clone().unwrap_or_default()["message"].clone();
            (turn, answer)
        })
        .collect()
}

fn silent(run: &Run) {
    assert_eq!((run.code, run.stdout.as_str()), (0, ""), "{run:?}");
}

#[tokio::test]
async fn stop_delivers_web_and_lark_messages_in_order_each_answered_once() {
    for agent in [Agent::ClaudeCode, Agent::Codex] {
        let (_fake, broker, events, host, chat) = linked(&[ANN]).await;
        let c = &broker.client;
        let hooks = Agents::new(&broker, &host, agent);
        silent(&hooks.stop(None, &[]).await);
        let web = enqueue(c, &host, "Please summarise the failing test.").await;
        acked(
            &events,
            &said(&events, &chat, ANN, "And list the flaky ones."),
        )
        .await;

        let first = blocked(&hooks.stop(Some("Ready."), &[]).await);
        assert!(
            first.contains("Please summarise the failing test."),
            "{first}"
        );
        assert!(first.contains("LoopX Web page"), "{first}");
        // Claude Code or Codex running the same stop again: the same turn,
        // nothing answered.
        assert_eq!(blocked(&hooks.stop_again(Some("Ready."), &[]).await), first);

        let second = blocked(&hooks.stop(Some("The test times out."), &[]).await);
        assert!(second.contains("And list the flaky ones."), "{second}");
        assert!(second.contains("in Lark"), "{second}");
        let answered = c.turn(host.session_id(), &web.turn_id).await.unwrap().body;
        assert_eq!(answered.state, TurnState::Completed);
        assert_eq!(answered.response.unwrap()["message"], "The test times out.");

        silent(&hooks.stop(Some("Two are flaky."), &[]).await);
        // Repeated: the completion replays, nothing doubles.
        silent(&hooks.stop_again(Some("Two are flaky."), &[]).await);
        let answers: Vec<(i64, TurnState, Value)> = answers(c, &host)
            .await
            .into_iter()
            .map(|(turn, answer)| (turn.seq, turn.state, answer))
            .collect();
        assert_eq!(
            answers,
            [
                (1, TurnState::Completed, json!("The test times out.")),
                (2, TurnState::Completed, json!("Two are flaky.")),
            ],
            "{agent:?}"
        );
        let session = c.session(host.session_id()).await.unwrap().body;
        assert_eq!(session.agent.state, AgentState::Waiting);
    }
}

/// A model that answers every message with the same words: each message is
/// still answered once, in order (the turn, not its words, tells two stops
/// apart).
#[tokio::test]
async fn the_same_answer_twice_answers_each_message_once_in_order() {
    for agent in [Agent::ClaudeCode, Agent::Codex] {
        let broker = TestBroker::start().await;
        let c = &broker.client;
        let host = bound_host(c).await;
        let hooks = Agents::new(&broker, &host, agent);
        for text in ["First.", "Second.", "Third."] {
            enqueue(c, &host, text).await;
        }
        assert!(blocked(&hooks.stop(Some("hello"), &[]).await).contains("First."));
        assert!(blocked(&hooks.stop(Some("Done."), &[]).await).contains("Second."));
        assert!(blocked(&hooks.stop(Some("Done."), &[]).await).contains("Third."));
        silent(&hooks.stop(Some("Done."), &[]).await);
        let answers: Vec<(String, TurnState, Value)> = answers(c, &host)
            .await
            .into_iter()
            .map(|(turn, answer)| (turn.text, turn.state, answer))
            .collect();
        assert_eq!(
            answers,
            [
                ("First.".into(), TurnState::Completed, json!("Done.")),
                ("Second.".into(), TurnState::Completed, json!("Done.")),
                ("Third.".into(), TurnState::Completed, json!("Done.")),
            ],
            "{agent:?}"
        );
    }
}

#[tokio::test]
async fn stop_with_wait_seconds_parks_and_wakes_on_an_enqueue() {
    let broker = TestBroker::start().await;
    let host = bound_host(&broker.client).await;
    let hooks = Agents::new(&broker, &host, Agent::Codex);
    let started = Instant::now();
    let parked = hooks.stop(Some("Done."), &["--wait-seconds", "20"]);
    let sender = async {
        tokio::time::sleep(Duration::from_millis(700)).await;
        enqueue(&broker.client, &host, "One more thing.").await
    };
    let (run, _) = tokio::join!(parked, sender);
    assert!(blocked(&run).contains("One more thing."));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(700) && took < Duration::from_secs(10),
        "{took:?}"
    );
    let nothing = hooks
        .stop(Some("Done too."), &["--wait-seconds", "1"])
        .await;
    silent(&nothing);
    assert!(nothing.took >= Duration::from_secs(1), "{nothing:?}");
}

#[tokio::test]
async fn session_end_hands_back_an_unanswered_turn_which_a_resumed_session_gets_again() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let hooks = Agents::new(&broker, &host, Agent::ClaudeCode);
    let sent = enqueue(c, &host, "Deploy the fix.").await;
    assert!(blocked(&hooks.stop(None, &[]).await).contains("Deploy the fix."));
    let ended = hooks
        .run(
            "session-end",
            "SessionEnd",
            json!({"reason": "prompt_input_exit"}),
            &[],
        )
        .await;
    silent(&ended);
    assert!(ended.took < Duration::from_secs(1), "{ended:?}");
    let turn = c.turn(host.session_id(), &sent.turn_id).await.unwrap().body;
    assert_eq!(turn.state, TurnState::Queued);
    assert_eq!(
        c.session(host.session_id()).await.unwrap().body.agent.state,
        AgentState::Away
    );

    let resumed = hooks
        .run(
            "session-start",
            "SessionStart",
            json!({"source": "resume"}),
            &[],
        )
        .await;
    silent(&resumed);
    assert!(blocked(&hooks.stop(Some("Back."), &[]).await).contains("Deploy the fix."));
    silent(&hooks.stop(Some("Deployed."), &[]).await);
    let turn = c.turn(host.session_id(), &sent.turn_id).await.unwrap().body;
    assert_eq!(turn.response.unwrap()["message"], "Deployed.");
}

#[tokio::test]
async fn permission_requests_print_the_verdict_from_the_web_page_and_lark() {
    let (_fake, broker, events, host, chat) = linked(&[ANN]).await;
    let c = &broker.client;
    let sid = host.session_id();
    let pending = || async {
        loop {
            let list = c
                .permissions(
                    sid,
                    &ListPermissions {
                        state: Some(PermissionState::Pending),
                    },
                )
                .await
                .unwrap()
                .body
                .permission_requests;
            if let Some(request) = list.first() {
                return request.clone();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    for (agent, answer) in [
        (Agent::ClaudeCode, "allow"),
        (Agent::Codex, "deny"),
        (Agent::Codex, "lark"),
    ] {
        let hooks = Agents::new(&broker, &host, agent);
        let secret = unique("rm -rf /srv/secret-preview");
        let asked = hooks.ask(json!({"command": secret, "description": "Clean up"}), &[]);
        let answering = async {
            let request = pending().await;
            assert_eq!(request.request_id.len(), 5);
            assert!(
                request
                    .request_id
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() && b != b'l')
            );
            assert_eq!(request.description, "Clean up");
            assert_eq!(request.tool_name, "Bash");
            assert_eq!(
                request.input_preview,
                json!({"command": secret, "description": "Clean up"}).to_string()
            );
            let id = request.request_id;
            match answer {
                "allow" => drop(
                    c.answer_permission(sid, &id, Behavior::Allow)
                        .await
                        .unwrap(),
                ),
                "deny" => drop(c.answer_permission(sid, &id, Behavior::Deny).await.unwrap()),
                _ => acked(&events, &said(&events, &chat, ANN, &format!("no {id}"))).await,
            }
        };
        let (run, _) = tokio::join!(asked, answering);
        assert_eq!(run.code, 0, "{run:?}");
        assert!(!run.stderr.contains(&secret), "the preview is never logged");
        let out: Value = serde_json::from_str(&run.stdout).unwrap();
        let expected = match answer {
            "allow" => json!({"behavior": "allow"}),
            "deny" => {
                json!({"behavior": "deny", "message": "A person denied this on the LoopX Web page."})
            }
            _ => json!({"behavior": "deny", "message": "A person denied this in Lark."}),
        };
        assert_eq!(
            out,
            json!({"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": expected}})
        );
    }
}

#[tokio::test]
async fn an_unanswered_permission_request_prints_nothing_and_expires() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let hooks = Agents::new(&broker, &host, Agent::ClaudeCode);
    let secret = unique("cat /etc/secret-preview");
    let run = hooks
        .ask(json!({"command": secret}), &["--wait-seconds", "1"])
        .await;
    silent(&run);
    assert!(!run.stderr.contains(&secret), "{run:?}");
    assert_eq!(run.stderr.lines().count(), 1, "{run:?}");
    let all = c
        .permissions(host.session_id(), &ListPermissions::default())
        .await
        .unwrap()
        .body
        .permission_requests;
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].state, PermissionState::Expired);
    assert_eq!(all[0].description, "Bash");
}

#[tokio::test]
async fn presence_follows_the_hooks_in_order_on_the_projection_and_the_stream() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let mut events = subscribe(&broker.url, TOKEN, host.session_id(), None).await;
    let hooks = Agents::new(&broker, &host, Agent::Codex);
    let starts = [
        (
            "session-start",
            "SessionStart",
            json!({"source": "startup"}),
            AgentState::Waiting,
        ),
        (
            "user-prompt-submit",
            "UserPromptSubmit",
            json!({"prompt": "hi"}),
            AgentState::Working,
        ),
    ];
    for (event, name, fields, state) in starts {
        silent(&hooks.run(event, name, fields, &[]).await);
        let session = c.session(host.session_id()).await.unwrap().body;
        assert_eq!(session.agent.state, state);
    }
    silent(&hooks.stop(Some("Hello."), &[]).await);
    silent(
        &hooks
            .run("session-end", "SessionEnd", json!({"reason": "other"}), &[])
            .await,
    );
    let seen = take(&mut events, 6).await;
    assert_eq!(
        states(&seen),
        [
            "agent:waiting",
            "turn:claimed",
            "agent:working",
            "turn:completed",
            "agent:waiting",
            "agent:away"
        ],
        "the prompt typed at the terminal is a turn, answered by stop"
    );
    let session = c.session(host.session_id()).await.unwrap().body;
    assert_eq!(session.agent.state, AgentState::Away);
    assert_eq!(seen[5].2["since"], session.agent.since.as_str());
}

#[tokio::test]
async fn bind_mode_registers_and_binds_the_agents_session_once() {
    let broker = TestBroker::start().await;
    let (goal, agent) = (unique("goal"), unique("agent"));
    let host_session = unique("claude-session");
    let args = [
        "session-start",
        "--agent",
        "claude-code",
        "--goal-id",
        &goal,
        "--agent-id",
        &agent,
        "--executor-endpoint-id",
        "exec-laptop",
    ];
    let input =
        Agent::ClaudeCode.input(&host_session, "SessionStart", json!({"source": "startup"}));
    silent(&hook(&broker.url, &args, &input).await);
    silent(&hook(&broker.url, &args, &input).await);
    let filter = loopx::model::ListSessions {
        goal_id: Some(goal.clone()),
        ..Default::default()
    };
    let sessions = broker.client.sessions(&filter).await.unwrap().body.sessions;
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0].host_surface, "claude-code");
    assert_eq!(sessions[0].agent.state, AgentState::Waiting);
}

#[tokio::test]
async fn the_agent_never_fails_broker_down_garbage_stdin_or_a_closed_session() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let hooks = Agents::new(&broker, &host, Agent::ClaudeCode);
    let down = format!("http://127.0.0.1:{}", free_port());
    let stdin = Agent::Codex.input("h", "Stop", json!({"stop_hook_active": false}));
    for event in ["stop", "permission-request", "session-start", "session-end"] {
        let args = ["--agent", "codex", "--session-id", "ses_x"];
        let run = hook(
            &down,
            &[&[event][..], &args].concat(),
            &stdin.replace("Stop", "X"),
        )
        .await;
        silent(&run);
        let name = match event {
            "stop" => "Stop",
            "permission-request" => "PermissionRequest",
            "session-start" => "SessionStart",
            _ => "SessionEnd",
        };
        let input = stdin.replace("\"Stop\"", &format!("\"{name}\""));
        let input = input.replace("}", ",\"tool_name\":\"Bash\",\"tool_input\":{}}");
        let run = hook(&down, &[&[event][..], &args].concat(), &input).await;
        silent(&run);
        assert_eq!(run.stderr.lines().count(), 1, "{run:?}");
        assert!(run.stderr.contains("unreachable"), "{run:?}");
        assert!(run.took < Duration::from_secs(5), "{run:?}");
    }
    for garbage in ["", "not json", "[]", "{\"hook_event_name\":\"Stop\"}"] {
        let run = hook(
            &broker.url,
            &[
                "stop",
                "--agent",
                "claude-code",
                "--session-id",
                host.session_id(),
            ],
            garbage,
        )
        .await;
        silent(&run);
        assert_eq!(run.stderr.lines().count(), 1, "{run:?}");
    }
    enqueue(c, &host, "never delivered").await;
    c.close(host.session_id()).await.unwrap();
    for run in [
        hooks.stop(Some("x"), &[]).await,
        hooks
            .ask(json!({"command": "ls"}), &["--wait-seconds", "1"])
            .await,
        hooks
            .run("session-end", "SessionEnd", json!({"reason": "other"}), &[])
            .await,
    ] {
        silent(&run);
        assert!(run.stderr.contains("session_closed"), "{run:?}");
        assert!(run.took < Duration::from_secs(5), "{run:?}");
    }
}

/// No hook holds the agent: not an agent that never closes the hook's stdin
/// (every event gives up within its budget, `session-end` within 1 s), not a
/// broker that accepts and never answers (each request within 5 s, a
/// claim's included).
#[tokio::test]
async fn a_hook_never_holds_the_agent_open_stdin_or_a_silent_broker() {
    let broker = TestBroker::start().await;
    let host = bound_host(&broker.client).await;
    let events = [
        ("stop", "Stop", 7.0),
        ("permission-request", "PermissionRequest", 7.0),
        ("session-start", "SessionStart", 7.0),
        ("user-prompt-submit", "UserPromptSubmit", 7.0),
        ("notification", "Notification", 7.0),
        ("session-end", "SessionEnd", 1.5),
    ];
    let args = |event| {
        [
            event,
            "--agent",
            "claude-code",
            "--session-id",
            host.session_id(),
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let open = events.map(|(event, name, _)| {
        let stdin = Agent::ClaudeCode.input(&host.host_session_id, name, json!({}));
        let args = args(event);
        let url = broker.url.clone();
        tokio::spawn(async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            hook_with(&url, &args, &stdin, false).await
        })
    });
    for ((event, _, budget), run) in events.iter().zip(open) {
        let run = run.await.unwrap();
        silent(&run);
        assert!(run.stderr.contains("stdin did not end"), "{event}: {run:?}");
        assert!(run.took.as_secs_f64() < *budget, "{event}: {run:?}");
    }

    // A listener that accepts every connection and never answers.
    let silent_broker = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", silent_broker.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut sockets = Vec::new();
        while let Ok((socket, _)) = silent_broker.accept().await {
            sockets.push(socket);
        }
    });
    for (event, name, budget) in [("stop", "Stop", 7.0), ("session-end", "SessionEnd", 1.5)] {
        let stdin = Agent::ClaudeCode.input(&host.host_session_id, name, json!({}));
        let args = args(event);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = hook(&url, &args, &stdin).await;
        silent(&run);
        assert!(run.took.as_secs_f64() < budget, "{event}: {run:?}");
    }
    held.abort();
}

#[tokio::test]
async fn install_merges_the_hooks_once_and_keeps_what_is_there() {
    let dir = tempfile::tempdir().unwrap();
    let claude = dir.path().join(".claude/settings.local.json");
    std::fs::create_dir_all(claude.parent().unwrap()).unwrap();
    let mine = json!({
        "permissions": {"allow": ["Bash(ls:*)"]},
        "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "notify-send done"}]}]},
    });
    std::fs::write(&claude, mine.to_string()).unwrap();
    let install = |agent: &'static str| {
        let dir = dir.path().to_owned();
        async move {
            let output = loopx()
                .args(["hook", "install", "--agent", agent, "--scope", "project"])
                .args(["--goal-id", "g-1", "--agent-id", "agent-7"])
                .args(["--executor-endpoint-id", "exec-laptop"])
                .arg("--project-dir")
                .arg(&dir)
                .env("HOME", &dir)
                .output()
                .await
                .unwrap();
            assert_eq!(output.status.code(), Some(0), "{output:?}");
            String::from_utf8(output.stdout).unwrap()
        }
    };
    let said = install("claude-code").await;
    assert!(
        said.contains("Stop: added") && said.contains("PermissionRequest: added"),
        "{said}"
    );
    let settings: Value = serde_json::from_str(&std::fs::read_to_string(&claude).unwrap()).unwrap();
    assert_eq!(settings["permissions"], mine["permissions"]);
    let stop = settings["hooks"]["Stop"].as_array().unwrap();
    assert_eq!(stop.len(), 2);
    assert_eq!(stop[0], mine["hooks"]["Stop"][0]);
    let command = stop[1]["hooks"][0]["command"].as_str().unwrap();
    assert!(
        command.starts_with('/')
            && command.contains(" hook stop --agent claude-code --goal-id g-1 --agent-id agent-7"),
        "{command}"
    );
    assert_eq!(stop[1]["hooks"][0]["timeout"], 60);
    assert_eq!(settings["hooks"]["PermissionRequest"][0]["matcher"], "*");
    let again = install("claude-code").await;
    assert!(
        again.contains("Stop: unchanged") && !again.contains("added"),
        "{again}"
    );
    assert_eq!(
        std::fs::read_to_string(&claude).unwrap(),
        serde_json::to_string_pretty(&settings).unwrap() + "\n"
    );

    let codex = dir.path().join(".codex/config.toml");
    std::fs::create_dir_all(codex.parent().unwrap()).unwrap();
    std::fs::write(&codex, "model = \"gpt-5-codex\" # mine\n").unwrap();
    let said = install("codex").await;
    // Without --trust: the command with --trust, and the manual way.
    let project = dir.path().canonicalize().unwrap();
    assert!(
        said.contains(" --trust\n")
            && said.contains(&format!("[projects.\"{}\"]", project.display()))
            && said.contains("/hooks"),
        "{said}"
    );
    let text = std::fs::read_to_string(&codex).unwrap();
    assert!(
        text.starts_with("model = \"gpt-5-codex\" # mine\n"),
        "{text}"
    );
    assert_eq!(text.matches("[[hooks.Stop]]").count(), 1, "{text}");
    assert!(!text.contains("Notification"), "{text}");
    install("codex").await;
    assert_eq!(std::fs::read_to_string(&codex).unwrap(), text);
}

/// A newcomer's first try: hooks installed for a session bound as in the
/// curl walk-through (docs/http-api.md). Install refuses a session the
/// hooks cannot attach to and says what to do; a hook refused at run time
/// shows in `loopx hook doctor` until a hook works again.
#[tokio::test]
async fn install_refuses_a_session_hooks_cannot_attach_to_and_doctor_shows_refusals() {
    let broker = TestBroker::start().await;
    let host = bound_host(&broker.client).await; // a codex-cli host, as in the walk-through
    let dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let run = |args: Vec<String>, stdin: Option<String>| {
        let (url, dir, data) = (
            broker.url.clone(),
            dir.path().to_owned(),
            data.path().to_owned(),
        );
        async move {
            let mut command = loopx();
            command.args(&args);
            if args[1] != "doctor" {
                command.args(["--broker-url", &url]);
            }
            if args[1] == "install" || args[1] == "doctor" {
                command.arg("--project-dir").arg(&dir);
            }
            command.env("HOME", &dir).env("LOOPX_DATA_DIR", &data);
            let run = spawn(command, &stdin.unwrap_or_default(), true).await;
            (run.code, run.stdout, run.stderr)
        }
    };
    let words = |line: &str| line.split(' ').map(str::to_owned).collect::<Vec<_>>();
    let install = |agent: &str| {
        words(&format!(
            "hook install --agent {agent} --session-id {}",
            host.session_id()
        ))
    };
    let (code, _, err) = run(install("claude-code"), None).await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("host_mismatch") && err.contains("--goal-id"),
        "{err}"
    );
    assert!(!dir.path().join(".claude").exists(), "nothing written");

    let (code, out, err) = run(install("codex"), None).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("answers only the host session it was bound to"),
        "{out}"
    );
    let doctor = words("hook doctor --agent codex");
    let (code, out, _) = run(doctor.clone(), None).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("ok: the broker at") && out.contains("is open"),
        "{out}"
    );

    // Codex runs the hooks as its own session: refused, and doctor says so.
    let stop = |host_session_id: &str| {
        let fields = json!({"stop_hook_active": false, "cwd": dir.path()});
        Agent::Codex.input(host_session_id, "Stop", fields)
    };
    let hook = words(&format!(
        "hook stop --agent codex --session-id {}",
        host.session_id()
    ));
    let refused = run(hook.clone(), Some(stop("codex-thread-1"))).await;
    assert_eq!((refused.0, refused.1.as_str()), (0, ""), "{refused:?}");
    let (code, out, _) = run(doctor.clone(), None).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("problem: a hook failed") && out.contains("host_mismatch"),
        "{out}"
    );
    assert!(!out.contains("codex-thread-1"), "no host session id: {out}");

    // A hook that works clears them.
    let worked = run(hook, Some(stop(&host.host_session_id))).await;
    assert_eq!(worked.0, 0, "{worked:?}");
    let (code, out, _) = run(doctor, None).await;
    assert_eq!(code, 0, "{out}");
}

/// PreToolUse / PostToolUse: the session's agent names the tool it runs,
/// by name only (never its input), and not once it ended.
#[tokio::test]
async fn the_tool_the_agent_runs_is_shown_by_name_only() {
    for agent in [Agent::ClaudeCode, Agent::Codex] {
        let broker = TestBroker::start().await;
        let c = &broker.client;
        let host = bound_host(c).await;
        let hooks = Agents::new(&broker, &host, agent);
        silent(
            &hooks
                .run(
                    "user-prompt-submit",
                    "UserPromptSubmit",
                    json!({"prompt": "go"}),
                    &[],
                )
                .await,
        );
        let input = json!({"tool_name": "Bash", "tool_input": {"command": "sleep 3 # secret-ish"}});
        silent(
            &hooks
                .run("pre-tool-use", "PreToolUse", input.clone(), &[])
                .await,
        );
        let reply = c.session(host.session_id()).await.unwrap();
        let agent_now = &reply.body.agent;
        assert_eq!(
            (agent_now.state, agent_now.tool.as_deref()),
            (AgentState::Working, Some("Bash"))
        );
        assert!(agent_now.tool_since.is_some());
        assert!(
            !reply.reply.text.contains("sleep 3"),
            "no tool input: {}",
            reply.reply.text
        );
        tokio::time::sleep(Duration::from_millis(2100)).await;
        let mut ended = input;
        ended["tool_response"] = json!({"stdout": ""});
        silent(&hooks.run("post-tool-use", "PostToolUse", ended, &[]).await);
        let after = c.session(host.session_id()).await.unwrap().body.agent;
        assert_eq!(
            (after.state, after.tool),
            (AgentState::Working, None),
            "{agent:?}"
        );
    }
}

#[tokio::test]
async fn claude_codes_notifications_are_session_events_without_their_text() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let mut events = subscribe(&broker.url, TOKEN, host.session_id(), None).await;
    let hooks = Agents::new(&broker, &host, Agent::ClaudeCode);
    let secret = unique("Claude needs your permission to use the secret tool");
    for kind in ["permission_prompt", "idle_prompt", "auth_success"] {
        let fields = json!({"message": secret, "title": "Claude Code", "notification_type": kind});
        let run = hooks.run("notification", "Notification", fields, &[]).await;
        silent(&run);
        assert!(!run.stderr.contains(&secret), "{run:?}");
    }
    assert_eq!(
        states(&take(&mut events, 3).await),
        [
            "notification:permission_prompt",
            "notification:idle_prompt",
            "agent:waiting"
        ]
    );
}

/// A prompt typed at the terminal is a turn of the conversation, in its
/// place: recorded by UserPromptSubmit, answered by Stop, never queued or
/// claimed, so a Web message sent meanwhile is still delivered at that Stop;
/// an interrupted prompt (the next one came first) ends unanswered.
#[tokio::test]
async fn prompts_typed_at_the_terminal_are_turns_answered_by_stop_in_order() {
    for agent in [Agent::ClaudeCode, Agent::Codex] {
        let broker = TestBroker::start().await;
        let c = &broker.client;
        let host = bound_host(c).await;
        let hooks = Agents::new(&broker, &host, agent);
        let prompt = |text: &str| json!({ "prompt": text });
        let typed = |text: &'static str| {
            let fields = prompt(text);
            let hooks = &hooks;
            async move {
                silent(
                    &hooks
                        .run("user-prompt-submit", "UserPromptSubmit", fields, &[])
                        .await,
                )
            }
        };
        typed("Run the tests.").await;
        typed("Fix the build first.").await;
        enqueue(c, &host, "And update the docs.").await;
        let delivered = blocked(&hooks.stop(Some("The build is fixed."), &[]).await);
        assert!(delivered.contains("And update the docs."), "{delivered}");
        silent(&hooks.stop(Some("The docs are updated."), &[]).await);
        let transcript: Vec<_> = answers(c, &host)
            .await
            .into_iter()
            .map(|(turn, answer)| {
                let origin = serde_json::to_value(turn.origin).unwrap();
                (turn.seq, origin, turn.text, turn.state, answer)
            })
            .collect();
        assert_eq!(
            transcript,
            [
                (
                    1,
                    json!("terminal"),
                    "Run the tests.".into(),
                    TurnState::Cancelled,
                    Value::Null
                ),
                (
                    2,
                    json!("terminal"),
                    "Fix the build first.".into(),
                    TurnState::Completed,
                    json!("The build is fixed.")
                ),
                (
                    3,
                    json!("web"),
                    "And update the docs.".into(),
                    TurnState::Completed,
                    json!("The docs are updated.")
                ),
            ],
            "{agent:?}"
        );
        let first = all_turns(c, &host).await.remove(0);
        assert_eq!(
            serde_json::to_value(first.cancel_reason).unwrap(),
            json!("unanswered")
        );
    }
}
