//! Waking an idle agent (HOOKS.md "Waking an idle agent"): a queued message
//! is typed into the agent's own terminal, as the person would type it, when
//! the hooks say the agent is idle at its prompt; the agent's
//! `UserPromptSubmit` hook then takes the turn (the typed text's marker names
//! it) and `stop` answers it as for any turn.
//!
//! The waker follows the session's event stream (content-free: turns' states
//! and the agent's presence) and types into a [`Terminal`]: a tmux pane
//! ([`tmux`]) or `loopx run`'s pseudo-terminal. It never starts, resumes or
//! interrupts the agent: it types only while the agent is `waiting`, only
//! into the agent process in the foreground of its terminal, never while the
//! person at the terminal is typing, and never the same turn twice.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use crate::client::{Client, ClientError, EventStream};
use crate::model::{
    AgentEventData, AgentNotification, AgentState, NotificationKind, ReportAgentState, TurnChange,
    TurnEventData,
};

pub mod procfs;
pub mod run;
pub mod screen;
pub mod text;
pub mod tmux;
pub mod transcript;

/// How long the agent must have been idle before a message is typed: its
/// Stop hook reports `waiting` just before the agent draws its prompt.
const SETTLE: Duration = Duration::from_millis(400);
/// How long the terminal must have been clear after anything held typing:
/// a draft the person sends with Enter makes the prompt empty at once, but
/// the hook that says the agent works on it comes a moment later.
const CLEAR_AFTER_HOLD: Duration = Duration::from_secs(3);
/// Between the pasted text and its Enter under `loopx run`: an Enter sent
/// at once can land as a newline in the prompt instead of submitting it.
pub const ENTER_AFTER: Duration = Duration::from_millis(150);
/// How long the `UserPromptSubmit` hook has to confirm a submission.
const CONFIRM_WITHIN: Duration = Duration::from_secs(4);
/// How often the waker looks at the terminal while nothing happens.
const TICK: Duration = Duration::from_millis(500);
/// The longest wait between reconnections to the event stream.
const RECONNECT_AT_MOST: Duration = Duration::from_secs(10);
/// How often the waker tells the broker it types into the agent (the
/// broker trusts it for 150 s: `delivery` is `typed_now` meanwhile).
const SAY_EVERY: Duration = Duration::from_secs(60);

/// Why nothing may be typed now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Something else than the agent has the terminal's foreground.
    NotForeground,
    /// The person at the terminal typed since the agent went idle, or
    /// moments ago.
    PersonTyping,
    /// The pane shows something else than the program (tmux copy mode).
    PaneInMode,
    /// The agent's prompt holds text (a draft), or no prompt can be seen.
    PromptHoldsText,
}

/// The agent or its terminal is gone: the waker ends.
#[derive(Debug)]
pub struct Gone(pub String);

/// Where a waker types: one agent's terminal.
#[allow(async_fn_in_trait)]
pub trait Terminal {
    /// Whether typing may go ahead now; checked before every message.
    async fn hold(&mut self) -> Result<Option<Hold>, Gone>;
    /// Whether the agent is still there (cheap; checked on every tick).
    fn gone(&mut self) -> Option<Gone>;
    /// Types `text` and submits it: pasted as one prompt, then Enter.
    async fn submit(&mut self, text: &str) -> std::io::Result<()>;
    /// Enter again, for a submission not confirmed.
    async fn enter(&mut self) -> std::io::Result<()>;
}

/// How a waker ended.
#[derive(Debug)]
pub enum Ended {
    /// The session closed, or the agent left (`session-end`).
    SessionOver,
    /// The agent or its terminal is gone.
    Gone(Gone),
}

/// The host identity a waker reports with (its notifications).
pub struct HostIdentity {
    pub host_surface: String,
    pub host_session_id: String,
}

/// Where the agent running this hook sits, as typing into it needs to
/// know: read off `/proc` once per hook process ([`Seat::here`]).
pub struct Seat {
    /// The hook runs in Codex's shared app-server, which cannot tell which
    /// terminal is its agent's.
    pub under_app_server: bool,
    /// The agent process itself (never a shell): typing goes only there.
    pub agent: Option<procfs::Agent>,
}

impl Seat {
    pub fn here() -> Seat {
        let me = std::process::id() as i32;
        let under_app_server = procfs::under_app_server(me);
        Seat {
            under_app_server,
            agent: (!under_app_server).then(|| procfs::agent_of(me)).flatten(),
        }
    }

