//! Waking an idle agent (HOOKS.md "Waking an idle agent"): queued messages
//! typed into an agent idle at its prompt, in a real tmux server and under
//! the real `loopx run`, against a real broker. The agent here is
//! tests/wake/fake_agent.py (it runs the hooks as Claude Code does and reads
//! its terminal with bracketed paste); tests/wake/ runs the real Claude Code
//! and Codex TUIs the same way in CI.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use loopx::model::{Delivery, ListSessions, Turn, TurnState};

use crate::support::*;

/// A private tmux server with one pane running an interactive shell, as a
/// person's terminal; killed when dropped.
struct Tmux {
    dir: tempfile::TempDir,
    socket: PathBuf,
}

impl Tmux {
    fn start(env: &[(&str, &str)]) -> Tmux {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("tmux.sock");
        let mut command = Command::new("tmux");
        command.arg("-S").arg(&socket).args(["-f", "/dev/null"]);
        command.args(["new-session", "-d", "-x", "160", "-y", "40"]);
        for (key, value) in env {
            command.args(["-e", &format!("{key}={value}")]);
        }
        command.args(["-e", "PS1=shell$ ", "bash", "--norc", "--noprofile", "-i"]);
        let status = command
            .status()
            .expect("tmux is installed (.ci/run installs it)");
        assert!(status.success());
        Tmux { dir, socket }
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Types `text` literally, then Enter when asked: a person at the pane.
    fn type_in(&self, text: &str, enter: bool) {
        self.tmux(&["send-keys", "-t", "%0", "-l", text]);
        if enter {
            self.tmux(&["send-keys", "-t", "%0", "Enter"]);
        }
    }

    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-t", "%0", "-S", "-200"])
    }

