//! Issue 53, item 7: an upload is checked before its body is read (the
//! token, its declared length, its type, the session), its files stream to
//! temporary files instead of memory, and the broker's memory stays flat
//! however many uploads are refused.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;

use crate::support::*;

const MIB: usize = 1024 * 1024;

/// A multipart body: the `message` part, then a `file` part of `file_bytes`
/// bytes streamed in 64 KiB chunks; with `endless`, the file never ends (no
/// closing boundary ever comes, so the body is never complete).
fn upload_body(file_bytes: usize, endless: bool) -> reqwest::Body {
    let head = "--b\r\nContent-Disposition: form-data; name=\"message\"\r\n\r\n\
         {\"origin\":\"web\",\"text\":\"x\"}\r\n\
         --b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f.bin\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n";
    let chunk = Bytes::from(vec![7u8; 64 * 1024]);
    let head = futures_util::stream::iter([Ok::<Bytes, std::io::Error>(Bytes::from(head))]);
    if endless {
        let forever = futures_util::stream::repeat_with(move || Ok(chunk.clone()));
        return reqwest::Body::wrap_stream(head.chain(forever));
    }
    let chunks = file_bytes.div_ceil(chunk.len());
    let rest = std::iter::repeat_n(chunk, chunks)
        .chain(std::iter::once(Bytes::from_static(b"\r\n--b--\r\n")))
        .map(Ok);
    reqwest::Body::wrap_stream(head.chain(futures_util::stream::iter(rest)))
}

fn upload(
    http: &reqwest::Client,
    url: &str,
    session_id: &str,
    token: &str,
    body: reqwest::Body,
) -> reqwest::RequestBuilder {
    http.post(format!(
        "{url}/v1/sessions/{session_id}/messages/with-attachments"
    ))
    .bearer_auth(token)
    .header("content-type", "multipart/form-data; boundary=b")
    .body(body)
}

