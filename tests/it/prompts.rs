//! Everything the agent asks, answered from the phone (issue 54, HOOKS.md
//! "Every blocking prompt"): questions with options, plans, "always allow"
//! suggestions, through the HTTP contract and through `loopx hook` with the
//! agents' own stdin shapes; and a prompt answered at the terminal first.

use std::time::{Duration, Instant};

use loopx::model::{
    AnswerPermission, AnsweredVia, Behavior, CreatePermissionRequest, ListPermissions,
    PermissionKind, PermissionRequest, PermissionState, PlanMode, Question, QuestionOption,
};
use serde_json::{Value, json};

use crate::hooks::{Agent, Agents, Run};
use crate::permissions::request;
use crate::support::*;

fn question(text: &str, multi: bool, labels: &[&str]) -> Question {
    Question {
        question: text.into(),
        header: "Pick".into(),
        multi_select: multi,
        options: labels
            .iter()
            .map(|l| QuestionOption {
                label: (*l).into(),
                description: format!("{l}, described"),
            })
            .collect(),
    }
}

fn answers(pairs: &[(&str, &str)]) -> AnswerPermission {
    AnswerPermission {
        answers: Some(
            pairs
                .iter()
                .map(|(q, a)| ((*q).to_owned(), (*a).to_owned()))
                .collect(),
        ),
        ..AnswerPermission::plain(Behavior::Allow)
    }
}

fn refused(
    result: Result<loopx::client::TypedReply<PermissionRequest>, loopx::client::ClientError>,
) -> (u16, String) {
    match result {
        Err(loopx::client::ClientError::Refused { reply, error }) => {
            (reply.status.as_u16(), loopx::model::wire(&error.error.code))
        }
        other => panic!("not refused: {other:?}"),
    }
}

#[tokio::test]
async fn a_question_is_allowed_only_with_an_answer_for_each_question() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let sid = host.session_id();
    let db = "Which database?";
    let parts = "Which parts?";
    let asked = CreatePermissionRequest {
        kind: PermissionKind::Question,
        questions: Some(vec![
            question(db, false, &["PostgreSQL", "SQLite"]),
            question(parts, true, &["API", "Web", "Lark"]),
        ]),
        ..request(&host, "quest", "")
    };
    let created = c.create_permission(sid, &asked).await.unwrap().body;
    assert_eq!(created.kind, PermissionKind::Question);
    assert_eq!(
        created.questions.as_ref().unwrap()[1].options[2].label,
        "Lark"
    );
    assert!(created.questions.as_ref().unwrap()[1].multi_select);

    for bad in [
        AnswerPermission::plain(Behavior::Allow),
        answers(&[(db, "PostgreSQL")]),
        answers(&[(db, "PostgreSQL"), (parts, "API"), ("Another?", "x")]),
        answers(&[(db, "PostgreSQL"), (parts, "  ")]),
        AnswerPermission {
            suggestion: Some(0),
            ..answers(&[(db, "PostgreSQL"), (parts, "API")])
        },
        AnswerPermission {
            mode: Some(PlanMode::AcceptEdits),
            ..answers(&[(db, "PostgreSQL"), (parts, "API")])
        },
    ] {
        let (status, code) = refused(c.answer_permission_with(sid, "quest", &bad).await);
        assert_eq!((status, code.as_str()), (422, "invalid_request"), "{bad:?}");
    }
    let still = c.permission(sid, "quest").await.unwrap().body;
    assert_eq!(
        still.state,
        PermissionState::Pending,
        "a refusal changes nothing"
    );

    let good = answers(&[(db, "My own words: DuckDB"), (parts, "API, Web")]);
    let answered = c.answer_permission_with(sid, "quest", &good).await.unwrap();
    assert!(!answered.reply.replayed);
    assert_eq!(answered.body.state, PermissionState::Allowed);
    let chosen = answered.body.answer.unwrap().answers.unwrap();
    assert_eq!(chosen[parts], "API, Web");
    let again = c.answer_permission_with(sid, "quest", &good).await.unwrap();
    assert!(again.reply.replayed, "the same answer again is a replay");
    let other = answers(&[(db, "SQLite"), (parts, "Lark")]);
    let (status, code) = refused(c.answer_permission_with(sid, "quest", &other).await);
    assert_eq!(
        (status, code.as_str()),
        (409, "permission_already_answered")
    );

    // Each kind carries its own fields only, within its limits.
    for bad in [
        CreatePermissionRequest {
            questions: Some(vec![question(db, false, &["a", "b"])]),
            ..request(&host, "bad01", "")
        },
        CreatePermissionRequest {
            kind: PermissionKind::Question,
            questions: Some(
                (0..5)
                    .map(|n| question(&format!("Q{n}?"), false, &["a"]))
                    .collect(),
            ),
            ..request(&host, "bad02", "")
        },
        CreatePermissionRequest {
            kind: PermissionKind::Question,
            ..request(&host, "bad03", "")
        },
        CreatePermissionRequest {
            kind: PermissionKind::Plan,
            plan: Some("   ".into()),
            ..request(&host, "bad04", "")
        },
    ] {
        let (status, code) = refused(c.create_permission(sid, &bad).await);
        assert_eq!((status, code.as_str()), (400, "invalid_request"), "{bad:?}");
    }
}