    /// The terminal the agent runs in, as a bind names it (HOOKS.md "The
    /// terminal's real life": a new host session there continues the
    /// open one): `loopx run`'s private folder, else the tmux pane, else
    /// the agent process itself (which `/clear` keeps), on this machine;
    /// sent as a digest. None under Codex's shared app-server, which cannot
    /// tell, or with no agent process found.
    pub fn terminal(&self) -> Option<String> {
        if self.under_app_server {
            return None;
        }
        let var = |name: &str| std::env::var(name).ok();
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        terminal_of(
            host.trim(),
            var(run::RUN_DIR),
            var("TMUX").zip(var("TMUX_PANE")),
            self.agent.as_ref(),
        )
    }

    /// Whether a waker types into this agent: it runs under `loopx run` or
    /// in a tmux pane (whose hooks start a waker), its process is found,
    /// and not in Codex's shared app-server. Then a message queued during a
    /// turn is typed in once the turn ends, not handed over by blocking the
    /// Stop.
    pub fn typed_in(&self) -> bool {
        let terminal = std::env::var_os(run::RUN_DIR).is_some()
            || (std::env::var_os("TMUX").is_some() && std::env::var_os("TMUX_PANE").is_some());
        terminal && !self.under_app_server && self.agent.is_some()
    }
}

/// The terminal's name on `host`: `loopx run`'s folder, else the tmux
/// server's socket and pane (from `TMUX`, `TMUX_PANE`), else the agent
/// process; a digest of it.
fn terminal_of(
    host: &str,
    run_dir: Option<String>,
    tmux: Option<(String, String)>,
    agent: Option<&procfs::Agent>,
) -> Option<String> {
    use sha2::{Digest, Sha256};
    let place = match (run_dir, tmux) {
        (Some(dir), _) => format!("run\0{dir}"),
        (None, Some((tmux, pane))) => {
            format!(
                "tmux\0{}\0{pane}",
                tmux.split(',').next().unwrap_or_default()
            )
        }
        (None, None) => {
            let agent = agent?;
            format!("process\0{}\0{}", agent.pid, agent.start)
        }
    };
    let digest = Sha256::digest(format!("{host}\0{place}").as_bytes());
    Some(format!("term-{}", hex::encode(&digest[..16])))
}

/// Where the hooks and the waker of this terminal keep the record of what
/// was typed: `loopx run`'s private folder for an agent under it, else the
/// data dir's `wakers` folder (the tmux waker gets the hooks' data dir).
pub fn records_dir(data_dir: &std::path::Path) -> std::path::PathBuf {
    match std::env::var_os(run::RUN_DIR) {
        Some(dir) => std::path::PathBuf::from(dir),
        None => data_dir.join("wakers"),
    }
}

/// One session's waker.
pub struct Waker<T> {
    /// The event stream's client (no overall timeout) and the one for
    /// every other call (a short one: a stuck broker never stalls typing).
    client: Client,
    calls: Client,
    session_id: String,
    host: HostIdentity,
    terminal: T,
    stream: Option<EventStream>,
    last_event: i64,
    /// The turns waiting in the queue (queued, or released back to it), by
    /// seq: the others leave the map as their events come.
    waiting: BTreeMap<i64, String>,
    /// The agent's presence and since when (ms since the epoch).
    agent: Option<(AgentState, i64)>,
    closed: bool,
    /// Turns typed once and not confirmed: not typed again until a turn
    /// has run.
    typed: HashSet<String>,
    /// When the broker was last told that this waker types in.
    said: Option<Instant>,
    /// When the terminal last held typing ([`Hold`]).
    held: Option<Instant>,
    /// Where a typed turn's files are saved (none: they are only named).
    saves: Option<std::path::PathBuf>,
    /// Where the record of what was typed is left for the agent's hooks
    /// ([`text::Record`]).
    records: std::path::PathBuf,
    /// The agent's transcript, read for interrupts.
    transcript: transcript::Watch,
}

impl<T: Terminal> Waker<T> {
    pub fn new(
        client: Client,
        session_id: String,
        host: HostIdentity,
        terminal: T,
        records: std::path::PathBuf,
    ) -> Self {
        Waker {
            transcript: transcript::Watch::new(&records, &session_id),
            calls: client.clone().with_timeout(Duration::from_secs(5)),
            client,
            session_id,
            host,
            terminal,
            stream: None,
            last_event: 0,
            waiting: BTreeMap::new(),
            agent: None,
            closed: false,
            typed: HashSet::new(),
            said: None,
            held: None,
            saves: None,
            records,
        }
    }

    /// Saves a typed turn's files under `root` and names them in the text.
    pub fn saving_files_in(self, root: std::path::PathBuf) -> Self {
        Waker {
            saves: Some(root),
            ..self
        }
    }

    /// Runs until the session is over or the agent is gone. The broker
    /// going away is waited out (reconnecting, from the last event seen).
    pub async fn run(mut self) -> Ended {
        let ended = self.typing().await;
        if !self.closed {
            // Best effort: the broker stops showing `typed_now` within
            // 150 s anyway.
            let _ = tokio::time::timeout(Duration::from_secs(2), self.say(false)).await;
        }
        ended
    }

