//! Attachments (issue 39): a message sent with files, listed by the claim
//! and the readback, downloaded by the owner; limits and hostile input.

use loopx::client::{Client, OutgoingFile};
use loopx::model::{Attachment, EnqueueRequest, TurnState};
use sha2::{Digest, Sha256};

use crate::support::*;

/// The start of a PNG, then some bytes.
pub fn png(len: usize) -> Vec<u8> {
    let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
    bytes.extend((0..len).map(|i| (i % 251) as u8));
    bytes
}

pub fn file(name: &str, content_type: &str, bytes: Vec<u8>) -> OutgoingFile {
    OutgoingFile {
        name: name.into(),
        content_type: content_type.into(),
        bytes,
    }
}

fn keyed(text: &str, id: &str) -> EnqueueRequest {
    EnqueueRequest {
        client_message_id: Some(id.into()),
        ..web(text)
    }
}

/// Status and code of a refused upload (never a 5xx).
async fn refused(client: &Client, host: &Host, files: &[OutgoingFile]) -> (u16, String) {
    code(
        client
            .enqueue_with_attachments(host.session_id(), &web("with files"), files)
            .await,
    )
}

#[tokio::test]
async fn a_file_sent_with_a_message_is_claimed_listed_and_downloaded_byte_for_byte() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let image = png(5000);
    let doc = b"plain notes\n".to_vec();
    let files = [
        file("shot.png", "image/png", image.clone()),
        file("notes.txt", "text/plain", doc.clone()),
    ];
    let message = keyed("look at this", "att-1");
    let sent = c
        .enqueue_with_attachments(host.session_id(), &message, &files)
        .await
        .unwrap();
    assert_eq!(sent.reply.status, 201);
    assert_eq!(sent.body.state, TurnState::Queued);

    // The same key, text and files: the same turn, replayed.
    let again = c
        .enqueue_with_attachments(host.session_id(), &message, &files)
        .await
        .unwrap();
    assert_eq!(again.reply.status, 200);
    assert!(again.reply.replayed && again.body.duplicate);
    assert_eq!(again.body.turn_id, sent.body.turn_id);
    // The same key with other files, or with none: 422.
    assert_eq!(
        code(
            c.enqueue_with_attachments(host.session_id(), &message, &files[..1])
                .await
        ),
        (422, "idempotency_key_reused".into())
    );
    assert_eq!(
        code(c.enqueue(host.session_id(), &message).await),
        (422, "idempotency_key_reused".into())
    );

    let claimed = claim(c, &host, &unique("claim"), 0).await;
    assert_eq!(claimed.turn.text, "look at this");
    let listed = &claimed.turn.attachments;
    assert_eq!(listed.len(), 2);
    let expect = |a: &Attachment, name: &str, ty: &str, bytes: &[u8]| {
        assert_eq!(a.name, name);
        assert_eq!(a.content_type, ty);
        assert_eq!(a.size, bytes.len() as u64);
        assert_eq!(a.sha256, hex::encode(Sha256::digest(bytes)));
    };
    expect(&listed[0], "shot.png", "image/png", &image);
    expect(&listed[1], "notes.txt", "application/octet-stream", &doc);
    assert_eq!(listed[1].declared_type, "text/plain");

    let (bytes, ty) = c.download(&listed[0].download).await.unwrap();
    assert_eq!(bytes, image);
    assert_eq!(ty, "image/png");
    let (bytes, ty) = c.download(&listed[1].download).await.unwrap();
    assert_eq!(bytes, doc);
    assert_eq!(ty, "application/octet-stream");

    // The readback lists them too; the session projection stays content-free.
    let turn = c
        .turn(host.session_id(), &sent.body.turn_id)
        .await
        .unwrap()
        .body;
    assert_eq!(&turn.attachments, listed);
    let session = c.session(host.session_id()).await.unwrap();
    assert!(!session.reply.text.contains("shot.png"));
    assert!(!session.reply.text.contains("attachments"));
}

