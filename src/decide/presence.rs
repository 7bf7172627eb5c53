//! Presence: whether a session's agent is there (HOOKS.md). A host reports
//! `working`, `waiting` or `away` (its hooks, its MCP bridge); a claim it
//! keeps parked counts as hearing from it, with no state of its own; the
//! projection shows the last report, and `away` once no host has been heard
//! from for [`AWAY_AFTER_MS`]. Each change is numbered in the
//! session's log as an `agent` event; a repeated report only refreshes when
//! the host was heard from, at most once per [`HEARD_REFRESH_MS`], so a host
//! that reports often writes little. Time alone never touches a claim.
//!
//! A waker on the host (HOOKS.md "Waking an idle agent") reports that it
//! types into the idle agent (`typing_in`), at least every minute; the
//! projection's `delivery` says from it how a message sent now arrives.

use super::pairing::{NewNote, Note, SessionName};
use super::terminal::{self, Said};
use super::{Decided, Subject, Writes, existing, hosted, log, open};
use super::{SessionRow, TurnRow};
use crate::error::{Error, Result};
use crate::ids::{Minter, check};
use crate::model::HostIdentity;
use crate::model::{AgentState, Delivery, NotificationKind, ReportAgentState, SessionState};

/// Silence after which the agent is shown `away`.
pub const AWAY_AFTER_MS: i64 = 10 * 60 * 1000;
/// How stale the last "heard from" may get before a same-state report is
/// written again.
pub const HEARD_REFRESH_MS: i64 = 60 * 1000;
/// How long a waker's report that it types in holds: it says so again every
/// minute, so two missed reports.
pub const WAKER_FRESH_MS: i64 = 150 * 1000;
/// The least time between two writes of the agent's current tool.
pub const TOOL_EVERY_MS: i64 = 2 * 1000;

/// What a host reports: a state (None: it was only heard from), the claim
/// its agent works on, whether a waker types into the idle agent.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub state: Option<AgentState>,
    pub claim_id: Option<String>,
    pub typing_in: Option<bool>,
    /// The tool the agent runs now (`Some("")`: none any more).
    pub tool: Option<String>,
    /// What the person at the terminal, or the agent, said.
    pub said: Option<Said>,
    /// The person interrupted the working agent ([`interrupt`]).
    pub interrupted: bool,
}

impl Report {
    /// A report as the route takes it: `state` or `typing_in` given, and a
    /// `claim_id` (an identifier) only with `working`.
    pub fn checked(report: &ReportAgentState) -> Result<Report> {
        if report.state.is_none() && report.typing_in.is_none() {
            return Err(Error::invalid("Give `state`, `typing_in`, or both."));
        }
        if report.state == Some(AgentState::Stalled) {
            return Err(Error::invalid(
                "`stalled` is the broker's to say, after `--stall-after` without a word from a working agent; report `working`, `waiting` or `away`.",
            ));
        }
        if report.state == Some(AgentState::Asking) {
            return Err(Error::invalid(
                "`asking` is the broker's to say, while a permission request is pending; report `working`, `waiting` or `away`.",
            ));
        }
        let said = match (&report.prompt, &report.answer) {
            (Some(_), Some(_)) => {
                return Err(Error::invalid(
                    "Give `prompt` or `answer`, not both: a prompt starts a turn, an answer ends one.",
                ));
            }
            (Some(prompt), None) => {
                if report.state != Some(AgentState::Working) {
                    return Err(Error::invalid(
                        "`prompt` goes with `\"state\": \"working\"` only: the agent works on it.",
                    ));
                }
                if prompt.is_empty() || prompt.len() > super::text::MAX_TEXT_BYTES {
                    return Err(Error::invalid(format!(
                        "`prompt` must be 1 to {} bytes.",
                        super::text::MAX_TEXT_BYTES
                    )));
                }
                Some(Said::Prompt(prompt.clone()))
            }
            (None, Some(answer)) => {
                if !matches!(
                    report.state,
                    Some(AgentState::Working | AgentState::Waiting)
                ) {
                    return Err(Error::invalid(
                        "`answer` goes with `\"state\": \"working\"` or `\"waiting\"`: the agent ended its turn.",
                    ));
                }
                Some(Said::Answer(answer.clone()))
            }
            (None, None) => None,
        };
        if let Some(claim_id) = &report.claim_id {
            check("claim_id", claim_id)?;
            if report.state != Some(AgentState::Working) {
                return Err(Error::invalid(
                    "`claim_id` goes with `\"state\": \"working\"` only: the holder says it works on that claim.",
                ));
            }
        }
        if report.interrupted && (report.state != Some(AgentState::Waiting) || said.is_some()) {
            return Err(Error::invalid(
                "`interrupted` goes with `\"state\": \"waiting\"` alone (no `prompt` or `answer`): the interrupted agent waits at its prompt.",
            ));
        }
        if let Some(tool) = &report.tool {
            if report.state != Some(AgentState::Working) {
                return Err(Error::invalid(
                    "`tool` goes with `\"state\": \"working\"` only: the agent runs it in a turn.",
                ));
            }
            if !tool.is_empty() {
                check("tool", tool)?;
            }
        }
        Ok(Report {
            state: report.state,
            claim_id: report.claim_id.clone(),
            typing_in: report.typing_in,
            tool: report.tool.clone(),
            said,
            interrupted: report.interrupted,
        })
    }
}

