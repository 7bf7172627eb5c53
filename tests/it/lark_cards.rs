//! Permission requests as Lark cards, against the fake Lark (its webhook
//! client, its long connection and its REST side), through real requests
//! made on the HTTP route: a card with Allow / Deny goes to the linked chat
//! once; an approver's click answers the request (`answered_via: "lark"`)
//! and is answered with the card in its final form; a stranger's click gets
//! a toast and changes nothing; a repeated click changes nothing; a request
//! settled anywhere else updates its card, once, retried on 5xx and not
//! after a final Lark error. Runs on SQLite and again on PostgreSQL.

use std::time::Duration;

use loopx::client::Client;
use loopx::model::{AnsweredVia, Behavior, PermissionRequest, PermissionState};
use serde_json::{Value, json};

use crate::fake_lark::*;
use crate::lark_permissions::{ANN, acked, linked, said};
use crate::permissions::created;
use crate::presence::withdrawal;
use crate::support::*;

const BOB: &str = "ou_7d8a6e6df7621556ce0d21922b676706";
const WITHIN: Duration = Duration::from_secs(10);

/// The card the bot sent to `chat` for request `id` (waits for it).
pub async fn card_for(fake: &FakeLark, chat: &str, id: &str) -> ReplyRequest {
    let deadline = std::time::Instant::now() + WITHIN;
    loop {
        let found = fake
            .messages_in(chat)
            .into_iter()
            .find(|m| buttons(&m.content).iter().any(|b| b["request_id"] == id));
        if let Some(card) = found {
            return card;
        }
        assert!(std::time::Instant::now() < deadline, "no card for {id}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The callback values of a card's buttons.
fn buttons(card: &Value) -> Vec<Value> {
    let elements = card["body"]["elements"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    elements
        .iter()
        .filter(|e| e["tag"] == "column_set")
        .flat_map(|set| set["columns"].as_array().cloned().unwrap_or_default())
        .flat_map(|column| column["elements"].as_array().cloned().unwrap_or_default())
        .filter(|e| e["tag"] == "button")
        .map(|button| button["behaviors"][0]["value"].clone())
        .collect()
}

/// The `card.action.trigger` Lark sends when `operator` clicks the card's
/// button for `behavior` (`allow` or `deny`) in `chat`.
pub fn click(card: &ReplyRequest, behavior: &str, operator: &str, chat: &str) -> Value {
    let value = buttons(&card.content)
        .into_iter()
        .find(|v| v["behavior"] == behavior)
        .expect("the button");
    json!({
        "schema": "2.0",
        "header": {
            "event_id": unique("ev"),
            "event_type": "card.action.trigger",
            "create_time": format!("{}000000", unix_now()),
            "token": VERIFICATION_TOKEN,
            "app_id": APP_ID,
            "tenant_key": "2ca1d211f64f6438",
        },
        "event": {
            "operator": {"open_id": operator, "user_id": null, "tenant_key": "2ca1d211f64f6438"},
            "token": unique("c"),
            "action": {"value": value, "tag": "button"},
            "host": "im_message",
            "context": {"open_message_id": card.posted_id, "open_chat_id": chat},
        },
    })
}

/// Posts a click to the webhook (the app's callback URL): the callback answer.
async fn clicked(events: &LarkEvents, click: &Value) -> Value {
    let ack = events.post(click).await;
    assert_eq!(ack.status, 200, "{ack:?}");
    assert!(ack.elapsed < Duration::from_secs(3), "{ack:?}");
    ack.body
}

/// The card a callback answer puts in place of the clicked one.
fn replacement(answer: &Value) -> &Value {
    assert_eq!(answer["card"]["type"], "raw", "{answer}");
    &answer["card"]["data"]
}

/// A card in its final form: no buttons, saying `what`.
fn assert_final(card: &Value, what: &str) {
    assert_eq!(card["schema"], "2.0", "{card}");
    assert!(buttons(card).is_empty(), "no buttons left: {card}");
    assert!(card.to_string().contains(what), "{what} in {card}");
}

async fn read(c: &Client, host: &Host, id: &str) -> PermissionRequest {
    c.permission(host.session_id(), id).await.unwrap().body
}

/// Waits until the broker has no card update left to make, then a little
/// more, so that counting updates counts them all.
async fn settled_updates(broker: &TestBroker) {
    let store = broker.broker.store();
    let deadline = std::time::Instant::now() + WITHIN;
    loop {
        let due = store
            .due_card_updates(loopx::time::now_ms() + 3_600_000, 10)
            .await
            .unwrap();
        if due.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "updates left: {due:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn a_request_goes_to_its_chat_once_as_a_card_with_two_buttons_naming_it() {
    let (fake, broker, _events, host, chat) = linked(&[ANN]).await;
    let c = &broker.client;
    created(c, &host, "abcde").await;
    let card = card_for(&fake, &chat, "abcde").await;
    assert_eq!(card.msg_type, "interactive");
    assert_eq!(card.content["schema"], "2.0");
    let values = buttons(&card.content);
    assert_eq!(values.len(), 2, "{}", card.content);
    for (value, behavior) in values.iter().zip(["allow", "deny"]) {
        assert_eq!(
            value,
            &json!({"session_id": host.session_id(), "request_id": "abcde", "behavior": behavior})
        );
    }
    assert!(card.text.contains("**Bash**: Remove the build directory"));
    assert!(
        card.text.contains("```\nrm -rf build\n```"),
        "{}",
        card.text
    );

    // The preview is a code block, escaped, never interpreted.
    let mut odd = crate::permissions::request(&host, "fghij", "echo ``` <script>x</script>");
    odd.description = "<b>bold</b>".into();
    c.create_permission(host.session_id(), &odd).await.unwrap();
    let escaped = card_for(&fake, &chat, "fghij").await;
    assert!(
        escaped
            .text
            .contains("````\necho ``` &lt;script&gt;x&lt;/script&gt;\n````"),
        "{}",
        escaped.text
    );
    assert!(!escaped.text.contains('<') || escaped.text.contains("&lt;b&gt;"));

    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(fake.messages_in(&chat).len(), 2, "one card per request");
    assert!(fake.patches().is_empty(), "nothing to update yet");
}

#[tokio::test]
async fn an_approvers_allow_and_deny_decide_and_are_answered_with_the_final_card() {
    let (fake, broker, events, host, chat) = linked(&[BOB, ANN]).await;
    let c = &broker.client;
    created(c, &host, "abcde").await;
    created(c, &host, "fghij").await;
    let allow = card_for(&fake, &chat, "abcde").await;
    let deny = card_for(&fake, &chat, "fghij").await;

    let answer = clicked(&events, &click(&allow, "allow", ANN, &chat)).await;
    assert_eq!(answer["toast"]["type"], "success", "{answer}");
    assert!(
        answer["toast"]["content"]
            .as_str()
            .unwrap()
            .contains("Allowed")
    );
    assert_final(replacement(&answer), "Allowed");
    assert!(
        replacement(&answer)
            .to_string()
            .contains(&format!("<at id={ANN}></at>"))
    );
    let request = read(c, &host, "abcde").await;
    assert_eq!(
        (request.state, request.answered_via),
        (PermissionState::Allowed, Some(AnsweredVia::Lark))
    );

    let answer = clicked(&events, &click(&deny, "deny", BOB, &chat)).await;
    assert_final(replacement(&answer), "Denied");
    assert_eq!(read(c, &host, "fghij").await.state, PermissionState::Denied);

    // The answers to the clicks replaced the cards: no update follows.
    settled_updates(&broker).await;
    assert!(fake.patches().is_empty(), "{:?}", fake.patches());
}

#[tokio::test]
async fn a_strangers_click_changes_nothing_and_a_repeated_click_nothing_more() {
    let (fake, broker, events, host, chat) = linked(&[ANN]).await;
    let c = &broker.client;
    created(c, &host, "abcde").await;
    let card = card_for(&fake, &chat, "abcde").await;

    let answer = clicked(&events, &click(&card, "allow", BOB, &chat)).await;
    assert_eq!(answer["toast"]["type"], "warning", "{answer}");
    assert!(answer.get("card").is_none(), "the card stays: {answer}");
    assert_eq!(
        read(c, &host, "abcde").await.state,
        PermissionState::Pending
    );

    // An approver's click in another chat than the linked one is no answer either.
    let elsewhere = clicked(&events, &click(&card, "allow", ANN, "oc_elsewhere")).await;
    assert!(elsewhere.get("card").is_none(), "{elsewhere}");
    assert_eq!(
        read(c, &host, "abcde").await.state,
        PermissionState::Pending
    );

    let first = click(&card, "deny", ANN, &chat);
    assert_final(replacement(&clicked(&events, &first).await), "Denied");
    let denied = read(c, &host, "abcde").await;
    assert_eq!(denied.state, PermissionState::Denied);
    // The same click again (its event id): nothing changes, nothing answered.
    assert_eq!(clicked(&events, &first).await, json!({}));
    assert_eq!(read(c, &host, "abcde").await, denied);
    // Another click on the answered request shows its final state.
    let late = clicked(&events, &click(&card, "allow", ANN, &chat)).await;
    assert_eq!(late["toast"]["type"], "info", "{late}");
    assert_final(replacement(&late), "Denied");
    assert_eq!(read(c, &host, "abcde").await, denied);
    // A stranger's click from a chat that is not the request's learns
    // nothing of it: not its state, not who answered.
    let foreign = clicked(&events, &click(&card, "allow", BOB, "oc_elsewhere")).await;
    assert_eq!(foreign["toast"]["type"], "warning", "{foreign}");
    assert!(foreign.get("card").is_none(), "{foreign}");
    assert!(!foreign.to_string().contains(ANN), "{foreign}");
    assert!(!foreign.to_string().contains("enied"), "{foreign}");
    assert_eq!(read(c, &host, "abcde").await, denied);

    let turns = c
        .turns(host.session_id(), &Default::default())
        .await
        .unwrap();
    assert!(turns.body.turns.is_empty(), "no click is a turn");
    settled_updates(&broker).await;
    assert!(fake.patches().is_empty(), "{:?}", fake.patches());
}

#[tokio::test]
async fn clicks_over_the_long_connection_in_event_and_card_frames_are_taken_the_same() {
    let fake = FakeLark::start().await;
    let broker = TestBroker::start_lark(fake.long_connection_config()).await;
    fake.ws.wait_connected(1, WITHIN).await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let chat = unique("oc");
    c.lark_link_approved(host.session_id(), &chat, &[ANN.to_owned()])
        .await
        .unwrap();
    created(c, &host, "abcde").await;
    created(c, &host, "fghij").await;
    let allow = card_for(&fake, &chat, "abcde").await;
    let deny = card_for(&fake, &chat, "fghij").await;
    let in_card_frame = |event: &Value| {
        let (message_id, frames) = fake
            .ws
            .event_frames(event.to_string().as_bytes(), 1, "card");
        frames.iter().for_each(|f| fake.ws.send_frame(f));
        message_id
    };

    let ack = fake
        .ws
        .deliver(&click(&allow, "allow", ANN, &chat), 1)
        .await;
    assert_eq!(ack.code, 200, "{ack:?}");
    assert_final(replacement(&ack.data), "Allowed");
    assert_eq!(
        read(c, &host, "abcde").await.state,
        PermissionState::Allowed
    );

    let stranger = in_card_frame(&click(&deny, "deny", BOB, &chat));
    let ack = fake.ws.wait_ack(&stranger, WITHIN).await;
    assert_eq!(ack.data["toast"]["type"], "warning", "{ack:?}");
    assert_eq!(
        read(c, &host, "fghij").await.state,
        PermissionState::Pending
    );

    let approver = click(&deny, "deny", ANN, &chat);
    let ack = fake.ws.wait_ack(&in_card_frame(&approver), WITHIN).await;
    assert_eq!(ack.code, 200, "{ack:?}");
    assert_final(replacement(&ack.data), "Denied");
    let denied = read(c, &host, "fghij").await;
    assert_eq!(
        (denied.state, denied.answered_via),
        (PermissionState::Denied, Some(AnsweredVia::Lark))
    );
    let again = fake.ws.wait_ack(&in_card_frame(&approver), WITHIN).await;
    assert_eq!((again.code, again.data.clone()), (200, json!({})));
    assert_eq!(read(c, &host, "fghij").await, denied);
    settled_updates(&broker).await;
    assert!(fake.patches().is_empty(), "{:?}", fake.patches());
}

#[tokio::test]
async fn a_card_follows_its_request_settled_anywhere_else_exactly_once() {
    let (fake, broker, events, host, chat) = linked(&[ANN]).await;
    let c = &broker.client;
    for id in ["webaa", "texts", "gonee", "close"] {
        created(c, &host, id).await;
    }
    let web = card_for(&fake, &chat, "webaa").await;
    let text = card_for(&fake, &chat, "texts").await;
    let gone = card_for(&fake, &chat, "gonee").await;
    let closed = card_for(&fake, &chat, "close").await;

    c.answer_permission(host.session_id(), "webaa", Behavior::Allow)
        .await
        .unwrap();
    let patch = &fake.wait_for_patches(&web.posted_id, 1, WITHIN).await[0];
    assert_eq!(patch.status, 200);
    assert_final(&patch.card, "Allowed");
    assert!(
        patch.card.to_string().contains("Web page"),
        "{}",
        patch.card
    );

    acked(&events, &said(&events, &chat, ANN, "no texts")).await;
    let patch = &fake.wait_for_patches(&text.posted_id, 1, WITHIN).await[0];
    assert_final(&patch.card, "Denied");
    assert!(
        patch
            .card
            .to_string()
            .contains(&format!("<at id={ANN}></at>"))
    );

    // Answered at the terminal: the host withdraws its request.
    c.withdraw_permission(host.session_id(), "gonee", &withdrawal(&host))
        .await
        .unwrap();
    let patch = &fake.wait_for_patches(&gone.posted_id, 1, WITHIN).await[0];
    assert_final(&patch.card, "No longer open");

    c.close(host.session_id()).await.unwrap();
    let patch = &fake.wait_for_patches(&closed.posted_id, 1, WITHIN).await[0];
    assert_final(&patch.card, "No longer open");
    // A late tap on the expired request shows its final state.
    let late = clicked(&events, &click(&closed, "allow", ANN, &chat)).await;
    assert_eq!(late["toast"]["type"], "info", "{late}");
    assert_final(replacement(&late), "No longer open");

    settled_updates(&broker).await;
    for card in [&web, &text, &gone, &closed] {
        assert_eq!(fake.patches_of(&card.posted_id).len(), 1, "once each");
    }
    assert_eq!(fake.patches().len(), 4);
}

#[tokio::test]
async fn a_card_update_refused_for_good_is_recorded_and_not_retried() {
    let (fake, broker, _events, host, chat) = linked(&[ANN]).await;
    let c = &broker.client;
    for (id, code) in [("olddd", 230031), ("recal", 230011), ("delet", 230110)] {
        created(c, &host, id).await;
        let card = card_for(&fake, &chat, id).await;
        fake.fail_next_patches([PatchFailure::Code(code)]);
        c.answer_permission(host.session_id(), id, Behavior::Deny)
            .await
            .unwrap();
        let patches = fake.wait_for_patches(&card.posted_id, 1, WITHIN).await;
        assert_eq!(patches[0].code, code);
        settled_updates(&broker).await;
        assert_eq!(fake.patches_of(&card.posted_id).len(), 1, "not retried");
    }
}

#[tokio::test]
async fn a_card_update_failing_with_5xx_is_retried() {
    let (fake, broker, _events, host, chat) = linked(&[ANN]).await;
    let c = &broker.client;
    created(c, &host, "abcde").await;
    let card = card_for(&fake, &chat, "abcde").await;
    fake.fail_next_patches([PatchFailure::ServerError, PatchFailure::ServerError]);
    c.answer_permission(host.session_id(), "abcde", Behavior::Allow)
        .await
        .unwrap();
    let patches = fake.wait_for_patches(&card.posted_id, 3, WITHIN).await;
    let statuses: Vec<u16> = patches.iter().map(|p| p.status).collect();
    assert_eq!(statuses, [500, 500, 200]);
    assert_final(&patches[2].card, "Allowed");
    settled_updates(&broker).await;
    assert_eq!(fake.patches_of(&card.posted_id).len(), 3);
}

#[tokio::test]
async fn web_and_lark_answers_racing_give_one_answer_and_one_final_card() {
    let (fake, broker, events, host, chat) = linked(&[ANN]).await;
    let c = &broker.client;
    for round in 0..8u8 {
        let id = format!("race{}", (b'a' + round) as char);
        created(c, &host, &id).await;
        let card = card_for(&fake, &chat, &id).await;
        let lark = click(&card, "allow", ANN, &chat);
        let (web, answer) = tokio::join!(
            c.answer_permission(host.session_id(), &id, Behavior::Deny),
            clicked(&events, &lark),
        );
        let request = read(c, &host, &id).await;
        let shown = match (request.state, request.answered_via) {
            (PermissionState::Denied, Some(AnsweredVia::Owner)) => {
                assert_eq!(web.unwrap().body.state, PermissionState::Denied);
                "Denied"
            }
            (PermissionState::Allowed, Some(AnsweredVia::Lark)) => {
                assert_eq!(code(web), (409, "permission_already_answered".into()));
                "Allowed"
            }
            other => panic!("one final answer, not {other:?}"),
        };
        // The click is answered with the final card, whoever won; the
        // card is updated at most once more, to the same final state, and
        // not at all when the click won.
        assert_final(replacement(&answer), shown);
        settled_updates(&broker).await;
        let patches = fake.patches_of(&card.posted_id);
        assert!(patches.len() <= 1, "round {round}: {patches:?}");
        if shown == "Allowed" {
            assert!(patches.is_empty(), "round {round}: {patches:?}");
        }
        for patch in patches {
            assert_final(&patch.card, shown);
        }
    }
    let turns = c
        .turns(host.session_id(), &Default::default())
        .await
        .unwrap();
    assert!(turns.body.turns.is_empty());
}
