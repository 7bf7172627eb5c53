//! The tests' fake Lark (REST API and long connection) as a standalone
//! process, for what runs outside `cargo test`:
//!
//! - `fake_lark_ws check`: serves two resources for the official client's
//!   download (`img_sdk_check`, a PNG named `sdk.png`; `img_sdk_limited`,
//!   rate limited once); waits for one long-connection client (Lark's
//!   official one, in `tests/lark_sdk/check_fake.py`), checks that it pings
//!   with the endpoint's service id, delivers a text event in 3 fragments and
//!   waits for its acknowledgement; prints a JSON verdict, exits 0 or 1.
//! - `fake_lark_ws serve [PING_SECONDS]`: serves until killed, pushing that
//!   ping interval (for measuring an idle connection).
//!
//! Either prints `FAKE_LARK_URL=<base url>` first.

#[path = "../tests/it/fake_lark.rs"]
mod fake_lark;
#[path = "../tests/it/fake_lark_ws.rs"]
mod fake_lark_ws;

use std::io::Write;
use std::time::Duration;

use serde_json::json;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let fake = fake_lark::FakeLark::start().await;
    let ping: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1);
    fake.ws.set_client_config(json!({"ReconnectCount": -1, "ReconnectInterval": 1, "ReconnectNonce": 0, "PingInterval": ping}));
    // What the official client downloads (LARK.md's resource route).
    fake.serve_resource("img_sdk_check", sdk_resource(0));
    fake.serve_resource("img_sdk_limited", sdk_resource(1));
    println!("FAKE_LARK_URL={}", fake.url);
    std::io::stdout().flush().unwrap();
    match args.first().map(String::as_str) {
        Some("serve") => {
            std::future::pending::<()>().await;
            std::process::ExitCode::SUCCESS
        }
        Some("check") => check(&fake).await,
        _ => {
            eprintln!("usage: fake_lark_ws check | serve [PING_SECONDS]");
            std::process::ExitCode::from(2)
        }
    }
}

/// The PNG the official client downloads, rate limited `limited` times first.
fn sdk_resource(limited: usize) -> fake_lark::FakeResource {
    fake_lark::FakeResource {
        bytes: b"\x89PNG\r\n\x1a\nsdk-check".to_vec(),
        content_type: "image/png".into(),
        name: "sdk.png".into(),
        rate_limited_first: limited,
        ..Default::default()
    }
}

async fn check(fake: &fake_lark::FakeLark) -> std::process::ExitCode {
    let verdict = tokio::time::timeout(Duration::from_secs(60), async {
        fake.ws.wait_connected(1, Duration::from_secs(60)).await;
        fake.ws
            .wait_for("a ping", Duration::from_secs(30), |ws| {
                !ws.pings(0).is_empty()
            })
            .await;
        let event = fake_lark::LarkEvents::new("http://unused", None).text_message(
            "ev-official-client",
            "oc_official_client",
            "om_official_client",
            &"fragmented event ".repeat(200),
        );
        let ack = fake.ws.deliver(&event, 3).await;
        let pings = fake.ws.pings(0);
        json!({
            "ok": ack.code == 200 && pings.iter().all(|p| p.service == fake.ws.service_id(0)),
            "pings": pings.len(),
            "service_id": fake.ws.service_id(0),
            "ping_services": pings.iter().map(|p| p.service).collect::<Vec<_>>(),
            "ack_code": ack.code,
            "ack_payload": ack.payload,
            "ack_seq": ack.frame.header("seq"),
            "ack_biz_rt": ack.frame.header("biz_rt"),
        })
    })
    .await
    .unwrap_or_else(|_| json!({"ok": false, "error": "timed out"}));
    println!("{verdict}");
    if verdict["ok"] == true {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