/// How a message sent at `now` reaches the agent shown in `state`.
pub fn delivery(session: &SessionRow, state: AgentState, now: i64) -> Delivery {
    let typer = session
        .waker_heard_at
        .is_some_and(|heard| now - heard < WAKER_FRESH_MS);
    match state {
        AgentState::Working => Delivery::EndOfTurn,
        AgentState::Waiting if typer => Delivery::TypedNow,
        _ => Delivery::Later,
    }
}

/// The tool a report names, if it changes the one shown and the last change
/// was written [`TOOL_EVERY_MS`] ago or more (a tool loop writes no row per
/// call). `Some(None)`: the tool ended.
fn tool_change(session: &SessionRow, tool: Option<&str>, now: i64) -> Option<Option<String>> {
    let wanted = tool.map(|name| (!name.is_empty()).then(|| name.to_owned()))?;
    let due = session
        .tool_since
        .is_none_or(|since| now - since >= TOOL_EVERY_MS);
    (wanted != session.agent_tool && due).then_some(wanted)
}

/// Whether a waker's report changes what is stored: a waker that starts, a
/// stale mark refreshed, or one that stopped.
fn waker_news(session: &SessionRow, typing_in: Option<bool>, now: i64) -> bool {
    match (typing_in, session.waker_heard_at) {
        (Some(true), Some(heard)) => now - heard >= HEARD_REFRESH_MS,
        (Some(true), None) | (Some(false), Some(_)) => true,
        _ => false,
    }
}

/// The presence shown at `now`: the reported state and since when;
/// `stalled` since the broker announced a working agent silent
/// ([`stalls`]); or, for an agent not working, `away` since
/// [`AWAY_AFTER_MS`] after the host was last heard from. A working agent
/// does not go away by silence: it stalls.
pub fn shown(session: &SessionRow, now: i64) -> (AgentState, i64) {
    let since = session.agent_since.unwrap_or(session.created_at);
    match (
        session.agent_state,
        session.agent_heard_at,
        session.stalled_at,
    ) {
        (AgentState::Away, ..) => (AgentState::Away, since),
        (AgentState::Working, _, Some(stalled)) => (AgentState::Stalled, stalled),
        (AgentState::Working, Some(_), None) => (AgentState::Working, since),
        (state, Some(heard), _) if now - heard < AWAY_AFTER_MS => (state, since),
        (_, heard, _) => (
            AgentState::Away,
            heard.map_or(since, |h| (h + AWAY_AFTER_MS).max(since)),
        ),
    }
}

/// Whether a report of `state` (None: the host was only heard from, its
/// last state stands) at `now` would write anything: a change of the shown
/// state, or a stale "heard from" for an attached agent.
pub fn is_news(session: &SessionRow, state: Option<AgentState>, now: i64) -> bool {
    let wanted = state.unwrap_or(session.agent_state);
    let stale = session
        .agent_heard_at
        .is_none_or(|heard| now - heard >= HEARD_REFRESH_MS);
    shown(session, now).0 != wanted || (wanted != AgentState::Away && stale)
}

