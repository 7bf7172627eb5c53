//! Turns typed at the agent's terminal (HOOKS.md "Presence"): the person at
//! the terminal submits a prompt (its UserPromptSubmit hook reports it), the
//! agent ends its turn (its Stop hook reports the last message). Each such
//! prompt is a turn of `origin: "terminal"`, numbered in the session's `seq`
//! like every turn, so the transcript reads in the order things were said;
//! but it is never queued or claimed: recorded `claimed` (the agent works on
//! it; no claim holds it, so none can complete, release or delay it), then
//! `completed` with the agent's answer, or cancelled `unanswered`.
//!
//! The session row names its one open terminal turn (`terminal_turn_id`);
//! a store loads that turn with the session for a report.

use super::pairing::{NewNote, Note, SessionName};
use super::{Change, SessionRow, Subject, TurnRow, Writes, log};
use crate::model::{CancelReason, Origin, TurnState};

/// What the terminal said with a presence report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    /// A prompt the person submitted.
    Prompt(String),
    /// The agent's last message at the end of its turn.
    Answer(String),
}

/// How many prompts a session's terminal may report at once, and then per
/// minute (a person types far slower): the one place of this limit, which
/// the broker enforces per session before the decision (beyond it, 429
/// `too_many_prompts` and nothing recorded). A prompt's size is a
/// message's (1 byte to 64 KiB, [`crate::broker::MAX_TEXT_BYTES`]).
pub const PROMPT_BURST: u32 = 10;
pub const PROMPTS_PER_MINUTE: u32 = 30;

pub use super::notice::FEED_CHARS;

/// The writes of what the terminal `said`, given the session and its open
/// terminal turn (if any): the session as it stands after them (numbering
/// and the open turn updated), and the writes (None: nothing to record).
/// A turn answered is sent as one card to `feed`, the chat whose link asks
/// for terminal turns (if one), keyed by the turn so it is sent once.
pub fn said(
    mut session: SessionRow,
    open: Option<TurnRow>,
    said: &Said,
    feed: Option<String>,
    id: impl FnOnce() -> String,
    now: i64,
) -> (SessionRow, Option<Writes>) {
    let open = open.filter(|turn| {
        turn.state == TurnState::Claimed && session.terminal_turn_id.as_ref() == Some(&turn.turn_id)
    });
    match said {
        Said::Prompt(text) if open.as_ref().is_some_and(|turn| &turn.text == text) => {
            // The same prompt again: its report repeated.
            (session, None)
        }
        Said::Prompt(text) => {
            let before = open.map(|turn| {
                Box::new(ended(
                    &mut session,
                    turn,
                    Err(CancelReason::Unanswered),
                    now,
                ))
            });
            let turn = TurnRow {
                state: TurnState::Claimed,
                claimed_at: Some(now),
                ..TurnRow::new(id(), &session, Origin::Terminal, text.clone(), now)
            };
            session.next_seq += 1;
            session.terminal_turn_id = Some(turn.turn_id.clone());
            let event = log(
                &mut session,
                Subject::Turn(&turn.turn_id, turn.seq),
                "claimed",
                now,
            );
            let writes = Writes {
                before,
                turn: Some(Change::Insert(turn)),
                event: Some(event),
                session: Some(session.clone()),
                ..Writes::default()
            };
            (session, Some(writes))
        }
        Said::Answer(text) => match open {
            Some(turn) => {
                let answer = (!text.trim().is_empty()).then_some(text.as_str());
                let note = feed.zip(answer).map(|(chat_id, answer)| NewNote {
                    message_id: format!("terminal-{}", turn.turn_id),
                    chat_id,
                    text: Note::Terminal {
                        name: SessionName::of(&session),
                        prompt: turn.text.clone(),
                        answer: answer.to_owned(),
                    }
                    .to_string(),
                    session_id: Some(session.session_id.clone()),
                    reply: false,
                    at: now,
                });
                let writes = Writes {
                    note,
                    ..ended(
                        &mut session,
                        turn,
                        answer.ok_or(CancelReason::Unanswered),
                        now,
                    )
                };
                (session, Some(writes))
            }
            None => (session, None),
        },
    }
}

/// The person interrupted the agent while it worked on the open terminal
/// turn: cancelled `interrupted`.
pub fn interrupted(session: &mut SessionRow, turn: TurnRow, now: i64) -> Writes {
    ended(session, turn, Err(CancelReason::Interrupted), now)
}