    async fn typing(&mut self) -> Ended {
        let mut retry = Duration::from_millis(200);
        loop {
            if let Some(gone) = self.terminal.gone() {
                return Ended::Gone(gone);
            }
            if self.closed || matches!(self.agent, Some((AgentState::Away, _))) {
                return Ended::SessionOver;
            }
            if self.said.is_none_or(|at| at.elapsed() >= SAY_EVERY) {
                self.said = Some(Instant::now());
                self.say(true).await;
            }
            if self.stream.is_none() {
                match self
                    .client
                    .events(&self.session_id, Some(self.last_event))
                    .await
                {
                    Ok(stream) => {
                        self.stream = Some(stream);
                        retry = Duration::from_millis(200);
                    }
                    Err(ClientError::Refused { .. }) => return Ended::SessionOver,
                    Err(_) => {
                        tokio::time::sleep(retry).await;
                        retry = (retry * 2).min(RECONNECT_AT_MOST);
                        continue;
                    }
                }
            }
            self.follow(TICK).await;
            self.interrupts().await;
            if let Err(gone) = self.deliver_next().await {
                return Ended::Gone(gone);
            }
        }
    }

    /// Applies the events that arrive within `wait`; returns soon after a
    /// burst of them (a replay) has been taken.
    async fn follow(&mut self, wait: Duration) {
        let mut deadline = tokio::time::Instant::now() + wait;
        loop {
            let Some(stream) = self.stream.as_mut() else {
                return;
            };
            match tokio::time::timeout_at(deadline, stream.next()).await {
                Err(_) => return,
                Ok(Some(Ok(event))) => {
                    self.apply(&event);
                    let soon = tokio::time::Instant::now() + Duration::from_millis(5);
                    deadline = deadline.min(soon);
                }
                Ok(_) => {
                    self.stream = None;
                    return;
                }
            }
        }
    }

    fn apply(&mut self, event: &eventsource_stream::Event) {
        if let Ok(id) = event.id.parse::<i64>() {
            self.last_event = self.last_event.max(id);
        }
        match event.event.as_str() {
            "turn" => {
                if let Ok(turn) = serde_json::from_str::<TurnEventData>(&event.data) {
                    if matches!(turn.state, TurnChange::Queued | TurnChange::Released) {
                        self.waiting.insert(turn.seq, turn.turn_id);
                    } else {
                        self.waiting.remove(&turn.seq);
                    }
                }
            }
            "agent" => {
                if let Ok(agent) = serde_json::from_str::<AgentEventData>(&event.data) {
                    let since = chrono::DateTime::parse_from_rfc3339(&agent.since)
                        .map_or_else(|_| crate::time::now_ms(), |t| t.timestamp_millis());
                    if agent.state == AgentState::Working {
                        // A turn runs: whatever was typed and not confirmed
                        // left the prompt with it (or never was there). The
                        // Stop hook leaves queued turns to this waker, so
                        // they are typed again once the agent waits.
                        self.typed.clear();
                    }
                    self.agent = Some((agent.state, since));
                }
            }
            "session" => self.closed = true,
            _ => {}
        }
    }

    /// The oldest turn waiting in the queue, unless it was typed before
    /// (it then waits for a turn to run, and the ones after it too).
    fn next_queued(&self) -> Option<(i64, String)> {
        self.waiting
            .first_key_value()
            .filter(|(_, id)| !self.typed.contains(*id))
            .map(|(seq, id)| (*seq, id.clone()))
    }

    /// Types the oldest queued message if the agent is idle and reachable,
    /// and waits for its hook to confirm it.
    async fn deliver_next(&mut self) -> Result<(), Gone> {
        let Some((AgentState::Waiting, idle_since)) = self.agent else {
            return Ok(());
        };
        let Some((seq, turn_id)) = self.next_queued() else {
            return Ok(());
        };
        if crate::time::now_ms() - idle_since < SETTLE.as_millis() as i64 {
            return Ok(());
        }
        if !self.clear().await? {
            return Ok(());
        }
        let Ok(turn) = self.calls.turn(&self.session_id, &turn_id).await else {
            return Ok(());
        };
        let files = match &self.saves {
            Some(root) => {
                crate::cli::attachments::save(
                    &self.client,
                    root,
                    &self.session_id,
                    &turn_id,
                    &turn.body.attachments,
                )
                .await
            }
            None => Vec::new(),
        };
        let message = crate::cli::attachments::with_files(&turn.body.text, &files);
        let typed = text::typed(seq, turn.body.origin, &message);
        // Reading the turn and saving its files took time: the terminal is
        // looked at again right before typing. The record goes first: the
        // hook that sees the typed prompt takes the turn only by it.
        if !self.clear().await?
            || text::Record::of(seq, &turn_id, &typed)
                .keep(&self.records, &self.session_id)
                .is_err()
        {
            return Ok(());
        }
        self.typed.insert(turn_id.clone());
        if self.terminal.submit(&typed).await.is_err() || !self.confirmed(seq).await {
            // Enter may have landed as a newline: once more, never the text.
            let _ = self.terminal.enter().await;
            if !self.confirmed(seq).await {
                self.unconfirmed().await;
            }
        }
        Ok(())
    }

