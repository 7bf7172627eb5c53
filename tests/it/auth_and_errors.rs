//! The owner token, the JSON error shape for every rejection, the limits and
//! the precedence between errors.

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::*;

/// Sends raw bytes with the given content type and answers (status, code).
async fn raw(
    broker: &TestBroker,
    method: Method,
    path: &str,
    token: Option<&str>,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> (u16, String) {
    let mut request = reqwest::Client::new().request(method, format!("{}{}", broker.url, path));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(content_type) = content_type {
        request = request.header("content-type", content_type);
    }
    let response = request.body(body).send().await.unwrap();
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let text = response.text().await.unwrap();
    if status < 300 {
        return (status, String::new());
    }
    assert_eq!(
        content_type, "application/json",
        "every error is JSON: {text:?}"
    );
    let value: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text:?}"));
    let code = value["error"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("no code: {text}"));
    assert!(
        value["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
    );
    (status, code.to_owned())
}

const JSON: Option<&str> = Some("application/json");

#[tokio::test]
async fn every_v1_route_needs_the_owner_token() {
    let broker = TestBroker::start().await;
    let host = bound_host(&broker.client).await;
    let sid = host.session_id();
    let routes = [
        (Method::POST, "/v1/agent-threads".to_owned()),
        (Method::POST, "/v1/sessions".to_owned()),
        (Method::GET, "/v1/sessions".to_owned()),
        (Method::GET, format!("/v1/sessions/{sid}")),
        (Method::POST, format!("/v1/sessions/{sid}/messages")),
        (Method::POST, format!("/v1/sessions/{sid}/claims")),
        (Method::POST, format!("/v1/sessions/{sid}/claims/c/release")),
        (Method::POST, format!("/v1/sessions/{sid}/turns/t/complete")),
        (Method::GET, format!("/v1/sessions/{sid}/turns/t")),
        (Method::GET, format!("/v1/sessions/{sid}/turns")),
        (Method::POST, format!("/v1/sessions/{sid}/close")),
        (Method::GET, "/v1/nowhere".to_owned()),
    ];
    for (method, path) in routes {
        for token in [None, Some("wrong-token"), Some(&TOKEN[..TOKEN.len() - 1])] {
            let answer = raw(&broker, method.clone(), &path, token, JSON, b"{}".to_vec()).await;
            assert_eq!(
                answer,
                (401, "unauthorized".into()),
                "{method} {path} with {token:?}"
            );
        }
    }
    // A wrong scheme is no token either.
    let reply = reqwest::Client::new()
        .get(format!("{}/v1/sessions", broker.url))
        .header("authorization", format!("Basic {TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 401);
    // The session was not closed by any of this.
    assert_eq!(
        broker.client.session(sid).await.unwrap().body.state,
        loopx::model::SessionState::Open
    );
}

#[tokio::test]
async fn health_and_the_document_need_no_token_and_reveal_no_data() {
    let broker = TestBroker::start().await;
    let anonymous = broker.client_with_token(None);
    let health = anonymous.healthz().await.unwrap();
    assert_eq!(health.reply.status, 200);
    assert_eq!(health.body, json!({"status": "ok"}));
}

#[tokio::test]
async fn unknown_routes_and_wrong_methods_answer_json_errors() {
    let broker = TestBroker::start().await;
    assert_eq!(
        raw(&broker, Method::GET, "/nowhere", None, None, vec![]).await,
        (404, "not_found".into())
    );
    assert_eq!(
        raw(
            &broker,
            Method::GET,
            "/v1/nowhere",
            Some(TOKEN),
            None,
            vec![]
        )
        .await,
        (404, "not_found".into())
    );
    assert_eq!(
        raw(
            &broker,
            Method::DELETE,
            "/v1/sessions",
            Some(TOKEN),
            None,
            vec![]
        )
        .await,
        (405, "method_not_allowed".into())
    );
    assert_eq!(
        raw(
            &broker,
            Method::GET,
            "/v1/sessions/x/close",
            Some(TOKEN),
            None,
            vec![]
        )
        .await,
        (405, "method_not_allowed".into())
    );
    assert_eq!(
        raw(&broker, Method::POST, "/healthz", None, None, vec![]).await,
        (405, "method_not_allowed".into())
    );
}

#[tokio::test]
async fn malformed_bodies_are_400_415_or_413_and_change_nothing() {
    let broker = TestBroker::start().await;
    let host = bound_host(&broker.client).await;
    let path = format!("/v1/sessions/{}/messages", host.session_id());
    let post = |content_type: Option<&'static str>, body: Vec<u8>| {
        raw(
            &broker,
            Method::POST,
            &path,
            Some(TOKEN),
            content_type,
            body,
        )
    };
    let bad_request = (400, "invalid_request".to_owned());
    assert_eq!(post(JSON, b"{not json".to_vec()).await, bad_request);
    assert_eq!(post(JSON, b"".to_vec()).await, bad_request);
    assert_eq!(post(JSON, b"[]".to_vec()).await, bad_request);
    assert_eq!(
        post(JSON, br#"{"origin": "web"}"#.to_vec()).await,
        bad_request
    );
    assert_eq!(
        post(JSON, br#"{"origin": "fax", "text": "x"}"#.to_vec()).await,
        bad_request
    );
    assert_eq!(
        post(JSON, br#"{"origin": "web", "text": 5}"#.to_vec()).await,
        bad_request
    );
    assert_eq!(
        post(
            JSON,
            br#"{"origin": "web", "text": "x", "colour": "red"}"#.to_vec()
        )
        .await,
        bad_request
    );
    assert_eq!(
        post(JSON, br#"{"origin": "web", "text": ""}"#.to_vec()).await,
        bad_request
    );
    assert_eq!(
        post(JSON, br#"{"origin": "web", "text": "x", "lark": {"chat_id": "a", "message_id": "b", "x": 1}}"#.to_vec()).await,
        bad_request
    );
    assert_eq!(post(JSON, vec![0xff, 0xfe]).await, bad_request);
    let long_text = json!({"origin": "web", "text": "x".repeat(64 * 1024 + 1)});
    assert_eq!(
        post(JSON, long_text.to_string().into_bytes()).await,
        bad_request
    );
    let max_text = json!({"origin": "web", "text": "é".repeat(32 * 1024)});
    assert_eq!(
        broker
            .client
            .send(Method::POST, &path, Some(&max_text), None)
            .await
            .unwrap()
            .status,
        201
    );

    let unsupported = (415, "unsupported_media_type".to_owned());
    let good = br#"{"origin": "web", "text": "x"}"#.to_vec();
    assert_eq!(post(None, good.clone()).await, unsupported);
    assert_eq!(post(Some("text/plain"), good.clone()).await, unsupported);
    assert_eq!(
        post(Some("application/x-www-form-urlencoded"), good.clone()).await,
        unsupported
    );
    assert_eq!(
        raw(
            &broker,
            Method::POST,
            &path,
            Some(TOKEN),
            Some("application/json; charset=utf-8"),
            good
        )
        .await
        .0,
        201
    );

    let too_large = vec![b' '; 2 * 1024 * 1024 + 1];
    assert_eq!(
        post(JSON, too_large).await,
        (413, "payload_too_large".into())
    );

    let turns = broker
        .client
        .turns(host.session_id(), &Default::default())
        .await
        .unwrap()
        .body;
    assert_eq!(
        turns.turns.len(),
        2,
        "only the two accepted messages were queued"
    );
}

#[tokio::test]
async fn client_chosen_ids_are_1_to_256_bytes_without_control_characters() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let ok = "x".repeat(256);
    assert_eq!(
        c.register(&thread(&ok, "a", "h"))
            .await
            .unwrap()
            .reply
            .status,
        201
    );
    for bad in [
        String::new(),
        "x".repeat(257),
        "a\u{0}b".into(),
        "tab\there".into(),
        "nl\n".into(),
        "del\u{7f}".into(),
    ] {
        assert_eq!(
            code(c.register(&thread(&bad, "a", "h")).await),
            (400, "invalid_request".into())
        );
        assert_eq!(
            code(c.register(&thread("g", &bad, "h")).await),
            (400, "invalid_request".into())
        );
        assert_eq!(
            code(c.register(&thread("g", "a", &bad)).await),
            (400, "invalid_request".into())
        );
        let mut t = thread("g", "a", "h");
        t.host_surface = bad.clone();
        assert_eq!(code(c.register(&t).await), (400, "invalid_request".into()));
        let mut b = bind_request("g", "a", "h");
        b.executor_endpoint_id = bad.clone();
        assert_eq!(code(c.bind(&b).await), (400, "invalid_request".into()));
    }
    let host = bound_host(c).await;
    let turn = enqueue(c, &host, "q").await;
    for bad in [String::new(), "x".repeat(257), "a\rb".into()] {
        assert_eq!(
            code(
                c.claim(host.session_id(), &host.claim_request(&bad, 0))
                    .await
            ),
            (400, "invalid_request".into())
        );
        let keyed = loopx::model::EnqueueRequest {
            attachments: Vec::new(),
            client_message_id: Some(bad.clone()),
            ..web("x")
        };
        assert_eq!(
            code(c.enqueue(host.session_id(), &keyed).await),
            (400, "invalid_request".into())
        );
    }
    claim(c, &host, "c1", 0).await;
    for bad in [String::new(), "x".repeat(257)] {
        assert_eq!(
            code(
                c.complete(
                    host.session_id(),
                    &turn.turn_id,
                    &host.completion("c1", &bad, "m")
                )
                .await
            ),
            (400, "invalid_request".into())
        );
    }
    // Multi-byte UTF-8 counts bytes: 128 × 2 bytes fits, 129 × 2 does not.
    assert_eq!(
        c.register(&thread(&"é".repeat(128), "a", "h"))
            .await
            .unwrap()
            .reply
            .status,
        201
    );
    assert_eq!(
        code(c.register(&thread(&"é".repeat(129), "a", "h")).await),
        (400, "invalid_request".into())
    );
}

#[tokio::test]
async fn precedence_401_413_415_400_404_403() {
    let broker = TestBroker::start().await;
    let host = bound_host(&broker.client).await;
    let huge = vec![b'x'; 2 * 1024 * 1024 + 10];
    let claims = format!("/v1/sessions/{}/claims", host.session_id());
    // 401 before 413.
    assert_eq!(
        raw(&broker, Method::POST, &claims, None, None, huge.clone())
            .await
            .0,
        401
    );
    // 413 before 415.
    assert_eq!(
        raw(
            &broker,
            Method::POST,
            &claims,
            Some(TOKEN),
            Some("text/plain"),
            huge
        )
        .await
        .0,
        413
    );
    // 415 before 400.
    assert_eq!(
        raw(
            &broker,
            Method::POST,
            &claims,
            Some(TOKEN),
            Some("text/plain"),
            b"{bad".to_vec()
        )
        .await
        .0,
        415
    );
    // 400 before 404.
    assert_eq!(
        raw(
            &broker,
            Method::POST,
            "/v1/sessions/ses_nope/claims",
            Some(TOKEN),
            JSON,
            b"{}".to_vec()
        )
        .await
        .0,
        400
    );
    // 404 before 403.
    let wrong_host = json!({"host_surface": "x", "host_session_id": "y", "claim_id": "c"});
    assert_eq!(
        raw(
            &broker,
            Method::POST,
            "/v1/sessions/ses_nope/claims",
            Some(TOKEN),
            JSON,
            wrong_host.to_string().into_bytes()
        )
        .await,
        (404, "not_found".into())
    );
    assert_eq!(
        raw(
            &broker,
            Method::POST,
            &claims,
            Some(TOKEN),
            JSON,
            wrong_host.to_string().into_bytes()
        )
        .await,
        (403, "host_mismatch".into())
    );
}

#[tokio::test]
async fn close_takes_an_empty_body_or_an_empty_object_only() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let a = bound_host(c).await;
    let b = bound_host(c).await;
    let close = |host: &Host| format!("/v1/sessions/{}/close", host.session_id());
    assert_eq!(
        raw(
            &broker,
            Method::POST,
            &close(&a),
            Some(TOKEN),
            JSON,
            br#"{"force": true}"#.to_vec()
        )
        .await
        .0,
        400
    );
    assert_eq!(
        raw(
            &broker,
            Method::POST,
            &close(&a),
            Some(TOKEN),
            Some("text/plain"),
            b"x".to_vec()
        )
        .await
        .0,
        415
    );
    assert_eq!(
        c.session(a.session_id()).await.unwrap().body.state,
        loopx::model::SessionState::Open
    );
    let empty = reqwest::Client::new()
        .post(format!("{}{}", broker.url, close(&a)))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(empty.status(), 200);
    let object = c
        .send(Method::POST, &close(&b), Some(&json!({})), None)
        .await
        .unwrap();
    assert_eq!(object.status, 200);
}

/// RFC 9110 makes the scheme name case-insensitive: `bearer` and `BEARER`
/// work; a missing space or another scheme does not.
#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive() {
    let broker = TestBroker::start().await;
    let host = bound_host(&broker.client).await;
    let url = format!("{}/v1/sessions/{}", broker.url, host.session_id());
    let http = reqwest::Client::new();
    for (value, status) in [
        (format!("bearer {TOKEN}"), 200),
        (format!("BEARER {TOKEN}"), 200),
        (format!("bEaReR  {TOKEN}"), 200),
        (format!("Bearer{TOKEN}"), 401),
        (format!("Basic {TOKEN}"), 401),
        (format!("bearer {TOKEN}x"), 401),
    ] {
        let answer = http
            .get(&url)
            .header("authorization", &value)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), status, "{value}");
    }
}

/// The Lark webhook reads its body as every other route does: over 2 MiB is
/// the JSON 413, whether the connector is on or off.
#[tokio::test]
async fn an_oversized_lark_event_is_the_json_413() {
    let broker = TestBroker::start().await;
    let body = vec![b' '; loopx::http::MAX_BODY_BYTES + 1];
    let answer = raw(
        &broker,
        Method::POST,
        "/v1/connectors/lark/events",
        None,
        JSON,
        body,
    )
    .await;
    assert_eq!(answer, (413, "payload_too_large".into()));
}