/// The open terminal turn ended: completed with its answer, or cancelled
/// for the reason given.
fn ended(
    session: &mut SessionRow,
    turn: TurnRow,
    answer: std::result::Result<&str, CancelReason>,
    now: i64,
) -> Writes {
    let turn = match answer {
        Ok(answer) => TurnRow {
            state: TurnState::Completed,
            completed_at: Some(now),
            response: Some(serde_json::json!({ "message": answer }).to_string()),
            ..turn
        },
        Err(reason) => TurnRow {
            state: TurnState::Cancelled,
            cancel_reason: Some(reason),
            ..turn
        },
    };
    session.terminal_turn_id = None;
    let state = match turn.state {
        TurnState::Completed => "completed",
        _ => "cancelled",
    };
    let event = log(session, Subject::Turn(&turn.turn_id, turn.seq), state, now);
    Writes {
        turn: Some(Change::Update(turn)),
        event: Some(event),
        session: Some(session.clone()),
        ..Writes::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::tests::session;
    use crate::model::SessionState;

    fn prompt(row: SessionRow, open: Option<TurnRow>, text: &str) -> (SessionRow, Writes) {
        let said = Said::Prompt(text.into());
        let (row, writes) = super::said(row, open, &said, None, || format!("turn_{text}"), 10);
        (row, writes.expect("a prompt is recorded"))
    }

    fn inserted(writes: &Writes) -> TurnRow {
        match &writes.turn {
            Some(Change::Insert(turn)) => turn.clone(),
            other => panic!("no new turn: {other:?}"),
        }
    }

    #[test]
    fn a_prompt_is_a_turn_in_seq_order_that_its_answer_completes() {
        let row = session(SessionState::Open);
        let (row, writes) = prompt(row, None, "fix the test");
        let turn = inserted(&writes);
        assert_eq!(
            (turn.origin, turn.state, turn.seq),
            (Origin::Terminal, TurnState::Claimed, 4)
        );
        assert_eq!(row.next_seq, 5, "it takes a seq like every turn");
        assert_eq!(row.queued_count, 3, "it is never queued");
        assert_eq!(row.active_claim_id, None, "and never claimed");
        assert_eq!(row.terminal_turn_id.as_deref(), Some("turn_fix the test"));
        let (again, nothing) = super::said(
            row.clone(),
            Some(turn.clone()),
            &Said::Prompt("fix the test".into()),
            None,
            || unreachable!(),
            11,
        );
        assert!(nothing.is_none(), "the same report again records nothing");
        assert_eq!(again, row);
        let (row, writes) = super::said(
            row,
            Some(turn),
            &Said::Answer("Fixed.".into()),
            Some("oc_feed".into()),
            || unreachable!(),
            12,
        );
        let writes = writes.expect("an answer");
        let note = writes.note.as_ref().expect("the feed's chat gets a card");
        assert_eq!(
            (note.chat_id.as_str(), note.message_id.as_str(), note.reply),
            ("oc_feed", "terminal-turn_fix the test", false),
            "one card per turn, keyed by it"
        );
        assert!(note.text.contains("fix the test") && note.text.contains("Fixed."));
        let Some(Change::Update(done)) = writes.turn else {
            panic!("the turn is updated")
        };
        assert_eq!(done.state, TurnState::Completed);
        assert_eq!(done.response.as_deref(), Some(r#"{"message":"Fixed."}"#));
        assert_eq!(row.terminal_turn_id, None);
        let (_, nothing) = super::said(
            row,
            Some(done),
            &Said::Answer("Fixed.".into()),
            Some("oc_feed".into()),
            || unreachable!(),
            13,
        );
        assert!(
            nothing.is_none(),
            "an answer with no open turn records nothing"
        );
    }

    #[test]
    fn a_new_prompt_cancels_the_open_one_unanswered_and_a_blank_answer_too() {
        let (row, first) = prompt(session(SessionState::Open), None, "one");
        let (row, second) = prompt(row, Some(inserted(&first)), "two");
        let before = second.before.as_deref().expect("the open turn ends first");
        let Some(Change::Update(cancelled)) = &before.turn else {
            panic!("the open turn is updated")
        };
        assert_eq!(cancelled.state, TurnState::Cancelled);
        assert_eq!(cancelled.cancel_reason, Some(CancelReason::Unanswered));
        let events: Vec<_> = [before.event.as_ref(), second.event.as_ref()]
            .into_iter()
            .flatten()
            .map(|e| (e.event_no, e.state))
            .collect();
        assert_eq!(
            events,
            [(10, "cancelled"), (11, "claimed")],
            "numbered in order"
        );
        let (_, blank) = super::said(
            row,
            Some(inserted(&second)),
            &Said::Answer(" \n".into()),
            Some("oc_feed".into()),
            || unreachable!(),
            12,
        );
        let blank = blank.expect("a blank answer ends it");
        assert!(blank.note.is_none(), "nothing answered, nothing sent");
        let Some(Change::Update(unanswered)) = blank.turn else {
            panic!("the turn is updated")
        };
        assert_eq!(unanswered.cancel_reason, Some(CancelReason::Unanswered));
    }
}