#[tokio::test]
async fn downloads_are_served_safely_and_only_to_the_owner_of_that_turn() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let html_in_png = {
        let mut b = png(0);
        b.extend_from_slice(b"<html><script>alert(1)</script></html>");
        b
    };
    let files = [
        file(
            "page.html",
            "text/html",
            b"<html><script>alert(1)</script>".to_vec(),
        ),
        file("pic.png", "text/html", html_in_png.clone()),
    ];
    let sent = c
        .enqueue_with_attachments(host.session_id(), &web("two"), &files)
        .await
        .unwrap()
        .body;
    let turn = c.turn(host.session_id(), &sent.turn_id).await.unwrap().body;
    let page = &turn.attachments[0].download;

    let raw = reqwest::Client::new();
    let get = |path: &str, token: Option<&str>| {
        let mut request = raw.get(format!("{}{path}", broker.url));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send()
    };
    let html = get(page, Some(TOKEN)).await.unwrap();
    assert_eq!(html.status(), 200);
    let headers = html.headers();
    assert_eq!(headers["content-type"], "application/octet-stream");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert!(
        headers["content-disposition"]
            .to_str()
            .unwrap()
            .starts_with("attachment; filename=\"page.html\"")
    );
    let image = get(&turn.attachments[1].download, Some(TOKEN))
        .await
        .unwrap();
    assert_eq!(image.headers()["content-type"], "image/png");
    assert_eq!(image.headers()["x-content-type-options"], "nosniff");
    assert_eq!(image.bytes().await.unwrap(), html_in_png);

    // No token, a wrong token: 401. Another session's path, another
    // position, a position that is no number: 404 / 400, never a 5xx.
    assert_eq!(get(page, None).await.unwrap().status(), 401);
    assert_eq!(get(page, Some("wrong")).await.unwrap().status(), 401);
    let other = bound_host(c).await;
    let elsewhere = page.replace(host.session_id(), other.session_id());
    assert_eq!(get(&elsewhere, Some(TOKEN)).await.unwrap().status(), 404);
    let beyond = page.replace("/attachments/0", "/attachments/7");
    assert_eq!(get(&beyond, Some(TOKEN)).await.unwrap().status(), 404);
    let nan = page.replace("/attachments/0", "/attachments/x");
    assert_eq!(get(&nan, Some(TOKEN)).await.unwrap().status(), 400);
    let nul = page.replace(&sent.turn_id, "turn%00x");
    assert_eq!(get(&nul, Some(TOKEN)).await.unwrap().status(), 404);
}

#[tokio::test]
async fn hostile_names_are_made_plain_and_bad_sizes_are_refused_with_nothing_written() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let long = format!("{}.png", "a".repeat(300));
    let files = [
        file("../../.bashrc", "text/plain", b"echo pwned".to_vec()),
        file(&long, "image/png", png(10)),
        file("..\\..\\win.ini", "text/plain", b"[x]".to_vec()),
        file("", "", b"x".to_vec()),
    ];
    let sent = c
        .enqueue_with_attachments(host.session_id(), &web("names"), &files)
        .await
        .unwrap()
        .body;
    let turn = c.turn(host.session_id(), &sent.turn_id).await.unwrap().body;
    let names: Vec<&str> = turn.attachments.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names[0], "bashrc");
    assert!(names[1].len() <= 200 && names[1].ends_with(".png"));
    // (the client escapes a backslash in the part's header)
    assert!(names[2].ends_with("win.ini") && !names[2].contains(['/', '\\']));
    assert_eq!(names[3], "file");
    assert_eq!(
        turn.attachments[3].declared_type,
        "application/octet-stream"
    );

    // A name with NUL in its header: refused as malformed or stored without it.
    match c
        .enqueue_with_attachments(
            host.session_id(),
            &web("nul"),
            &[file("a\0b.txt", "text/plain", b"x".to_vec())],
        )
        .await
    {
        Ok(sent) => {
            let turn = c
                .turn(host.session_id(), &sent.body.turn_id)
                .await
                .unwrap()
                .body;
            assert!(!turn.attachments[0].name.contains('\0'));
        }
        Err(e) => assert_eq!(code::<()>(Err(e)).0, 400),
    }

    let before = all_turns(c, &host).await.len();
    // 0 bytes: 400.
    assert_eq!(
        refused(c, &host, &[file("empty.txt", "text/plain", Vec::new())]).await,
        (400, "invalid_request".into())
    );
    // One byte over 20 MiB: 413.
    let big = vec![7u8; 20 * 1024 * 1024 + 1];
    assert_eq!(
        refused(c, &host, &[file("big.bin", "application/zip", big)]).await,
        (413, "payload_too_large".into())
    );
    // Eleven files: 413.
    let many: Vec<OutgoingFile> = (0..11)
        .map(|i| file(&format!("{i}.txt"), "text/plain", b"x".to_vec()))
        .collect();
    assert_eq!(
        refused(c, &host, &many).await,
        (413, "payload_too_large".into())
    );
    // Three of 19 MiB: over 50 MiB together, 413.
    let nineteen = vec![1u8; 19 * 1024 * 1024];
    let three: Vec<OutgoingFile> = (0..3)
        .map(|i| file(&format!("{i}.bin"), "", nineteen.clone()))
        .collect();
    assert_eq!(
        refused(c, &host, &three).await,
        (413, "payload_too_large".into())
    );
    // Not multipart: 415; no message part, an unknown part: 400; unknown session: 404.
    let raw = reqwest::Client::new();
    let url = format!(
        "{}/v1/sessions/{}/messages/with-attachments",
        broker.url,
        host.session_id()
    );
    let json = raw
        .post(&url)
        .bearer_auth(TOKEN)
        .json(&web("x"))
        .send()
        .await
        .unwrap();
    assert_eq!(json.status(), 415);
    let no_message = raw
        .post(&url)
        .bearer_auth(TOKEN)
        .header("content-type", "multipart/form-data; boundary=b")
        .body("--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nxyz\r\n--b--\r\n")
        .send()
        .await
        .unwrap();
    assert_eq!(no_message.status(), 400);
    let garbage = raw
        .post(&url)
        .bearer_auth(TOKEN)
        .header("content-type", "multipart/form-data; boundary=b")
        .body("not multipart at all")
        .send()
        .await
        .unwrap();
    assert_eq!(garbage.status(), 400);
    assert_eq!(
        code(
            c.enqueue_with_attachments(
                "ses_nope",
                &web("x"),
                &[file("a.txt", "text/plain", b"x".to_vec())]
            )
            .await
        ),
        (404, "not_found".into())
    );
    // The queue is as it was.
    assert_eq!(all_turns(c, &host).await.len(), before);
}

