//! Devices signed in with a one-time link (WEB.md "Signing in a phone"):
//! a link signs in one device, once; an expired, used or wrong code is one
//! refusal; guessing is throttled; a device credential works on `/v1` but
//! not on the devices' routes; a revoked device is 401 at once; the limits
//! (open links, devices, names) hold; `loopx web` prints the link, its QR
//! code, the devices, and revokes.

use loopx::client::{Client, ClientError};
use loopx::model::{ListSessions, SignIn};
use reqwest::Method;

use crate::cli::loopx_at;
use crate::support::{TOKEN, TestBroker, bound_host, code, enqueue};

async fn link(broker: &TestBroker) -> String {
    broker.client.device_link().await.unwrap().body.code
}

fn sign_in(code: &str, name: &str) -> SignIn {
    SignIn {
        code: code.to_owned(),
        name: name.to_owned(),
    }
}

/// A client with no bearer at all, as a phone opening a link is.
fn anonymous(broker: &TestBroker) -> Client {
    broker.client_with_token(None)
}

/// Moves every sign-in link's expiry into the past (the API cannot).
async fn expire_links(broker: &TestBroker) {
    broker
        .execute_sql("update device_links set expires_at = 0")
        .await;
}

/// How many devices are signed in.
async fn devices_signed_in(broker: &TestBroker) -> usize {
    broker.client.devices().await.unwrap().body.devices.len()
}

#[tokio::test]
async fn devices_a_link_signs_in_one_device_once_with_a_credential_of_its_own() {
    let mut broker = TestBroker::start().await;
    let host = bound_host(&broker.client).await;
    let minted = broker.client.device_link().await.unwrap().body;
    assert_eq!(minted.code.len(), 26);
    let phone = anonymous(&broker)
        .sign_in_device(&sign_in(
            &minted.code.to_lowercase(),
            "  Chrome on Android ",
        ))
        .await
        .unwrap();
    assert_eq!(phone.reply.status, 201);
    let device = phone.body;
    assert_eq!(device.name, "Chrome on Android");
    assert!(device.device_id.starts_with("dev_") && device.token.starts_with("lxd_"));
    assert_ne!(device.token, TOKEN);

    // The device works on /v1 with its own credential, as the owner would.
    let as_phone = broker.client_with_token(Some(&device.token));
    as_phone.sessions(&ListSessions::default()).await.unwrap();
    enqueue(&as_phone, &host, "from the phone").await;

    // Good once: the same code again is the one refusal.
    let again = anonymous(&broker)
        .sign_in_device(&sign_in(&minted.code, "Another"))
        .await;
    assert_eq!(code(again), (401, "unauthorized".into()));

    // Listed (never with its credential), seen just now.
    let list = broker.client.devices().await.unwrap();
    assert!(!list.reply.text.contains(&device.token) && !list.reply.text.contains("token"));
    let [listed] = list.body.devices.as_slice() else {
        panic!("{list:?}")
    };
    assert_eq!(
        (listed.device_id.as_str(), listed.name.as_str()),
        (device.device_id.as_str(), "Chrome on Android")
    );
    assert!(listed.last_seen_at.is_some());

    // Managing devices and minting links is the owner's alone.
    assert_eq!(code(as_phone.devices().await), (403, "owner_only".into()));
    assert_eq!(
        code(as_phone.device_link().await),
        (403, "owner_only".into())
    );
    let revoke = as_phone.revoke_device(&device.device_id).await;
    assert!(
        matches!(revoke, Err(ClientError::Refused { ref reply, .. }) if reply.status == 403),
        "{revoke:?}"
    );
    broker.stop().await;
}

#[tokio::test]
async fn devices_an_expired_used_or_wrong_code_is_the_one_same_refusal() {
    let mut broker = TestBroker::start().await;
    let used = link(&broker).await;
    anonymous(&broker)
        .sign_in_device(&sign_in(&used, "First"))
        .await
        .unwrap();
    let expired = link(&broker).await;
    expire_links(&broker).await;
    let mut messages = Vec::new();
    for code_ in [
        expired.as_str(),
        used.as_str(),
        "0000000000000000000000000Z",
        "",
        "\0",
    ] {
        match anonymous(&broker)
            .sign_in_device(&sign_in(code_, "Phone"))
            .await
        {
            Err(ClientError::Refused { reply, error }) => {
                assert_eq!(
                    (reply.status.as_u16(), error.error.code_str()),
                    (401, "unauthorized".into()),
                    "{code_:?}"
                );
                messages.push(error.error.message);
            }
            other => panic!("{code_:?}: {other:?}"),
        }
    }
    messages.dedup();
    assert_eq!(messages.len(), 1, "it does not say which: {messages:?}");
    // Nothing else changed.
    assert_eq!(broker.client.devices().await.unwrap().body.devices.len(), 1);
    broker.stop().await;
}

#[tokio::test]
async fn devices_a_revoked_device_is_refused_at_its_next_request() {
    let mut broker = TestBroker::start().await;
    let code_ = link(&broker).await;
    let device = anonymous(&broker)
        .sign_in_device(&sign_in(&code_, "Safari on iPhone"))
        .await
        .unwrap()
        .body;
    let as_phone = broker.client_with_token(Some(&device.token));
    as_phone.sessions(&ListSessions::default()).await.unwrap();

    let revoked = broker
        .client
        .revoke_device(&device.device_id)
        .await
        .unwrap();
    assert_eq!(revoked.status, 204);
    assert_eq!(
        code(as_phone.sessions(&ListSessions::default()).await),
        (401, "unauthorized".into())
    );
    assert_eq!(devices_signed_in(&broker).await, 0);
    let again = broker.client.revoke_device(&device.device_id).await;
    assert!(
        matches!(again, Err(ClientError::Refused { ref reply, .. }) if reply.status == 404),
        "{again:?}"
    );
    // A credential that was never made, and one shaped like a device's, are 401 too.
    for token in ["lxd_", "lxd_AAAA", "not-a-token"] {
        let stranger = broker.client_with_token(Some(token));
        assert_eq!(
            code(stranger.sessions(&ListSessions::default()).await),
            (401, "unauthorized".into())
        );
    }
    broker.stop().await;
}

