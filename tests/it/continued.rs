//! One conversation per terminal (HOOKS.md "The terminal's real life"): a
//! new host session bound from the terminal of an open session (`/clear`,
//! a restart in the same pane) continues it, in one transaction; another
//! terminal's stays its own. Against a real broker, on SQLite and again on
//! PostgreSQL.

use loopx::model::{BindRequest, SessionState, TurnState};

use crate::events::{states, subscribe, take};
use crate::support::*;

/// Registers and binds `host_session_id` of the goal and agent, from
/// `terminal`.
async fn bound_from(
    c: &loopx::client::Client,
    goal_id: &str,
    agent_id: &str,
    host_session_id: &str,
    terminal: &str,
) -> (u16, Host) {
    c.register(&thread(goal_id, agent_id, host_session_id))
        .await
        .unwrap();
    let bound = c
        .bind(&BindRequest {
            terminal: Some(terminal.into()),
            ..bind_request(goal_id, agent_id, host_session_id)
        })
        .await
        .unwrap();
    let host = Host {
        goal_id: goal_id.into(),
        agent_id: agent_id.into(),
        host_session_id: host_session_id.into(),
        session: bound.body,
    };
    (bound.reply.status.as_u16(), host)
}

#[tokio::test]
async fn a_new_host_session_in_the_same_terminal_continues_the_open_one_in_order() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let (goal, agent) = (unique("goal"), unique("agent"));
    let (_, old) = bound_from(c, &goal, &agent, &unique("host-a"), "term-pane-1").await;
    let old_id = old.session_id().to_owned();
    let first = enqueue(c, &old, "first, held when /clear came").await;
    let second = enqueue(c, &old, "second").await;
    let third = enqueue(c, &old, "third").await;
    claim(c, &old, "hook-held", 0).await;
    // Another pane of the same project: a session of its own throughout.
    let (_, other_pane) = bound_from(c, &goal, &agent, &unique("host-b"), "term-pane-2").await;
    assert_ne!(other_pane.session_id(), old_id);
    let mut old_events = subscribe(&broker.url, TOKEN, &old_id, None).await;

    let (status, new) = bound_from(c, &goal, &agent, &unique("host-c"), "term-pane-1").await;
    assert_eq!(status, 201);
    let new_id = new.session_id().to_owned();
    assert_eq!(new.session.continued_from.as_deref(), Some(old_id.as_str()));
    assert_eq!(new.session.continued_in, None);

    // The old one: closed, naming the new; its held turn released first.
    assert_eq!(
        states(&take(&mut old_events, 2).await),
        ["turn:released", "session:closed"]
    );
    let closed = c.session(&old_id).await.unwrap().body;
    assert_eq!(closed.state, SessionState::Closed);
    assert_eq!(closed.continued_in.as_deref(), Some(new_id.as_str()));
    assert!(all_turns(c, &old).await.is_empty(), "every turn moved");
    // Its claim is spent: the old host's late answer is refused.
    let late = c
        .complete(
            &old_id,
            &first.turn_id,
            &old.completion("hook-held", "late", "x"),
        )
        .await;
    assert!(late.is_err());

    // The new one: the three turns, in order, with their seq; its log
    // replays them queued; its numbering goes on.
    let moved: Vec<_> = all_turns(c, &new)
        .await
        .into_iter()
        .map(|t| (t.turn_id, t.seq, t.state))
        .collect();
    assert_eq!(
        moved,
        [
            (first.turn_id.clone(), first.seq, TurnState::Queued),
            (second.turn_id.clone(), second.seq, TurnState::Queued),
            (third.turn_id.clone(), third.seq, TurnState::Queued),
        ]
    );
    let mut new_events = subscribe(&broker.url, TOKEN, &new_id, Some(0)).await;
    assert_eq!(
        states(&take(&mut new_events, 3).await),
        ["turn:queued", "turn:queued", "turn:queued"]
    );
    let fourth = enqueue(c, &new, "after /clear").await;
    assert_eq!(fourth.seq, third.seq + 1);
    for expected in [&first, &second, &third, &fourth] {
        let claimed = claim(c, &new, &unique("hook"), 0).await;
        assert_eq!(claimed.turn.turn_id, expected.turn_id);
        c.complete(
            &new_id,
            &claimed.turn.turn_id,
            &new.completion(&claimed.claim_id, &unique("done"), "ok"),
        )
        .await
        .unwrap();
    }

    // Bound again: the same session; the other pane's untouched.
    let (again, same) = bound_from(c, &goal, &agent, &new.host_session_id, "term-pane-1").await;
    assert_eq!((again, same.session_id()), (200, new_id.as_str()));
    let untouched = c.session(other_pane.session_id()).await.unwrap().body;
    assert_eq!(
        (untouched.state, untouched.continued_in),
        (SessionState::Open, None)
    );
}

#[tokio::test]
async fn a_terminal_is_checked_and_without_one_a_bind_continues_nothing() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let (goal, agent) = (unique("goal"), unique("agent"));
    let (_, old) = bound_from(c, &goal, &agent, &unique("host-a"), "term-1").await;
    enqueue(c, &old, "waits").await;
    let host = unique("host-b");
    c.register(&thread(&goal, &agent, &host)).await.unwrap();
    let bad = BindRequest {
        terminal: Some("bad\u{7}terminal".into()),
        ..bind_request(&goal, &agent, &host)
    };
    assert_eq!(code(c.bind(&bad).await).0, 400);
    let plain = c.bind(&bind_request(&goal, &agent, &host)).await.unwrap();
    assert_eq!(plain.body.continued_from, None);
    let still = c.session(old.session_id()).await.unwrap().body;
    assert_eq!(still.state, SessionState::Open);
    assert_eq!(all_turns(c, &old).await.len(), 1);
}