/// Every replica serves every file: stored through one broker, downloaded
/// through another on the same PostgreSQL database.
#[tokio::test]
async fn a_file_stored_through_one_replica_is_downloaded_through_another() {
    let Some(db) = TestDatabase::create().await else {
        eprintln!("note: skipped: set LOOPX_TEST_DATABASE_URL to run it");
        return;
    };
    let (a, b) = tokio::join!(replica(&db), replica(&db));
    let host = bound_host(&a.client).await;
    let image = png(300_000);
    let sent = a
        .client
        .enqueue_with_attachments(
            host.session_id(),
            &web("from a"),
            &[file("shot.png", "image/png", image.clone())],
        )
        .await
        .unwrap()
        .body;
    let claimed = claim(&b.client, &host, &unique("claim"), 0).await;
    assert_eq!(claimed.turn.turn_id, sent.turn_id);
    let (bytes, ty) = b
        .client
        .download(&claimed.turn.attachments[0].download)
        .await
        .unwrap();
    assert_eq!(ty, "image/png");
    assert_eq!(bytes, image);
    a.shutdown.cancel();
    b.shutdown.cancel();
}

struct Replica {
    client: Client,
    shutdown: tokio_util::sync::CancellationToken,
    _dir: tempfile::TempDir,
}

async fn replica(db: &TestDatabase) -> Replica {
    use loopx::serve;
    let dir = tempfile::tempdir().unwrap();
    let store = serve::open_store(
        dir.path(),
        Some(&db.url),
        loopx::store::sqlite::Durability::Relaxed,
    )
    .await
    .unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let app = serve::App::new(serve::AppConfig::new(store, TOKEN.into()), shutdown.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(app.serve(listener));
    Replica {
        client: Client::new(&url, Some(TOKEN.into())),
        shutdown,
        _dir: dir,
    }
}

/// Retention prunes a closed session's files with it: its attachment rows,
/// and the bytes no other turn names; bytes another session still names stay.
#[tokio::test]
async fn a_pruned_session_takes_its_files_and_leaves_shared_ones() {
    use loopx::store::retention;
    const DAY_MS: i64 = 86_400_000;
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let (old, kept) = (bound_host(c).await, bound_host(c).await);
    let shared = png(1000);
    let own = b"only the old session's".to_vec();
    c.enqueue_with_attachments(
        old.session_id(),
        &web("old"),
        &[
            file("shared.png", "image/png", shared.clone()),
            file("own.txt", "text/plain", own.clone()),
        ],
    )
    .await
    .unwrap();
    let sent = c
        .enqueue_with_attachments(
            kept.session_id(),
            &web("kept"),
            &[file("shared.png", "image/png", shared.clone())],
        )
        .await
        .unwrap()
        .body;
    c.close(old.session_id()).await.unwrap();
    let db = Db::of(&broker).await;
    db.execute(
        "update sessions set closed_at = closed_at - $1 where session_id = $2",
        30 * DAY_MS,
        old.session_id(),
    )
    .await;
    db.execute(
        "update attachment_blobs set created_at = created_at - $1 where sha256 <> $2",
        30 * DAY_MS,
        "",
    )
    .await;
    let cutoff = retention::cutoff_ms(loopx::time::now_ms(), 5);
    retention::prune(broker.broker.store(), cutoff, std::time::Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(db.count("turn_attachments", old.session_id()).await, 0);
    assert_eq!(db.blobs(&hex::encode(Sha256::digest(&own))).await, 0);
    assert_eq!(db.blobs(&hex::encode(Sha256::digest(&shared))).await, 1);
    let turn = c.turn(kept.session_id(), &sent.turn_id).await.unwrap().body;
    let (bytes, _) = c.download(&turn.attachments[0].download).await.unwrap();
    assert_eq!(bytes, shared);
}

/// A direct connection to a test broker's database.
enum Db {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

impl Db {
    async fn of(broker: &TestBroker) -> Db {
        match &broker.database {
            Some(database) => Db::Postgres(sqlx::PgPool::connect(&database.url).await.unwrap()),
            None => {
                let path = broker.dir.path().join("broker.db");
                let url = format!("sqlite://{}", path.display());
                Db::Sqlite(sqlx::SqlitePool::connect(&url).await.unwrap())
            }
        }
    }

    async fn execute(&self, sql: &str, a: i64, b: &str) {
        match self {
            Db::Sqlite(db) => sqlx::query(sql).bind(a).bind(b).execute(db).await.map(drop),
            Db::Postgres(db) => sqlx::query(sql).bind(a).bind(b).execute(db).await.map(drop),
        }
        .unwrap();
    }

    async fn scalar(&self, sql: &str, value: &str) -> i64 {
        match self {
            Db::Sqlite(db) => sqlx::query_scalar(sql).bind(value).fetch_one(db).await,
            Db::Postgres(db) => sqlx::query_scalar(sql).bind(value).fetch_one(db).await,
        }
        .unwrap()
    }

    async fn count(&self, table: &str, session_id: &str) -> i64 {
        let sql = format!("select count(*) from {table} where session_id = $1");
        self.scalar(&sql, session_id).await
    }

    async fn blobs(&self, sha256: &str) -> i64 {
        self.scalar(
            "select count(*) from attachment_blobs where sha256 = $1",
            sha256,
        )
        .await
    }
}

/// `loopx hook stop` delivers a turn with files: it saves each in a private
/// folder under the data dir and names it, with its type and size, in the
/// text the agent reads; the saved bytes are the uploaded ones, and a
/// hostile name lands as a plain file in that folder.
#[tokio::test]
async fn hook_stop_saves_a_turns_files_privately_and_names_them() {
    use std::os::unix::fs::PermissionsExt;
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let image = png(12 * 1024 - 8);
    c.enqueue_with_attachments(
        host.session_id(),
        &web("what does this show?"),
        &[
            file("shot.png", "image/png", image.clone()),
            file("../../.bashrc", "text/plain", b"echo hi".to_vec()),
        ],
    )
    .await
    .unwrap();
    let data = tempfile::tempdir().unwrap();
    let transcript = tempfile::NamedTempFile::new().unwrap();
    let input = serde_json::json!({
        "session_id": host.host_session_id,
        "cwd": "/work/project",
        "hook_event_name": "Stop",
        "transcript_path": transcript.path(),
        "stop_hook_active": false,
    });
    let output = run_with_stdin(
        loopx()
            .args(["hook", "stop", "--agent", "claude-code", "--session-id"])
            .arg(host.session_id())
            .args(["--host-surface", HOST_SURFACE, "--broker-url", &broker.url])
            .env("LOOPX_DATA_DIR", data.path())
            .env("LOOPX_TOKEN", TOKEN),
        &input.to_string(),
    )
    .await;
    let out: serde_json::Value = serde_json::from_str(output.trim()).unwrap();
    assert_eq!(out["decision"], "block");
    let reason = out["reason"].as_str().unwrap();
    assert!(reason.contains("what does this show?"), "{reason}");

    let turn = all_turns(c, &host).await.remove(0);
    let folder = data
        .path()
        .join("attachments")
        .join(host.session_id())
        .join(&turn.turn_id);
    let shot = folder.join("shot.png");
    assert!(
        reason.contains(&format!("Attached: {} (image/png, 12 KB)", shot.display())),
        "{reason}"
    );
    assert_eq!(std::fs::read(&shot).unwrap(), image);
    let bashrc = folder.join("bashrc");
    assert!(reason.contains(&format!("Attached: {}", bashrc.display())));
    assert_eq!(std::fs::read(&bashrc).unwrap(), b"echo hi");
    for dir in [&folder, &data.path().join("attachments")] {
        let mode = std::fs::metadata(dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", dir.display());
    }
    let mode = std::fs::metadata(&shot).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // Nothing landed outside the folder.
    let entries = std::fs::read_dir(&folder).unwrap().count();
    assert_eq!(entries, 2);
    assert!(!data.path().join(".bashrc").exists());
}

/// `worker-bridge attached-session-claim --save-attachments DIR` saves the
/// claimed turn's files beside its answer.
#[tokio::test]
async fn worker_bridge_claim_saves_attachments_into_the_given_folder() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let bytes = b"%PDF-1.7 not really".to_vec();
    let sent = c
        .enqueue_with_attachments(
            host.session_id(),
            &web("the report"),
            &[file("report.pdf", "application/pdf", bytes.clone())],
        )
        .await
        .unwrap()
        .body;
    let dir = tempfile::tempdir().unwrap();
    let output = run_with_stdin(
        loopx()
            .args(["worker-bridge", "attached-session-claim", "--session-id"])
            .arg(host.session_id())
            .args(["--host-surface", HOST_SURFACE, "--host-session-id"])
            .arg(&host.host_session_id)
            .args(["--claim-id", "wb-1", "--broker-url", &broker.url])
            .arg("--save-attachments")
            .arg(dir.path())
            .env("LOOPX_TOKEN", TOKEN),
        "",
    )
    .await;
    let saved = dir
        .path()
        .join(host.session_id())
        .join(&sent.turn_id)
        .join("report.pdf");
    assert_eq!(std::fs::read(&saved).unwrap(), bytes);
    assert!(output.contains(&format!(
        "Attached: {} (application/octet-stream, 19 B)",
        saved.display()
    )));
}

/// Runs a command with `stdin`; its stdout (it must succeed).
async fn run_with_stdin(command: &mut tokio::process::Command, stdin: &str) -> String {
    use std::process::Stdio;
    use tokio::io::AsyncWriteExt;
    let mut child = command
        .env_remove("LOOPX_SESSION_ID")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    let output = child.wait_with_output().await.unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        output.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// `loopx mcp` (tools only): `wait_for_message` answers a turn's text with
/// a line naming each of its files, saved under the data dir.
#[tokio::test]
async fn mcp_wait_for_message_names_the_saved_files() {
    use std::process::Stdio;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let bytes = b"col1,col2\n1,2\n".to_vec();
    let image = png(64);
    let sent = c
        .enqueue_with_attachments(
            host.session_id(),
            &web("sum the columns"),
            &[
                file("data.csv", "text/csv", bytes.clone()),
                file("chart.png", "image/png", image.clone()),
            ],
        )
        .await
        .unwrap()
        .body;
    let data = tempfile::tempdir().unwrap();
    let mut child = loopx()
        .args(["mcp", "--tools-only", "--session-id"])
        .arg(host.session_id())
        .args(["--host-surface", HOST_SURFACE, "--host-session-id"])
        .arg(&host.host_session_id)
        .args(["--broker-url", &broker.url])
        .env("LOOPX_DATA_DIR", data.path())
        .env("LOOPX_TOKEN", TOKEN)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut answer = async |id: &str| loop {
        let line = tokio::time::timeout(std::time::Duration::from_secs(15), lines.next_line())
            .await
            .expect("an answer in time")
            .unwrap()
            .expect("stdout open");
        let message: serde_json::Value = serde_json::from_str(&line).unwrap();
        if message["id"] == id {
            return message;
        }
    };
    let send = |m: serde_json::Value| format!("{m}\n");
    stdin
        .write_all(send(serde_json::json!({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})).as_bytes())
        .await
        .unwrap();
    answer("init").await;
    let calls = [
        serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        serde_json::json!({"jsonrpc": "2.0", "id": "wait", "method": "tools/call",
            "params": {"name": "wait_for_message", "arguments": {"wait_seconds": 0}}}),
    ];
    for call in calls {
        stdin.write_all(send(call).as_bytes()).await.unwrap();
    }
    let result = answer("wait").await;
    let content = &result["result"]["structuredContent"];
    assert_eq!(content["claimed"], true, "{result}");
    let saved = data
        .path()
        .join("attachments")
        .join(host.session_id())
        .join(&sent.turn_id)
        .join("data.csv");
    assert_eq!(
        content["text"],
        format!(
            "sum the columns\n\nAttached: {} (application/octet-stream, 14 B)\nAttached: {} (image/png, 72 B)",
            saved.display(),
            saved.with_file_name("chart.png").display()
        )
    );
    // The image is given as MCP image content too.
    use base64::Engine;
    let blocks = result["result"]["content"].as_array().unwrap();
    let shown = blocks
        .iter()
        .find(|b| b["type"] == "image")
        .expect("an image block");
    assert_eq!(shown["mimeType"], "image/png");
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(shown["data"].as_str().unwrap())
            .unwrap(),
        image
    );
    assert_eq!(std::fs::read(&saved).unwrap(), bytes);
    drop(stdin);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), child.wait()).await;
}

/// The session's limit (500 MiB of files): a message that would pass it is
/// refused with 413 and nothing written; a replay of one already taken is
/// still answered as a replay.
#[tokio::test]
async fn the_session_limit_refuses_new_files_and_still_answers_a_replay() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let files = [file("a.png", "image/png", png(1000))];
    let keyed = keyed("first", "limit-1");
    let sent = c
        .enqueue_with_attachments(host.session_id(), &keyed, &files)
        .await
        .unwrap()
        .body;
    // The session now holds all but 100 bytes of its 500 MiB.
    let db = Db::of(&broker).await;
    db.execute(
        "insert into turn_attachments (turn_id, position, session_id, name, declared_type, \
         content_type, size, sha256) values ('turn_fake', 0, $2, 'big', 'x', 'x', $1, 'none')",
        500 * 1024 * 1024 - 1008 - 100,
        host.session_id(),
    )
    .await;
    let before = all_turns(c, &host).await.len();
    assert_eq!(
        refused(c, &host, &[file("b.png", "image/png", png(200))]).await,
        (413, "payload_too_large".into())
    );
    assert_eq!(all_turns(c, &host).await.len(), before);
    let replay = c
        .enqueue_with_attachments(host.session_id(), &keyed, &files)
        .await
        .unwrap();
    assert!(replay.reply.replayed);
    assert_eq!(replay.body.turn_id, sent.turn_id);
    // What still fits is taken.
    c.enqueue_with_attachments(
        host.session_id(),
        &web("small"),
        &[file("c.txt", "", vec![1; 90])],
    )
    .await
    .unwrap();
}

