//! The Lark connector against a fake Lark: the verified webhook (challenge,
//! signature, encryption, freshness, verification token), durable
//! de-duplication, the chat link API, and the reply path (tokens, retries,
//! rate limits, final errors, restarts) seen through the turn readback.

use std::time::{Duration, Instant};

use loopx::model::{ClaimAnswer, ListTurns, Origin, ReplyState, Turn, TurnState};
use serde_json::{Value, json};

use crate::fake_lark::*;
use crate::support::*;

/// A fake Lark, a broker with the connector pointed at it, and Lark's event sender.
async fn lark(encrypt_key: Option<&str>) -> (FakeLark, TestBroker, LarkEvents) {
    let fake = FakeLark::start().await;
    let broker = TestBroker::start_lark(fake.config(encrypt_key)).await;
    let events = LarkEvents::new(&broker.url, encrypt_key);
    (fake, broker, events)
}

/// A bound session with this Lark chat linked to it.
async fn linked(client: &loopx::client::Client, chat_id: &str) -> Host {
    let host = bound_host(client).await;
    let link = client
        .lark_link(host.session_id(), chat_id)
        .await
        .unwrap()
        .body;
    assert_eq!(link.session_id, host.session_id());
    assert_eq!(link.chat_id.as_deref(), Some(chat_id));
    host
}

pub(crate) async fn turns(client: &loopx::client::Client, session_id: &str) -> Vec<Turn> {
    client
        .turns(session_id, &ListTurns::default())
        .await
        .unwrap()
        .body
        .turns
}

fn assert_acked(ack: &Ack) {
    assert_eq!(ack.status, 200, "the webhook acknowledges: {ack:?}");
    assert!(
        ack.elapsed < Duration::from_secs(3),
        "well inside Lark's 3 s: {ack:?}"
    );
}

fn assert_refused(ack: &Ack) {
    assert_eq!(ack.status, 401, "{ack:?}");
    assert!(ack.content_type.starts_with("application/json"), "{ack:?}");
    assert_eq!(ack.error_code(), "unauthorized", "{ack:?}");
    assert!(
        ack.body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{ack:?}"
    );
}

