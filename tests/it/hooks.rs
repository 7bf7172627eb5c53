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
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
    took: Duration,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Agent {
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
    let started = Instant::now();
    let mut child = loopx()
        .arg("hook")
        .args(args)
        .args(["--broker-url", url])
        .env("LOOPX_TOKEN", TOKEN)
        .env_remove("LOOPX_SESSION_ID")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    let output = child.wait_with_output().await.unwrap();
    Run {
        code: output.status.code().expect("exits, not killed"),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
        took: started.elapsed(),
    }
}

/// One agent's hooks on one bound session.
struct Agents<'a> {
    broker: &'a TestBroker,
    host: &'a Host,
    agent: Agent,
}

impl Agents<'_> {
    async fn run(&self, event: &str, name: &str, fields: Value, extra: &[&str]) -> Run {
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

    async fn stop(&self, last: Option<&str>, extra: &[&str]) -> Run {
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

fn silent(run: &Run) {
    assert_eq!((run.code, run.stdout.as_str()), (0, ""), "{run:?}");
}

#[tokio::test]
async fn stop_delivers_web_and_lark_messages_in_order_each_answered_once() {
    for agent in [Agent::ClaudeCode, Agent::Codex] {
        let (_fake, broker, events, host, chat) = linked(&[ANN]).await;
        let c = &broker.client;
        let hooks = Agents {
            broker: &broker,
            host: &host,
            agent,
        };
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
        assert_eq!(blocked(&hooks.stop(Some("Ready."), &[]).await), first);

        let second = blocked(&hooks.stop(Some("The test times out."), &[]).await);
        assert!(second.contains("And list the flaky ones."), "{second}");
        assert!(second.contains("in Lark"), "{second}");
        let answered = c.turn(host.session_id(), &web.turn_id).await.unwrap().body;
        assert_eq!(answered.state, TurnState::Completed);
        assert_eq!(answered.response.unwrap()["message"], "The test times out.");

        silent(&hooks.stop(Some("Two are flaky."), &[]).await);
        // Repeated: the completion replays, nothing doubles.
        silent(&hooks.stop(Some("Two are flaky."), &[]).await);
        let turns = c
            .turns(host.session_id(), &Default::default())
            .await
            .unwrap()
            .body
            .turns;
        let answers: Vec<(i64, TurnState, Value)> = turns
            .iter()
            .map(|t| {
                (
                    t.seq,
                    t.state,
                    t.response.clone().unwrap_or_default()["message"].clone(),
                )
            })
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

#[tokio::test]
async fn stop_with_wait_seconds_parks_and_wakes_on_an_enqueue() {
    let broker = TestBroker::start().await;
    let host = bound_host(&broker.client).await;
    let hooks = Agents {
        broker: &broker,
        host: &host,
        agent: Agent::Codex,
    };
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
    let hooks = Agents {
        broker: &broker,
        host: &host,
        agent: Agent::ClaudeCode,
    };
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
        let hooks = Agents {
            broker: &broker,
            host: &host,
            agent,
        };
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
    let hooks = Agents {
        broker: &broker,
        host: &host,
        agent: Agent::ClaudeCode,
    };
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
    let hooks = Agents {
        broker: &broker,
        host: &host,
        agent: Agent::Codex,
    };
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
    let seen = take(&mut events, 4).await;
    assert_eq!(
        states(&seen),
        [
            "agent:waiting",
            "agent:working",
            "agent:waiting",
            "agent:away"
        ]
    );
    let session = c.session(host.session_id()).await.unwrap().body;
    assert_eq!(session.agent.state, AgentState::Away);
    assert_eq!(seen[3].2["since"], session.agent.since.as_str());
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
    let hooks = Agents {
        broker: &broker,
        host: &host,
        agent: Agent::ClaudeCode,
    };
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
                .args(["--session-id", "ses_01JD8X5Z2R9V6Q3K4M7N8P0A1B"])
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
            && command.contains(" hook stop --agent claude-code --session-id ses_"),
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

#[tokio::test]
async fn claude_codes_notifications_are_session_events_without_their_text() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let mut events = subscribe(&broker.url, TOKEN, host.session_id(), None).await;
    let hooks = Agents {
        broker: &broker,
        host: &host,
        agent: Agent::ClaudeCode,
    };
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
