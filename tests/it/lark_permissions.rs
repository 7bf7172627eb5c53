//! Permission requests through Lark: a request in a linked session goes out
//! to the chat as a message saying how to answer; `yes <id>` / `no <id>` from
//! an approver of the link answers it and is never a turn; anyone else's is
//! acknowledged and ignored, silently. Runs on SQLite and again on PostgreSQL.

use std::time::Duration;

use loopx::client::Client;
use loopx::model::{AnsweredVia, Behavior, ListTurns, PermissionState};
use serde_json::{Value, json};

use crate::fake_lark::*;
use crate::permissions::{created, request};
use crate::support::*;

pub(crate) const ANN: &str = "ou_84aad35d084aa403a838cf73ee18467";
const BOB: &str = "ou_7d8a6e6df7621556ce0d21922b676706";
const WITHIN: Duration = Duration::from_secs(10);

/// A fake Lark, a broker pointed at it, Lark's event sender, and a bound
/// session linked to a fresh chat with these approvers.
pub(crate) async fn linked(approvers: &[&str]) -> (FakeLark, TestBroker, LarkEvents, Host, String) {
    let fake = FakeLark::start().await;
    let broker = TestBroker::start_lark(fake.config(None)).await;
    let events = LarkEvents::new(&broker.url, None);
    let host = bound_host(&broker.client).await;
    let chat = unique("oc");
    let approvers: Vec<String> = approvers.iter().map(|a| a.to_string()).collect();
    broker
        .client
        .lark_link_approved(host.session_id(), &chat, &approvers)
        .await
        .unwrap();
    (fake, broker, events, host, chat)
}

/// A text message from `sender` in `chat`, with the bot @mentioned first.
pub(crate) fn said(events: &LarkEvents, chat: &str, sender: &str, text: &str) -> Value {
    let content = json!({ "text": format!("@_user_1 {text}") }).to_string();
    let mut event = events.message(&unique("ev"), chat, &unique("om"), "text", &content);
    event["event"]["sender"]["sender_id"]["open_id"] = json!(sender);
    event["event"]["message"]["mentions"] = json!([{
        "key": "@_user_1",
        "id": {"union_id": "on_bot", "user_id": null, "open_id": "ou_bot0000000000000000000000000000"},
        "name": "LoopX Bot",
        "tenant_key": "736588c9260f175e",
    }]);
    event
}

pub(crate) async fn acked(events: &LarkEvents, event: &Value) {
    let ack = events.post(event).await;
    assert_eq!(ack.status, 200, "{ack:?}");
    assert_eq!(ack.body, json!({}), "{ack:?}");
}

async fn state(
    c: &Client,
    host: &Host,
    request_id: &str,
) -> (PermissionState, Option<AnsweredVia>) {
    let read = c
        .permission(host.session_id(), request_id)
        .await
        .unwrap()
        .body;
    (read.state, read.answered_via)
}

async fn turn_count(c: &Client, host: &Host) -> usize {
    c.turns(host.session_id(), &ListTurns::default())
        .await
        .unwrap()
        .body
        .turns
        .len()
}

#[tokio::test]
async fn a_request_in_a_linked_session_is_posted_to_its_chat_once() {
    let (fake, broker, _events, host, chat) = linked(&[ANN]).await;
    let c = &broker.client;
    created(c, &host, "abcde").await;
    let messages = fake.wait_for_messages_in(&chat, 1, WITHIN).await;
    let sent = &messages[0];
    assert_eq!(sent.msg_type, "interactive");
    assert!(sent.bearer.starts_with("t-"), "{sent:?}");
    assert!(
        !sent.uuid.is_empty() && sent.uuid.chars().count() <= 50,
        "{sent:?}"
    );
    for part in [
        "Bash",
        "Remove the build directory",
        "rm -rf build",
        "\"yes abcde\"",
        "\"no abcde\"",
    ] {
        assert!(sent.text.contains(part), "{part} in {:?}", sent.text);
    }

    // The host's replayed create sends nothing more; another request its own.
    let replay = c
        .create_permission(host.session_id(), &request(&host, "abcde", "rm -rf build"))
        .await
        .unwrap();
    assert!(replay.reply.replayed);
    created(c, &host, "fghij").await;
    let messages = fake.wait_for_messages_in(&chat, 2, WITHIN).await;
    assert!(messages[1].text.contains("\"yes fghij\""), "{messages:?}");
    assert_ne!(messages[1].uuid, sent.uuid);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(fake.requests().len(), 2, "{:?}", fake.requests());

    // An unlinked session's request goes nowhere.
    let alone = bound_host(c).await;
    created(c, &alone, "abcde").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(fake.requests().len(), 2, "{:?}", fake.requests());
}

#[tokio::test]
async fn a_failed_request_message_is_retried_with_the_same_uuid() {
    let (fake, broker, _events, host, chat) = linked(&[]).await;
    fake.fail_next([Failure::ServerError]);
    created(&broker.client, &host, "abcde").await;
    fake.wait_for_messages_in(&chat, 1, WITHIN).await;
    let requests = fake.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert_eq!(requests[0].status, 500);
    assert_eq!(requests[0].uuid, requests[1].uuid);
    assert_eq!(fake.messages_in(&chat).len(), 1);
}