#[tokio::test]
async fn devices_guessing_codes_is_throttled_after_ten_wrong_ones() {
    let mut broker = TestBroker::start().await;
    let good = link(&broker).await;
    for n in 0..10 {
        let guess = format!("{n:0>26}");
        let refused = anonymous(&broker)
            .sign_in_device(&sign_in(&guess, "Guesser"))
            .await;
        assert_eq!(code(refused), (401, "unauthorized".into()), "guess {n}");
    }
    // Shut now, for a good code too, with Retry-After.
    let reply = anonymous(&broker)
        .send(
            Method::POST,
            "/v1/devices",
            Some(&sign_in(&good, "Owner's phone")),
            None,
        )
        .await
        .unwrap();
    assert_eq!(reply.status, 429, "{}", reply.text);
    assert!(reply.text.contains("too_many_attempts"));
    // The good link is not spent by a throttled try: it still works once
    // the window ends (after a restart the count starts again).
    broker.restart(None).await;
    let device = anonymous(&broker)
        .sign_in_device(&sign_in(&good, "Owner's phone"))
        .await
        .unwrap();
    assert_eq!(device.reply.status, 201);
    broker.stop().await;
}

#[tokio::test]
async fn devices_limits_hold_names_open_links_and_devices() {
    let mut broker = TestBroker::start().await;
    // Names: 1 to 64 characters, no control character; checked before the code.
    let code_ = link(&broker).await;
    for name in ["", "   ", "tab\tname", &"x".repeat(65)] {
        let refused = anonymous(&broker)
            .sign_in_device(&sign_in(&code_, name))
            .await;
        assert_eq!(code(refused), (400, "invalid_request".into()), "{name:?}");
    }
    // Unknown fields and a missing name are 400 as everywhere.
    let reply = anonymous(&broker)
        .send(
            Method::POST,
            "/v1/devices",
            Some(&serde_json::json!({"code": code_, "name": "n", "extra": 1})),
            None,
        )
        .await
        .unwrap();
    assert_eq!(reply.status, 400);
    let reply = anonymous(&broker)
        .send(
            Method::POST,
            "/v1/devices",
            Some(&serde_json::json!({"code": code_})),
            None,
        )
        .await
        .unwrap();
    assert_eq!(reply.status, 400);

    // At most 20 links open at once.
    for _ in 1..20 {
        link(&broker).await;
    }
    assert_eq!(
        code(broker.client.device_link().await),
        (429, "too_many_attempts".into())
    );
    expire_links(&broker).await;
    link(&broker).await; // the expired ones are gone

    // At most 50 devices; the 51st keeps its link.
    for n in 0..50 {
        let code_ = link(&broker).await;
        anonymous(&broker)
            .sign_in_device(&sign_in(&code_, &format!("Phone {n}")))
            .await
            .unwrap();
    }
    let spare = link(&broker).await;
    assert_eq!(
        code(
            anonymous(&broker)
                .sign_in_device(&sign_in(&spare, "One too many"))
                .await
        ),
        (409, "too_many_devices".into())
    );
    let first = broker.client.devices().await.unwrap().body.devices[0]
        .device_id
        .clone();
    broker.client.revoke_device(&first).await.unwrap();
    anonymous(&broker)
        .sign_in_device(&sign_in(&spare, "One too many"))
        .await
        .unwrap();
    broker.stop().await;
}

#[tokio::test]
async fn devices_loopx_web_prints_the_link_and_its_qr_code_lists_and_revokes() {
    let mut broker = TestBroker::start().await;
    let broker_url = broker.url.clone();
    let link_args = [
        "web",
        "link",
        "--format",
        "json",
        "--base-url",
        "https://phone.example",
    ];
    let json = loopx_at(&broker_url, &link_args).await.ok().json();
    let url = json["url"].as_str().unwrap();
    let code_ = url.strip_prefix("https://phone.example/#link=").expect(url);
    assert!(json["expires_at"].as_str().unwrap().ends_with('Z'));
    anonymous(&broker)
        .sign_in_device(&sign_in(code_, "Firefox on Linux"))
        .await
        .unwrap();

    let text = loopx_at(&broker_url, &["web", "link"])
        .await
        .ok()
        .stdout
        .clone();
    assert!(text.contains(&format!("{}/#link=", broker.url)), "{text}");
    assert!(
        text.contains('▀') || text.contains('▄'),
        "a QR code in half blocks: {text}"
    );

    let devices = loopx_at(&broker_url, &["web", "devices"])
        .await
        .ok()
        .stdout
        .clone();
    assert!(devices.contains("Firefox on Linux"), "{devices}");
    let id = devices.split_whitespace().next().unwrap().to_owned();
    let listed = loopx_at(&broker_url, &["web", "devices", "--format", "json"])
        .await
        .ok()
        .json();
    assert_eq!(listed["devices"][0]["device_id"], id.as_str());
    loopx_at(&broker_url, &["web", "revoke", "--device-id", &id])
        .await
        .ok();
    assert_eq!(devices_signed_in(&broker).await, 0);
    let gone = loopx_at(&broker_url, &["web", "revoke", "--device-id", &id]).await;
    assert_eq!(gone.code, 1, "the broker refused: {gone:?}");
    broker.stop().await;
}