/// The status of a request whose body never ends: it must be answered
/// without the broker waiting for the body (on 74c10af the unknown session
/// and the full session were answered only after the whole body).
async fn answered_mid_body(request: reqwest::RequestBuilder) -> u16 {
    tokio::time::timeout(Duration::from_secs(5), request.send())
        .await
        .expect("answered while the body is still being sent")
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn refusals_are_answered_before_the_body_is_read() {
    let broker = TestBroker::start().await;
    let host = bound_host(&broker.client).await;
    let http = reqwest::Client::new();
    let url = &broker.url;
    let id = host.session_id();
    let endless = || upload_body(MIB, true);
    // An unknown session, a wrong token.
    let unknown = upload(&http, url, "ses_nope", TOKEN, endless());
    assert_eq!(answered_mid_body(unknown).await, 404);
    let wrong = upload(&http, url, id, "wrong-token", endless());
    assert_eq!(answered_mid_body(wrong).await, 401);
    // A declared length of 10 GB: 413 before a byte of it is sent.
    let huge = upload(&http, url, id, TOKEN, endless()).header("content-length", "10737418240");
    assert_eq!(answered_mid_body(huge).await, 413);
    // A closed session: 409.
    let closed = bound_host(&broker.client).await;
    broker.client.close(closed.session_id()).await.unwrap();
    let late = upload(&http, url, closed.session_id(), TOKEN, endless());
    assert_eq!(answered_mid_body(late).await, 409);
    // A session at its limit: 413 at the first byte of the file.
    fill_session(&broker, id).await;
    let full = upload(&http, url, id, TOKEN, endless());
    assert_eq!(answered_mid_body(full).await, 413);
    assert!(all_turns(&broker.client, &host).await.is_empty());
}

/// The session's files already hold its 500 MiB (a row no turn is behind).
async fn fill_session(broker: &TestBroker, session_id: &str) {
    let sql = "insert into turn_attachments (turn_id, position, session_id, name, \
               declared_type, content_type, size, sha256) \
               values ('turn_fake', 0, $1, 'big', 'x', 'x', 524288000, 'none')";
    match &broker.database {
        Some(db) => {
            let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
            sqlx::query(sql)
                .bind(session_id)
                .execute(&pool)
                .await
                .unwrap();
        }
        None => fill_sqlite(&broker.dir.path().join("broker.db"), session_id).await,
    }
}

async fn fill_sqlite(path: &std::path::Path, session_id: &str) {
    let url = format!("sqlite://{}", path.display());
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    sqlx::query(
        "insert into turn_attachments (turn_id, position, session_id, name, \
         declared_type, content_type, size, sha256) \
         values ('turn_fake', 0, $1, 'big', 'x', 'x', 524288000, 'none')",
    )
    .bind(session_id)
    .execute(&pool)
    .await
    .unwrap();
}

/// The broker process's peak resident memory so far (VmHWM), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

/// The bytes of the files under `dir`, all folders down.
fn bytes_under(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => bytes_under(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

/// The tester's figures: thirty parallel 50 MiB uploads to a session at its
/// limit took the broker to 1.3 GB before all were refused, eight to a
/// session that does not exist added 140 MB. Now each is refused at its
/// first bytes: the broker's peak memory grows by less than 64 MiB, and
/// nothing stays on disk.
#[tokio::test]
async fn refused_uploads_do_not_grow_the_broker_or_its_disk() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let broker = Spawned::start(&data, &["--durability", "relaxed"]).await;
    let host = bound_host(&broker.client).await;
    let token = std::fs::read_to_string(data.join("owner.token")).unwrap();
    let token = token.trim();
    fill_sqlite(&data.join("broker.db"), host.session_id()).await;
    let pid = broker.child.id().unwrap();
    let (rss, disk) = (peak_rss(pid), bytes_under(&data));
    let http = reqwest::Client::new();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..38 {
        let session = if i < 30 {
            host.session_id()
        } else {
            "ses_nope"
        };
        let request = upload(
            &http,
            &broker.url,
            session,
            token,
            upload_body(50 * MIB, false),
        );
        tasks.spawn(async move { request.send().await.map(|r| r.status().as_u16()) });
    }
    // Each is answered (or, refused while still sending, has its connection
    // closed under it): never taken.
    let answers = tasks.join_all().await;
    let statuses: Vec<u16> = answers.into_iter().flatten().collect();
    let (grown, written) = (
        peak_rss(pid) - rss,
        bytes_under(&data) - disk.min(bytes_under(&data)),
    );
    eprintln!(
        "38 refused 50 MiB uploads: peak RSS +{} KiB, data dir +{} KiB, {:?}",
        grown / 1024,
        written / 1024,
        started.elapsed()
    );
    assert!(
        statuses.iter().all(|s| [404, 413].contains(s)),
        "{statuses:?}"
    );
    assert!(grown < 64 * MIB as u64, "the broker grew by {grown} bytes");
    assert!(
        written < 4 * MIB as u64,
        "the data dir grew by {written} bytes"
    );
    broker.terminate().await;
}

/// Uploads that are taken stream to disk and are stored one at a time (a
/// stored file is still copied a few times on its way into SQLite, about
/// 4x its size): eight parallel 20 MiB uploads are all taken. The broker's
/// peak memory is printed, not asserted: it was 150-290 MiB over runs here
/// (SQLite's pages of the stored bytes count in it), against 326 MiB on
/// 74c10af, too close for a bound that holds on every machine; the refused
/// uploads' bound above is the one that tells the two apart.
#[tokio::test]
async fn taken_uploads_are_stored_one_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let broker = Spawned::start(&data, &["--durability", "relaxed"]).await;
    let host = bound_host(&broker.client).await;
    let token = std::fs::read_to_string(data.join("owner.token")).unwrap();
    let pid = broker.child.id().unwrap();
    let rss = peak_rss(pid);
    let http = reqwest::Client::new();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let body = upload_body(20 * MIB, false);
        let request = upload(&http, &broker.url, host.session_id(), token.trim(), body);
        tasks.spawn(async move { request.send().await.unwrap().status().as_u16() });
    }
    let statuses = tasks.join_all().await;
    let grown = peak_rss(pid) - rss;
    eprintln!("8 taken 20 MiB uploads: peak RSS +{} KiB", grown / 1024);
    assert!(statuses.iter().all(|s| *s == 201), "{statuses:?}");
    broker.terminate().await;
}