#[tokio::test]
async fn an_approvers_answer_decides_the_request_and_is_no_turn() {
    let (fake, broker, events, host, chat) = linked(&[BOB, ANN]).await;
    let c = &broker.client;
    created(c, &host, "abcde").await;
    created(c, &host, "fghij").await;

    let yes = said(&events, &chat, ANN, " Yes  abcde ");
    acked(&events, &yes).await;
    assert_eq!(
        state(c, &host, "abcde").await,
        (PermissionState::Allowed, Some(AnsweredVia::Lark))
    );
    let read = c.permission(host.session_id(), "abcde").await.unwrap().body;
    assert!(read.answered_at.is_some());
    acked(&events, &said(&events, &chat, BOB, "no fghij")).await;
    assert_eq!(
        state(c, &host, "fghij").await,
        (PermissionState::Denied, Some(AnsweredVia::Lark))
    );

    // A redelivery is a no-op; the same answer again is fine; another answer
    // to an answered request changes nothing.
    acked(&events, &yes).await;
    acked(&events, &said(&events, &chat, BOB, "yes abcde")).await;
    acked(&events, &said(&events, &chat, ANN, "no abcde")).await;
    acked(&events, &said(&events, &chat, ANN, "yes fghij")).await;
    assert_eq!(
        state(c, &host, "abcde").await,
        (PermissionState::Allowed, Some(AnsweredVia::Lark))
    );
    assert_eq!(state(c, &host, "fghij").await.0, PermissionState::Denied);
    assert_eq!(
        c.permission(host.session_id(), "abcde")
            .await
            .unwrap()
            .body
            .answered_at,
        read.answered_at
    );
    // The Web page's other answer is refused as for any answered request.
    let web = c
        .answer_permission(host.session_id(), "abcde", Behavior::Deny)
        .await;
    assert_eq!(code(web), (409, "permission_already_answered".into()));

    // None of it became a turn, and nothing was said in the chat about it.
    assert_eq!(turn_count(c, &host).await, 0);
    fake.wait_for_messages_in(&chat, 2, WITHIN).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(fake.requests().len(), 2, "the two request messages only");
}

#[tokio::test]
async fn anyone_elses_answer_changes_nothing_and_says_nothing() {
    let (fake, broker, events, host, chat) = linked(&[ANN]).await;
    let c = &broker.client;
    created(c, &host, "abcde").await;
    fake.wait_for_messages_in(&chat, 1, WITHIN).await;

    // A stranger, an approver naming an unknown request, an approver of
    // another session's request: acknowledged, ignored, not turns.
    let other = bound_host(c).await;
    created(c, &other, "mnopq").await;
    for (sender, text) in [
        (BOB, "yes abcde"),
        (BOB, "no abcde"),
        (ANN, "yes qwert"),
        (ANN, "yes mnopq"),
    ] {
        acked(&events, &said(&events, &chat, sender, text)).await;
    }
    assert_eq!(
        state(c, &host, "abcde").await,
        (PermissionState::Pending, None)
    );
    assert_eq!(
        state(c, &other, "mnopq").await,
        (PermissionState::Pending, None)
    );
    assert_eq!(turn_count(c, &host).await, 0);

    // Ordinary chat that merely starts with yes/no still reaches the agent.
    acked(&events, &said(&events, &chat, BOB, "yes please")).await;
    acked(&events, &said(&events, &chat, ANN, "yes abcde and more")).await;
    assert_eq!(turn_count(c, &host).await, 2);
    assert_eq!(state(c, &host, "abcde").await.0, PermissionState::Pending);

    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(fake.requests().len(), 1, "only the request's own message");
}

#[tokio::test]
async fn without_approvers_nobody_on_lark_can_answer_but_the_web_page_can() {
    let (_fake, broker, events, host, chat) = linked(&[]).await;
    let c = &broker.client;
    created(c, &host, "abcde").await;
    acked(&events, &said(&events, &chat, ANN, "yes abcde")).await;
    assert_eq!(
        state(c, &host, "abcde").await,
        (PermissionState::Pending, None)
    );
    assert_eq!(turn_count(c, &host).await, 0);
    c.answer_permission(host.session_id(), "abcde", Behavior::Allow)
        .await
        .unwrap();
    assert_eq!(
        state(c, &host, "abcde").await,
        (PermissionState::Allowed, Some(AnsweredVia::Owner))
    );
}

#[tokio::test]
async fn web_and_lark_answers_racing_give_one_final_answer() {
    let (_fake, broker, events, host, chat) = linked(&[ANN]).await;
    let c = &broker.client;
    for round in 0..8 {
        let id = format!("race{}", (b'a' + round) as char);
        created(c, &host, &id).await;
        let lark = said(&events, &chat, ANN, &format!("yes {id}"));
        let (web, _) = tokio::join!(
            c.answer_permission(host.session_id(), &id, Behavior::Deny),
            acked(&events, &lark),
        );
        let (final_state, via) = state(c, &host, &id).await;
        match (final_state, via) {
            (PermissionState::Denied, Some(AnsweredVia::Owner)) => {
                assert_eq!(web.unwrap().body.state, PermissionState::Denied);
            }
            (PermissionState::Allowed, Some(AnsweredVia::Lark)) => {
                assert_eq!(code(web), (409, "permission_already_answered".into()));
            }
            other => panic!("one final answer, not {other:?}"),
        }
    }
    assert_eq!(turn_count(c, &host).await, 0);
}