/// Polls the turn readback until `done` holds (panics after `within`).
async fn wait_turn(
    client: &loopx::client::Client,
    session_id: &str,
    turn_id: &str,
    within: Duration,
    done: impl Fn(&Turn) -> bool,
) -> Turn {
    let deadline = Instant::now() + within;
    loop {
        let turn = client.turn(session_id, turn_id).await.unwrap().body;
        if done(&turn) {
            return turn;
        }
        assert!(
            Instant::now() < deadline,
            "the turn did not get there within {within:?}: {turn:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (up to 20 s) for a long answer's reply to settle, and checks it was
/// sent as cards that each fit Lark's card limit, each its own `uuid`, with no
/// refused request on the way. Answers the parts as Lark got them.
async fn sent_in_parts(
    c: &loopx::client::Client,
    fake: &FakeLark,
    host: &Host,
    turn_id: &str,
    message_id: &str,
) -> Vec<ReplyRequest> {
    let turn = wait_turn(
        c,
        host.session_id(),
        turn_id,
        Duration::from_secs(20),
        |t| {
            t.reply
                .as_ref()
                .is_some_and(|r| r.state != ReplyState::Pending)
        },
    )
    .await;
    let codes: Vec<_> = fake
        .requests()
        .iter()
        .map(|r| (r.code, r.body_len))
        .collect();
    assert_eq!(
        turn.reply.as_ref().unwrap().state,
        ReplyState::Sent,
        "{:?}; requests (code, body bytes): {codes:?}",
        turn.reply
    );
    assert!(codes.iter().all(|(code, _)| *code == 0), "{codes:?}");
    let replies = fake.replies_to(message_id);
    assert!(replies.len() >= 2, "{codes:?}");
    for part in &replies {
        assert_eq!(part.msg_type, "interactive");
        assert!(part.body_len <= MAX_CARD, "{} bytes", part.body_len);
    }
    let uuids: std::collections::HashSet<_> = replies.iter().map(|r| &r.uuid).collect();
    assert_eq!(uuids.len(), replies.len(), "each part has its own uuid");
    replies
}

fn reply_is(state: ReplyState) -> impl Fn(&Turn) -> bool {
    move |turn| turn.reply.as_ref().is_some_and(|r| r.state == state)
}

/// Delivers one Lark text message into a linked session, claims it as the
/// host and completes it with `answer`. Answers the turn id.
async fn lark_turn_answered(
    client: &loopx::client::Client,
    events: &LarkEvents,
    host: &Host,
    chat_id: &str,
    message_id: &str,
    answer: &str,
) -> String {
    let event_id = unique("ev");
    assert_acked(
        &events
            .post(&events.text_message(&event_id, chat_id, message_id, "a question"))
            .await,
    );
    let claim_id = unique("claim");
    let claimed = claim(client, host, &claim_id, 0).await;
    assert_eq!(claimed.turn.origin, Origin::Lark);
    client
        .complete(
            host.session_id(),
            &claimed.turn.turn_id,
            &host.completion(&claim_id, &unique("done"), answer),
        )
        .await
        .unwrap();
    claimed.turn.turn_id
}

// ---------------------------------------------------------------------------
// The webhook: verification.

#[tokio::test]
async fn answers_the_url_verification_challenge_in_plain() {
    let (_fake, _broker, events) = lark(None).await;
    let ack = events.post(&events.challenge("ajls384kdj")).await;
    assert_eq!(ack.status, 200, "{ack:?}");
    assert_eq!(ack.body, json!({"challenge": "ajls384kdj"}));
    assert!(ack.elapsed < Duration::from_secs(1), "within 1 s: {ack:?}");
    // Without the signature headers too: Lark's SDKs check the token here.
    let unsigned = Delivery {
        signature: None,
        ..events.sign(events.body(&events.challenge("second")))
    };
    let ack = events.send(&unsigned).await;
    assert_eq!(ack.status, 200, "{ack:?}");
    assert_eq!(ack.body, json!({"challenge": "second"}));
}

#[tokio::test]
async fn answers_the_challenge_when_it_arrives_encrypted() {
    let (_fake, _broker, events) = lark(Some(ENCRYPT_KEY)).await;
    let body = events.body(&events.challenge("ajls384kdj"));
    assert!(
        serde_json::from_slice::<Value>(&body).unwrap()["encrypt"].is_string(),
        "the fake sends it encrypted"
    );
    let ack = events.send(&events.sign(body)).await;
    assert_eq!(ack.status, 200, "{ack:?}");
    assert_eq!(ack.body, json!({"challenge": "ajls384kdj"}));
    assert!(ack.elapsed < Duration::from_secs(1), "within 1 s: {ack:?}");
}

/// Lark's SDKs verify the URL challenge by decryption and token alone, so an
/// unsigned encrypted challenge is answered; one with a wrong token or that
/// does not decrypt is not, and every other event still needs its signature.
#[tokio::test]
async fn an_unsigned_encrypted_challenge_is_answered_when_it_decrypts_and_its_token_matches() {
    let (_fake, broker, events) = lark(Some(ENCRYPT_KEY)).await;
    let unsigned = |body: Vec<u8>| Delivery {
        signature: None,
        ..events.sign(body)
    };
    let ack = events
        .send(&unsigned(events.body(&events.challenge("ajls384kdj"))))
        .await;
    assert_eq!(ack.status, 200, "{ack:?}");
    assert_eq!(ack.body, json!({"challenge": "ajls384kdj"}));

    let mut wrong_token = events.challenge("ajls384kdj");
    wrong_token["token"] = json!("not-the-verification-token");
    let ack = events.send(&unsigned(events.body(&wrong_token))).await;
    assert_refused(&ack);
    let garbage = json!({"encrypt": "bm90IGEgY2lwaGVydGV4dA=="}).to_string();
    assert_refused(&events.send(&unsigned(garbage.into_bytes())).await);
    let plain = serde_json::to_vec(&events.challenge("ajls384kdj")).unwrap();
    assert_refused(&events.send(&unsigned(plain)).await);

    // A message event without its signature is still refused and not queued.
    let chat = unique("oc");
    let host = linked(&broker.client, &chat).await;
    let message = events.text_message("ev-unsigned", &chat, "om-unsigned", "hello");
    assert_refused(&events.send(&unsigned(events.body(&message))).await);
    let turns = broker
        .client
        .turns(host.session_id(), &Default::default())
        .await
        .unwrap();
    assert!(turns.body.turns.is_empty());
}

#[tokio::test]
async fn a_challenge_with_the_wrong_verification_token_is_refused() {
    for key in [None, Some(ENCRYPT_KEY)] {
        let (_fake, _broker, events) = lark(key).await;
        let mut challenge = events.challenge("ajls384kdj");
        challenge["token"] = json!("not-the-verification-token");
        let ack = events.post(&challenge).await;
        assert_refused(&ack);
        assert!(ack.body.get("challenge").is_none());
    }
}

/// Every way an event can fail verification: 401, and nothing stored (the
/// same event id, delivered properly afterwards, is still enqueued).
#[tokio::test]
async fn events_that_fail_verification_are_refused_and_store_nothing() {
    let (_fake, broker, events) = lark(Some(ENCRYPT_KEY)).await;
    let c = &broker.client;
    let chat = unique("oc");
    let host = linked(c, &chat).await;
    let event = events.text_message("ev-unverified", &chat, "om-unverified", "hello");

    // A wrong signature (signed with another key).
    let mut wrong_key = events.clone();
    wrong_key.encrypt_key = Some("another key".into());
    let delivery = wrong_key.sign(events.body(&event));
    assert_refused(&events.send(&delivery).await);

    // A signature over other bytes than those sent (tampered after signing).
    let mut tampered = events.sign(events.body(&event));
    tampered.body.extend_from_slice(b" ");
    assert_refused(&events.send(&tampered).await);

    // A signature that is not hex at all.
    let mut garbage = events.sign(events.body(&event));
    garbage.signature = Some("not-a-signature".into());
    assert_refused(&events.send(&garbage).await);

    // Missing signature headers while a key is configured.
    let unsigned = Delivery {
        signature: None,
        ..events.sign(events.body(&event))
    };
    assert_refused(&events.send(&unsigned).await);

    // A stale timestamp (10 minutes old), correctly signed; and one from the future.
    let stale = events.sign_at(events.body(&event), unix_now() - 600);
    assert_refused(&events.send(&stale).await);
    let future = events.sign_at(events.body(&event), unix_now() + 600);
    assert_refused(&events.send(&future).await);

    // A timestamp that is not a number.
    let mut nonsense = events.sign(events.body(&event));
    nonsense.timestamp = "yesterday".into();
    let key = events.encrypt_key.as_deref().unwrap();
    nonsense.signature = Some(signature(
        &nonsense.timestamp,
        &nonsense.nonce,
        key,
        &nonsense.body,
    ));
    assert_refused(&events.send(&nonsense).await);

    // The wrong verification token inside a well-signed, well-encrypted body.
    let mut wrong_token = event.clone();
    wrong_token["header"]["token"] = json!("not-the-verification-token");
    assert_refused(&events.post(&wrong_token).await);

    // Correctly signed, but the `encrypt` field does not decrypt: other
    // key, bad padding, not base64, too short.
    // (Another key's ciphertext decrypts to valid padding about once in 256
    // tries: pick one that does not, so that the case is what it says.)
    let other_key = loop {
        let encrypted = encrypt("another key", &serde_json::to_vec(&event).unwrap());
        if decrypt(key, &encrypted).is_none() {
            break encrypted;
        }
    };
    use base64::Engine;
    let bad_padding = (0u8..=255)
        .map(|b| base64::engine::general_purpose::STANDARD.encode([b; 48]))
        .find(|encrypted| decrypt(key, encrypted).is_none())
        .unwrap();
    let undecryptable = [
        other_key,
        bad_padding,
        "not base64 !".to_owned(),
        encrypt(key, b"")[..24].to_owned(),
        String::new(),
    ];
    for encrypted in undecryptable {
        let body = json!({"encrypt": encrypted}).to_string().into_bytes();
        assert_refused(&events.send(&events.sign(body)).await);
    }

    assert!(
        turns(c, host.session_id()).await.is_empty(),
        "nothing stored"
    );

    // The event id was not burnt: a proper delivery is enqueued.
    assert_acked(&events.post(&event).await);
    let stored = turns(c, host.session_id()).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].text, "hello");
}

#[tokio::test]
async fn an_unencrypted_connector_refuses_encrypted_bodies_and_wrong_tokens() {
    let (_fake, broker, events) = lark(None).await;
    let c = &broker.client;
    let chat = unique("oc");
    let host = linked(c, &chat).await;
    let event = events.text_message("ev-1", &chat, "om-1", "hello");

    // An `{"encrypt"}` body while no key is configured.
    let mut encrypting = events.clone();
    encrypting.encrypt_key = Some("some key".into());
    let body = encrypting.body(&event);
    assert_refused(&events.send(&events.sign(body.clone())).await);
    assert_refused(&encrypting.send(&encrypting.sign(body)).await);

    // The wrong verification token.
    let mut wrong_token = event.clone();
    wrong_token["header"]["token"] = json!("not-the-verification-token");
    assert_refused(&events.post(&wrong_token).await);
    let mut no_token = event.clone();
    no_token["header"].as_object_mut().unwrap().remove("token");
    assert_refused(&events.post(&no_token).await);

    // (Without an encrypt key nothing signs the timestamp, so there is no
    // freshness to check: stale timestamps are covered with a key above.)

    assert!(
        turns(c, host.session_id()).await.is_empty(),
        "nothing stored"
    );
    assert_acked(&events.post(&event).await);
    assert_eq!(turns(c, host.session_id()).await.len(), 1);
}

#[tokio::test]
async fn the_webhook_is_not_found_while_the_connector_is_off() {
    let broker = TestBroker::start().await;
    let events = LarkEvents::new(&broker.url, None);
    let ack = events.post(&events.challenge("ajls384kdj")).await;
    assert_eq!(ack.status, 404, "{ack:?}");
    assert_eq!(ack.error_code(), "not_found");
    let ack = events
        .post(&events.text_message("ev-1", "oc-1", "om-1", "hello"))
        .await;
    assert_eq!(ack.status, 404, "{ack:?}");
    assert_eq!(ack.error_code(), "not_found");
}

#[tokio::test]
async fn the_webhook_needs_no_owner_token_and_answers_an_empty_object() {
    let (_fake, broker, events) = lark(Some(ENCRYPT_KEY)).await;
    let chat = unique("oc");
    let host = linked(&broker.client, &chat).await;
    let ack = events
        .post(&events.text_message(&unique("ev"), &chat, &unique("om"), "hi"))
        .await;
    assert_acked(&ack);
    assert_eq!(ack.body, json!({}));
    assert_eq!(turns(&broker.client, host.session_id()).await.len(), 1);
}

// ---------------------------------------------------------------------------
// The webhook: what gets enqueued.

#[tokio::test]
async fn a_text_message_is_enqueued_with_origin_lark_and_its_event_id() {
    let (_fake, broker, events) = lark(Some(ENCRYPT_KEY)).await;
    let c = &broker.client;
    let chat = unique("oc");
    let host = linked(c, &chat).await;
    let event_id = unique("ev");
    let message_id = unique("om");
    assert_acked(
        &events
            .post(&events.text_message(&event_id, &chat, &message_id, "what is 2+2?"))
            .await,
    );
    let stored = turns(c, host.session_id()).await;
    assert_eq!(stored.len(), 1);
    let turn = &stored[0];
    assert_eq!(turn.origin, Origin::Lark);
    assert_eq!(turn.text, "what is 2+2?");
    assert_eq!(turn.state, TurnState::Queued);
    assert_eq!(turn.seq, 1);
    assert!(turn.reply.is_none(), "no reply before a completion");

    // Web and Lark share the one queue.
    let web_turn = enqueue(c, &host, "from the web").await;
    assert_eq!(web_turn.seq, 2);

    // The enqueue's idempotency key is the event id.
    let mut reuse = web("another text");
    reuse.client_message_id = Some(event_id.clone());
    assert_eq!(
        code(c.enqueue(host.session_id(), &reuse).await),
        (422, "idempotency_key_reused".into())
    );

    // The host gets the text.
    let claimed = claim(c, &host, "c1", 0).await;
    assert_eq!(claimed.turn.turn_id, turn.turn_id);
    assert_eq!(claimed.turn.origin, Origin::Lark);
    assert_eq!(claimed.turn.text, "what is 2+2?");
}

#[tokio::test]
async fn a_redelivered_event_is_enqueued_once() {
    let (_fake, broker, events) = lark(Some(ENCRYPT_KEY)).await;
    let c = &broker.client;
    let chat = unique("oc");
    let host = linked(c, &chat).await;
    let event = events.text_message("ev-redelivered", &chat, "om-redelivered", "once");
    for _ in 0..3 {
        // Each redelivery is freshly encrypted and signed, as Lark does.
        let ack = events.post(&event).await;
        assert_acked(&ack);
        assert_eq!(ack.body, json!({}));
    }
    // Redeliveries racing each other.
    let (a, b, d) = tokio::join!(
        events.post(&event),
        events.post(&event),
        events.post(&event)
    );
    for ack in [a, b, d] {
        assert_acked(&ack);
    }
    let stored = turns(c, host.session_id()).await;
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(stored[0].text, "once");
}

#[tokio::test]
async fn concurrent_first_deliveries_of_one_event_enqueue_once() {
    let (_fake, broker, events) = lark(None).await;
    let c = &broker.client;
    let chat = unique("oc");
    let host = linked(c, &chat).await;
    let mut deliveries = Vec::new();
    for i in 0..8 {
        let event = events.text_message(
            &format!("ev-race-{}", i % 2),
            &chat,
            &format!("om-race-{}", i % 2),
            "race",
        );
        let events = events.clone();
        deliveries.push(tokio::spawn(async move { events.post(&event).await }));
    }
    for delivery in deliveries {
        assert_acked(&delivery.await.unwrap());
    }
    let stored = turns(c, host.session_id()).await;
    assert_eq!(stored.len(), 2, "{stored:?}");
}

#[tokio::test]
async fn the_same_message_under_another_event_id_is_enqueued_once() {
    let (_fake, broker, events) = lark(None).await;
    let c = &broker.client;
    let chat = unique("oc");
    let host = linked(c, &chat).await;
    assert_acked(
        &events
            .post(&events.text_message("ev-a", &chat, "om-same", "hello"))
            .await,
    );
    assert_acked(
        &events
            .post(&events.text_message("ev-b", &chat, "om-same", "hello"))
            .await,
    );
    assert_acked(
        &events
            .post(&events.text_message("ev-c", &chat, "om-other", "again"))
            .await,
    );
    let stored = turns(c, host.session_id()).await;
    let texts: Vec<_> = stored.iter().map(|t| t.text.as_str()).collect();
    assert_eq!(texts, ["hello", "again"]);
}

#[tokio::test]
async fn a_message_from_an_unlinked_chat_is_acknowledged_and_not_enqueued() {
    let (_fake, broker, events) = lark(Some(ENCRYPT_KEY)).await;
    let c = &broker.client;
    let host = linked(c, &unique("oc")).await;
    let ack = events
        .post(&events.text_message(
            &unique("ev"),
            &unique("oc-elsewhere"),
            &unique("om"),
            "hello",
        ))
        .await;
    assert_acked(&ack);
    assert!(turns(c, host.session_id()).await.is_empty());

    // Unlinked, then messages from the chat go nowhere.
    let chat = unique("oc");
    let unlinked = linked(c, &chat).await;
    c.lark_unlink(unlinked.session_id()).await.unwrap();
    assert_acked(
        &events
            .post(&events.text_message(&unique("ev"), &chat, &unique("om"), "hello"))
            .await,
    );
    assert!(turns(c, unlinked.session_id()).await.is_empty());

    // A closed session's link feeds nothing either.
    let chat = unique("oc");
    let closed = linked(c, &chat).await;
    c.close(closed.session_id()).await.unwrap();
    assert_acked(
        &events
            .post(&events.text_message(&unique("ev"), &chat, &unique("om"), "hello"))
            .await,
    );
    assert!(turns(c, closed.session_id()).await.is_empty());
}

#[tokio::test]
async fn other_events_are_acknowledged_and_not_enqueued_and_files_are_turns() {
    let (_fake, broker, events) = lark(Some(ENCRYPT_KEY)).await;
    let c = &broker.client;
    let chat = unique("oc");
    let host = linked(c, &chat).await;
    let image = events.message(
        &unique("ev"),
        &chat,
        &unique("om"),
        "image",
        r#"{"image_key":"img_7ea74629-9191-4176-998c-2e603c9c5e8g"}"#,
    );
    assert_acked(&events.post(&image).await);
    let post = events.message(
        &unique("ev"),
        &chat,
        &unique("om"),
        "post",
        r#"{"title":"t","content":[[{"tag":"text","text":"rich"}]]}"#,
    );
    assert_acked(&events.post(&post).await);
    let file = events.message(
        &unique("ev"),
        &chat,
        &unique("om"),
        "file",
        r#"{"file_key":"file_v2_9e1d","file_name":"a.pdf"}"#,
    );
    assert_acked(&events.post(&file).await);
    // Another event type altogether.
    let mut added = events.text_message(&unique("ev"), &chat, &unique("om"), "x");
    added["header"]["event_type"] = json!("im.chat.member.bot.added_v1");
    added["event"] = json!({"chat_id": chat, "operator_id": {"open_id": "ou_1"}, "name": "group"});
    assert_acked(&events.post(&added).await);
    // An image, a post and a file are turns (issue 39); their resources,
    // which this fake does not serve, are named as not fetched.
    let taken = turns(c, host.session_id()).await;
    assert_eq!(taken.len(), 3, "{taken:#?}");
    assert_eq!(taken[1].text, "t\nrich");
    assert!(
        taken[0].text.contains("could not be fetched"),
        "{}",
        taken[0].text
    );

    // The chat still works for text.
    assert_acked(
        &events
            .post(&events.text_message(&unique("ev"), &chat, &unique("om"), "text"))
            .await,
    );
    assert_eq!(turns(c, host.session_id()).await.len(), 4);
}

fn mention(key: &str, name: &str) -> Value {
    json!({
        "key": key,
        "id": {
            "union_id": "on_8ed6aa67826108097d9ee143816345",
            "user_id": "e33ggbyz",
            "open_id": "ou_84aad35d084aa403a838cf73ee18467",
        },
        "name": name,
        "tenant_key": "736588c9260f175e",
    })
}

#[tokio::test]
async fn mentions_become_at_names() {
    let (_fake, broker, events) = lark(None).await;
    let c = &broker.client;
    let chat = unique("oc");
    let host = linked(c, &chat).await;
    let mut event = events.text_message(&unique("ev"), &chat, &unique("om"), "@_user_1 hello");
    event["event"]["message"]["mentions"] = json!([mention("@_user_1", "Tom")]);
    event["event"]["message"]["root_id"] = json!("om_root");
    event["event"]["message"]["parent_id"] = json!("om_root");
    event["event"]["message"]["thread_id"] = json!("omt_d4be107c616");
    assert_acked(&events.post(&event).await);

    let mut two = events.text_message(
        &unique("ev"),
        &chat,
        &unique("om"),
        "@_user_1 and @_user_2, see @_user_1",
    );
    two["event"]["message"]["mentions"] =
        json!([mention("@_user_1", "Tom"), mention("@_user_2", "Ann")]);
    assert_acked(&events.post(&two).await);

    // No mentions: the text stays as it is.
    assert_acked(
        &events
            .post(&events.text_message(&unique("ev"), &chat, &unique("om"), "plain @_user_1"))
            .await,
    );

    let texts: Vec<_> = turns(c, host.session_id())
        .await
        .into_iter()
        .map(|t| t.text)
        .collect();
    assert_eq!(
        texts,
        ["@Tom hello", "@Tom and @Ann, see @Tom", "plain @_user_1"]
    );
}

#[tokio::test]
async fn mention_keys_that_prefix_one_another_are_replaced_whole() {
    let (_fake, broker, events) = lark(None).await;
    let c = &broker.client;
    let chat = unique("oc");
    let host = linked(c, &chat).await;
    let mentions: Vec<Value> = (1..=10)
        .map(|i| mention(&format!("@_user_{i}"), &format!("P{i}")))
        .collect();
    let mut event =
        events.text_message(&unique("ev"), &chat, &unique("om"), "@_user_10 @_user_1 hi");
    event["event"]["message"]["mentions"] = json!(mentions);
    assert_acked(&events.post(&event).await);
    let stored = turns(c, host.session_id()).await;
    assert_eq!(stored[0].text, "@P10 @P1 hi");
}

// ---------------------------------------------------------------------------
// The link API.

#[tokio::test]
async fn link_put_get_delete() {
    let (_fake, broker, _events) = lark(None).await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let sid = host.session_id();

    let none = c.lark_link_status(sid).await.unwrap();
    assert_eq!(none.reply.status, 200);
    assert_eq!(none.body.session_id, sid);
    assert_eq!(none.body.chat_id, None);
    assert_eq!(
        none.reply.json(),
        json!({"session_id": sid, "chat_id": null, "approvers": [], "terminal_turns": false})
    );

    let put = c.lark_link(sid, "oc_a").await.unwrap();
    assert_eq!(put.reply.status, 200);
    assert_eq!(
        put.reply.json(),
        json!({"session_id": sid, "chat_id": "oc_a", "approvers": [], "terminal_turns": false})
    );
    // Idempotent.
    let again = c.lark_link(sid, "oc_a").await.unwrap();
    assert_eq!(
        again.reply.json(),
        json!({"session_id": sid, "chat_id": "oc_a", "approvers": [], "terminal_turns": false})
    );
    let got = c.lark_link_status(sid).await.unwrap();
    assert_eq!(
        got.reply.json(),
        json!({"session_id": sid, "chat_id": "oc_a", "approvers": [], "terminal_turns": false})
    );

    // Linking another chat replaces the session's link and frees the first chat.
    c.lark_link(sid, "oc_b").await.unwrap();
    assert_eq!(
        c.lark_link_status(sid)
            .await
            .unwrap()
            .body
            .chat_id
            .as_deref(),
        Some("oc_b")
    );
    let other = bound_host(c).await;
    assert_eq!(
        c.lark_link(other.session_id(), "oc_a")
            .await
            .unwrap()
            .body
            .chat_id
            .as_deref(),
        Some("oc_a")
    );

    let deleted = c.lark_unlink(sid).await.unwrap();
    assert_eq!(deleted.reply.status, 200);
    assert_eq!(
        deleted.reply.json(),
        json!({"session_id": sid, "chat_id": null, "approvers": [], "terminal_turns": false})
    );
    assert_eq!(c.lark_link_status(sid).await.unwrap().body.chat_id, None);
    // Unlinking an unlinked session is fine too.
    let twice = c.lark_unlink(sid).await.unwrap();
    assert_eq!(twice.body.chat_id, None);
    // Its chat is free again.
    c.lark_link(bound_host(c).await.session_id(), "oc_b")
        .await
        .unwrap();
}

#[tokio::test]
async fn link_conflicts_and_errors() {
    let (_fake, broker, _events) = lark(None).await;
    let c = &broker.client;
    let first = bound_host(c).await;
    let second = bound_host(c).await;
    c.lark_link(first.session_id(), "oc_taken").await.unwrap();

    // A chat holds several sessions: the second joins the first.
    c.lark_link(second.session_id(), "oc_taken").await.unwrap();
    for host in [&first, &second] {
        let link = c.lark_link_status(host.session_id()).await.unwrap().body;
        assert_eq!(link.chat_id.as_deref(), Some("oc_taken"));
    }
    c.close(first.session_id()).await.unwrap();

    // A closed session cannot be linked.
    assert_eq!(
        code(c.lark_link(first.session_id(), "oc_new").await),
        (409, "session_closed".into())
    );

    // Unknown session.
    assert_eq!(
        code(c.lark_link("ses_unknown", "oc_x").await),
        (404, "not_found".into())
    );
    assert_eq!(
        code(c.lark_link_status("ses_unknown").await),
        (404, "not_found".into())
    );
    assert_eq!(
        code(c.lark_unlink("ses_unknown").await),
        (404, "not_found".into())
    );

    // Bad chat ids.
    assert_eq!(
        code(c.lark_link(second.session_id(), "").await),
        (400, "invalid_request".into())
    );
    assert_eq!(
        code(c.lark_link(second.session_id(), "oc\u{7}bell").await),
        (400, "invalid_request".into())
    );

    // The owner token is needed.
    for anonymous in [
        broker.client_with_token(None),
        broker.client_with_token(Some("wrong")),
    ] {
        let sid = second.session_id();
        assert_eq!(
            code(anonymous.lark_link(sid, "oc_y").await),
            (401, "unauthorized".into())
        );
        assert_eq!(
            code(anonymous.lark_link_status(sid).await),
            (401, "unauthorized".into())
        );
        assert_eq!(
            code(anonymous.lark_unlink(sid).await),
            (401, "unauthorized".into())
        );
    }
    assert_eq!(
        c.lark_link_status(second.session_id())
            .await
            .unwrap()
            .body
            .chat_id
            .as_deref(),
        Some("oc_taken")
    );
}

const ANN: &str = "ou_84aad35d084aa403a838cf73ee18467";
const BOB: &str = "ou_7d8a6e6df7621556ce0d21922b676706";

fn ids(list: &[&str]) -> Vec<String> {
    list.iter().map(|id| id.to_string()).collect()
}

#[tokio::test]
async fn link_approvers_round_trip_and_relinking_replaces_them() {
    let (_fake, broker, _events) = lark(None).await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let sid = host.session_id();

    let put = c
        .lark_link_approved(sid, "oc_a", &ids(&[ANN, BOB, ANN]))
        .await
        .unwrap();
    assert_eq!(put.reply.status, 200);
    let expected = json!({"session_id": sid, "chat_id": "oc_a", "approvers": [ANN, BOB], "terminal_turns": false});
    assert_eq!(put.reply.json(), expected, "a repeated id counts once");
    assert_eq!(
        c.lark_link_status(sid).await.unwrap().reply.json(),
        expected
    );

    // Linking the same chat again replaces the list, to empty as well.
    c.lark_link_approved(sid, "oc_a", &ids(&[BOB]))
        .await
        .unwrap();
    assert_eq!(
        c.lark_link_status(sid).await.unwrap().body.approvers,
        ids(&[BOB])
    );
    c.lark_link(sid, "oc_a").await.unwrap();
    assert!(
        c.lark_link_status(sid)
            .await
            .unwrap()
            .body
            .approvers
            .is_empty()
    );

    // Unlinking drops them; a closed session's link is gone with them.
    c.lark_link_approved(sid, "oc_a", &ids(&[ANN]))
        .await
        .unwrap();
    assert_eq!(
        c.lark_unlink(sid).await.unwrap().reply.json(),
        json!({"session_id": sid, "chat_id": null, "approvers": [], "terminal_turns": false})
    );
    c.lark_link_approved(sid, "oc_a", &ids(&[ANN]))
        .await
        .unwrap();
    c.close(sid).await.unwrap();
    assert_eq!(
        c.lark_link_status(sid).await.unwrap().reply.json(),
        json!({"session_id": sid, "chat_id": null, "approvers": [], "terminal_turns": false})
    );
}

#[tokio::test]
async fn link_approvers_have_limits_and_bad_ones_change_nothing() {
    let (_fake, broker, _events) = lark(None).await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let sid = host.session_id();
    c.lark_link_approved(sid, "oc_a", &ids(&[ANN]))
        .await
        .unwrap();

    let longest = format!("ou_{}", "f".repeat(61));
    let fifty: Vec<String> = (0..50).map(|i| format!("ou_{i:032x}")).collect();
    let linked = c.lark_link_approved(sid, "oc_a", &fifty).await.unwrap();
    assert_eq!(linked.body.approvers, fifty, "50 is the most, in order");
    let linked = c
        .lark_link_approved(sid, "oc_a", std::slice::from_ref(&longest))
        .await
        .unwrap();
    assert_eq!(linked.body.approvers, vec![longest.clone()], "64 bytes fit");

    let too_many = [fifty, ids(&[ANN])].concat();
    let too_long = format!("{longest}f");
    for bad in [
        too_many,
        vec![too_long],
        ids(&[""]),
        ids(&["ou_"]),
        ids(&["on_8ed6aa67826108097d9ee143816345"]),
        ids(&[ANN, "ou_has space"]),
        ids(&["ou_\u{7}"]),
        ids(&["ou_ünïcode"]),
    ] {
        let refused = c.lark_link_approved(sid, "oc_b", &bad).await;
        let Err(loopx::client::ClientError::Refused { reply, .. }) = refused else {
            panic!("refused: {refused:?}")
        };
        let body = reply.json();
        assert_eq!(reply.status, 400, "{bad:?}");
        assert_eq!(body["error"]["code"], "invalid_request", "{bad:?}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("approvers"), "{message}");
    }
    assert_eq!(
        c.lark_link_status(sid).await.unwrap().reply.json(),
        json!({"session_id": sid, "chat_id": "oc_a", "approvers": [longest], "terminal_turns": false}),
        "a refused link changes nothing"
    );

    // Mistyped approvers are strict JSON errors too.
    let http = reqwest::Client::new();
    let url = format!("{}/v1/sessions/{sid}/lark-link", broker.url);
    for body in [
        json!({"chat_id": "oc_a", "approvers": "ou_abc"}),
        json!({"chat_id": "oc_a", "approvers": [1]}),
        json!({"chat_id": "oc_a", "approvers": null}),
    ] {
        let response = http
            .put(&url)
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 400, "{body}");
        let value: Value = response.json().await.unwrap();
        assert_eq!(value["error"]["code"], "invalid_request", "{body}");
    }
}

#[tokio::test]
async fn link_bodies_are_strict_json() {
    let (_fake, broker, _events) = lark(None).await;
    let host = bound_host(&broker.client).await;
    let url = format!("{}/v1/sessions/{}/lark-link", broker.url, host.session_id());
    let http = reqwest::Client::new();
    for (content_type, body, status, code) in [
        (
            "application/json",
            r#"{"chat_id":"oc_1","extra":1}"#,
            400,
            "invalid_request",
        ),
        (
            "application/json",
            r#"{"chat_id":5}"#,
            400,
            "invalid_request",
        ),
        ("application/json", r#"{}"#, 400, "invalid_request"),
        ("application/json", r#"{"chat_id":"#, 400, "invalid_request"),
        (
            "text/plain",
            r#"{"chat_id":"oc_1"}"#,
            415,
            "unsupported_media_type",
        ),
    ] {
        let response = http
            .put(&url)
            .bearer_auth(TOKEN)
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), status, "{body}");
        let value: Value = response.json().await.unwrap();
        assert_eq!(value["error"]["code"], code, "{body}");
    }
}

// ---------------------------------------------------------------------------
// The reply path.

#[tokio::test]
async fn a_whole_round_trip_replies_once_to_the_right_message() {
    let (fake, broker, events) = lark(Some(ENCRYPT_KEY)).await;
    let c = &broker.client;
    let chat = unique("oc");
    let host = linked(c, &chat).await;
    let event_id = unique("ev");
    let message_id = unique("om");
    assert_acked(
        &events
            .post(&events.text_message(&event_id, &chat, &message_id, "what is 2+2?"))
            .await,
    );
    let claimed = claim(c, &host, "c1", 0).await;
    assert_eq!(claimed.turn.text, "what is 2+2?");
    let turn_id = claimed.turn.turn_id.clone();
    assert!(
        c.turn(host.session_id(), &turn_id)
            .await
            .unwrap()
            .body
            .reply
            .is_none()
    );
    assert!(fake.requests().is_empty(), "no reply before the completion");

    let answer = "4, with \"quotes\", a \\ backslash,\nnewlines and 你好";
    let completion = host.completion("c1", "k1", answer);
    c.complete(host.session_id(), &turn_id, &completion)
        .await
        .unwrap();

    let turn = wait_turn(
        c,
        host.session_id(),
        &turn_id,
        Duration::from_secs(10),
        reply_is(ReplyState::Sent),
    )
    .await;
    let reply = turn.reply.unwrap();
    assert_eq!(reply.channel, "lark");
    assert_eq!(reply.attempts, 1);
    assert_eq!(reply.error, None);
    assert_eq!(turn.state, TurnState::Completed);

    let replies = fake.replies();
    assert_eq!(replies.len(), 1, "{replies:?}");
    let sent = &replies[0];
    assert_eq!(sent.message_id, message_id);
    // Plain text reads as it was written: one card, the text unchanged.
    assert_eq!(sent.text, answer);
    assert_eq!(sent.msg_type, "interactive");
    assert_eq!(sent.reply_in_thread, Some(false));
    assert!(
        !sent.uuid.is_empty() && sent.uuid.chars().count() <= 50,
        "{sent:?}"
    );
    assert!(sent.bearer.starts_with("t-"), "the tenant token: {sent:?}");
    assert_eq!(fake.token_requests(), 1);
    assert_eq!(fake.requests().len(), 1);

    // A redundant completion replay sends nothing more.
    let replay = c
        .complete(host.session_id(), &turn_id, &completion)
        .await
        .unwrap();
    assert!(replay.body.replayed);
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(fake.requests().len(), 1, "{:?}", fake.requests());
    let turn = c.turn(host.session_id(), &turn_id).await.unwrap().body;
    assert_eq!(turn.reply.unwrap().state, ReplyState::Sent);

    // The readback lists the reply too.
    let listed = turns(c, host.session_id()).await;
    assert_eq!(listed[0].reply.as_ref().unwrap().state, ReplyState::Sent);

    // A Web turn has no reply and sends nothing to Lark.
    let web_turn = enqueue(c, &host, "from the web").await;
    claim(c, &host, "c2", 0).await;
    c.complete(
        host.session_id(),
        &web_turn.turn_id,
        &host.completion("c2", "k2", "web answer"),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        c.turn(host.session_id(), &web_turn.turn_id)
            .await
            .unwrap()
            .body
            .reply
            .is_none()
    );
    assert_eq!(fake.requests().len(), 1);

    // A second Lark message: its own reply, with another uuid; the token is reused.
    let second = unique("om");
    let turn_id = lark_turn_answered(c, &events, &host, &chat, &second, "second answer").await;
    wait_turn(
        c,
        host.session_id(),
        &turn_id,
        Duration::from_secs(10),
        reply_is(ReplyState::Sent),
    )
    .await;
    let replies = fake.replies_to(&second);
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].text, "second answer");
    assert_ne!(replies[0].uuid, sent.uuid);
    assert_eq!(fake.token_requests(), 1, "the token is cached");
}

