//! Files from Lark (issue 39): an image, a file and a post with pictures
//! become one turn each, their resources downloaded through the fake Lark's
//! resource route with the tenant token and stored with the turn; a
//! resource that fails for good is a line of the turn's text; one that
//! answers 5xx twice arrives on the third try; a redelivery is one turn and
//! one download.

use loopx::model::Turn;

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
    fake.serve_resource("img_one", resource(one.clone(), "image/png", "one.png"));
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

    let turns = turns_of(c, host.session_id()).await;
    assert_eq!(turns.len(), 4, "{turns:#?}");
    assert_eq!(fake.downloads("img_shot"), 1);
    let bytes_of =
        async |turn: &Turn, i: usize| c.download(&turn.attachments[i].download).await.unwrap().0;
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
            "gone.zip, could not be fetched: Lark answered HTTP 400 Bad Request with code 234003"
        ),
        "{}",
        turns[3].text
    );
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
