//! Pairing a Lark chat with a session by a one-time code, over the fake
//! Lark's long connection: the owner asks for a code (HTTP, CLI), a person
//! sends `/link <code>` to the bot in a direct chat or a group; the chat is
//! linked, the sender an approver, and the bot answers with a card naming
//! the session. Used, expired and wrong codes change nothing and say so;
//! a chat that keeps guessing is throttled; a redelivered `/link` is taken
//! once.

use std::time::Duration;

use serde_json::{Value, json};

use crate::fake_lark::*;
use crate::support::*;

/// The fake's default sender (`sender.sender_id.open_id`).
pub const SENDER: &str = "ou_84aad35d084aa403a838cf73ee18467";

/// A fake Lark and an in-process broker connected to it over the long connection.
pub async fn connected() -> (FakeLark, TestBroker) {
    let fake = FakeLark::start().await;
    let broker = TestBroker::start_lark(fake.long_connection_config()).await;
    fake.ws.wait_connected(1, Duration::from_secs(10)).await;
    (fake, broker)
}

/// A text message event in `chat_id`; `p2p` for a direct chat with the bot.
pub fn said(event_id: &str, chat_id: &str, message_id: &str, text: &str) -> Value {
    let mut event =
        LarkEvents::new("http://unused", None).text_message(event_id, chat_id, message_id, text);
    if chat_id.starts_with("oc_dm") {
        event["event"]["message"]["chat_type"] = json!("p2p");
    }
    event
}

/// Delivers an event and expects it acknowledged with 200.
pub async fn deliver(fake: &FakeLark, event: &Value) {
    let ack = fake.ws.deliver(event, 1).await;
    assert_eq!(ack.code, 200, "{ack:?}");
}