/// What a report did: the session after it, and whether its shown state
/// changed (an `agent` event was logged).
#[derive(Debug)]
pub struct Reported {
    pub session: SessionRow,
    pub changed: bool,
}

/// The host reports its agent's state (None: a parked claim, heard from
/// only), in this order: unknown session 404; another host 403
/// `host_mismatch`; closed 409 `session_closed`. Nothing new (the same state,
/// heard from lately): nothing written. A change of the shown state (an
/// `away` after silence ending too) is logged as an `agent` event.
///
/// `working` naming the session's active claim (`claim_id`) is also its
/// holder's sign of life, recorded every time
/// ([`crate::decide::turn::holder_gone`]); naming another claim (one
/// released or answered meanwhile) it is only a report.
pub fn report(
    rows: ReportRows,
    host: &HostIdentity,
    report: &Report,
    minter: &Minter,
    now: i64,
) -> Result<Decided<Reported>> {
    let mut rows = rows;
    let session = hosted(rows.session.take(), host)?;
    open(&session)?;
    let state = report.state;
    let (steps, mut session) = steps(session, rows, report, minter, now);
    let heard = marks(&mut session, report, now);
    if steps.is_none() && !heard.any() && !is_news(&session, state, now) {
        return Ok(Decided::nothing(Reported {
            session,
            changed: false,
        }));
    }
    // A waker that stopped says nothing of the agent: only its mark goes.
    let stopped = report.typing_in == Some(false) && state.is_none() && !heard.holder;
    let wanted = state.unwrap_or(session.agent_state);
    let changed = !stopped && (heard.unstalled || shown(&session, now).0 != wanted);
    // Only the agent's own events keep a working agent from stalling: a
    // waker or a parked claim says only that its process lives.
    if !stopped && (state.is_some() || session.agent_state != AgentState::Working) {
        session.agent_heard_at = Some(now);
    }
    let event = if changed {
        session.agent_state = wanted;
        session.agent_since = Some(now);
        Some(log(&mut session, Subject::Agent, wanted.as_str(), now))
    } else {
        // A new tool is news for the page too: an `agent` event, the state
        // as it stands (the page reads the tool from the projection).
        heard
            .tool
            .then(|| log(&mut session, Subject::Agent, wanted.as_str(), now))
    };
    Ok(Decided {
        writes: Writes {
            before: steps,
            session: Some(session.clone()),
            event,
            ..Writes::default()
        },
        answer: Reported { session, changed },
    })
}

/// The turns a report settles or records before the presence itself (the
/// session's other rows, `rows`): an interrupt's ([`interrupt`]), then
/// what the terminal said ([`terminal::said`]), as one chain of steps.
fn steps(
    session: SessionRow,
    rows: ReportRows,
    report: &Report,
    minter: &Minter,
    now: i64,
) -> (Option<Box<Writes>>, SessionRow) {
    let (interrupted, session) = interrupt(session, rows.interrupted, &rows.terminal, report, now);
    let (said, session) = match &report.said {
        Some(said) => {
            let (session, writes) = terminal::said(
                session,
                rows.terminal,
                said,
                rows.terminal_feed,
                || minter.mint("turn"),
                now,
            );
            (writes, session)
        }
        None => (None, session),
    };
    (chain(interrupted.into_iter().chain(said)), session)
}

/// What a report marks on the session besides its state, and whether each
/// is news.
struct Heard {
    /// A hook event ended a stall.
    unstalled: bool,
    /// The holder of the active claim spoke.
    holder: bool,
    /// A waker started or stopped typing in, or is due to be heard again.
    waker: bool,
    /// The agent's tool changed (written).
    tool: bool,
}

impl Heard {
    fn any(&self) -> bool {
        self.unstalled || self.holder || self.waker || self.tool
    }
}