/// Uploads racing for the session's last bytes: the limit is checked under
/// the session's lock, so exactly one of them fits.
#[tokio::test]
async fn racing_uploads_never_take_a_session_over_its_limit() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    // The session holds all but 150 bytes of its 500 MiB.
    let db = Db::of(&broker).await;
    db.execute(
        "insert into turn_attachments (turn_id, position, session_id, name, declared_type, \
         content_type, size, sha256) values ('turn_fake', 0, $2, 'big', 'x', 'x', $1, 'none')",
        500 * 1024 * 1024 - 150,
        host.session_id(),
    )
    .await;
    let upload = async |i: u8| {
        let files = [file(&format!("f{i}.bin"), "", vec![i; 100])];
        c.enqueue_with_attachments(host.session_id(), &web(&format!("race {i}")), &files)
            .await
    };
    let (a, b, d, e) = tokio::join!(upload(0), upload(1), upload(2), upload(3));
    let answers = [a, b, d, e];
    let taken = answers.iter().filter(|a| a.is_ok()).count();
    assert_eq!(taken, 1, "{answers:?}");
    for refused in answers.into_iter().filter(|a| a.is_err()) {
        assert_eq!(code(refused), (413, "payload_too_large".into()));
    }
    assert_eq!(all_turns(c, &host).await.len(), 1);
}