#[tokio::test]
async fn a_released_and_reclaimed_lark_turn_replies_once_with_the_final_answer() {
    let (fake, broker, events) = lark(None).await;
    let c = &broker.client;
    let chat = unique("oc");
    let host = linked(c, &chat).await;
    let message_id = unique("om");
    assert_acked(
        &events
            .post(&events.text_message(&unique("ev"), &chat, &message_id, "q"))
            .await,
    );
    let first = claim(c, &host, "c1", 0).await;
    c.release(
        host.session_id(),
        "c1",
        &loopx::model::ReleaseRequest::host(HOST_SURFACE, host.host_session_id.clone()),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(fake.requests().is_empty(), "a release sends nothing");
    let second = claim(c, &host, "c2", 0).await;
    assert_eq!(second.turn.turn_id, first.turn.turn_id);
    c.complete(
        host.session_id(),
        &second.turn.turn_id,
        &host.completion("c2", "k2", "final"),
    )
    .await
    .unwrap();
    wait_turn(
        c,
        host.session_id(),
        &second.turn.turn_id,
        Duration::from_secs(10),
        reply_is(ReplyState::Sent),
    )
    .await;
    let replies = fake.replies_to(&message_id);
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].text, "final");
}

#[tokio::test]
async fn an_invalidated_token_is_refreshed_and_the_reply_retried_once() {
    let (fake, broker, events) = lark(None).await;
    let c = &broker.client;
    let chat = unique("oc");
    let host = linked(c, &chat).await;
    let first = unique("om");
    let turn_id = lark_turn_answered(c, &events, &host, &chat, &first, "one").await;
    wait_turn(
        c,
        host.session_id(),
        &turn_id,
        Duration::from_secs(10),
        reply_is(ReplyState::Sent),
    )
    .await;
    assert_eq!(fake.token_requests(), 1);

    // Lark revokes the cached token.
    fake.fail_next([Failure::TokenInvalid]);
    let second = unique("om");
    let turn_id = lark_turn_answered(c, &events, &host, &chat, &second, "two").await;
    let turn = wait_turn(
        c,
        host.session_id(),
        &turn_id,
        Duration::from_secs(10),
        reply_is(ReplyState::Sent),
    )
    .await;
    assert_eq!(fake.token_requests(), 2, "one refresh");
    let requests: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.message_id == second)
        .collect();
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert_eq!(requests[0].code, 99991663);
    assert_eq!(requests[1].code, 0);
    assert_eq!(
        requests[0].uuid, requests[1].uuid,
        "the same uuid on the retry"
    );
    assert_ne!(requests[0].bearer, requests[1].bearer, "with the new token");
    assert_eq!(fake.replies_to(&second).len(), 1);
    assert_eq!(fake.replies_to(&second)[0].text, "two");
    assert_eq!(turn.reply.unwrap().error, None);
}