    /// Whether nothing holds typing now, nor did in the last
    /// [`CLEAR_AFTER_HOLD`].
    async fn clear(&mut self) -> Result<bool, Gone> {
        if self.terminal.hold().await?.is_some() {
            self.held = Some(Instant::now());
        }
        Ok(self.held.is_none_or(|at| at.elapsed() >= CLEAR_AFTER_HOLD))
    }

    /// Whether the turn left the queue (its hook claimed it) within
    /// [`CONFIRM_WITHIN`].
    async fn confirmed(&mut self, seq: i64) -> bool {
        let started = Instant::now();
        while started.elapsed() < CONFIRM_WITHIN {
            if self.stream.is_none() {
                return false;
            }
            self.follow(Duration::from_millis(100)).await;
            if !self.waiting.contains_key(&seq) {
                return true;
            }
        }
        false
    }

    /// An interrupt the agent wrote to its transcript (Esc, Ctrl-C: no Stop
    /// hook runs) while shown working: the broker is told, which settles
    /// the turn it worked on and shows it waiting; the next queued message
    /// is then typed in as for any idle agent.
    async fn interrupts(&mut self) {
        if !self.transcript.interrupted() || !matches!(self.agent, Some((AgentState::Working, _))) {
            return;
        }
        let report = ReportAgentState {
            interrupted: true,
            ..self.report(Some(AgentState::Waiting), None)
        };
        let _ = self.calls.report_agent(&self.session_id, &report).await;
    }

    /// A report of this waker's host: `state`, `typing_in`, nothing else.
    fn report(&self, state: Option<AgentState>, typing_in: Option<bool>) -> ReportAgentState {
        ReportAgentState {
            typing_in,
            ..ReportAgentState::of(&self.host.host_surface, &self.host.host_session_id, state)
        }
    }

    /// Tells the broker whether this waker types into the idle agent (its
    /// `typing_in` presence report; the agent's state stands).
    async fn say(&self, typing_in: bool) {
        let report = self.report(None, Some(typing_in));
        let _ = self.calls.report_agent(&self.session_id, &report).await;
    }

    /// Says in the session's events that a typed message was not confirmed:
    /// it stays queued, for the end of the agent's next turn.
    async fn unconfirmed(&self) {
        let notice = AgentNotification {
            host_surface: self.host.host_surface.clone(),
            host_session_id: self.host.host_session_id.clone(),
            kind: NotificationKind::TypingUnconfirmed,
        };
        let _ = self.calls.notify(&self.session_id, &notice).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_terminal_is_its_pane_its_run_or_its_agent_and_two_panes_are_two() {
        let tmux = |pane: &str| Some(("/tmp/tmux-1/default,123,0".to_owned(), pane.to_owned()));
        let pane = terminal_of("box", None, tmux("%1"), None);
        assert!(
            pane.as_deref()
                .is_some_and(|t| t.starts_with("term-") && t.len() == 37)
        );
        // The same pane after /clear or a restart (another server pid in
        // TMUX's tail is the same server): the same terminal.
        let again = Some(("/tmp/tmux-1/default,999,0".to_owned(), "%1".to_owned()));
        assert_eq!(terminal_of("box", None, again, None), pane);
        assert_ne!(
            terminal_of("box", None, tmux("%2"), None),
            pane,
            "another pane"
        );
        assert_ne!(
            terminal_of("other", None, tmux("%1"), None),
            pane,
            "another machine"
        );
        let run = terminal_of(
            "box",
            Some("/run/user/1/loopx-run.a".into()),
            tmux("%1"),
            None,
        );
        assert_ne!(run, pane, "loopx run inside a pane is the run's");
        let agent = procfs::Agent {
            pid: 42,
            start: 7,
            tty: 34816,
            exe: "/usr/bin/claude".into(),
            argv: "digest".into(),
        };
        let process = terminal_of("box", None, None, Some(&agent));
        assert!(process.is_some());
        let restarted = procfs::Agent { start: 8, ..agent };
        assert_ne!(terminal_of("box", None, None, Some(&restarted)), process);
        assert_eq!(
            terminal_of("box", None, None, None),
            None,
            "nothing to name"
        );
    }
}
