//! One bot, many sessions, over the fake Lark's long connection: three
//! sessions paired into one chat, `/list` numbering them with presence,
//! `/use N` switching, plain messages going to the current one, a reply to
//! a session's answer going to that session whichever is current, answers
//! and permission cards naming their session, a tap on a card (or a typed
//! `no <id>`) answering its own session's request, commands taken once
//! across redeliveries and a restart, and a close leaving the chat's list
//! with one note.

use std::time::Duration;

use serde_json::{Value, json};

use crate::fake_lark::*;
use crate::lark_cards::{card_for, click};
use crate::lark_pairing::{SENDER, answer_to, code_for, connected, deliver, said};
use crate::support::*;
use loopx::model::{PermissionState, ReplyState};

const CHAT: &str = "oc_many";

/// A session's name as the bot shows it.
fn name(host: &Host) -> String {
    format!("{} · {}", host.goal_id, host.agent_id)
}

/// Three sessions paired into [`CHAT`] in order: the last is current.
async fn three(fake: &FakeLark, broker: &TestBroker) -> Vec<Host> {
    let mut hosts = Vec::new();
    for i in 0..3 {
        let host = bound_host(&broker.client).await;
        let code = code_for(broker, &host).await;
        let message = format!("om_link{i}");
        let text = format!("/link {code}");
        deliver(fake, &said(&format!("ev_link{i}"), CHAT, &message, &text)).await;
        let (title, _) = answer_to(fake, &message).await;
        assert!(
            title.starts_with("Linked") && title.contains(&name(&host)),
            "{title}"
        );
        hosts.push(host);
    }
    hosts
}

/// A message in [`CHAT`] that replies to the bot's message `parent`.
fn reply_to(event_id: &str, message_id: &str, parent: &str, text: &str) -> Value {
    let mut event = said(event_id, CHAT, message_id, text);
    event["event"]["message"]["parent_id"] = json!(parent);
    event["event"]["message"]["root_id"] = json!(parent);
    event
}

/// The texts of the host's turns, in order.
async fn texts(broker: &TestBroker, host: &Host) -> Vec<String> {
    all_turns(&broker.client, host)
        .await
        .into_iter()
        .map(|t| t.text)
        .collect()
}

/// Sends `/list` as `message_id` and answers the list's lines.
async fn list(fake: &FakeLark, event_id: &str, message_id: &str) -> Vec<String> {
    deliver(fake, &said(event_id, CHAT, message_id, "/list")).await;
    let (title, text) = answer_to(fake, message_id).await;
    assert!(title.starts_with("Sessions"), "{title}");
    text.lines().map(str::to_owned).collect()
}