    /// Waits for the shell's prompt on the last line: the agent is gone.
    async fn wait_shell(&self) {
        let started = Instant::now();
        loop {
            let screen = self.screen();
            let last = screen
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or_default();
            if last.trim_end().ends_with("shell$") {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "no shell prompt:\n{screen}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn wait_screen(&self, needle: &str) {
        let started = Instant::now();
        while !self.screen().contains(needle) {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "no {needle:?} on screen:\n{}",
                self.screen()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        self.tmux(&["kill-server"]);
    }
}

/// A broker, a tmux server whose hooks use a data dir of their own, and a
/// goal and prompts file for the agent.
struct Scene {
    broker: TestBroker,
    tmux: Tmux,
    prompts_file: PathBuf,
    goal: String,
    _data: tempfile::TempDir,
}

impl Scene {
    async fn start() -> Scene {
        let broker = TestBroker::start().await;
        let data = tempfile::tempdir().unwrap();
        let data_dir = data.path().display().to_string();
        let tmux = Tmux::start(&[("LOOPX_TOKEN", TOKEN), ("LOOPX_DATA_DIR", &data_dir)]);
        Scene {
            broker,
            prompts_file: tmux.dir.path().join("prompts"),
            tmux,
            goal: unique("goal"),
            _data: data,
        }
    }
}

/// The fake agent's command line, its prompts file, and its binding.
fn agent_command(broker: &TestBroker, prompts: &Path, goal: &str) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/wake/fake_agent.py");
    format!(
        "python3 {script} {} {} --goal-id {goal} --agent-id fake --executor-endpoint-id tmux --broker-url {}",
        env!("CARGO_BIN_EXE_loopx"),
        prompts.display(),
        broker.url
    )
}

/// `command` under `loopx run`.
fn under_run(broker: &TestBroker, command: &str) -> String {
    format!(
        "{} run --broker-url {} -- {command}",
        env!("CARGO_BIN_EXE_loopx"),
        broker.url
    )
}

/// The session the agent's first hook bound, once its agent waits.
async fn session_of(broker: &TestBroker, goal: &str) -> String {
    let filter = ListSessions {
        goal_id: Some(goal.to_owned()),
        ..Default::default()
    };
    let started = Instant::now();
    loop {
        let sessions = broker.client.sessions(&filter).await.unwrap().body.sessions;
        if let Some(session) = sessions.first()
            && session.agent.state == loopx::model::AgentState::Waiting
        {
            return session.session_id.clone();
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the agent never attached"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How the session's projection says a message sent now arrives.
async fn delivery(broker: &TestBroker, session_id: &str) -> Delivery {
    broker
        .client
        .session(session_id)
        .await
        .unwrap()
        .body
        .agent
        .delivery
}

async fn send(broker: &TestBroker, session_id: &str, text: &str) -> String {
    broker
        .client
        .enqueue(session_id, &web(text))
        .await
        .unwrap()
        .body
        .turn_id
}

/// Waits until every turn of `ids` is completed; their readbacks.
async fn answered(broker: &TestBroker, session_id: &str, ids: &[String]) -> Vec<Turn> {
    let started = Instant::now();
    loop {
        let mut turns = Vec::new();
        for id in ids {
            turns.push(broker.client.turn(session_id, id).await.unwrap().body);
        }
        if turns.iter().all(|t| t.state == TurnState::Completed) {
            return turns;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "not all answered: {turns:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// From enqueue to its claim by the typed prompt's hook, in ms.
fn latency(turn: &Turn) -> i64 {
    let at = |t: &str| {
        chrono::DateTime::parse_from_rfc3339(t)
            .unwrap()
            .timestamp_millis()
    };
    at(turn.claimed_at.as_deref().unwrap()) - at(&turn.enqueued_at)
}

fn prompts(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// The waker processes running for this tmux server: the wakers, or their
/// typists.
fn waker_pids(tmux: &Tmux, typists: bool) -> Vec<String> {
    let socket = tmux.socket.display().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let cmdline = String::from_utf8_lossy(&std::fs::read(path.join("cmdline")).ok()?)
                .replace('\0', " ");
            let ours = cmdline.contains("tmux-waker") && cmdline.contains(&socket);
            let role = cmdline.contains("--typist") == typists;
            (ours && role).then(|| path.file_name()?.to_str().map(str::to_owned))?
        })
        .collect()
}

/// The wakers (each keeps one typist running).
fn wakers(tmux: &Tmux) -> usize {
    waker_pids(tmux, false).len()
}

#[tokio::test]
async fn an_idle_agent_in_tmux_gets_messages_typed_in_each_answered_once() {
    let Scene {
        broker,
        tmux,
        prompts_file,
        goal,
        _data,
    } = Scene::start().await;
    tmux.type_in(&agent_command(&broker, &prompts_file, &goal), true);
    let session = session_of(&broker, &goal).await;
    tokio::time::sleep(Duration::from_secs(2)).await; // idle a while
    assert_eq!(
        delivery(&broker, &session).await,
        Delivery::TypedNow,
        "the page says so"
    );

    let one = send(&broker, &session, "Which tests fail?").await;
    let first = &answered(&broker, &session, &[one]).await[0];
    let message = first.response.as_ref().unwrap()["message"]
        .as_str()
        .unwrap();
    assert_eq!(message, "Echo: [LoopX #1 web] Which tests fail?");
    let mut latencies = vec![latency(first)];

    let three = [
        send(&broker, &session, "First of three.").await,
        send(&broker, &session, "Second of three.").await,
        send(&broker, &session, "Third of three.").await,
    ];
    // The first is typed; the agent's Stop hook then hands it the others,
    // one turn each, as for any busy agent.
    let turns = answered(&broker, &session, &three).await;
    for turn in &turns {
        let answer = turn.response.as_ref().unwrap()["message"].as_str().unwrap();
        assert!(answer.contains(&turn.text), "{answer}");
    }
    assert!(
        turns.windows(2).all(|w| w[0].claimed_at < w[1].claimed_at),
        "in order"
    );

    let lines = send(&broker, &session, "Line one.\nLine two.\r\n\x1b[31mred\x07").await;
    let slash = send(&broker, &session, "/clear everything").await;
    let more = answered(&broker, &session, &[lines, slash]).await;
    latencies.push(latency(&more[0]));
    let got = prompts(&prompts_file);
    assert_eq!(got[0], "[LoopX #1 web] Which tests fail?");
    assert_eq!(got[1], "[LoopX #2 web] First of three.");
    assert_eq!(
        got[4], "[LoopX #5 web] Line one.\nLine two.\n[31mred",
        "one prompt, no escapes"
    );
    for text in [
        "Which tests fail?",
        "of three.",
        "Line one.",
        "/clear everything",
    ] {
        let count: usize = got.iter().map(|p| p.matches(text).count()).sum();
        let expected = if text == "of three." { 3 } else { 1 };
        assert_eq!(count, expected, "{text:?} delivered once each: {got:#?}");
    }
    assert!(
        !got.iter().any(|p| p.starts_with('/')),
        "never a slash command: {got:#?}"
    );
    latencies.sort();
    eprintln!("tmux: enqueue to typed-and-claimed, ms: {latencies:?}");
    assert_eq!(wakers(&tmux), 1, "one waker for the pane");

    // The agent exits; the shell is back in the pane: nothing is typed there,
    // and no waker is left.
    tmux.type_in("/exit", true);
    tmux.wait_shell().await;
    let started = Instant::now();
    while wakers(&tmux) > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "a waker outlived its agent"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(delivery(&broker, &session).await, Delivery::Later);
    let after = send(&broker, &session, "echo typed-into-the-shell").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !tmux.screen().contains("typed-into-the-shell"),
        "{}",
        tmux.screen()
    );
    let waiting = broker.client.turn(&session, &after).await.unwrap().body;
    assert_eq!(
        waiting.state,
        TurnState::Queued,
        "kept for the agent's return"
    );
}

#[tokio::test]
async fn loopx_run_types_into_its_agent_and_the_person_at_the_terminal_wins() {
    let Scene {
        broker,
        tmux,
        prompts_file,
        goal,
        _data,
    } = Scene::start().await;
    tmux.type_in(
        &under_run(&broker, &agent_command(&broker, &prompts_file, &goal)),
        true,
    );
    let session = session_of(&broker, &goal).await;
    assert_eq!(wakers(&tmux), 0, "loopx run types itself: no tmux waker");

    let one = send(&broker, &session, "!rm -rf / is a message, not a command").await;
    let first = &answered(&broker, &session, &[one]).await[0];
    assert_eq!(
        first.response.as_ref().unwrap()["message"],
        "Echo: [LoopX #1 web] !rm -rf / is a message, not a command"
    );
    eprintln!(
        "loopx run: enqueue to typed-and-claimed: {} ms",
        latency(first)
    );

    // The person starts a prompt and has not sent it: nothing is typed.
    tmux.type_in("half a thought", false);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let queued = send(&broker, &session, "Sent while the person types.").await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        broker
            .client
            .turn(&session, &queued)
            .await
            .unwrap()
            .body
            .state,
        TurnState::Queued
    );
    // They send it: their prompt is theirs, whole; the message comes at the
    // end of that turn (the Stop hook), answered once.
    tmux.type_in(" and the rest", true);
    let turn = &answered(&broker, &session, &[queued]).await[0];
    let answer = turn.response.as_ref().unwrap()["message"].as_str().unwrap();
    assert!(answer.contains("Sent while the person types."), "{answer}");
    let got = prompts(&prompts_file);
    assert_eq!(
        got[1], "half a thought and the rest",
        "never interleaved: {got:?}"
    );
    assert_eq!(got.len(), 3, "{got:?}");

    // The agent's exit status is loopx's.
    tmux.type_in("/exit", true);
    tmux.wait_shell().await;
    tmux.type_in(
        &format!(
            "{} run -- sh -c 'exit 7'; echo status=$?",
            env!("CARGO_BIN_EXE_loopx")
        ),
        true,
    );
    tmux.wait_screen("status=7").await;
}

/// A message with files typed into an idle agent names each file, saved in
/// the hooks' data dir (issue 39): the agent reads the path it can open.
#[tokio::test]
async fn a_message_with_a_file_is_typed_naming_the_saved_file() {
    let Scene {
        broker,
        tmux,
        prompts_file,
        goal,
        _data,
    } = Scene::start().await;
    tmux.type_in(&agent_command(&broker, &prompts_file, &goal), true);
    let session = session_of(&broker, &goal).await;
    tokio::time::sleep(Duration::from_secs(2)).await; // idle a while
    let image = crate::attachments::png(2000);
    let sent = broker
        .client
        .enqueue_with_attachments(
            &session,
            &web("What is on this screenshot?"),
            &[crate::attachments::file(
                "shot.png",
                "image/png",
                image.clone(),
            )],
        )
        .await
        .unwrap()
        .body;
    answered(&broker, &session, std::slice::from_ref(&sent.turn_id)).await;
    let saved = _data
        .path()
        .join("attachments")
        .join(&session)
        .join(&sent.turn_id)
        .join("shot.png");
    let got = prompts(&prompts_file);
    assert_eq!(
        got[0],
        format!(
            "[LoopX #1 web] What is on this screenshot?\n\nAttached: {} (image/png, 2 KB)",
            saved.display()
        )
    );
    assert_eq!(std::fs::read(&saved).unwrap(), image);
}

/// Never into a dialog, and a waker killed is never a message lost or
/// typed twice: a message sent while the agent shows a dialog mid-turn is
/// not typed into it (it arrives at the end of that turn); one sent while
/// no waker runs (killed with SIGKILL) stays queued until the next turn's
/// end, and the hooks start a new waker.
#[tokio::test]
async fn no_dialog_is_answered_by_a_message_and_a_killed_waker_loses_nothing() {
    let Scene {
        broker,
        tmux,
        prompts_file,
        goal,
        _data,
    } = Scene::start().await;
    tmux.type_in(&agent_command(&broker, &prompts_file, &goal), true);
    let session = session_of(&broker, &goal).await;
    tmux.type_in("please ask first", true);
    tmux.wait_screen("Allow this? [y/n]").await;
    let during = send(&broker, &session, "Sent while the dialog is up.").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        broker
            .client
            .turn(&session, &during)
            .await
            .unwrap()
            .body
            .state,
        TurnState::Queued
    );
    tmux.type_in("y", false);
    answered(&broker, &session, std::slice::from_ref(&during)).await;
    let got = prompts(&prompts_file);
    assert_eq!(
        got[1], "dialog answered: y",
        "the person's key, not the message: {got:?}"
    );

    // The waker is killed: a message waits, whole, for the agent's next turn.
    let started = Instant::now();
    while wakers(&tmux) == 0 {
        assert!(started.elapsed() < Duration::from_secs(10), "no waker");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let socket = tmux.socket.display().to_string();
    let killed = Command::new("pkill")
        .args(["-9", "-f", &format!("tmux-waker.*{socket}")])
        .status()
        .unwrap();
    assert!(killed.success());
    // The dialog's turn may still be ending (its Stop hook starts a waker
    // when none runs): killed again until none has run for a second.
    let mut quiet_since = Instant::now();
    while quiet_since.elapsed() < Duration::from_secs(1) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "a waker keeps coming back"
        );
        if wakers(&tmux) > 0 {
            let _ = Command::new("pkill")
                .args(["-9", "-f", &format!("tmux-waker.*{socket}")])
                .status();
            quiet_since = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let waits = send(&broker, &session, "Sent with no waker.").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        broker
            .client
            .turn(&session, &waits)
            .await
            .unwrap()
            .body
            .state,
        TurnState::Queued
    );
    tmux.type_in("the person is back", true);
    answered(&broker, &session, &[waits]).await;
    let got = prompts(&prompts_file);
    let count = |text: &str| got.iter().filter(|p| p.contains(text)).count();
    assert_eq!(
        (count("Sent while the dialog"), count("Sent with no waker.")),
        (1, 1),
        "{got:#?}"
    );
    // The person's prompt started a new waker: the next message is typed
    // (sent once that waker runs and the agent waits at its prompt, else the
    // turn's own Stop delivers it, as it should).
    let started = Instant::now();
    while wakers(&tmux) == 0
        || broker
            .client
            .session(&session)
            .await
            .unwrap()
            .body
            .agent
            .state
            != loopx::model::AgentState::Waiting
    {
        assert!(started.elapsed() < Duration::from_secs(10), "no new waker");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let next = send(&broker, &session, "And typed again.").await;
    let turn = &answered(&broker, &session, &[next]).await[0];
    assert!(
        turn.response.as_ref().unwrap()["message"]
            .as_str()
            .unwrap()
            .starts_with("Echo: [LoopX #")
    );
}

/// Idle-to-typed latency (issue 36), printed, not asserted: 20 messages,
/// each sent to an agent idle for 1.5 s, from enqueue to the claim made by
/// the typed prompt's UserPromptSubmit hook (the broker's timestamps).
/// `cargo nextest run --test it wake::latency --run-ignored only --no-capture`
#[tokio::test]
#[ignore = "a measurement: run by hand, figures in BENCHMARKS.md"]
async fn latency_of_typing_into_an_idle_agent() {
    for via_run in [false, true] {
        let Scene {
            broker,
            tmux,
            prompts_file,
            goal,
            _data,
        } = Scene::start().await;
        let agent = agent_command(&broker, &prompts_file, &goal);
        let command = if via_run {
            under_run(&broker, &agent)
        } else {
            agent
        };
        tmux.type_in(&command, true);
        let session = session_of(&broker, &goal).await;
        let mut latencies = Vec::new();
        for n in 0..20 {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let id = send(&broker, &session, &format!("Message {n}.")).await;
            latencies.push(latency(&answered(&broker, &session, &[id]).await[0]));
        }
        latencies.sort();
        let (p50, p99) = (latencies[9], latencies[19]);
        let way = if via_run { "loopx run" } else { "tmux" };
        eprintln!(
            "{way}: enqueue to typed and claimed over 20: p50 {p50} ms, p99 {p99} ms, all {latencies:?}"
        );
    }
}

/// The fake agent's process, found by its prompts file.
fn agent_pid(prompts: &Path) -> i32 {
    let mark = prompts.display().to_string();
    let started = Instant::now();
    loop {
        let found = std::fs::read_dir("/proc").unwrap().find_map(|entry| {
            let path = entry.ok()?.path();
            let cmdline = String::from_utf8_lossy(&std::fs::read(path.join("cmdline")).ok()?)
                .replace('\0', " ");
            let program = cmdline.split(' ').next()?.rsplit('/').next()?;
            (program.starts_with("python")
                && cmdline.contains("fake_agent.py")
                && cmdline.contains(&mark))
            .then(|| path.file_name()?.to_str()?.parse().ok())?
        });
        if let Some(pid) = found {
            return pid;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no agent process"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Issue 53 (1): an agent started as `bash -c "agent; exec bash -i"` (a
/// tmux idiom; bash also runs the last command of a `-c` list in place) and
/// killed leaves an interactive shell with the pid, start time, terminal and
/// foreground group the agent's group had. A message sent then is never
/// typed into that shell, in tmux or under `loopx run`: it stays queued.
#[tokio::test]
async fn a_shell_left_in_a_killed_agents_place_never_gets_a_message() {
    for via_run in [false, true] {
        let Scene {
            broker,
            tmux,
            prompts_file,
            goal,
            _data,
        } = Scene::start().await;
        let agent = agent_command(&broker, &prompts_file, &goal);
        let shell = "exec env PS1='after$ ' bash --norc --noprofile -i";
        let inner = format!("bash -c \"{agent}; {shell}\"");
        let command = if via_run {
            under_run(&broker, &inner)
        } else {
            inner
        };
        tmux.type_in(&command, true);
        let session = session_of(&broker, &goal).await;
        // The agent works: a message is typed and answered.
        let first = send(&broker, &session, "Before the crash.").await;
        answered(&broker, &session, &[first]).await;
        tokio::time::sleep(Duration::from_secs(1)).await;

        let pid = agent_pid(&prompts_file);
        assert!(
            Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status()
                .unwrap()
                .success()
        );
        tmux.wait_screen("after$").await;
        let pwned = tmux.dir.path().join("pwned");
        let text = format!("look at this\ntouch {}", pwned.display());
        let after = send(&broker, &session, &text).await;
        tokio::time::sleep(Duration::from_secs(4)).await;
        let way = if via_run { "loopx run" } else { "tmux" };
        assert!(!pwned.exists(), "{way}: the message ran in the shell");
        assert!(
            !tmux.screen().contains("look at this"),
            "{way}: {}",
            tmux.screen()
        );
        let waiting = broker.client.turn(&session, &after).await.unwrap().body;
        assert_eq!(
            waiting.state,
            TurnState::Queued,
            "{way}: kept for the agent"
        );
    }
}

/// Issue 53 (2): a draft in the agent's prompt (sent with `send-keys`, as a
/// script or a paste puts it there: no client's keys) is never merged with
/// a message: the message waits, the person's prompt is theirs alone, and
/// the message is delivered once, with its own text.
#[tokio::test]
async fn a_draft_in_the_prompt_is_never_merged_with_a_message() {
    let Scene {
        broker,
        tmux,
        prompts_file,
        goal,
        _data,
    } = Scene::start().await;
    tmux.type_in(&agent_command(&broker, &prompts_file, &goal), true);
    let session = session_of(&broker, &goal).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    tmux.type_in("my half typed draft about the bug", false);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let message = send(&broker, &session, "deploy is green").await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let waiting = broker.client.turn(&session, &message).await.unwrap().body;
    assert_eq!(waiting.state, TurnState::Queued, "{}", tmux.screen());
    assert!(!tmux.screen().contains("[LoopX"), "{}", tmux.screen());
    tmux.type_in("", true);
    let turn = &answered(&broker, &session, std::slice::from_ref(&message)).await[0];
    let answer = turn.response.as_ref().unwrap()["message"].as_str().unwrap();
    assert!(answer.contains("deploy is green"), "{answer}");
    let got = prompts(&prompts_file);
    assert_eq!(got[0], "my half typed draft about the bug", "{got:#?}");
    let count = got.iter().filter(|p| p.contains("deploy is green")).count();
    assert_eq!(count, 1, "delivered once: {got:#?}");
}

/// Issue 53 (4): a marker typed at the terminal by hand (`[LoopX #1 web]
/// anything`) takes no turn: it is the person's own prompt, and the queued
/// message reaches the agent with its own text and is answered once.
#[tokio::test]
async fn a_forged_marker_typed_at_the_terminal_takes_no_turn() {
    let Scene {
        broker,
        tmux,
        prompts_file,
        goal,
        _data,
    } = Scene::start().await;
    tmux.type_in(
        &under_run(&broker, &agent_command(&broker, &prompts_file, &goal)),
        true,
    );
    let session = session_of(&broker, &goal).await;
    // The person is typing (loopx run sees the keys): the message waits.
    tmux.type_in("[LoopX #1 web] ", false);
    let queued = send(&broker, &session, "The real message.").await;
    tmux.type_in("anything", true);
    let turn = &answered(&broker, &session, std::slice::from_ref(&queued)).await[0];
    let answer = turn.response.as_ref().unwrap()["message"].as_str().unwrap();
    assert!(answer.contains("The real message."), "{answer}");
    let got = prompts(&prompts_file);
    assert_eq!(got[0], "[LoopX #1 web] anything", "{got:#?}");
    assert_eq!(
        got.iter()
            .filter(|p| p.contains("The real message."))
            .count(),
        1,
        "{got:#?}"
    );
}

/// Issue 53 (3): a person typing in another window of the agent's tmux
/// session (their client's keys keep its `client_activity` fresh) does not
/// hold a message for the agent's pane: it is typed and answered while
/// they type.
#[tokio::test]
async fn keys_in_another_window_do_not_hold_a_message() {
    use std::io::Write;
    let Scene {
        broker,
        tmux,
        prompts_file,
        goal,
        _data,
    } = Scene::start().await;
    tmux.type_in(&agent_command(&broker, &prompts_file, &goal), true);
    let session = session_of(&broker, &goal).await;
    // A person's client, attached through a terminal of its own, looking
    // at a second window.
    let attach = format!("tmux -S {} attach", tmux.socket.display());
    let mut client = Command::new("script")
        .args(["-qfec", &attach, "/dev/null"])
        .env("TERM", "xterm")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("script (util-linux) is installed");
    tokio::time::sleep(Duration::from_millis(500)).await;
    tmux.tmux(&["new-window"]);
    let mut keys = client.stdin.take().unwrap();
    let typing = std::thread::spawn(move || {
        for _ in 0..40 {
            if keys.write_all(b"x").and_then(|()| keys.flush()).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    let id = send(&broker, &session, "Sent while someone types elsewhere.").await;
    let started = Instant::now();
    loop {
        let turn = broker.client.turn(&session, &id).await.unwrap().body;
        if turn.state == TurnState::Completed {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "held by keys in another window: {:?}",
            turn.state
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = client.kill();
    let _ = typing.join();
    let _ = client.wait();
}

/// Issue 53 (5): a typist killed (SIGKILL) is replaced by its waker within
/// seconds, with no hook running, and the next message is typed once.
#[tokio::test]
async fn a_killed_typist_is_replaced_and_types_the_next_message() {
    let Scene {
        broker,
        tmux,
        prompts_file,
        goal,
        _data,
    } = Scene::start().await;
    tmux.type_in(&agent_command(&broker, &prompts_file, &goal), true);
    let session = session_of(&broker, &goal).await;
    let started = Instant::now();
    let first = loop {
        if let [pid] = waker_pids(&tmux, true).as_slice() {
            break pid.clone();
        }
        assert!(started.elapsed() < Duration::from_secs(10), "no typist");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        Command::new("kill")
            .args(["-9", &first])
            .status()
            .unwrap()
            .success()
    );
    let started = Instant::now();
    loop {
        let now = waker_pids(&tmux, true);
        if now.len() == 1 && now[0] != first {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no new typist: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(wakers(&tmux), 1);
    let id = send(&broker, &session, "After the typist was replaced.").await;
    answered(&broker, &session, &[id]).await;
    let got = prompts(&prompts_file);
    assert_eq!(got, ["[LoopX #1 web] After the typist was replaced."]);
}