impl Db {
    /// The files' bytes stored: how many blobs, and their bytes together.
    async fn stored(&self) -> (i64, i64) {
        let sql = "select count(*), cast(coalesce(sum(size), 0) as bigint) from attachment_blobs";
        match self {
            Db::Sqlite(db) => sqlx::query_as(sql).fetch_one(db).await,
            Db::Postgres(db) => sqlx::query_as(sql).fetch_one(db).await,
        }
        .unwrap()
    }

    /// A blob no turn names, stored `age_ms` ago (as a broker before issue
    /// 53 left one behind).
    async fn orphan(&self, sha256: &str, age_ms: i64) {
        let at = loopx::time::now_ms() - age_ms;
        let sql = match self {
            Db::Sqlite(_) => {
                "insert into attachment_blobs (sha256, size, sniffed_type, bytes, created_at) \
                 values ($2, 3, null, cast('abc' as blob), $1)"
            }
            Db::Postgres(_) => {
                "insert into attachment_blobs (sha256, size, sniffed_type, bytes, created_at) \
                 values ($2, 3, null, convert_to('abc', 'UTF8'), $1)"
            }
        };
        self.execute(sql, at, sha256).await;
    }
}

/// Issue 53, item 6: a request that reuses a `client_message_id` with other
/// files is refused 422 and stores none of their bytes (on 74c10af, four
/// such requests of 1 MiB each left 4 MiB behind; the tester's 50 MiB ones,
/// 200 MB).
#[tokio::test]
async fn a_reused_client_message_id_with_new_files_stores_no_bytes() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let message = keyed("first", "reuse-1");
    c.enqueue_with_attachments(
        host.session_id(),
        &message,
        &[file("a.txt", "", vec![1; 10])],
    )
    .await
    .unwrap();
    let db = Db::of(&broker).await;
    let before = db.stored().await;
    assert_eq!(before, (1, 10));
    for i in 0..4u8 {
        let other = [file("big.bin", "", vec![i + 2; 1024 * 1024])];
        assert_eq!(
            code(
                c.enqueue_with_attachments(host.session_id(), &message, &other)
                    .await
            ),
            (422, "idempotency_key_reused".into())
        );
    }
    assert_eq!(db.stored().await, before, "a refused upload left its bytes");
    // A replay stores nothing new either, and still answers 200.
    let replay = c
        .enqueue_with_attachments(
            host.session_id(),
            &message,
            &[file("a.txt", "", vec![1; 10])],
        )
        .await
        .unwrap();
    assert!(replay.reply.replayed);
    assert_eq!(db.stored().await, before);
}