/// The pending request of the session, once there is one.
async fn pending(c: &loopx::client::Client, sid: &str) -> PermissionRequest {
    let started = Instant::now();
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
        if let Some(request) = list.into_iter().next() {
            return request;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "no request");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The decision a PermissionRequest hook printed.
fn decision(run: &Run) -> Value {
    assert_eq!(run.code, 0, "{run:?}");
    let out: Value = serde_json::from_str(run.stdout.trim()).unwrap_or_else(|_| panic!("{run:?}"));
    assert_eq!(
        out["hookSpecificOutput"]["hookEventName"],
        "PermissionRequest"
    );
    out["hookSpecificOutput"]["decision"].clone()
}

#[tokio::test]
async fn the_agent_gets_exactly_the_answers_the_plan_verdict_and_the_suggestion() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let sid = host.session_id();
    let hooks = Agents::new(&broker, &host, Agent::ClaudeCode);

    // A question, as Claude Code sends AskUserQuestion.
    let sent = json!([
        {"question": "Which database?", "header": "DB", "multiSelect": false,
         "options": [{"label": "PostgreSQL", "description": "a server"}, {"label": "SQLite", "description": "a file"}]},
        {"question": "Which parts?", "header": "Parts", "multiSelect": true,
         "options": [{"label": "API", "description": ""}, {"label": "Web", "description": ""}]}
    ]);
    let fields = json!({"tool_name": "AskUserQuestion", "tool_input": {"questions": sent}});
    let asked = hooks.run("permission-request", "PermissionRequest", fields, &[]);
    let answering = async {
        let request = pending(c, sid).await;
        assert_eq!(request.kind, PermissionKind::Question);
        let questions = request.questions.unwrap();
        assert_eq!(questions[0].options[1].label, "SQLite");
        assert!(questions[1].multi_select);
        let chosen = answers(&[
            ("Which database?", "PostgreSQL"),
            ("Which parts?", "API, Web"),
        ]);
        c.answer_permission_with(sid, &request.request_id, &chosen)
            .await
            .unwrap();
    };
    let (run, ()) = tokio::join!(asked, answering);
    assert_eq!(
        decision(&run),
        json!({"behavior": "allow", "updatedInput": {"questions": sent,
               "answers": {"Which database?": "PostgreSQL", "Which parts?": "API, Web"}}})
    );

    // A plan, from the file it names; approved with edits accepted, then
    // sent back with feedback.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plan.md");
    std::fs::write(&file, "# The plan\n\n1. Read\n2. Write").unwrap();
    for (behavior, expected) in [
        (
            Behavior::Allow,
            json!({"behavior": "allow", "updatedPermissions": [
            {"type": "setMode", "mode": "acceptEdits", "destination": "session"}]}),
        ),
        (
            Behavior::Deny,
            json!({"behavior": "deny", "message": "Split step 2 first."}),
        ),
    ] {
        let fields = json!({"tool_name": "ExitPlanMode", "tool_input": {"planFilePath": file}});
        let asked = hooks.run("permission-request", "PermissionRequest", fields, &[]);
        let answering = async {
            let request = pending(c, sid).await;
            assert_eq!(request.kind, PermissionKind::Plan);
            assert_eq!(
                request.plan.as_deref(),
                Some("# The plan\n\n1. Read\n2. Write")
            );
            let answer = match behavior {
                Behavior::Allow => AnswerPermission {
                    mode: Some(PlanMode::AcceptEdits),
                    ..AnswerPermission::plain(Behavior::Allow)
                },
                Behavior::Deny => AnswerPermission {
                    message: Some("Split step 2 first.".into()),
                    ..AnswerPermission::plain(Behavior::Deny)
                },
            };
            c.answer_permission_with(sid, &request.request_id, &answer)
                .await
                .unwrap();
        };
        let (run, ()) = tokio::join!(asked, answering);
        assert_eq!(decision(&run), expected);
    }

    // "Always allow": the chosen suggestion echoed back unchanged.
    let rule = json!({"type": "addRules", "rules": [{"toolName": "Bash", "ruleContent": "npm test"}],
                      "behavior": "allow", "destination": "localSettings"});
    let mode = json!({"type": "setMode", "mode": "acceptEdits", "destination": "session"});
    let fields = json!({"tool_name": "Bash", "tool_input": {"command": "npm test"},
                        "permission_suggestions": [mode, rule]});
    let asked = hooks.run("permission-request", "PermissionRequest", fields, &[]);
    let answering = async {
        let request = pending(c, sid).await;
        assert_eq!(request.kind, PermissionKind::Tool);
        assert_eq!(
            request.suggestions[1].label,
            "Always allow Bash(npm test) in this project (on this machine)"
        );
        let always = AnswerPermission {
            suggestion: Some(1),
            ..AnswerPermission::plain(Behavior::Allow)
        };
        c.answer_permission_with(sid, &request.request_id, &always)
            .await
            .unwrap();
    };
    let (run, ()) = tokio::join!(asked, answering);
    assert_eq!(
        decision(&run),
        json!({"behavior": "allow", "updatedPermissions": [rule]})
    );
}