#[tokio::test]
async fn an_expired_token_is_not_used() {
    let (fake, broker, events) = lark(None).await;
    fake.set_token_expire(1);
    let c = &broker.client;
    let chat = unique("oc");
    let host = linked(c, &chat).await;
    let first = unique("om");
    let turn_id = lark_turn_answered(c, &events, &host, &chat, &first, "one").await;
    wait_turn(
        c,
        host.session_id(),
        &turn_id,
        Duration::from_secs(10),
        reply_is(ReplyState::Sent),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let second = unique("om");
    let turn_id = lark_turn_answered(c, &events, &host, &chat, &second, "two").await;
    wait_turn(
        c,
        host.session_id(),
        &turn_id,
        Duration::from_secs(10),
        reply_is(ReplyState::Sent),
    )
    .await;
    assert!(fake.token_requests() >= 2, "the expired token was replaced");
    assert_eq!(fake.replies_to(&first).len(), 1);
    assert_eq!(fake.replies_to(&second).len(), 1);
    assert_eq!(fake.replies_to(&second)[0].text, "two");
}

async fn rate_limited_once(failure: Failure) {
    let (fake, broker, events) = lark(None).await;
    let c = &broker.client;
    let chat = unique("oc");
    let host = linked(c, &chat).await;
    fake.fail_next([failure]);
    let message_id = unique("om");
    let turn_id = lark_turn_answered(c, &events, &host, &chat, &message_id, "later").await;
    let turn = wait_turn(
        c,
        host.session_id(),
        &turn_id,
        Duration::from_secs(10),
        reply_is(ReplyState::Sent),
    )
    .await;
    let requests = fake.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert_eq!(requests[0].code, 99991400);
    assert_eq!(requests[0].uuid, requests[1].uuid);
    let waited = requests[1].at.duration_since(requests[0].at);
    assert!(
        waited >= Duration::from_millis(900),
        "x-ogw-ratelimit-reset: 1 is honoured (retried after {waited:?})"
    );
    assert_eq!(fake.replies_to(&message_id).len(), 1);
    let reply = turn.reply.unwrap();
    assert_eq!(reply.attempts, 2);
    assert_eq!(reply.error, None);
}

#[tokio::test]
async fn http_429_is_retried_after_the_rate_limit_reset() {
    rate_limited_once(Failure::TooManyRequests).await;
}

#[tokio::test]
async fn a_rate_limit_code_in_a_200_is_retried_after_the_reset() {
    rate_limited_once(Failure::RateLimitCode).await;
}

#[tokio::test]
async fn server_errors_are_retried_with_backoff_and_the_same_uuid() {
    let (fake, broker, events) = lark(None).await;
    let c = &broker.client;
    let chat = unique("oc");
    let host = linked(c, &chat).await;
    fake.fail_next([Failure::ServerError, Failure::ServerError]);
    let message_id = unique("om");
    let turn_id = lark_turn_answered(c, &events, &host, &chat, &message_id, "eventually").await;
    let pending = wait_turn(
        c,
        host.session_id(),
        &turn_id,
        Duration::from_secs(10),
        |t| t.reply.as_ref().is_some_and(|r| r.attempts >= 1),
    )
    .await;
    let turn = wait_turn(
        c,
        host.session_id(),
        &turn_id,
        Duration::from_secs(10),
        reply_is(ReplyState::Sent),
    )
    .await;
    if pending.reply.as_ref().unwrap().state == ReplyState::Pending {
        assert!(
            pending.reply.as_ref().unwrap().error.is_some(),
            "{pending:?}"
        );
    }
    let requests = fake.requests();
    assert_eq!(requests.len(), 3, "{requests:?}");
    assert!(requests.iter().all(|r| r.uuid == requests[0].uuid));
    assert_eq!(fake.replies_to(&message_id).len(), 1);
    let reply = turn.reply.unwrap();
    assert_eq!(reply.attempts, 3);
    assert_eq!(reply.error, None, "a sent reply carries no error");
}

#[tokio::test]
async fn a_final_error_is_recorded_and_not_retried() {
    let (fake, broker, events) = lark(None).await;
    let c = &broker.client;
    let chat = unique("oc");
    let host = linked(c, &chat).await;
    fake.fail_next([Failure::BotNotInChat]);
    let message_id = unique("om");
    let answer = "the secret answer text";
    let turn_id = lark_turn_answered(c, &events, &host, &chat, &message_id, answer).await;
    let turn = wait_turn(
        c,
        host.session_id(),
        &turn_id,
        Duration::from_secs(10),
        reply_is(ReplyState::Failed),
    )
    .await;
    let reply = turn.reply.unwrap();
    assert_eq!(reply.channel, "lark");
    assert_eq!(reply.attempts, 1);
    let error = reply.error.expect("the failure is recorded");
    assert!(!error.is_empty());
    assert!(!error.contains(answer), "never the answer's text: {error}");
    // Not retried: the request count stops growing (retries would come every ≤ 500 ms).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(fake.requests().len(), 1, "{:?}", fake.requests());
    assert!(fake.replies().is_empty());
    let turn = c.turn(host.session_id(), &turn_id).await.unwrap().body;
    assert_eq!(turn.reply.unwrap().state, ReplyState::Failed);
    assert_eq!(
        turn.state,
        TurnState::Completed,
        "the turn itself stays completed"
    );

    // The connector goes on with the next reply.
    let next = unique("om");
    let turn_id = lark_turn_answered(c, &events, &host, &chat, &next, "next").await;
    wait_turn(
        c,
        host.session_id(),
        &turn_id,
        Duration::from_secs(10),
        reply_is(ReplyState::Sent),
    )
    .await;
    assert_eq!(fake.replies_to(&next).len(), 1);
}

#[tokio::test]
async fn a_reply_that_never_gets_through_is_given_up_after_max_attempts() {
    let fake = FakeLark::start().await;
    fake.fail_always(Some(Failure::ServerError));
    let mut config = fake.config(None);
    config.retry_base = Duration::from_millis(20);
    config.retry_max = Duration::from_millis(50);
    config.max_attempts = 3;
    let broker = TestBroker::start_lark(config).await;
    let events = LarkEvents::new(&broker.url, None);
    let c = &broker.client;
    let chat = unique("oc");
    let host = linked(c, &chat).await;
    let turn_id = lark_turn_answered(c, &events, &host, &chat, &unique("om"), "lost").await;
    let turn = wait_turn(
        c,
        host.session_id(),
        &turn_id,
        Duration::from_secs(10),
        reply_is(ReplyState::Failed),
    )
    .await;
    let reply = turn.reply.unwrap();
    assert_eq!(reply.attempts, 3);
    assert!(reply.error.is_some());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(fake.requests().len(), 3, "{:?}", fake.requests());
}

#[tokio::test]
async fn an_answer_longer_than_larks_limit_is_split_or_truncated() {
    let (fake, broker, events) = lark(None).await;
    let c = &broker.client;
    let chat = unique("oc");
    let host = linked(c, &chat).await;
    let message_id = unique("om");
    let answer: String = (0..20_000).map(|i| format!("答案{i:04} ")).collect();
    assert!(answer.len() > 200 * 1024);
    let turn_id = lark_turn_answered(c, &events, &host, &chat, &message_id, &answer).await;
    let replies = sent_in_parts(c, &fake, &host, &turn_id, &message_id).await;
    assert!(
        replies[0].text.contains("答案0000 答案0001 "),
        "the answer's start comes first"
    );
}

/// An agent's Markdown answer arrives as cards that render it: a heading, a
/// list, a table and a 40 KB code block split into parts under Lark's 30 KB
/// card limit, each with its code fences balanced, numbered, in order, once;
/// raw HTML escaped.
#[tokio::test]
async fn a_markdown_answer_arrives_as_numbered_cards_with_balanced_fences() {
    let (fake, broker, events) = lark(None).await;
    let c = &broker.client;
    let chat = unique("oc");
    let host = linked(c, &chat).await;
    let message_id = unique("om");
    const LINES: usize = 1700;
    let code: String = (0..LINES)
        .map(|i| format!("    let v{i:04} = \"<{i}>\";\n"))
        .collect();
    assert!(code.len() >= 40 * 1024, "{}", code.len());
    let answer = format!(
        "## Plan\n\n- **build** it\n- test it <script>alert(1)</script>\n\n| step | state |\n|---|---|\n| build | done |\n\n```rust\n{code}```\n\nDone."
    );
    let turn_id = lark_turn_answered(c, &events, &host, &chat, &message_id, &answer).await;
    sent_in_parts(c, &fake, &host, &turn_id, &message_id).await;
    // Once: nothing more arrives later.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let replies = fake.replies_to(&message_id);
    let count = replies.len();
    assert!(count >= 3, "{count} parts");
    for (i, part) in replies.iter().enumerate() {
        let fences = part.text.lines().filter(|l| l.starts_with("```")).count();
        assert_eq!(fences % 2, 0, "part {i} leaves a fence open");
        assert!(
            part.text.ends_with(&format!("({}/{count})", i + 1)),
            "part {i} in order"
        );
        assert!(!part.text.contains('<'), "no raw HTML in part {i}");
    }
    assert!(replies[0].text.starts_with("## Plan\n\n- **build** it\n"));
    assert!(
        replies[0]
            .text
            .contains("&lt;script&gt;alert(1)&lt;/script&gt;")
    );
    assert!(replies[0].text.contains("| build | done |"));
    assert!(
        replies[1]
            .text
            .starts_with("```rust\n    let v0000 = \"&lt;0&gt;\";")
    );
    assert!(replies[count - 1].text.contains("Done."));
    // Every code line arrives once, in order.
    let lines: Vec<&str> = replies
        .iter()
        .flat_map(|r| r.text.lines())
        .filter(|l| l.starts_with("    let v"))
        .collect();
    assert_eq!(lines.len(), LINES);
    assert!(lines.windows(2).all(|w| w[0] < w[1]));
}

// ---------------------------------------------------------------------------
// Restarts: the real binary.

fn flag_refs(flags: &[String]) -> Vec<&str> {
    flags.iter().map(String::as_str).collect()
}

#[tokio::test]
async fn deduplication_survives_a_restart() {
    let fake = FakeLark::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let flags = fake.flags(Some(ENCRYPT_KEY));
    let broker = Spawned::start(&data, &flag_refs(&flags)).await;
    let chat = unique("oc");
    let host = linked(&broker.client, &chat).await;
    let events = LarkEvents::new(&broker.url, Some(ENCRYPT_KEY));
    let event = events.text_message("ev-durable", &chat, "om-durable", "once");
    assert_acked(&events.post(&event).await);
    assert_eq!(turns(&broker.client, host.session_id()).await.len(), 1);
    assert!(broker.terminate().await.success());

    let broker = Spawned::start(&data, &flag_refs(&flags)).await;
    let events = LarkEvents::new(&broker.url, Some(ENCRYPT_KEY));
    // Lark redelivers the same event after the restart…
    assert_acked(&events.post(&event).await);
    // …or the same message under another event id.
    assert_acked(
        &events
            .post(&events.text_message("ev-other", &chat, "om-durable", "once"))
            .await,
    );
    let stored = turns(&broker.client, host.session_id()).await;
    assert_eq!(stored.len(), 1, "{stored:?}");
    // The link survived too.
    assert_acked(
        &events
            .post(&events.text_message("ev-new", &chat, "om-new", "new"))
            .await,
    );
    assert_eq!(turns(&broker.client, host.session_id()).await.len(), 2);
    assert!(broker.terminate().await.success());
}

#[tokio::test]
async fn a_reply_committed_before_a_restart_is_sent_once_after_it() {
    let failing = FakeLark::start().await;
    failing.fail_always(Some(Failure::ServerError));
    let healthy = FakeLark::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");

    let broker = Spawned::start(&data, &flag_refs(&failing.flags(None))).await;
    let c = broker.client.clone();
    let chat = unique("oc");
    let host = linked(&c, &chat).await;
    let events = LarkEvents::new(&broker.url, None);
    let message_id = unique("om");
    let turn_id =
        lark_turn_answered(&c, &events, &host, &chat, &message_id, "after the restart").await;
    let failed = failing.wait_for_requests(1, Duration::from_secs(10)).await;
    let pending = wait_turn(
        &c,
        host.session_id(),
        &turn_id,
        Duration::from_secs(10),
        |t| t.reply.as_ref().is_some_and(|r| r.attempts >= 1),
    )
    .await;
    let reply = pending.reply.unwrap();
    assert_eq!(reply.state, ReplyState::Pending);
    assert!(
        reply.error.is_some(),
        "the last failure is shown: {reply:?}"
    );
    assert!(broker.terminate().await.success());
    assert!(failing.replies().is_empty());

    let broker = Spawned::start(&data, &flag_refs(&healthy.flags(None))).await;
    let c = broker.client.clone();
    let turn = wait_turn(
        &c,
        host.session_id(),
        &turn_id,
        Duration::from_secs(30),
        reply_is(ReplyState::Sent),
    )
    .await;
    let replies = healthy.replies();
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_eq!(replies[0].message_id, message_id);
    assert_eq!(replies[0].text, "after the restart");
    assert_eq!(
        replies[0].uuid, failed[0].uuid,
        "the uuid survives the restart"
    );
    assert_eq!(turn.reply.unwrap().error, None);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(healthy.requests().len(), 1);
    assert!(broker.terminate().await.success());
}

#[tokio::test]
async fn a_reply_waits_out_an_unreachable_lark_across_a_restart() {
    let healthy = FakeLark::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let closed = format!("http://127.0.0.1:{}", free_port());

    let broker = Spawned::start(&data, &flag_refs(&lark_flags(&closed, None))).await;
    let c = broker.client.clone();
    let chat = unique("oc");
    let host = linked(&c, &chat).await;
    let events = LarkEvents::new(&broker.url, None);
    let message_id = unique("om");
    let turn_id = lark_turn_answered(&c, &events, &host, &chat, &message_id, "eventually").await;
    let turn = c.turn(host.session_id(), &turn_id).await.unwrap().body;
    assert_eq!(
        turn.reply.unwrap().state,
        ReplyState::Pending,
        "committed with the completion"
    );
    assert!(broker.terminate().await.success());

    let broker = Spawned::start(&data, &flag_refs(&healthy.flags(None))).await;
    wait_turn(
        &broker.client,
        host.session_id(),
        &turn_id,
        Duration::from_secs(30),
        reply_is(ReplyState::Sent),
    )
    .await;
    let replies = healthy.replies();
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_eq!(replies[0].message_id, message_id);
    assert_eq!(replies[0].text, "eventually");
    assert!(broker.terminate().await.success());
}

/// A claim replay answers the same Lark turn; the readback holds its reply.
#[tokio::test]
async fn the_claim_replay_of_a_lark_turn_is_the_same_turn() {
    let (_fake, broker, events) = lark(None).await;
    let c = &broker.client;
    let chat = unique("oc");
    let host = linked(c, &chat).await;
    assert_acked(
        &events
            .post(&events.text_message(&unique("ev"), &chat, &unique("om"), "q"))
            .await,
    );
    let first = claim(c, &host, "c1", 0).await;
    let replay = c
        .claim(host.session_id(), &host.claim_request("c1", 0))
        .await
        .unwrap();
    assert!(replay.reply.replayed);
    let ClaimAnswer::Claimed(again) = replay.body else {
        panic!("expected the same turn")
    };
    assert_eq!(again.turn.turn_id, first.turn.turn_id);
    assert_eq!(again.turn.origin, Origin::Lark);
}

// ---------------------------------------------------------------------------
// The edges of the reply path.

/// Lark's 30 KB card limit is on the request body, where the answer is JSON-escaped
/// twice (`content` is a JSON string inside the JSON body): quotes, backslashes
/// and newlines grow, so parts must be cut by their encoded size.
#[tokio::test]
async fn an_answer_full_of_escaped_characters_stays_within_larks_body_limit() {
    let (fake, broker, events) = lark(None).await;
    let c = &broker.client;
    let chat = unique("oc");
    let host = linked(c, &chat).await;
    let message_id = unique("om");
    // Code, as agents answer: quotes, backslashes and newlines everywhere.
    let line = "    println!(\"{}\\n\", \"quoted \\\"text\\\"\");\n";
    let answer = line.repeat(160_000 / line.len());
    let turn_id = lark_turn_answered(c, &events, &host, &chat, &message_id, &answer).await;
    let replies = sent_in_parts(c, &fake, &host, &turn_id, &message_id).await;
    assert!(replies[0].text.starts_with(line));
}

/// Being rate limited is not a failed attempt: a reply that Lark asks to wait
/// for is sent after the wait, whatever the attempt budget.
#[tokio::test]
async fn rate_limits_do_not_use_up_the_attempts() {
    let fake = FakeLark::start().await;
    let mut config = fake.config(None);
    config.max_attempts = 1;
    let broker = TestBroker::start_lark(config).await;
    let events = LarkEvents::new(&broker.url, None);
    let c = &broker.client;
    let chat = unique("oc");
    let host = linked(c, &chat).await;
    fake.fail_next([Failure::TooManyRequests]);
    let message_id = unique("om");
    let turn_id = lark_turn_answered(c, &events, &host, &chat, &message_id, "wait for it").await;
    let turn = wait_turn(
        c,
        host.session_id(),
        &turn_id,
        Duration::from_secs(10),
        |t| {
            t.reply
                .as_ref()
                .is_some_and(|r| r.state != ReplyState::Pending)
        },
    )
    .await;
    assert_eq!(
        turn.reply.as_ref().unwrap().state,
        ReplyState::Sent,
        "{:?}",
        turn.reply
    );
    assert_eq!(fake.replies_to(&message_id).len(), 1);
}

/// Twelve answers to one chat in a burst (Lark allows 5 QPS per chat): each
/// arrives exactly once, to its own message.
#[tokio::test]
async fn a_burst_of_replies_to_one_chat_arrives_once_each() {
    let (fake, broker, events) = lark(None).await;
    let c = &broker.client;
    let chat = unique("oc");
    let host = linked(c, &chat).await;
    let mut answered = Vec::new();
    for i in 0..12 {
        let message_id = format!("om-burst-{i}");
        let turn_id = lark_turn_answered(
            c,
            &events,
            &host,
            &chat,
            &message_id,
            &format!("answer {i}"),
        )
        .await;
        answered.push((message_id, turn_id));
    }
    for (_, turn_id) in &answered {
        wait_turn(
            c,
            host.session_id(),
            turn_id,
            Duration::from_secs(15),
            reply_is(ReplyState::Sent),
        )
        .await;
    }
    for (i, (message_id, _)) in answered.iter().enumerate() {
        let replies = fake.replies_to(message_id);
        assert_eq!(replies.len(), 1, "{message_id}: {replies:?}");
        assert_eq!(replies[0].text, format!("answer {i}"));
    }
    assert_eq!(fake.replies().len(), 12);
    assert_eq!(fake.token_requests(), 1);
}

/// A Lark that accepts the connection and never answers does not hold up a
/// shutdown; the reply is still pending, and goes out after the restart.
#[tokio::test]
async fn a_hanging_lark_does_not_hold_up_shutdown() {
    let fake = FakeLark::start().await;
    fake.hang(true);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let flags = fake.flags(None);
    let broker = Spawned::start(&data, &flag_refs(&flags)).await;
    let c = broker.client.clone();
    let chat = unique("oc");
    let host = linked(&c, &chat).await;
    let events = LarkEvents::new(&broker.url, None);
    let message_id = unique("om");
    let turn_id = lark_turn_answered(&c, &events, &host, &chat, &message_id, "held").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while fake.hung() == 0 {
        assert!(Instant::now() < deadline, "the reply request never came");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = Instant::now();
    assert!(broker.terminate().await.success());
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "SIGTERM took {:?} with a reply in flight",
        started.elapsed()
    );

    fake.hang(false);
    let broker = Spawned::start(&data, &flag_refs(&flags)).await;
    wait_turn(
        &broker.client,
        host.session_id(),
        &turn_id,
        Duration::from_secs(30),
        reply_is(ReplyState::Sent),
    )
    .await;
    assert_eq!(fake.replies_to(&message_id).len(), 1);
    assert!(broker.terminate().await.success());
}