/// Issue 53, item 6: uploads that lose the race for the session's last
/// bytes (413 under the session's lock) leave none of their bytes behind.
#[tokio::test]
async fn uploads_that_lose_the_race_for_the_last_bytes_leave_nothing() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let db = Db::of(&broker).await;
    db.execute(
        "insert into turn_attachments (turn_id, position, session_id, name, declared_type, \
         content_type, size, sha256) values ('turn_fake', 0, $2, 'big', 'x', 'x', $1, 'none')",
        500 * 1024 * 1024 - 150_000,
        host.session_id(),
    )
    .await;
    let upload = async |i: u8| {
        let files = [file(&format!("f{i}.bin"), "", vec![i; 100_000])];
        c.enqueue_with_attachments(host.session_id(), &web(&format!("race {i}")), &files)
            .await
    };
    let (a, b, d, e, f, g) = tokio::join!(
        upload(0),
        upload(1),
        upload(2),
        upload(3),
        upload(4),
        upload(5)
    );
    let answers = [a, b, d, e, f, g];
    assert_eq!(answers.iter().filter(|a| a.is_ok()).count(), 1);
    // One file's bytes, the winner's: 100,000 (on 74c10af, up to 600,000).
    assert_eq!(db.stored().await, (1, 100_000));
}

/// Issue 53, item 6: bytes no turn names (left by an older broker) are
/// removed at start and hourly, with retention off (the default).
#[tokio::test]
async fn bytes_no_turn_names_are_removed_with_retention_off() {
    let mut broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    c.enqueue_with_attachments(
        host.session_id(),
        &web("kept"),
        &[file("k.txt", "", vec![9; 5])],
    )
    .await
    .unwrap();
    let db = Db::of(&broker).await;
    db.orphan(&"0".repeat(64), 2 * 3_600_000).await;
    db.orphan(&"1".repeat(64), 60_000).await;
    assert_eq!(db.stored().await.0, 3);
    broker.restart(None).await;
    let mut left = 0;
    for _ in 0..100 {
        left = db.blobs(&"0".repeat(64)).await;
        if left == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(left, 0, "an unnamed blob over an hour old is still stored");
    // A named blob stays; an unnamed one younger than an hour too (for now).
    assert_eq!(db.stored().await, (2, 8));
}

/// Issue 53, item 8: names with a bidi override (U+202E), a zero-width
/// space (U+200B) or a line separator (U+2028) are stored and saved without
/// them, and each path named to the agent is a file on disk (on 74c10af the
/// names kept them: `…/evil\u{202E}hs.png` shown as `evilgnp.sh`, a path with a
/// line break).
#[tokio::test]
async fn invisible_characters_leave_names_and_the_named_paths_exist() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let files = [
        file("evil\u{202E}hs.png", "image/png", png(10)),
        file("report\u{200B}.pdf", "application/pdf", b"%PDF".to_vec()),
        file("a\u{2028}b.txt", "text/plain", b"ab".to_vec()),
    ];
    let sent = c
        .enqueue_with_attachments(host.session_id(), &web("names"), &files)
        .await
        .unwrap()
        .body;
    let turn = c.turn(host.session_id(), &sent.turn_id).await.unwrap().body;
    let names: Vec<&str> = turn.attachments.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["evilhs.png", "report.pdf", "ab.txt"]);
    let dir = tempfile::tempdir().unwrap();
    let output = claim_saving(&broker, &host, "inv-1", dir.path()).await;
    let named = attached_paths(&output);
    assert_eq!(named.len(), 3, "{output}");
    for path in named {
        assert!(
            std::path::Path::new(&path).is_file(),
            "{path:?} is not on disk"
        );
        assert!(
            !path.chars().any(loopx::attachments::is_invisible),
            "{path:?}"
        );
    }
}