#[tokio::test]
async fn outside_default_mode_a_question_is_asked_before_the_tool_runs_and_never_twice() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let sid = host.session_id();
    let hooks = Agents::new(&broker, &host, Agent::ClaudeCode);
    let sent = json!([{"question": "Ship it?", "header": "Ship", "multiSelect": false,
                       "options": [{"label": "Yes", "description": ""}, {"label": "No", "description": ""}]}]);
    // In `default` mode the PermissionRequest asks: PreToolUse asks nothing.
    let fields = json!({"tool_name": "AskUserQuestion", "tool_input": {"questions": sent}});
    let run = hooks
        .run("pre-tool-use", "PreToolUse", fields.clone(), &[])
        .await;
    assert_eq!((run.code, run.stdout.as_str()), (0, ""), "{run:?}");
    let none = c
        .permissions(sid, &ListPermissions::default())
        .await
        .unwrap()
        .body;
    assert!(none.permission_requests.is_empty());

    let mut accept = fields;
    accept["permission_mode"] = json!("acceptEdits");
    let asked = hooks.run("pre-tool-use", "PreToolUse", accept, &[]);
    let answering = async {
        let request = pending(c, sid).await;
        let chosen = answers(&[("Ship it?", "Yes")]);
        c.answer_permission_with(sid, &request.request_id, &chosen)
            .await
            .unwrap();
    };
    let (run, ()) = tokio::join!(asked, answering);
    let out: Value = serde_json::from_str(run.stdout.trim()).unwrap_or_else(|_| panic!("{run:?}"));
    assert_eq!(
        out,
        json!({"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "allow",
               "updatedInput": {"questions": sent, "answers": {"Ship it?": "Yes"}}}})
    );
}