/// Answers the host's queued turn, Lark's message `message_id`, with
/// `answer`; waits until the answer's card went out (its turn's reply
/// `sent`), and gives the card's request.
async fn answered(
    fake: &FakeLark,
    broker: &TestBroker,
    host: &Host,
    message_id: &str,
) -> ReplyRequest {
    let c = &broker.client;
    let claim_id = unique("claim");
    let turn = claim(c, host, &claim_id, 0).await.turn;
    let done = host.completion(&claim_id, &unique("done"), "the answer");
    c.complete(host.session_id(), &turn.turn_id, &done)
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let read = c.turn(host.session_id(), &turn.turn_id).await.unwrap().body;
        if read.reply.as_ref().map(|r| r.state) == Some(ReplyState::Sent) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{read:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    fake.replies_to(message_id).remove(0)
}

#[tokio::test]
async fn lark_sessions_a_chat_holds_three_and_replies_find_theirs() {
    let (fake, broker) = connected().await;
    let hosts = three(&fake, &broker).await;
    // The third agent is at work, running a tool.
    let working = loopx::model::ReportAgentState {
        tool: Some("Bash".into()),
        ..crate::presence::report(&hosts[2], loopx::model::AgentState::Working)
    };
    broker
        .client
        .report_agent(hosts[2].session_id(), &working)
        .await
        .unwrap();
    let lines = list(&fake, "ev_l1", "om_l1").await;
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(
        lines[2].contains("): working (Bash) · current"),
        "{}",
        lines[2]
    );
    for (i, (line, host)) in lines.iter().zip(&hosts).enumerate().take(2) {
        assert!(
            line.starts_with(&format!(
                "{}. **{}** ({HOST_SURFACE}): away",
                i + 1,
                name(host)
            )),
            "{line}"
        );
        assert!(!line.contains("current"), "{line}");
        // An agent away may have exited: how to bring it back (issue 55).
        assert!(line.contains("if it exited: `codex resume`"), "{line}");
    }

    // Session 1 asks and answers: its answer's card names it.
    deliver(&fake, &said("ev_u1", CHAT, "om_u1", "/use 1")).await;
    let (title, _) = answer_to(&fake, "om_u1").await;
    assert!(title.contains(&name(&hosts[0])), "{title}");
    deliver(&fake, &said("ev_q1", CHAT, "om_q1", "question one")).await;
    assert_eq!(texts(&broker, &hosts[0]).await, ["question one"]);
    let card = answered(&fake, &broker, &hosts[0], "om_q1").await;
    assert_eq!(
        card.content["header"]["title"]["content"],
        name(&hosts[0]),
        "{}",
        card.content
    );

    // Session 2 current (by a prefix of its agent): plain messages go there.
    let prefix = &hosts[1].agent_id[..hosts[1].agent_id.len() - 3];
    deliver(
        &fake,
        &said("ev_u2", CHAT, "om_u2", &format!("/use {prefix}")),
    )
    .await;
    assert!(answer_to(&fake, "om_u2").await.0.contains(&name(&hosts[1])));
    deliver(&fake, &said("ev_u3", CHAT, "om_u3", "/use 2")).await;
    assert!(answer_to(&fake, "om_u3").await.0.contains(&name(&hosts[1])));
    let lines = list(&fake, "ev_l2", "om_l2").await;
    assert!(lines[1].contains("current") && !lines[2].contains("current"));
    deliver(&fake, &said("ev_m2", CHAT, "om_m2", "hello two")).await;
    assert_eq!(texts(&broker, &hosts[1]).await, ["hello two"]);

    // A reply to session 1's answer goes to session 1, though 2 is current.
    let event = reply_to("ev_r1", "om_r1", &card.posted_id, "follow-up");
    deliver(&fake, &event).await;
    assert_eq!(
        texts(&broker, &hosts[0]).await,
        ["question one", "follow-up"]
    );
    // So does a reply to the question session 1 took (in its thread).
    deliver(&fake, &reply_to("ev_r2", "om_r2", "om_q1", "more on one")).await;
    assert_eq!(
        texts(&broker, &hosts[0]).await,
        ["question one", "follow-up", "more on one"]
    );
    // A reply to session 3's "Linked" note goes to session 3.
    let linked = fake.replies_to("om_link2").remove(0).posted_id;
    deliver(&fake, &reply_to("ev_r3", "om_r3", &linked, "to three")).await;
    assert_eq!(texts(&broker, &hosts[2]).await, ["to three"]);
    // A reply to a message the broker never sent goes to the current one;
    // `//clear` reaches the agent as `/clear`.
    deliver(&fake, &reply_to("ev_r4", "om_r4", "om_unknown", "//clear")).await;
    assert_eq!(texts(&broker, &hosts[1]).await, ["hello two", "/clear"]);
    assert_eq!(texts(&broker, &hosts[0]).await.len(), 3);
    assert_eq!(texts(&broker, &hosts[2]).await.len(), 1);
}

#[tokio::test]
async fn lark_sessions_cards_name_their_session_and_a_tap_answers_its_own() {
    let (fake, broker) = connected().await;
    let hosts = three(&fake, &broker).await;
    deliver(&fake, &said("ev_u", CHAT, "om_u", "/use 2")).await;
    answer_to(&fake, "om_u").await;
    let c = &broker.client;
    let request_id = unique("perm");
    let permission = loopx::model::CreatePermissionRequest {
        host_surface: HOST_SURFACE.into(),
        host_session_id: hosts[0].host_session_id.clone(),
        request_id: request_id.clone(),
        tool_name: "Bash".into(),
        description: "list".into(),
        input_preview: "ls".into(),
        ..Default::default()
    };
    c.create_permission(hosts[0].session_id(), &permission)
        .await
        .unwrap();
    let card = card_for(&fake, CHAT, &request_id).await;
    let title = card.content["header"]["title"]["content"].as_str().unwrap();
    assert!(
        title.starts_with("Permission request") && title.ends_with(&name(&hosts[0])),
        "{title}"
    );
    let ack = fake
        .ws
        .deliver(&click(&card, "allow", SENDER, CHAT), 1)
        .await;
    assert_eq!(ack.code, 200, "{ack:?}");
    let final_title = ack.data["card"]["data"]["header"]["title"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        final_title.starts_with("Allowed") && final_title.ends_with(&name(&hosts[0])),
        "{}",
        ack.data
    );
    let read = c.permission(hosts[0].session_id(), &request_id).await;
    assert_eq!(read.unwrap().body.state, PermissionState::Allowed);
    // `no <id>` typed in the chat (no reply) finds the session that asked.
    let second = loopx::model::CreatePermissionRequest {
        request_id: unique("perm"),
        ..permission
    };
    c.create_permission(hosts[0].session_id(), &second)
        .await
        .unwrap();
    let text = format!("no {}", second.request_id);
    deliver(&fake, &said("ev_no", CHAT, "om_no", &text)).await;
    let read = c
        .permission(hosts[0].session_id(), &second.request_id)
        .await;
    assert_eq!(read.unwrap().body.state, PermissionState::Denied);
    // The current session got nothing of it.
    assert!(texts(&broker, &hosts[1]).await.is_empty());
}

#[tokio::test]
async fn lark_sessions_a_redelivered_command_is_taken_once_across_a_restart() {
    let (fake, mut broker) = connected().await;
    let hosts = three(&fake, &broker).await;
    let first_use = said("ev_x1", CHAT, "om_x1", "/use 1");
    deliver(&fake, &first_use).await;
    answer_to(&fake, "om_x1").await;
    deliver(&fake, &said("ev_x2", CHAT, "om_x2", "/use 2")).await;
    answer_to(&fake, "om_x2").await;
    // The first `/use` again, same event: session 2 stays current.
    deliver(&fake, &first_use).await;
    broker.restart(Some(fake.long_connection_config())).await;
    fake.ws.wait_connected(2, Duration::from_secs(10)).await;
    // After the restart, the same message under a new event id: no change.
    deliver(&fake, &said("ev_x3", CHAT, "om_x1", "/use 1")).await;
    deliver(&fake, &said("ev_x4", CHAT, "om_x4", "still two")).await;
    assert_eq!(texts(&broker, &hosts[1]).await, ["still two"]);
    assert!(texts(&broker, &hosts[0]).await.is_empty());
    assert_eq!(fake.replies_to("om_x1").len(), 1, "answered once");
    broker.stop().await;
}

#[tokio::test]
async fn lark_sessions_a_closed_session_leaves_the_list_and_says_so_once() {
    let (fake, broker) = connected().await;
    let hosts = three(&fake, &broker).await;
    let c = &broker.client;
    c.close(hosts[1].session_id()).await.unwrap();
    let notes = fake
        .wait_for_messages_in(CHAT, 1, Duration::from_secs(10))
        .await;
    let title = notes[0].content["header"]["title"]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(
        title.starts_with("Closed") && title.contains(&name(&hosts[1])),
        "{title}"
    );
    // Closing again changes nothing and says nothing more.
    c.close(hosts[1].session_id()).await.unwrap();
    let lines = list(&fake, "ev_l", "om_l").await;
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].contains(&name(&hosts[0])) && lines[1].contains(&name(&hosts[2])));
    assert!(lines[1].starts_with("2. ") && lines[1].contains("current"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(fake.messages_in(CHAT).len(), 1, "said once");
}

#[tokio::test]
async fn lark_sessions_a_continued_session_keeps_its_place_in_the_chat_and_says_so_once() {
    let (fake, mut broker) = connected().await;
    let c = &broker.client;
    let hosts = three(&fake, &broker).await;
    // The current (third) session's terminal goes on in a new host session
    // (`/clear`): it was bound from that terminal.
    let last = &hosts[2];
    let old_id = last.session_id().to_owned();
    let bind_from = |host_session_id: &str| loopx::model::BindRequest {
        terminal: Some("term-pane-1".into()),
        ..bind_request(&last.goal_id, &last.agent_id, host_session_id)
    };
    let terminal_host = unique("host-term");
    c.register(&thread(&last.goal_id, &last.agent_id, &terminal_host))
        .await
        .unwrap();
    // The third session, as bound from a terminal: another session of the
    // same tuple is bound from it, and linked in its place.
    c.close(&old_id).await.unwrap();
    let from_terminal = c.bind(&bind_from(&terminal_host)).await.unwrap().body;
    let linked = Host {
        session: from_terminal.clone(),
        host_session_id: terminal_host.clone(),
        ..last.clone()
    };
    let code = code_for(&broker, &linked).await;
    deliver(
        &fake,
        &said("ev_relink", CHAT, "om_relink", &format!("/link {code}")),
    )
    .await;
    answer_to(&fake, "om_relink").await;
    let before = fake.messages_in(CHAT).len();

    let next_host = unique("host-after-clear");
    c.register(&thread(&last.goal_id, &last.agent_id, &next_host))
        .await
        .unwrap();
    let next = c.bind(&bind_from(&next_host)).await.unwrap().body;
    assert_eq!(
        next.continued_from.as_deref(),
        Some(from_terminal.session_id.as_str())
    );
    let notes = fake
        .wait_for_messages_in(CHAT, before + 1, Duration::from_secs(10))
        .await;
    let title = notes[before].content["header"]["title"]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(title.starts_with("Continued"), "{title}");
    // Its place in the list, its approvers' chat and the current pick are
    // the new session's: a plain message goes there.
    let lines = list(&fake, "ev_l", "om_l").await;
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(
        lines[2].starts_with("3. ") && lines[2].contains("current"),
        "{lines:?}"
    );
    deliver(&fake, &said("ev_hi", CHAT, "om_hi", "after the clear")).await;
    let new_host = Host {
        session: next.clone(),
        host_session_id: next_host,
        ..last.clone()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while texts(&broker, &new_host).await != ["after the clear"] {
        assert!(
            std::time::Instant::now() < deadline,
            "the message went elsewhere"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let continued = fake
        .messages_in(CHAT)
        .iter()
        .filter(|m| {
            m.content["header"]["title"]["content"]
                .as_str()
                .is_some_and(|t| t.starts_with("Continued"))
        })
        .count();
    assert_eq!(continued, 1, "said once");
    broker.stop().await;
}

#[tokio::test]
async fn lark_sessions_an_interrupted_message_is_told_it_was_not_answered() {
    let (fake, mut broker) = connected().await;
    let c = &broker.client;
    let hosts = three(&fake, &broker).await;
    let host = &hosts[2];
    deliver(&fake, &said("ev_ask", CHAT, "om_ask", "run the slow job")).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while texts(&broker, host).await.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the message never came"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let turn = claim(c, host, "hook-typed", 0).await.turn;
    let working = crate::presence::report(host, loopx::model::AgentState::Working);
    c.report_agent(host.session_id(), &working).await.unwrap();
    let interrupted = loopx::model::ReportAgentState {
        interrupted: true,
        ..crate::presence::report(host, loopx::model::AgentState::Waiting)
    };
    c.report_agent(host.session_id(), &interrupted)
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let read = c.turn(host.session_id(), &turn.turn_id).await.unwrap().body;
        if read.reply.as_ref().map(|r| r.state) == Some(ReplyState::Sent) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{read:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let told = fake.replies_to("om_ask").remove(0);
    let said_text = told.content.to_string();
    assert!(
        said_text.contains("Interrupted at the terminal"),
        "{said_text}"
    );
    broker.stop().await;
}