/// `worker-bridge attached-session-claim --save-attachments DIR`: its stdout.
async fn claim_saving(
    broker: &TestBroker,
    host: &Host,
    claim_id: &str,
    dir: &std::path::Path,
) -> String {
    run_with_stdin(
        loopx()
            .args(["worker-bridge", "attached-session-claim", "--session-id"])
            .arg(host.session_id())
            .args(["--host-surface", HOST_SURFACE, "--host-session-id"])
            .arg(&host.host_session_id)
            .args(["--claim-id", claim_id, "--broker-url", &broker.url])
            .arg("--save-attachments")
            .arg(dir)
            .env("LOOPX_TOKEN", TOKEN),
        "",
    )
    .await
}

/// The paths of the `Attached: <path> (<type>, <size>)` lines.
fn attached_paths(output: &str) -> Vec<String> {
    output
        .lines()
        .filter_map(|l| l.strip_prefix("Attached: "))
        .filter_map(|l| l.rsplit_once(" (").map(|(path, _)| path.to_owned()))
        .collect()
}

/// Issue 53, item 9: `--save-attachments DIR` leaves DIR's mode alone (on
/// 74c10af an existing 1777 DIR became 0700), and a link planted at
/// `DIR/<session>/<turn>` is never followed: its target is neither chmod-ed
/// nor written to, and the file is named as not saved.
#[tokio::test]
async fn save_attachments_changes_no_mode_it_did_not_make_and_follows_no_link() {
    use std::os::unix::fs::PermissionsExt;
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let one = [file("a.txt", "text/plain", b"one".to_vec())];
    let sent = c
        .enqueue_with_attachments(host.session_id(), &web("first"), &one)
        .await
        .unwrap()
        .body;
    let output = claim_saving(&broker, &host, "keep-1", dir.path()).await;
    assert_eq!(mode(dir.path()), 0o1777, "DIR's mode was changed");
    let session_dir = dir.path().join(host.session_id());
    assert_eq!(mode(&session_dir), 0o700);
    assert_eq!(attached_paths(&output).len(), 1, "{output}");
    c.complete(
        host.session_id(),
        &sent.turn_id,
        &host.completion("keep-1", "k-1", "ok"),
    )
    .await
    .unwrap();

    // A link planted where the next turn's folder goes.
    let target = tempfile::tempdir().unwrap();
    std::fs::set_permissions(target.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let next = c
        .enqueue_with_attachments(host.session_id(), &web("second"), &one)
        .await
        .unwrap()
        .body;
    std::os::unix::fs::symlink(target.path(), session_dir.join(&next.turn_id)).unwrap();
    let output = claim_saving(&broker, &host, "keep-2", dir.path()).await;
    assert!(attached_paths(&output).is_empty(), "{output}");
    assert!(output.contains("could not be saved"), "{output}");
    assert_eq!(mode(target.path()), 0o755, "the link's target was chmod-ed");
    assert_eq!(
        std::fs::read_dir(target.path()).unwrap().count(),
        0,
        "written through the link"
    );
}

/// Issue 53, item 10: `x.txt`, `2-x.txt`, `x.txt` in one turn are three
/// files (on 74c10af the third became `2-x.txt` over the second, and two
/// lines named it); saving never overwrites, and the turn delivered again
/// names the same three files.
#[tokio::test]
async fn colliding_names_are_saved_as_distinct_files_and_never_overwritten() {
    let broker = TestBroker::start().await;
    let c = &broker.client;
    let host = bound_host(c).await;
    let files = [
        file("x.txt", "text/plain", b"one".to_vec()),
        file("2-x.txt", "text/plain", b"two".to_vec()),
        file("x.txt", "text/plain", b"three".to_vec()),
    ];
    c.enqueue_with_attachments(host.session_id(), &web("three"), &files)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let output = claim_saving(&broker, &host, "coll-1", dir.path()).await;
    let paths = attached_paths(&output);
    let contents: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
    assert_eq!(
        contents,
        [b"one".to_vec(), b"two".to_vec(), b"three".to_vec()],
        "{output}"
    );
    let distinct: std::collections::HashSet<&String> = paths.iter().collect();
    assert_eq!(distinct.len(), 3, "{output}");
    // Delivered again (the same claim replayed): the same files, nothing new.
    let again = claim_saving(&broker, &host, "coll-1", dir.path()).await;
    assert_eq!(attached_paths(&again), paths, "{again}");
    let folder = std::path::Path::new(&paths[0]).parent().unwrap();
    assert_eq!(std::fs::read_dir(folder).unwrap().count(), 3);
}