/// Waits for the bot's one answer to `message_id`: its card's title and text.
pub async fn answer_to(fake: &FakeLark, message_id: &str) -> (String, String) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(reply) = fake.replies_to(message_id).first() {
            let title = reply.content["header"]["title"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            return (title, reply.text.clone());
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no answer to {message_id}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn code_for(broker: &TestBroker, host: &Host) -> String {
    let made = broker
        .client
        .lark_pair_code(host.session_id())
        .await
        .unwrap();
    assert_eq!(made.reply.status.as_u16(), 201);
    assert_eq!(made.body.command, format!("/link {}", made.body.code));
    made.body.code
}

async fn link_of(broker: &TestBroker, host: &Host) -> loopx::model::LarkLink {
    broker
        .client
        .lark_link_status(host.session_id())
        .await
        .unwrap()
        .body
}

fn is_refusal((title, text): &(String, String)) -> bool {
    title.starts_with("Not linked") && text.contains("wrong, used or expired")
}

#[tokio::test]
async fn lark_pairing_links_a_direct_chat_and_a_group_and_the_sender_approves() {
    let (fake, broker) = connected().await;
    let first = bound_host(&broker.client).await;
    let code = code_for(&broker, &first).await;
    assert_eq!(code.len(), 10);
    deliver(
        &fake,
        &said("ev_p1", "oc_dm1", "om_p1", &format!("/link {code}")),
    )
    .await;
    let (title, text) = answer_to(&fake, "om_p1").await;
    let name = format!("{} · {}", first.goal_id, first.agent_id);
    assert!(
        title.starts_with("Linked") && title.contains(&name),
        "{title}"
    );
    assert!(text.contains(&name), "{text}");
    let link = link_of(&broker, &first).await;
    assert_eq!(link.chat_id.as_deref(), Some("oc_dm1"));
    assert_eq!(link.approvers, vec![SENDER.to_owned()]);

    // The same code again, from a group: nothing changes, and the bot says so.
    deliver(
        &fake,
        &said("ev_p2", "oc_grp1", "om_p2", &format!("/link {code}")),
    )
    .await;
    assert!(is_refusal(&answer_to(&fake, "om_p2").await));
    assert_eq!(
        link_of(&broker, &first).await.chat_id.as_deref(),
        Some("oc_dm1")
    );

    // A group, the bot @mentioned, the code typed in lower case with a dash.
    let second = bound_host(&broker.client).await;
    let code = code_for(&broker, &second).await.to_lowercase();
    let typed = format!("@_user_1 /link {}-{}", &code[..5], &code[5..]);
    let mut event = said("ev_p3", "oc_grp1", "om_p3", &typed);
    event["event"]["message"]["mentions"] = json!([{"key": "@_user_1", "name": "LoopX",
        "id": {"open_id": "ou_bot", "union_id": "on_bot", "user_id": null}}]);
    deliver(&fake, &event).await;
    assert!(answer_to(&fake, "om_p3").await.0.starts_with("Linked"));
    let link = link_of(&broker, &second).await;
    assert_eq!(link.chat_id.as_deref(), Some("oc_grp1"));
    assert_eq!(link.approvers, vec![SENDER.to_owned()]);

    // Linked: a message there is the session's turn; the `/link` was none.
    deliver(&fake, &said("ev_p4", "oc_grp1", "om_p4", "hello")).await;
    let turns = all_turns(&broker.client, &second).await;
    assert_eq!(turns.len(), 1);
    assert_eq!(turns[0].text, "hello");
    assert!(all_turns(&broker.client, &first).await.is_empty());
}

#[tokio::test]
async fn lark_pairing_refuses_wrong_and_expired_codes_alike() {
    let (fake, broker) = connected().await;
    let host = bound_host(&broker.client).await;
    deliver(&fake, &said("ev_w1", "oc_w", "om_w1", "/link 0000000000")).await;
    let wrong = answer_to(&fake, "om_w1").await;
    assert!(is_refusal(&wrong), "{wrong:?}");
    deliver(&fake, &said("ev_w2", "oc_w", "om_w2", "/link")).await;
    assert_eq!(answer_to(&fake, "om_w2").await, wrong);

    let old = code_for(&broker, &host).await;
    expire_codes(&broker).await;
    deliver(
        &fake,
        &said("ev_w3", "oc_w", "om_w3", &format!("/link {old}")),
    )
    .await;
    // Expired reads exactly as wrong: which it was is not told.
    assert_eq!(answer_to(&fake, "om_w3").await, wrong);
    assert_eq!(link_of(&broker, &host).await.chat_id, None);
    // A closed session's code is as good as none.
    let late = code_for(&broker, &host).await;
    broker.client.close(host.session_id()).await.unwrap();
    deliver(
        &fake,
        &said("ev_w4", "oc_w", "om_w4", &format!("/link {late}")),
    )
    .await;
    assert_eq!(answer_to(&fake, "om_w4").await, wrong);
    let (status, error) = code(broker.client.lark_pair_code(host.session_id()).await);
    assert_eq!((status, error.as_str()), (409, "session_closed"));
    let (status, error) = code(broker.client.lark_pair_code("ses_nope").await);
    assert_eq!((status, error.as_str()), (404, "not_found"));
}

#[tokio::test]
async fn lark_pairing_throttles_a_chat_that_keeps_guessing() {
    let (fake, broker) = connected().await;
    let host = bound_host(&broker.client).await;
    for i in 0..20 {
        let text = format!("/link {:010}", i);
        deliver(
            &fake,
            &said(&format!("ev_g{i}"), "oc_g", &format!("om_g{i}"), &text),
        )
        .await;
    }
    let (title, text) = answer_to(&fake, "om_g19").await;
    assert!(
        title.starts_with("Not linked") && text.contains("Too many"),
        "{text}"
    );
    assert!(is_refusal(&answer_to(&fake, "om_g0").await));
    // Even a good code is not heard there now; another chat is not throttled.
    let code = code_for(&broker, &host).await;
    deliver(
        &fake,
        &said("ev_g20", "oc_g", "om_g20", &format!("/link {code}")),
    )
    .await;
    assert!(answer_to(&fake, "om_g20").await.1.contains("Too many"));
    assert_eq!(link_of(&broker, &host).await.chat_id, None);
    deliver(
        &fake,
        &said("ev_g21", "oc_g2", "om_g21", &format!("/link {code}")),
    )
    .await;
    assert!(answer_to(&fake, "om_g21").await.0.starts_with("Linked"));
}

#[tokio::test]
async fn lark_pairing_a_redelivered_link_is_taken_once() {
    let (fake, mut broker) = connected().await;
    let host = bound_host(&broker.client).await;
    let code = code_for(&broker, &host).await;
    let event = said("ev_r1", "oc_r", "om_r1", &format!("/link {code}"));
    deliver(&fake, &event).await;
    assert!(answer_to(&fake, "om_r1").await.0.starts_with("Linked"));
    broker.client.lark_unlink(host.session_id()).await.unwrap();
    // The same event again, then the same message under a new event id:
    // neither links again nor answers again.
    deliver(&fake, &event).await;
    deliver(
        &fake,
        &said("ev_r2", "oc_r", "om_r1", &format!("/link {code}")),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(fake.replies_to("om_r1").len(), 1);
    assert_eq!(link_of(&broker, &host).await.chat_id, None);
    broker.stop().await;
}

/// Moves every pairing code's expiry into the past (the API cannot).
async fn expire_codes(broker: &TestBroker) {
    broker
        .execute_sql("update lark_pair_codes set expires_at = 0")
        .await;
}

#[tokio::test]
async fn lark_commands_are_answered_never_queued_and_double_slashes_reach_the_agent() {
    let (fake, broker) = connected().await;
    let host = bound_host(&broker.client).await;
    deliver(&fake, &said("ev_c0", "oc_c", "om_c0", "/list")).await;
    assert!(
        answer_to(&fake, "om_c0")
            .await
            .1
            .contains("linked to no session")
    );
    let code = code_for(&broker, &host).await;
    deliver(
        &fake,
        &said("ev_c1", "oc_c", "om_c1", &format!("/link {code}")),
    )
    .await;
    answer_to(&fake, "om_c1").await;
    let name = format!("{} · {}", host.goal_id, host.agent_id);

    deliver(&fake, &said("ev_c2", "oc_c", "om_c2", "/list")).await;
    let (title, list) = answer_to(&fake, "om_c2").await;
    assert!(title.starts_with("Sessions"), "{title}");
    assert!(list.starts_with(&format!("1. **{name}**")), "{list}");
    assert!(list.contains("away") && list.contains("current"), "{list}");
    deliver(&fake, &said("ev_c3", "oc_c", "om_c3", "/status")).await;
    assert!(answer_to(&fake, "om_c3").await.1.contains(&name));
    deliver(&fake, &said("ev_c4", "oc_c", "om_c4", "/use 1")).await;
    assert!(answer_to(&fake, "om_c4").await.0.contains(&name));
    deliver(&fake, &said("ev_c5", "oc_c", "om_c5", "/use 7")).await;
    assert!(
        answer_to(&fake, "om_c5")
            .await
            .0
            .starts_with("No such session")
    );
    deliver(&fake, &said("ev_c6", "oc_c", "om_c6", "/whatever")).await;
    assert!(answer_to(&fake, "om_c6").await.1.contains("/use N"));
    deliver(&fake, &said("ev_c7", "oc_c", "om_c7", "//clear")).await;
    let turns = all_turns(&broker.client, &host).await;
    assert_eq!(turns.len(), 1, "no command was queued");
    assert_eq!(turns[0].text, "/clear");

    deliver(&fake, &said("ev_c8", "oc_c", "om_c8", "/unlink 1")).await;
    assert!(answer_to(&fake, "om_c8").await.0.starts_with("Unlinked"));
    assert_eq!(link_of(&broker, &host).await.chat_id, None);
    deliver(&fake, &said("ev_c9", "oc_c", "om_c9", "hello")).await;
    assert_eq!(all_turns(&broker.client, &host).await.len(), 1);
}