/// The agent moved on while the phone's card was open: the request is
/// retired as answered at the terminal within moments, its hook prints
/// nothing, and a late answer from the phone is refused, never taken.
#[tokio::test]
async fn a_prompt_answered_at_the_terminal_first_is_retired_and_a_late_answer_refused() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let sid = host.session_id();
    let hooks = Agents::new(&broker, &host, Agent::ClaudeCode);
    let input = json!({"command": "cargo build", "description": "Build"});
    let fields = json!({"tool_name": "Bash", "tool_input": input});
    let asked = hooks.run(
        "permission-request",
        "PermissionRequest",
        fields.clone(),
        &[],
    );
    let terminal = async {
        let request = pending(c, sid).await;
        // The person allowed it at the terminal: the tool ran, PostToolUse.
        let started = Instant::now();
        hooks
            .run("post-tool-use", "PostToolUse", fields.clone(), &[])
            .await;
        let retired = c.permission(sid, &request.request_id).await.unwrap().body;
        assert!(started.elapsed() < Duration::from_secs(5));
        (request.request_id, retired)
    };
    let (run, (id, retired)) = tokio::join!(asked, terminal);
    assert_eq!(run.stdout, "", "{run:?}");
    assert_eq!(retired.state, PermissionState::Expired);
    assert_eq!(retired.answered_via, Some(AnsweredVia::Terminal));
    let (status, code) = refused(c.answer_permission(sid, &id, Behavior::Allow).await);
    assert_eq!(
        (status, code.as_str()),
        (409, "permission_already_answered")
    );

    // The agent ends the hook itself (its own prompt answered): the same.
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_loopx"));
    let stdin = json!({"session_id": host.host_session_id, "cwd": "/work/project",
                       "hook_event_name": "PermissionRequest", "permission_mode": "default",
                       "transcript_path": "/tmp/t.jsonl", "tool_name": "Bash",
                       "tool_input": {"command": "make"}});
    command
        .args([
            "hook",
            "permission-request",
            "--agent",
            "claude-code",
            "--session-id",
            sid,
        ])
        .args(["--host-surface", HOST_SURFACE, "--broker-url", &broker.url])
        .env("LOOPX_TOKEN", TOKEN)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    let mut child = command.spawn().unwrap();
    use tokio::io::AsyncWriteExt;
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.to_string().as_bytes()).await.unwrap();
    drop(input);
    let request = pending(c, sid).await;
    let pid = child.id().unwrap().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    child.wait().await.unwrap();
    let retired = c.permission(sid, &request.request_id).await.unwrap().body;
    assert_eq!(
        (retired.state, retired.answered_via),
        (PermissionState::Expired, Some(AnsweredVia::Terminal))
    );
}

/// While a request is pending, the session's agent is `asking` ("waiting
/// for you") in the projection and the list; answered, it is not; a host
/// cannot report `asking` itself.
#[tokio::test]
async fn the_agent_is_asking_while_a_request_is_pending() {
    use loopx::model::{AgentState, ListSessions, ReportAgentState};
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let other = bound_host(c).await;
    let sid = host.session_id();
    let report =
        |state: AgentState| ReportAgentState::of(HOST_SURFACE, &host.host_session_id, Some(state));
    c.report_agent(sid, &report(AgentState::Working))
        .await
        .unwrap();
    let shown = |id: String| async move {
        let one = c.session(&id).await.unwrap().body.agent.state;
        let list = c
            .sessions(&ListSessions::default())
            .await
            .unwrap()
            .body
            .sessions;
        let listed = list
            .iter()
            .find(|s| s.session_id == id)
            .unwrap()
            .agent
            .state;
        assert_eq!(one, listed, "the projection and the list agree");
        one
    };
    assert_eq!(shown(sid.to_owned()).await, AgentState::Working);
    c.create_permission(sid, &request(&host, "askme", "ls"))
        .await
        .unwrap();
    assert_eq!(shown(sid.to_owned()).await, AgentState::Asking);
    assert_ne!(
        shown(other.session_id().to_owned()).await,
        AgentState::Asking,
        "only the session that asks"
    );
    c.answer_permission(sid, "askme", Behavior::Allow)
        .await
        .unwrap();
    assert_eq!(shown(sid.to_owned()).await, AgentState::Working);
    let (status, code) = match c.report_agent(sid, &report(AgentState::Asking)).await {
        Err(loopx::client::ClientError::Refused { reply, error }) => {
            (reply.status.as_u16(), loopx::model::wire(&error.error.code))
        }
        other => panic!("taken: {other:?}"),
    };
    assert_eq!((status, code.as_str()), (400, "invalid_request"));
}