/// Marks what the report says besides the state: a stall ended, the
/// holder heard, the waker's word, the tool.
fn marks(session: &mut SessionRow, report: &Report, now: i64) -> Heard {
    let state = report.state;
    // A hook event ends a stall; a waker's word (the process lives) does not.
    let unstalled = state.is_some() && session.stalled_at.take().is_some();
    let holder = state == Some(AgentState::Working)
        && report.claim_id.is_some()
        && session.active_claim_id == report.claim_id;
    if holder {
        session.holder_heard_at = Some(now);
    }
    let waker = waker_news(session, report.typing_in, now);
    let tool = tool_change(session, report.tool.as_deref(), now);
    if let Some(tool) = &tool {
        session.agent_tool.clone_from(tool);
        session.tool_since = Some(now);
    }
    if state.is_some_and(|s| s != AgentState::Working) && session.agent_tool.is_some() {
        // A turn that ended ends its tool.
        session.agent_tool = None;
        session.tool_since = Some(now);
    }
    match report.typing_in {
        Some(true) => session.waker_heard_at = Some(now),
        Some(false) => session.waker_heard_at = None,
        None => {}
    }
    Heard {
        unstalled,
        holder,
        waker,
        tool: tool.is_some(),
    }
}

/// The person interrupted the agent (a report `interrupted`): if it is
/// shown working, the LoopX turn it worked on (`active`: the session's
/// active claim and its turn) and the open terminal turn are cancelled
/// `interrupted`, each its own step, in that order. Otherwise nothing.
fn interrupt(
    mut session: SessionRow,
    active: Option<(super::ClaimRow, TurnRow)>,
    terminal: &Option<TurnRow>,
    report: &Report,
    now: i64,
) -> (Vec<Writes>, SessionRow) {
    let mut steps = Vec::new();
    if !report.interrupted || session.agent_state != AgentState::Working {
        return (steps, session);
    }
    if let Some((claim, turn)) = active
        && session.active_claim_id.as_ref() == Some(&claim.claim_id)
    {
        steps.push(super::turn::interrupted(&mut session, claim, turn, now));
    }
    if let Some(turn) = terminal
        .clone()
        .filter(|t| session.terminal_turn_id.as_ref() == Some(&t.turn_id))
    {
        steps.push(terminal::interrupted(&mut session, turn, now));
    }
    (steps, session)
}

/// Steps taken one after another, as one chain of [`Writes::before`]: the
/// first step is applied first (a step's own step before stays before it).
fn chain(steps: impl IntoIterator<Item = Writes>) -> Option<Box<Writes>> {
    fn after(mut step: Writes, first: Option<Box<Writes>>) -> Box<Writes> {
        let before = match step.before.take() {
            Some(own) => Some(after(*own, first)),
            None => first,
        };
        Box::new(Writes { before, ..step })
    }
    steps
        .into_iter()
        .fold(None, |first, step| Some(after(step, first)))
}

/// What a report decision reads: the session, and its open terminal turn
/// (the one `terminal_turn_id` names), if any.
#[derive(Debug, Default)]
pub struct ReportRows {
    pub session: Option<SessionRow>,
    pub terminal: Option<TurnRow>,
    /// With a report `interrupted` only: the session's active claim and its
    /// turn.
    pub interrupted: Option<(super::ClaimRow, TurnRow)>,
    /// The chat the session's link sends terminal turns to
    /// ([`crate::store::TERMINAL_FEED`]), read only when the report may
    /// answer one ([`ReportRows::feeds`]).
    pub terminal_feed: Option<String>,
}

impl ReportRows {
    /// Whether `report` may complete the session's open terminal turn, so
    /// that a store reads the chat that gets it.
    pub fn feeds(session: Option<&SessionRow>, report: &Report) -> bool {
        matches!(report.said, Some(terminal::Said::Answer(_)))
            && session.is_some_and(|s| s.terminal_turn_id.is_some())
    }
}

/// Whether the session's agent fell silent for [`AWAY_AFTER_MS`] without
/// that being announced yet: open, last reported `waiting` (a working agent
/// stalls instead, [`stalls`]), and not marked as shown away since its last
/// report.
pub fn lapsed(session: &SessionRow, now: i64) -> bool {
    session.state == SessionState::Open
        && session.agent_state == AgentState::Waiting
        && session.agent_heard_at.is_some_and(|heard| {
            now - heard >= AWAY_AFTER_MS
                && session
                    .agent_since
                    .is_none_or(|since| since < heard + AWAY_AFTER_MS)
        })
}

/// Whether the session's working agent has had no hook event for
/// `stall_after_ms` (0: never) without that being announced yet.
pub fn stalls(session: &SessionRow, stall_after_ms: i64, now: i64) -> bool {
    stall_after_ms > 0
        && session.state == SessionState::Open
        && session.agent_state == AgentState::Working
        && session.stalled_at.is_none()
        && session
            .agent_heard_at
            .is_some_and(|heard| now - heard >= stall_after_ms)
}

