//! Files from Lark (issue 39): an image, a file and a post with pictures
//! become one turn each, their resources downloaded through the fake Lark's
//! resource route with the tenant token and stored with the turn; a
//! resource that fails for good is a line of the turn's text; one that
//! answers 5xx twice arrives on the third try, one rate limited after the
//! wait; a redelivery is one turn and one download. The download runs
//! after the event is acknowledged, as a job that survives a restart, and
//! the turn keeps its place in the queue meanwhile.

use std::time::{Duration, Instant};

use loopx::model::{ClaimedTurn, Turn};

use crate::attachments::png;
use crate::fake_lark::*;
use crate::support::*;

async fn turns_of(client: &loopx::client::Client, session_id: &str) -> Vec<Turn> {
    client
        .turns(session_id, &Default::default())
        .await
        .unwrap()
        .body
        .turns
}

fn resource(bytes: Vec<u8>, content_type: &str, name: &str) -> FakeResource {
    FakeResource {
        bytes,
        content_type: content_type.into(),
        name: name.into(),
        ..FakeResource::default()
    }
}

#[tokio::test]
async fn images_files_and_posts_from_lark_arrive_as_turns_with_their_files() {
    let fake = FakeLark::start().await;
    let broker = TestBroker::start_lark(fake.config(Some(ENCRYPT_KEY))).await;
    let events = LarkEvents::new(&broker.url, Some(ENCRYPT_KEY));
    let c = &broker.client;
    let chat = unique("oc");
    let host = bound_host(c).await;
    c.lark_link(host.session_id(), &chat).await.unwrap();

    let shot = png(4000);
    let report = vec![42u8; 5 * 1024 * 1024];
    let (one, two) = (png(100), png(200));
    fake.serve_resource("img_shot", resource(shot.clone(), "image/png", "shot.png"));
    fake.serve_resource(
        "file_report",
        FakeResource {
            fail_first: 2,
            ..resource(report.clone(), "application/pdf", "report.pdf")
        },
    );
    fake.serve_resource(
        "img_one",
        FakeResource {
            rate_limited_first: 1,
            ..resource(one.clone(), "image/png", "one.png")
        },
    );
    fake.serve_resource("img_two", resource(two.clone(), "image/png", "two.png"));
    fake.serve_resource(
        "file_gone",
        FakeResource {
            final_code: Some(234003),
            ..FakeResource::default()
        },
    );

    let image = events.message(
        &unique("ev"),
        &chat,
        &unique("om"),
        "image",
        r#"{"image_key":"img_shot"}"#,
    );
    let ack = events.post(&image).await;
    assert_eq!(ack.status, 200, "{ack:?}");
    // Lark delivers it again: one turn, one download.
    events.post(&image).await;
    events
        .post(&events.message(
            &unique("ev"),
            &chat,
            &unique("om"),
            "file",
            r#"{"file_key":"file_report","file_name":"report.pdf"}"#,
        ))
        .await;
    let post = r#"{"title":"Two pictures","content":[[{"tag":"text","text":"first "},{"tag":"img","image_key":"img_one"}],[{"tag":"text","text":"then"},{"tag":"img","image_key":"img_two"}]]}"#;
    events
        .post(&events.message(&unique("ev"), &chat, &unique("om"), "post", post))
        .await;
    events
        .post(&events.message(
            &unique("ev"),
            &chat,
            &unique("om"),
            "file",
            r#"{"file_key":"file_gone","file_name":"gone.zip"}"#,
        ))
        .await;

    // Each turn is claimed in the order sent, once its files are in.
    let mut turns = Vec::new();
    for _ in 0..4 {
        turns.push(claim_and_answer(c, &host).await);
    }
    assert_eq!(turns_of(c, host.session_id()).await.len(), 4);
    assert_eq!(fake.downloads("img_shot"), 1);
    let bytes_of = async |turn: &ClaimedTurn, i: usize| {
        c.download(&turn.attachments[i].download).await.unwrap().0
    };
    assert_eq!(turns[0].text, "(an image)");
    assert_eq!(turns[0].attachments[0].content_type, "image/png");
    assert_eq!(bytes_of(&turns[0], 0).await, shot);
    assert_eq!(turns[1].text, "(a file: report.pdf)");
    assert_eq!(turns[1].attachments[0].name, "report.pdf");
    assert_eq!(turns[1].attachments[0].declared_type, "application/pdf");
    assert_eq!(bytes_of(&turns[1], 0).await, report);
    assert_eq!(turns[2].text, "Two pictures\nfirst \nthen");
    assert_eq!(turns[2].attachments.len(), 2);
    assert_eq!(bytes_of(&turns[2], 0).await, one);
    assert_eq!(bytes_of(&turns[2], 1).await, two);
    assert!(turns[3].attachments.is_empty());
    assert!(
        turns[3].text.contains(
            "gone.zip, could not be fetched: Lark answered code 234003 (resource refused)"
        ),
        "{}",
        turns[3].text
    );
}

