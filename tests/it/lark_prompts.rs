//! Every blocking prompt as a Lark card (issue 54), against the fake Lark
//! (its webhook client, its long connection and its REST side): a question
//! card's form answers the request with exactly the answers picked (an
//! incomplete form answers nothing), one tap answers a single question, a
//! plan is approved with a mode or sent back with feedback, a tool card's
//! "always allow" button answers with its suggestion; a prompt answered at
//! the terminal first updates its card and a late click answers nothing;
//! `yes <id>` cannot allow a question. Runs on SQLite and again on
//! PostgreSQL.

use std::collections::BTreeMap;
use std::time::Duration;

use loopx::client::Client;
use loopx::model::{
    AnsweredVia, CreatePermissionRequest, PermissionKind, PermissionRequest, PermissionState,
    PlanMode, Question, QuestionOption, Suggestion,
};
use serde_json::{Value, json};

use crate::fake_lark::*;
use crate::lark_pairing::answer_to;
use crate::lark_permissions::{ANN, acked, linked, said};
use crate::permissions::request;
use crate::presence::withdrawal;
use crate::support::*;

const BOB: &str = "ou_7d8a6e6df7621556ce0d21922b676706";
const WITHIN: Duration = Duration::from_secs(10);

const DATABASE: &str = "Which database should the service use?";
const FEATURES: &str = "Which features ship first?";

fn question(text: &str, header: &str, multi: bool, labels: &[&str]) -> Question {
    Question {
        question: text.into(),
        header: header.into(),
        multi_select: multi,
        options: labels
            .iter()
            .map(|l| QuestionOption {
                label: (*l).into(),
                description: format!("{l}, described"),
            })
            .collect(),
    }
}

async fn asked(c: &Client, host: &Host, id: &str, questions: Vec<Question>) {
    let made = CreatePermissionRequest {
        tool_name: "AskUserQuestion".into(),
        kind: PermissionKind::Question,
        questions: Some(questions),
        ..request(host, id, "")
    };
    c.create_permission(host.session_id(), &made).await.unwrap();
}

/// The two questions most tests ask: one single-select, one multi-select.
fn two_questions() -> Vec<Question> {
    vec![
        question(DATABASE, "Database", false, &["PostgreSQL", "SQLite"]),
        question(FEATURES, "Features", true, &["Auth", "Search", "Billing"]),
    ]
}

async fn read(c: &Client, host: &Host, id: &str) -> PermissionRequest {
    c.permission(host.session_id(), id).await.unwrap().body
}

/// Every button of a card, wherever it sits (a column, a form), in order.
fn buttons(card: &Value) -> Vec<Value> {
    fn walk(node: &Value, found: &mut Vec<Value>) {
        match node {
            Value::Object(map) => {
                if map.get("tag") == Some(&json!("button")) {
                    found.push(node.clone());
                }
                map.values().for_each(|v| walk(v, found));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, found)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    walk(card, &mut found);
    found
}

/// The callback value of the card's button that `pick` picks.
fn value_of(card: &Value, pick: impl Fn(&Value) -> bool) -> Value {
    buttons(card)
        .into_iter()
        .map(|b| b["behaviors"][0]["value"].clone())
        .find(|v| pick(v))
        .unwrap_or_else(|| panic!("no such button in {card}"))
}

/// The card the bot sent to `chat` for request `id` (waits for it).
async fn card_for(fake: &FakeLark, chat: &str, id: &str) -> ReplyRequest {
    let deadline = std::time::Instant::now() + WITHIN;
    loop {
        let found = fake.messages_in(chat).into_iter().find(|m| {
            buttons(&m.content)
                .iter()
                .any(|b| b["behaviors"][0]["value"]["request_id"] == id)
        });
        if let Some(card) = found {
            return card;
        }
        assert!(std::time::Instant::now() < deadline, "no card for {id}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The `card.action.trigger` Lark sends when `operator` clicks the button
/// whose value is `value` in `chat`, with a form's values when it submits one.
fn action(
    card: &ReplyRequest,
    value: Value,
    form: Option<Value>,
    operator: &str,
    chat: &str,
) -> Value {
    let mut action = json!({"value": value, "tag": "button"});
    if let Some(form) = form {
        action["form_value"] = form;
        action["name"] = json!(format!("{}_submit", value["form"].as_str().unwrap()));
    }
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
            "action": action,
            "host": "im_message",
            "context": {"open_message_id": card.posted_id, "open_chat_id": chat},
        },
    })
}

/// A question card's form, submitted by `operator` with `form`'s values.
fn submitted(card: &ReplyRequest, form: Value, operator: &str, chat: &str) -> Value {
    let value = value_of(&card.content, |v| v["form"] == "answers");
    action(card, value, Some(form), operator, chat)
}

/// Posts a click to the webhook: the callback answer.
async fn clicked(events: &LarkEvents, click: &Value) -> Value {
    let ack = events.post(click).await;
    assert_eq!(ack.status, 200, "{ack:?}");
    ack.body
}

fn answers(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(q, a)| ((*q).to_owned(), (*a).to_owned()))
            .collect(),
    )
}