/// The broker announces a silent agent (an `agent` event, once; else
/// nothing): `away` when it [`lapsed`], `stalled` when it [`stalls`]. The
/// reported state stays as it was, so that only a host's own `away` counts
/// as its agent leaving ([`crate::decide::turn::holder_gone`]) and a
/// stalled turn is never released by time. For `away`, `agent_since`
/// becomes the moment it was shown away, which marks the change as
/// announced; for `stalled`, `stalled_at`. The next report announces the
/// agent back. A stall is also told, once, to the Lark chat the session is
/// linked to (`lark_chat`), as a short note naming the session.
pub fn lapse(
    session: Option<SessionRow>,
    lark_chat: Option<String>,
    stall_after_ms: i64,
    now: i64,
) -> Result<Decided<Reported>> {
    let mut session = existing(session)?;
    let heard = session.agent_heard_at.unwrap_or_default();
    let (state, at) = if lapsed(&session, now) {
        let away_at = heard + AWAY_AFTER_MS;
        session.agent_since = Some(away_at);
        (AgentState::Away, away_at)
    } else if stalls(&session, stall_after_ms, now) {
        let stalled_at = heard + stall_after_ms;
        session.stalled_at = Some(stalled_at);
        (AgentState::Stalled, stalled_at)
    } else {
        return Ok(Decided::nothing(Reported {
            session,
            changed: false,
        }));
    };
    let event = log(&mut session, Subject::Agent, state.as_str(), at);
    let note = lark_chat
        .filter(|_| state == AgentState::Stalled)
        .map(|chat_id| NewNote {
            // One per stall: the event's number keys it.
            message_id: format!("stalled-{}-{}", session.session_id, event.event_no),
            chat_id,
            text: Note::Stalled(SessionName::of(&session)).to_string(),
            session_id: Some(session.session_id.clone()),
            reply: false,
            at: now,
        });
    Ok(Decided {
        writes: Writes {
            session: Some(session.clone()),
            event: Some(event),
            note,
            ..Writes::default()
        },
        answer: Reported {
            session,
            changed: true,
        },
    })
}