/// Claims the session's next turn (waiting for it) and answers it.
async fn claim_and_answer(c: &loopx::client::Client, host: &Host) -> ClaimedTurn {
    let claim_id = unique("claim");
    let claimed = claim(c, host, &claim_id, 20).await;
    c.complete(
        host.session_id(),
        &claimed.turn.turn_id,
        &host.completion(&claim_id, &unique("done"), "seen"),
    )
    .await
    .unwrap();
    claimed.turn
}

/// Whether a claim finds a turn right now.
async fn claimable(c: &loopx::client::Client, host: &Host) -> bool {
    let answer = c
        .claim(host.session_id(), &host.claim_request(&unique("claim"), 0))
        .await
        .unwrap()
        .body;
    matches!(answer, loopx::model::ClaimAnswer::Claimed(_))
}

/// The event is acknowledged before its file is fetched; the turn holds its
/// place (a text sent after it waits behind it); a restart mid-download
/// fetches again and the turn arrives once, before the text.
#[tokio::test]
async fn a_download_survives_a_restart_and_its_turn_keeps_its_place() {
    let fake = FakeLark::start().await;
    let mut broker = TestBroker::start_lark(fake.config(None)).await;
    let events = LarkEvents::new(&broker.url, None);
    let chat = unique("oc");
    let host = bound_host(&broker.client).await;
    broker
        .client
        .lark_link(host.session_id(), &chat)
        .await
        .unwrap();
    let shot = png(2500);
    let slow = FakeResource {
        hang: true,
        ..resource(shot.clone(), "image/png", "slow.png")
    };
    fake.serve_resource("img_slow", slow);

    let started = Instant::now();
    let ack = events
        .post(&events.message(
            &unique("ev"),
            &chat,
            &unique("om"),
            "image",
            r#"{"image_key":"img_slow"}"#,
        ))
        .await;
    assert_eq!(ack.status, 200, "{ack:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "acknowledged within Lark's 3 s"
    );
    events
        .post(&events.text_message(&unique("ev"), &chat, &unique("om"), "and fix it"))
        .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while fake.hung_downloads("img_slow") == 0 {
        assert!(Instant::now() < deadline, "the download started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Both turns are there, in order; neither is claimable yet.
    let listed = turns_of(&broker.client, host.session_id()).await;
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0].text, "(an image)");
    assert!(
        !claimable(&broker.client, &host).await,
        "the text waits behind the image"
    );

    // The broker restarts mid-download; Lark answers now.
    fake.serve_resource("img_slow", resource(shot.clone(), "image/png", "slow.png"));
    broker.restart(Some(fake.config(None))).await;
    let c = &broker.client;
    let first = claim_and_answer(c, &host).await;
    assert_eq!(first.text, "(an image)");
    assert_eq!(first.attachments.len(), 1);
    assert_eq!(first.attachments[0].name, "slow.png");
    assert_eq!(
        c.download(&first.attachments[0].download).await.unwrap().0,
        shot
    );
    let second = claim_and_answer(c, &host).await;
    assert_eq!(second.text, "and fix it");
    assert_eq!(turns_of(c, host.session_id()).await.len(), 2);
    assert_eq!(fake.downloads("img_slow"), 1);
}

/// A hook-delivered Lark turn names files whose bytes equal what Lark served.
#[tokio::test]
async fn a_lark_image_reaches_the_agent_as_a_saved_file() {
    let fake = FakeLark::start().await;
    let broker = TestBroker::start_lark(fake.config(None)).await;
    let events = LarkEvents::new(&broker.url, None);
    let c = &broker.client;
    let chat = unique("oc");
    let host = bound_host(c).await;
    c.lark_link(host.session_id(), &chat).await.unwrap();
    let shot = png(3000);
    fake.serve_resource(
        "img_phone",
        resource(shot.clone(), "image/png", "IMG_1.png"),
    );
    events
        .post(&events.message(
            &unique("ev"),
            &chat,
            &unique("om"),
            "image",
            r#"{"image_key":"img_phone"}"#,
        ))
        .await;
    let claimed = claim(c, &host, &unique("claim"), 5).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("attachments");
    let saved = loopx::cli::attachments::save(
        c,
        &root,
        &claimed.session_id,
        &claimed.turn.turn_id,
        &claimed.turn.attachments,
    )
    .await;
    let path = saved[0].outcome.clone().unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), shot);
    assert!(
        loopx::cli::attachments::describe(&saved)
            .starts_with(&format!("Attached: {} (image/png, 3 KB)", path.display()))
    );
}