/// The card a callback answer puts in place of the clicked one.
fn replacement(answer: &Value) -> &Value {
    assert_eq!(answer["card"]["type"], "raw", "{answer}");
    &answer["card"]["data"]
}

#[tokio::test]
async fn a_question_cards_form_answers_with_exactly_its_answers_over_the_long_connection() {
    let fake = FakeLark::start().await;
    let broker = TestBroker::start_lark(fake.long_connection_config()).await;
    fake.ws.wait_connected(1, WITHIN).await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let chat = unique("oc");
    c.lark_link_approved(host.session_id(), &chat, &[ANN.to_owned()])
        .await
        .unwrap();
    asked(c, &host, "abcde", two_questions()).await;
    let card = card_for(&fake, &chat, "abcde").await;
    let text = card.content.to_string();
    for shown in [DATABASE, FEATURES, "Database", "Billing, described"] {
        assert!(text.contains(shown), "{shown} in {text}");
    }
    let form = card.content["body"]["elements"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["tag"] == "form")
        .expect("a form")
        .clone();
    let tags: Vec<&str> = form["elements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["tag"].as_str().unwrap())
        .collect();
    assert_eq!(
        tags,
        [
            "select_static",
            "input",
            "multi_select_static",
            "input",
            "button"
        ]
    );

    // A stranger's complete form answers nothing.
    let full = json!({"q0": "1", "q1": ["2", "0"], "a0": "", "a1": ""});
    let ack = fake
        .ws
        .deliver(&submitted(&card, full.clone(), BOB, &chat), 1)
        .await;
    assert_eq!(ack.data["toast"]["type"], "warning", "{ack:?}");
    assert_eq!(
        read(c, &host, "abcde").await.state,
        PermissionState::Pending
    );

    // An approver's incomplete form: a toast says what is missing, nothing
    // is answered, the card stays.
    let partial = json!({"q0": "1", "a1": "  "});
    let ack = fake
        .ws
        .deliver(&submitted(&card, partial, ANN, &chat), 1)
        .await;
    assert_eq!(ack.code, 200, "{ack:?}");
    assert_eq!(ack.data["toast"]["type"], "warning", "{ack:?}");
    let toast = ack.data["toast"]["content"].as_str().unwrap();
    assert!(
        toast.contains("Features") && !toast.contains("Database"),
        "{toast}"
    );
    assert!(ack.data.get("card").is_none(), "{ack:?}");
    let pending = read(c, &host, "abcde").await;
    assert_eq!(
        (pending.state, pending.answer),
        (PermissionState::Pending, None)
    );

    // The complete form: exactly those answers, the labels of a
    // multi-select in the question's order.
    let ack = fake
        .ws
        .deliver(&submitted(&card, full, ANN, &chat), 1)
        .await;
    assert_eq!(ack.data["toast"]["type"], "success", "{ack:?}");
    let answered = read(c, &host, "abcde").await;
    assert_eq!(
        (answered.state, answered.answered_via),
        (PermissionState::Allowed, Some(AnsweredVia::Lark))
    );
    let chosen = answered.answer.expect("what was chosen");
    assert_eq!(
        chosen.answers,
        answers(&[(DATABASE, "SQLite"), (FEATURES, "Auth, Billing")])
    );
    let shown = replacement(&ack.data).to_string();
    assert!(
        shown.contains("Auth, Billing") && shown.contains("SQLite"),
        "{shown}"
    );
    assert!(
        !shown.contains("\"form\""),
        "no form left on the card: {shown}"
    );

    // Words of one's own win over a pick; one tap answers a lone question.
    asked(c, &host, "fghij", two_questions()).await;
    let words = card_for(&fake, &chat, "fghij").await;
    let form = json!({"q0": "0", "a0": "CockroachDB, please", "q1": ["1"]});
    let ack = fake
        .ws
        .deliver(&submitted(&words, form, ANN, &chat), 1)
        .await;
    assert_eq!(ack.data["toast"]["type"], "success", "{ack:?}");
    assert_eq!(
        read(c, &host, "fghij").await.answer.unwrap().answers,
        answers(&[(DATABASE, "CockroachDB, please"), (FEATURES, "Search")])
    );
    let lone = vec![question(
        DATABASE,
        "Database",
        false,
        &["PostgreSQL", "SQLite"],
    )];
    asked(c, &host, "kmnop", lone).await;
    let tap = card_for(&fake, &chat, "kmnop").await;
    let value = value_of(&tap.content, |v| v["option"] == 0);
    let ack = fake
        .ws
        .deliver(&action(&tap, value, None, ANN, &chat), 1)
        .await;
    assert_eq!(ack.data["toast"]["type"], "success", "{ack:?}");
    assert_eq!(
        read(c, &host, "kmnop").await.answer.unwrap().answers,
        answers(&[(DATABASE, "PostgreSQL")])
    );
}

#[tokio::test]
async fn a_plan_is_approved_with_its_mode_or_sent_back_with_feedback() {
    let (fake, broker, events, host, chat) = linked(&[ANN]).await;
    let c = &broker.client;
    let plan = |id: &str, plan: String| CreatePermissionRequest {
        tool_name: "ExitPlanMode".into(),
        kind: PermissionKind::Plan,
        plan: Some(plan),
        ..request(&host, id, "")
    };
    let markdown = "## Steps\n\n1. Add the `users` table\n2. Write <the> migration".to_owned();
    for id in ["plana", "planb"] {
        c.create_permission(host.session_id(), &plan(id, markdown.clone()))
            .await
            .unwrap();
    }
    let approve = card_for(&fake, &chat, "plana").await;
    assert!(
        approve.text.contains("## Steps") && approve.text.contains("&lt;the&gt;"),
        "{}",
        approve.text
    );
    let value = value_of(&approve.content, |v| v["mode"] == "accept_edits");
    let answer = clicked(&events, &action(&approve, value, None, ANN, &chat)).await;
    assert_eq!(answer["toast"]["type"], "success", "{answer}");
    assert!(
        replacement(&answer)
            .to_string()
            .contains("auto-accept edits"),
        "{answer}"
    );
    let approved = read(c, &host, "plana").await;
    assert_eq!(approved.state, PermissionState::Allowed);
    assert_eq!(approved.answer.unwrap().mode, Some(PlanMode::AcceptEdits));

    let back = card_for(&fake, &chat, "planb").await;
    let value = value_of(&back.content, |v| v["form"] == "feedback");
    let empty = action(
        &back,
        value.clone(),
        Some(json!({"feedback": " "})),
        ANN,
        &chat,
    );
    let answer = clicked(&events, &empty).await;
    assert_eq!(answer["toast"]["type"], "warning", "{answer}");
    assert_eq!(
        read(c, &host, "planb").await.state,
        PermissionState::Pending
    );
    let said = json!({"feedback": "Split the migration in two"});
    let answer = clicked(&events, &action(&back, value, Some(said), ANN, &chat)).await;
    assert_eq!(answer["toast"]["type"], "success", "{answer}");
    let denied = read(c, &host, "planb").await;
    assert_eq!(denied.state, PermissionState::Denied);
    let chosen = denied.answer.unwrap();
    assert_eq!(
        (chosen.message.as_deref(), chosen.mode),
        (Some("Split the migration in two"), None)
    );
    assert!(
        replacement(&answer)
            .to_string()
            .contains("Split the migration in two")
    );

    // A plan longer than a card: cut below Lark's limit, saying so.
    let long = (0..1500)
        .map(|n| format!("{n}. A step that says \"what\" it does\n"))
        .collect::<String>();
    c.create_permission(host.session_id(), &plan("planc", long))
        .await
        .unwrap();
    let cut = card_for(&fake, &chat, "planc").await;
    assert_eq!(cut.code, 0, "{cut:?}");
    assert!(cut.body_len < 30_000, "{}", cut.body_len);
    assert!(cut.text.contains("longer than a card"), "{}", cut.text);
}

#[tokio::test]
async fn a_tool_cards_always_allow_button_answers_with_its_suggestion() {
    let (fake, broker, events, host, chat) = linked(&[ANN]).await;
    let c = &broker.client;
    let labels = [
        "Always allow Bash(npm test)",
        "Always allow Bash(npm *) here",
    ];
    let made = CreatePermissionRequest {
        suggestions: Some(
            labels
                .iter()
                .map(|l| Suggestion { label: (*l).into() })
                .collect(),
        ),
        ..request(&host, "abcde", "npm test")
    };
    c.create_permission(host.session_id(), &made).await.unwrap();
    let card = card_for(&fake, &chat, "abcde").await;
    let texts: Vec<String> = buttons(&card.content)
        .iter()
        .map(|b| b["text"]["content"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(texts.len(), 4, "{texts:?}");
    assert_eq!(&texts[2..], labels.map(str::to_owned));
    let value = value_of(&card.content, |v| v["suggestion"] == 1);
    let answer = clicked(&events, &action(&card, value, None, ANN, &chat)).await;
    assert_eq!(answer["toast"]["type"], "success", "{answer}");
    assert!(
        replacement(&answer).to_string().contains(labels[1]),
        "{answer}"
    );
    let allowed = read(c, &host, "abcde").await;
    assert_eq!(allowed.state, PermissionState::Allowed);
    assert_eq!(allowed.answer.unwrap().suggestion, Some(1));
}

#[tokio::test]
async fn a_prompt_answered_at_the_terminal_updates_its_card_and_a_late_click_answers_nothing() {
    let (fake, broker, events, host, chat) = linked(&[ANN]).await;
    let c = &broker.client;
    asked(c, &host, "abcde", two_questions()).await;
    let card = card_for(&fake, &chat, "abcde").await;
    let terminal = loopx::model::WithdrawPermission {
        answered_at_terminal: true,
        ..withdrawal(&host)
    };
    c.withdraw_permission(host.session_id(), "abcde", &terminal)
        .await
        .unwrap();
    let patch = &fake.wait_for_patches(&card.posted_id, 1, WITHIN).await[0];
    let shown = patch.card.to_string();
    assert!(shown.contains("Answered at the terminal"), "{shown}");
    assert!(buttons(&patch.card).is_empty(), "{shown}");

    let full = json!({"q0": "0", "q1": ["0"]});
    let late = clicked(&events, &submitted(&card, full, ANN, &chat)).await;
    assert_eq!(late["toast"]["type"], "info", "{late}");
    assert!(
        late["toast"]["content"]
            .as_str()
            .unwrap()
            .contains("Already answered"),
        "{late}"
    );
    let retired = read(c, &host, "abcde").await;
    assert_eq!(
        (retired.state, retired.answered_via, retired.answer),
        (PermissionState::Expired, Some(AnsweredVia::Terminal), None)
    );
}

#[tokio::test]
async fn yes_on_a_question_answers_nothing_and_says_where_to_answer() {
    let (fake, broker, events, host, chat) = linked(&[ANN]).await;
    let c = &broker.client;
    asked(c, &host, "abcde", two_questions()).await;
    card_for(&fake, &chat, "abcde").await;

    let yes = said(&events, &chat, ANN, "yes abcde");
    acked(&events, &yes).await;
    let message_id = yes["event"]["message"]["message_id"].as_str().unwrap();
    let (title, text) = answer_to(&fake, message_id).await;
    assert!(title.contains("Not answered"), "{title}");
    assert!(text.contains("on its card"), "{text}");
    assert_eq!(
        read(c, &host, "abcde").await.state,
        PermissionState::Pending
    );

    // A stranger's `yes` is still ignored, silently.
    let stranger = said(&events, &chat, BOB, "yes abcde");
    acked(&events, &stranger).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stranger_id = stranger["event"]["message"]["message_id"].as_str().unwrap();
    assert!(fake.replies_to(stranger_id).is_empty());

    // `no` declines it as before.
    acked(&events, &said(&events, &chat, ANN, "no abcde")).await;
    assert_eq!(read(c, &host, "abcde").await.state, PermissionState::Denied);
}