/// The host's agent waits for someone at its terminal, in this order:
/// unknown session 404; another host 403 `host_mismatch`; closed 409
/// `session_closed`. Logged as a `notification` event (its text is never
/// stored); the host counts as heard from.
pub fn notify(
    session: Option<SessionRow>,
    host: &HostIdentity,
    kind: NotificationKind,
    now: i64,
) -> Result<Decided<SessionRow>> {
    let mut session = hosted(session, host)?;
    open(&session)?;
    session.agent_heard_at = Some(now);
    let event = log(&mut session, Subject::Notification, kind.as_str(), now);
    Ok(Decided {
        writes: Writes {
            session: Some(session.clone()),
            event: Some(event),
            ..Writes::default()
        },
        answer: session,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::tests::{host, session};
    use crate::error::ErrorCode;
    use crate::model::SessionState;

    fn rows(session: SessionRow) -> ReportRows {
        ReportRows {
            session: Some(session),
            ..ReportRows::default()
        }
    }

    fn reported(row: SessionRow, state: AgentState, now: i64) -> Decided<Reported> {
        let said = Report {
            state: Some(state),
            ..Report::default()
        };
        decided(&row, &said, now)
    }

    /// What `said` at `now` decides on `row`, by its host.
    fn decided(row: &SessionRow, said: &Report, now: i64) -> Decided<Reported> {
        report(rows(row.clone()), &host("h"), said, &Minter::default(), now).expect("a report")
    }

    #[test]
    fn a_parked_claim_only_keeps_an_attached_agent_heard_from() {
        let heard = |row: &SessionRow, now| {
            report(
                rows(row.clone()),
                &host("h"),
                &Report::default(),
                &Minter::default(),
                now,
            )
        };
        let fresh = session(SessionState::Open);
        assert!(
            heard(&fresh, 5).unwrap().writes.session.is_none(),
            "away stays away"
        );
        let waiting = reported(fresh, AgentState::Waiting, 1_000).answer.session;
        assert!(heard(&waiting, 2_000).unwrap().writes.session.is_none());
        let refreshed = heard(&waiting, 1_000 + HEARD_REFRESH_MS).unwrap();
        assert!(!refreshed.answer.changed && refreshed.writes.event.is_none());
        let back = heard(&waiting, 1_000 + AWAY_AFTER_MS + 1).unwrap();
        assert!(back.answer.changed);
        assert_eq!(back.writes.event.expect("an event").state, "waiting");
    }

    #[test]
    fn a_change_is_logged_a_repeat_only_refreshes_and_silence_shows_away() {
        let fresh = session(SessionState::Open);
        assert_eq!(shown(&fresh, 100), (AgentState::Away, 0));
        let first = reported(fresh, AgentState::Waiting, 1_000);
        assert!(first.answer.changed);
        let event = first.writes.event.expect("an agent event");
        assert_eq!(
            (event.kind, event.state, event.event_no),
            ("agent", "waiting", 9)
        );
        let row = first.answer.session;
        assert_eq!(shown(&row, 2_000), (AgentState::Waiting, 1_000));
        let again = reported(row.clone(), AgentState::Waiting, 2_000);
        assert!(!again.answer.changed && again.writes.session.is_none());
        let later = reported(row.clone(), AgentState::Waiting, 1_000 + HEARD_REFRESH_MS);
        assert!(!later.answer.changed && later.writes.event.is_none());
        assert_eq!(
            later.writes.session.expect("a refresh").agent_heard_at,
            Some(61_000)
        );
        let silent = 1_000 + AWAY_AFTER_MS;
        assert_eq!(shown(&row, silent), (AgentState::Away, silent));
        let back = reported(row, AgentState::Working, silent + 5);
        assert!(back.answer.changed);
        assert_eq!(
            shown(&back.answer.session, silent + 6),
            (AgentState::Working, silent + 5)
        );
    }

    #[test]
    fn a_silent_agent_is_announced_away_once_and_back_on_its_next_report() {
        let row = reported(session(SessionState::Open), AgentState::Waiting, 1_000)
            .answer
            .session;
        assert!(
            lapse(Some(row.clone()), None, 0, 1_000 + AWAY_AFTER_MS - 1)
                .unwrap()
                .writes
                .event
                .is_none()
        );
        let now = 5_000 + AWAY_AFTER_MS;
        let gone = lapse(Some(row), None, 0, now).unwrap();
        let event = gone.writes.event.expect("an agent event");
        assert_eq!((event.state, event.at), ("away", 1_000 + AWAY_AFTER_MS));
        let row = gone.answer.session;
        // Still `waiting` as reported: only the host's own away is leaving.
        assert_eq!(row.agent_state, AgentState::Waiting);
        assert_eq!(shown(&row, now), (AgentState::Away, 1_000 + AWAY_AFTER_MS));
        assert!(!lapsed(&row, now + 1));
        assert!(
            lapse(Some(row.clone()), None, 0, now + 1)
                .unwrap()
                .writes
                .event
                .is_none()
        );
        let back = reported(row, AgentState::Working, now + 2);
        assert_eq!(back.writes.event.expect("back").state, "working");
    }

    #[test]
    fn a_silent_working_agent_stalls_once_never_goes_away_and_its_next_event_clears_it() {
        const AFTER: i64 = 2_000;
        let row = reported(session(SessionState::Open), AgentState::Working, 1_000)
            .answer
            .session;
        let early = lapse(Some(row.clone()), None, AFTER, 1_000 + AFTER - 1).unwrap();
        assert!(early.writes.event.is_none(), "not silent long enough");
        assert!(
            lapse(Some(row.clone()), None, 0, 1_000 + AWAY_AFTER_MS)
                .unwrap()
                .writes
                .event
                .is_none(),
            "with stalls off, a working agent is neither stalled nor away"
        );
        assert_eq!(
            shown(&row, 1_000 + AWAY_AFTER_MS * 3).0,
            AgentState::Working
        );
        let stalled = lapse(Some(row), Some("oc_chat".into()), AFTER, 9_000).unwrap();
        let note = stalled
            .writes
            .note
            .as_ref()
            .expect("the linked chat is told");
        assert_eq!((note.chat_id.as_str(), note.reply), ("oc_chat", false));
        let event = stalled.writes.event.expect("an agent event");
        assert_eq!((event.state, event.at), ("stalled", 1_000 + AFTER));
        let row = stalled.answer.session;
        assert_eq!(
            row.agent_state,
            AgentState::Working,
            "its turn stays its own"
        );
        assert_eq!(shown(&row, 9_000), (AgentState::Stalled, 1_000 + AFTER));
        assert_eq!(row.projection().agent.delivery, Delivery::Later);
        let again = lapse(Some(row.clone()), None, AFTER, 9_000 + AWAY_AFTER_MS).unwrap();
        assert!(again.writes.event.is_none(), "announced once, and not away");
        let waker = Report {
            typing_in: Some(true),
            ..Report::default()
        };
        let typed = decided(&row, &waker, 9_500).answer.session;
        assert_eq!(
            shown(&typed, 9_500).0,
            AgentState::Stalled,
            "a waker's word is no hook event"
        );
        let back = reported(row, AgentState::Working, 10_000);
        assert!(back.answer.changed);
        assert_eq!(back.writes.event.expect("cleared").state, "working");
        assert_eq!(back.answer.session.stalled_at, None);
    }

    #[test]
    fn an_interrupt_cancels_the_turn_the_working_agent_had_and_its_claim_is_spent() {
        use crate::decide::{Change, ClaimRow, ClaimState};
        use crate::model::{CancelReason, Origin, TurnState};
        let mut row = reported(session(SessionState::Open), AgentState::Working, 1_000)
            .answer
            .session;
        row.active_claim_id = Some("hook-1".into());
        let turn = TurnRow {
            state: TurnState::Claimed,
            current_claim_id: Some("hook-1".into()),
            ..TurnRow::new("turn_a".into(), &row, Origin::Web, "hi".into(), 1_000)
        };
        let claim = ClaimRow {
            claim_id: "hook-1".into(),
            session_id: row.session_id.clone(),
            turn_id: "turn_a".into(),
            attempt: 1,
            state: ClaimState::Active,
            claimed_at: 1_000,
            released_at: None,
        };
        let interrupted = Report {
            state: Some(AgentState::Waiting),
            interrupted: true,
            ..Report::default()
        };
        let rows = |row: &SessionRow| ReportRows {
            session: Some(row.clone()),
            interrupted: Some((claim.clone(), turn.clone())),
            ..ReportRows::default()
        };
        let decided = report(
            rows(&row),
            &host("h"),
            &interrupted,
            &Minter::default(),
            2_000,
        )
        .expect("reported");
        let step = decided.writes.before.as_deref().expect("the turn's step");
        let Some(Change::Update(cancelled)) = &step.turn else {
            panic!("the turn is written")
        };
        assert_eq!(cancelled.state, TurnState::Cancelled);
        assert_eq!(cancelled.cancel_reason, Some(CancelReason::Interrupted));
        let Some(Change::Update(spent)) = &step.claim else {
            panic!("the claim is written")
        };
        assert_eq!(spent.state, ClaimState::Released);
        let after = &decided.answer.session;
        assert_eq!(after.active_claim_id, None);
        assert_eq!(after.agent_state, AgentState::Waiting);
        // The turn's event, then the agent's: numbered in that order.
        let turn_event = step.event.as_ref().expect("logged");
        let agent_event = decided.writes.event.as_ref().expect("logged");
        assert_eq!(
            (turn_event.state, agent_event.state),
            ("cancelled", "waiting")
        );
        assert_eq!(agent_event.event_no, turn_event.event_no + 1);
        // An agent shown waiting already was not working on anything.
        let again = report(
            rows(after),
            &host("h"),
            &interrupted,
            &Minter::default(),
            3_000,
        )
        .expect("reported");
        assert!(again.writes.before.is_none(), "nothing cancelled");
        // Only with `waiting`, and alone.
        let wrong = ReportAgentState {
            state: Some(AgentState::Working),
            interrupted: true,
            ..crate::decide::tests::report_of("h")
        };
        assert_eq!(
            Report::checked(&wrong).unwrap_err().code,
            ErrorCode::InvalidRequest
        );
    }

    fn working() -> Report {
        Report {
            state: Some(AgentState::Working),
            ..Report::default()
        }
    }

    #[test]
    fn a_waker_makes_an_idle_agent_typed_into_until_it_stops_or_falls_silent() {
        let waiting = reported(session(SessionState::Open), AgentState::Waiting, 1_000)
            .answer
            .session;
        assert_eq!(
            delivery(&waiting, AgentState::Waiting, 1_000),
            Delivery::Later
        );
        let typing = |row: &SessionRow, on: bool, now| {
            let said = Report {
                typing_in: Some(on),
                ..Report::default()
            };
            decided(row, &said, now)
        };
        let started = typing(&waiting, true, 2_000);
        assert!(started.writes.event.is_none(), "the state stands");
        let row = started.writes.session.expect("the mark written");
        assert_eq!(
            delivery(&row, AgentState::Waiting, 2_000),
            Delivery::TypedNow
        );
        assert_eq!(
            delivery(&row, AgentState::Working, 2_000),
            Delivery::EndOfTurn
        );
        assert!(
            typing(&row, true, 3_000).writes.session.is_none(),
            "fresh: nothing written"
        );
        let later = 2_000 + WAKER_FRESH_MS;
        assert_eq!(delivery(&row, AgentState::Waiting, later), Delivery::Later);
        // Its heartbeats keep the idle agent from being shown away.
        let kept = typing(&row, true, 2_000 + AWAY_AFTER_MS - 1).answer.session;
        assert_eq!(
            shown(&kept, 2_000 + AWAY_AFTER_MS + 1).0,
            AgentState::Waiting
        );
        let stopped = typing(&kept, false, 2_000 + AWAY_AFTER_MS).answer.session;
        assert_eq!(stopped.waker_heard_at, None);
        assert_eq!(
            stopped.agent_heard_at, kept.agent_heard_at,
            "says nothing of the agent"
        );
    }

    #[test]
    fn the_current_tool_is_written_at_most_every_two_seconds_and_ends_with_the_turn() {
        let tool = |row: &SessionRow, name: &str, now| {
            let said = Report {
                tool: Some(name.into()),
                ..working()
            };
            decided(row, &said, now)
        };
        let row = reported(session(SessionState::Open), AgentState::Working, 1_000)
            .answer
            .session;
        let bash = tool(&row, "Bash", 10_000);
        assert!(bash.writes.event.is_some(), "the page hears of it");
        let row = bash.writes.session.expect("written");
        assert_eq!(
            (row.agent_tool.as_deref(), row.tool_since),
            (Some("Bash"), Some(10_000))
        );
        assert_eq!(
            row.agent_since,
            Some(1_000),
            "still working since the turn began"
        );
        // A tool loop: the end and the next start within 2 s write nothing.
        assert!(tool(&row, "", 10_500).writes.session.is_none());
        assert!(tool(&row, "Bash", 10_600).writes.session.is_none());
        let edit = tool(&row, "Edit", 12_100)
            .writes
            .session
            .expect("due again");
        assert_eq!(edit.agent_tool.as_deref(), Some("Edit"));
        let ended = reported(edit, AgentState::Waiting, 13_000).answer.session;
        assert_eq!(ended.agent_tool, None);
        assert_eq!(ended.projection().agent.tool, None);
    }

    #[test]
    fn only_the_bound_host_reports_on_an_open_session() {
        let refused = |row: Option<SessionRow>, id: &str| {
            let rows = ReportRows {
                session: row,
                ..ReportRows::default()
            };
            report(rows, &host(id), &working(), &Minter::default(), 1)
                .expect_err("a refusal")
                .code
        };
        assert_eq!(refused(None, "h"), ErrorCode::NotFound);
        assert_eq!(
            refused(Some(session(SessionState::Open)), "x"),
            ErrorCode::HostMismatch
        );
        assert_eq!(
            refused(Some(session(SessionState::Closed)), "h"),
            ErrorCode::SessionClosed
        );
        let idle = NotificationKind::IdlePrompt;
        let told = notify(Some(session(SessionState::Open)), &host("h"), idle, 7).unwrap();
        let event = told.writes.event.expect("an event");
        assert_eq!((event.kind, event.state), ("notification", "idle_prompt"));
        let stranger = notify(Some(session(SessionState::Open)), &host("x"), idle, 7);
        assert_eq!(
            stranger.expect_err("a refusal").code,
            ErrorCode::HostMismatch
        );
    }
}
