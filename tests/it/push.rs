//! Web Push subscriptions (WEB.md "Installable, and it tells you"): the
//! broker's VAPID key, subscriptions tied to their caller (the owner or a
//! device) and gone with a revoked device, the endpoint and key rules, the
//! per-caller limit, a browser subscribing again.

use loopx::client::Client;
use loopx::model::{
    NewPushSubscription, PushKey, PushKeys, PushSubscription, PushSubscriptionList, SignIn,
};
use reqwest::Method;

use crate::support::TestBroker;

async fn key(client: &Client) -> String {
    let reply = client
        .call::<PushKey>(Method::GET, "/v1/push/key", None::<&()>, None)
        .await;
    reply.unwrap().body.key
}

/// A subscription whose `p256dh` is a real P-256 point (the broker's own
/// key serves) and whose auth secret is 16 bytes.
async fn subscription(client: &Client, endpoint: &str) -> NewPushSubscription {
    NewPushSubscription {
        endpoint: endpoint.to_owned(),
        keys: PushKeys {
            p256dh: key(client).await,
            auth: "_ordMnz7uTCmrpBTeUV4Bw".into(),
        },
    }
}

async fn subscribe(client: &Client, body: &NewPushSubscription) -> (u16, String) {
    let reply = client
        .send(Method::POST, "/v1/push/subscriptions", Some(body), None)
        .await
        .unwrap();
    (reply.status.as_u16(), reply.text)
}

async fn listed(client: &Client) -> Vec<PushSubscription> {
    client
        .call::<PushSubscriptionList>(Method::GET, "/v1/push/subscriptions", None::<&()>, None)
        .await
        .unwrap()
        .body
        .subscriptions
}

async fn device(broker: &TestBroker, name: &str) -> (String, Client) {
    let code = broker.client.device_link().await.unwrap().body.code;
    let sign_in = SignIn {
        code,
        name: name.into(),
    };
    let signed = broker
        .client_with_token(None)
        .sign_in_device(&sign_in)
        .await
        .unwrap()
        .body;
    (
        signed.device_id,
        broker.client_with_token(Some(&signed.token)),
    )
}

#[tokio::test]
async fn push_the_key_is_an_uncompressed_p256_point() {
    use base64::Engine;
    let mut broker = TestBroker::start().await;
    let key = key(&broker.client).await;
    let point = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(&key)
        .unwrap();
    assert_eq!((point.len(), point[0]), (65, 4));
    let anonymous = broker.client_with_token(None);
    let reply = anonymous
        .send(Method::GET, "/v1/push/key", None::<&()>, None)
        .await
        .unwrap();
    assert_eq!(reply.status, 401);
    broker.stop().await;
}

#[tokio::test]
async fn push_subscriptions_belong_to_their_caller_and_go_with_a_revoked_device() {
    let mut broker = TestBroker::start().await;
    let owner = broker.client.clone();
    let (device_id, phone) = device(&broker, "Safari on iPhone").await;
    let (status, body) = subscribe(
        &owner,
        &subscription(&owner, "https://push.example.net/owner").await,
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = subscribe(
        &phone,
        &subscription(&phone, "http://127.0.0.1:9/phone").await,
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert!(
        !body.contains("p256dh") && !body.contains("auth"),
        "never the keys: {body}"
    );
    let mine = listed(&owner).await;
    let theirs = listed(&phone).await;
    assert_eq!(mine.len(), 1);
    assert_eq!(theirs.len(), 1);
    assert_eq!(theirs[0].endpoint, "http://127.0.0.1:9/phone");

    // Only the caller removes its own.
    let path = format!("/v1/push/subscriptions/{}", mine[0].subscription_id);
    let reply = phone
        .send(Method::DELETE, &path, None::<&()>, None)
        .await
        .unwrap();
    assert_eq!(reply.status, 404);

    // The same endpoint again replaces the earlier subscription.
    subscribe(
        &phone,
        &subscription(&phone, "http://127.0.0.1:9/phone").await,
    )
    .await;
    assert_eq!(listed(&phone).await.len(), 1);

    broker.client.revoke_device(&device_id).await.unwrap();
    let left = broker
        .broker
        .store()
        .push_subscriptions(Some(&device_id))
        .await
        .unwrap();
    assert!(left.is_empty(), "gone with the device: {left:?}");
    assert_eq!(listed(&owner).await.len(), 1, "the owner's stays");
    let reply = owner
        .send(Method::DELETE, &path, None::<&()>, None)
        .await
        .unwrap();
    assert_eq!(reply.status, 204);
    assert!(listed(&owner).await.is_empty());
    broker.stop().await;
}

#[tokio::test]
async fn push_endpoints_keys_and_the_limit_are_checked() {
    let mut broker = TestBroker::start().await;
    let owner = broker.client.clone();
    for endpoint in [
        "http://push.example.net/x",
        "ftp://127.0.0.1/x",
        "not a url",
        &format!("https://e.net/{}", "a".repeat(2048)),
    ] {
        let (status, body) = subscribe(&owner, &subscription(&owner, endpoint).await).await;
        assert_eq!(status, 400, "{endpoint}: {body}");
    }
    let mut bad = subscription(&owner, "https://push.example.net/x").await;
    bad.keys.auth = "c2hvcnQ".into();
    assert_eq!(subscribe(&owner, &bad).await.0, 400);
    bad.keys.auth = "_ordMnz7uTCmrpBTeUV4Bw".into();
    bad.keys.p256dh = "BBBB".into();
    assert_eq!(subscribe(&owner, &bad).await.0, 400);
    let extra = serde_json::json!({"endpoint": "https://e.net/x", "keys": {"p256dh": "a", "auth": "b"}, "x": 1});
    let reply = owner
        .send(Method::POST, "/v1/push/subscriptions", Some(&extra), None)
        .await
        .unwrap();
    assert_eq!(reply.status, 400);

    for n in 0..10 {
        let endpoint = format!("https://push.example.net/{n}");
        assert_eq!(
            subscribe(&owner, &subscription(&owner, &endpoint).await)
                .await
                .0,
            201
        );
    }
    let (status, body) = subscribe(
        &owner,
        &subscription(&owner, "https://push.example.net/11").await,
    )
    .await;
    assert_eq!(status, 409);
    assert!(body.contains("too_many_subscriptions"), "{body}");
    broker.stop().await;
}
