//! Attachments: a message sent with files (multipart), and a turn's file
//! downloaded. The rules (limits, names, types) are `crate::attachments`'s;
//! this file checks what it can before the body (its declared length, its
//! type, the session), streams the parts to temporary files as they arrive,
//! bounds how many uploads run at once, and serves the bytes safely. An
//! upload is never held whole in memory before its enqueue.

use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;

use axum::extract::multipart::Field;
use axum::extract::{FromRequest, Multipart, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, body::Bytes};
use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
use tokio::sync::Semaphore;

use super::{AppPath, AppState, replayed_header, server::BodyDeadline};
use crate::attachments::{self, MAX_UPLOAD_BODY_BYTES, Upload};
use crate::error::{Error, ErrorBody, ErrorCode, Result};
use crate::model::{EnqueueRequest, Enqueued};

pub fn router() -> axum::Router<AppState> {
    axum::Router::new()
        .route(
            "/v1/sessions/{session_id}/messages/with-attachments",
            post(enqueue_with_attachments)
                .layer(axum::extract::DefaultBodyLimit::max(MAX_UPLOAD_BODY_BYTES)),
        )
        .route(
            "/v1/sessions/{session_id}/turns/{turn_id}/attachments/{position}",
            get(download),
        )
}

/// Uploads at once: how many are read from the network (each streams its
/// files to temporary files, at most 52 MiB of disk), and how many are
/// stored (each held in memory, at most 50 MiB, while its enqueue runs).
/// Others wait for a turn, within the body deadline.
pub const UPLOADS_RECEIVED_AT_ONCE: usize = 8;
pub const UPLOADS_STORED_AT_ONCE: usize = 1;

/// Where uploads stream to, and how many run at once.
pub struct Uploads {
    dir: PathBuf,
    receiving: Semaphore,
    storing: Semaphore,
}

impl Uploads {
    /// Uploads streamed to unnamed temporary files in `dir` (created
    /// owner-only if missing).
    pub fn new(dir: PathBuf) -> Self {
        if let Err(e) = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
        {
            tracing::warn!(error = %e, dir = %dir.display(), "cannot create the uploads folder");
        }
        Self {
            dir,
            receiving: Semaphore::new(UPLOADS_RECEIVED_AT_ONCE),
            storing: Semaphore::new(UPLOADS_STORED_AT_ONCE),
        }
    }
}

/// The multipart body of a message with files (documentation only).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub(crate) struct MessageWithAttachments {
    /// The message as JSON, exactly the body of `enqueueMessage`
    /// (`origin`, `text`, `client_message_id`, `ingress`, `lark`); sent as
    /// a part named `message` (any part content type).
    message: EnqueueRequest,
    /// The files, in order: parts named `file`, each with its `filename` and
    /// `Content-Type`; up to 10 of them.
    #[schema(value_type = Vec<String>, format = Binary)]
    file: Vec<Vec<u8>>,
}

/// Enqueue a message with files.
///
/// `multipart/form-data` with one part named `message` (the JSON body of
/// `enqueueMessage`, same fields, same rules) and up to 10 parts named `file`.
/// Answers exactly as `enqueueMessage`: 201 with the queued turn, or on a
/// replay of the same `client_message_id` with the same text and the same
/// files (names, types and bytes, in order), 200 with `duplicate: true` and
/// `Idempotent-Replayed: true`; with other files, 422
/// `idempotency_key_reused`. The claim and the turn readback list the files
/// as `attachments`; the session projection never does.
///
/// Limits, checked as the parts arrive and before anything is written (413
/// `payload_too_large`, nothing stored, the queue unchanged): 20 MiB per
/// file, 50 MiB and 10 files per message, 500 MiB per session (its turns'
/// files together, counted as the files arrive unless the `message` part,
/// sent first, replays a `client_message_id` the session holds; the body
/// itself at most 52 MiB, a larger `Content-Length` refused before the body
/// is read). A file of 0 bytes is 400 `invalid_request`. Files stream to
/// temporary files, never held whole in memory; 8 uploads are read at once
/// and 1 stored at once, the others wait their turn within the body
/// deadline (408 `request_timeout` past it). A file's name is made safe
/// (its last path component, no leading dots and no invisible characters:
/// controls, format and bidi characters such as U+202E or U+200B, line and
/// paragraph separators; at most 200 bytes, `file` when empty); its type is sniffed from its bytes (PNG, JPEG, GIF, WebP) and
/// anything else is served as `application/octet-stream`.
///
/// Files are stored in the database, content-addressed by SHA-256 (a file
/// sent twice is stored once), in the transaction of the turn that names
/// them (a refused upload stores nothing), so every replica serves them;
/// they are pruned with their session by retention. Order of checks, the
/// first four before a byte of the body is read: 401, 413 (a declared
/// `Content-Length` over 52 MiB), 415 (not `multipart/form-data`), 404 and
/// 409 `session_closed`; then, as the body arrives, 413, 400, and the other
/// conflicts of `enqueueMessage`.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/messages/with-attachments", operation_id = "enqueueMessageWithAttachments", tag = "turns",
    params(("session_id" = String, Path, description = "The session id.")),
    request_body(content = MessageWithAttachments, content_type = "multipart/form-data"),
    responses(
        (status = 201, description = "Queued, with its files.", body = Enqueued),
        (status = 200, description = "A replay of the same `client_message_id`, text and files.", body = Enqueued),
        (status = 400, description = "`invalid_request` (a missing or malformed `message` part, an unknown part, a file of 0 bytes).", body = ErrorBody),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
        (status = 409, description = "`session_closed` or `live_steering_unavailable`.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`: a file over 20 MiB, a message over 50 MiB or 10 files, a session over 500 MiB.", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type` (not `multipart/form-data`).", body = ErrorBody),
        (status = 422, description = "`idempotency_key_reused`.", body = ErrorBody),
        (status = 429, description = "`queue_full`.", body = ErrorBody),
    ))]
pub async fn enqueue_with_attachments(
    State(state): State<AppState>,
    AppPath(session_id): AppPath<String>,
    request: Request,
) -> Result<Response> {
    // Before a byte of the body: its declared length, its type, the session.
    check_head(request.headers())?;
    let held = state.broker.attachments_held(&session_id).await?;
    let deadline = request.extensions().get::<BodyDeadline>().copied();
    let received = super::within_body_deadline(deadline, async {
        let _turn = state.uploads.receiving.acquire().await.map_err(closed)?;
        read_parts(request, &state, &session_id, held).await
    })
    .await??;
    let message: EnqueueRequest = serde_json::from_slice(&received.message)
        .map_err(|e| Error::invalid(format!("Invalid `message` part: {e}.")))?;
    let _turn = state.uploads.storing.acquire().await.map_err(closed)?;
    let mut uploads = Vec::with_capacity(received.files.len());
    for (position, file) in received.files.into_iter().enumerate() {
        uploads.push(file.load(position as u32).await?);
    }
    let answer = state
        .broker
        .enqueue_with_attachments(&session_id, message, uploads)
        .await?;
    let status = if answer.replayed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, replayed_header(answer.replayed), Json(answer.body)).into_response())
}

/// What the head alone says: a declared length over the body's limit
/// (413), a body that is not `multipart/form-data` (415).
fn check_head(headers: &HeaderMap) -> Result<()> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_UPLOAD_BODY_BYTES as u64) {
        return Err(body_too_large());
    }
    let is_multipart = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("multipart/form-data")
        });
    if !is_multipart {
        return Err(Error::new(
            ErrorCode::UnsupportedMediaType,
            "The request body must be `multipart/form-data`.",
        ));
    }
    Ok(())
}

fn body_too_large() -> Error {
    Error::new(
        ErrorCode::PayloadTooLarge,
        format!("The request body is over {MAX_UPLOAD_BODY_BYTES} bytes."),
    )
}

/// The semaphores are never closed; should one be, the upload is refused.
fn closed(_: tokio::sync::AcquireError) -> Error {
    Error::store("waiting for an upload's turn", "the upload gate is closed")
}

/// The parts as received: the `message` part's bytes, and each file in a
/// temporary file.
struct Received {
    message: Bytes,
    files: Vec<ReceivedFile>,
}

/// A `file` part, streamed to an unnamed temporary file (removed when
/// this is dropped, or by the system at a crash).
struct ReceivedFile {
    name: Option<String>,
    content_type: Option<String>,
    file: tokio::fs::File,
    size: u64,
}

impl ReceivedFile {
    /// Its bytes read back, as an upload at `position` (the rule of
    /// [`Upload::new`]: 0 bytes refused, the name made safe, the type sniffed).
    async fn load(mut self, position: u32) -> Result<Upload> {
        let mut bytes = Vec::with_capacity(self.size as usize);
        self.file
            .seek(std::io::SeekFrom::Start(0))
            .await
            .map_err(disk)?;
        self.file.read_to_end(&mut bytes).await.map_err(disk)?;
        Upload::new(
            position,
            self.name.as_deref(),
            self.content_type.as_deref(),
            bytes.into(),
        )
    }
}

/// A temporary file that failed: logged, answered 503 without detail.
#[track_caller]
fn disk(e: std::io::Error) -> Error {
    Error::store(
        "streaming an upload to a temporary file",
        e.to_string().as_str(),
    )
}

/// The `message` part and the files, each file streamed to disk and its
/// size, the message's and the session's (`held`: its files' bytes, unless
/// the `message` part, read first, is a replay of a turn it holds) checked
/// as the bytes arrive: 413 at the first byte too many. The message's JSON
/// is read after the last part, so that a limit (413) is answered before a
/// malformed message (400).
async fn read_parts(
    request: Request,
    state: &AppState,
    session_id: &str,
    held: u64,
) -> Result<Received> {
    let mut multipart = Multipart::from_request(request, state)
        .await
        .map_err(|e| Error::invalid(format!("Invalid multipart body: {}.", e.body_text())))?;
    let mut message: Option<Bytes> = None;
    let mut held = Some(held);
    let mut files: Vec<ReceivedFile> = Vec::new();
    let mut total: u64 = 0;
    while let Some(field) = multipart.next_field().await.map_err(multipart_error)? {
        match field.name() {
            Some("message") if message.is_none() => {
                let bytes = read_message(field).await?;
                if is_replay(state, session_id, &bytes).await? {
                    held = None;
                }
                message = Some(bytes);
            }
            Some("file") => {
                attachments::check_message(files.len() + 1, total)?;
                let limits = Limits {
                    files: files.len() + 1,
                    held,
                };
                files.push(receive_file(field, &state.uploads.dir, limits, &mut total).await?);
            }
            _ => {
                return Err(Error::invalid(
                    "A part is named neither `message` (once) nor `file`.",
                ));
            }
        }
    }
    let message = message
        .ok_or_else(|| Error::invalid("The `message` part (the JSON message) is missing."))?;
    Ok(Received { message, files })
}

/// Whether the `message` part names a `client_message_id` the session
/// holds already (read leniently: a malformed part is refused 400 later).
async fn is_replay(state: &AppState, session_id: &str, message: &[u8]) -> Result<bool> {
    let id = serde_json::from_slice::<EnqueueRequest>(message)
        .ok()
        .and_then(|m| m.client_message_id);
    match id {
        Some(id) => state.broker.holds_client_message_id(session_id, &id).await,
        None => Ok(false),
    }
}

/// The `message` part, at most 2 MiB.
async fn read_message(mut field: Field<'_>) -> Result<Bytes> {
    let mut bytes = BytesMut::new();
    while let Some(chunk) = field.chunk().await.map_err(multipart_error)? {
        bytes.extend_from_slice(&chunk);
        if bytes.len() > crate::broker::MAX_BODY_BYTES {
            return Err(Error::new(
                ErrorCode::PayloadTooLarge,
                "The `message` part is over 2 MiB.",
            ));
        }
    }
    Ok(bytes.freeze())
}

/// What a file's bytes are checked against as they arrive: the message's
/// count of files so far, and the bytes the session's files hold (`None`:
/// a replay, whose files are counted already).
struct Limits {
    files: usize,
    held: Option<u64>,
}

/// One `file` part, streamed to a temporary file in `dir`; `total` is the
/// message's file bytes so far.
async fn receive_file(
    mut field: Field<'_>,
    dir: &std::path::Path,
    limits: Limits,
    total: &mut u64,
) -> Result<ReceivedFile> {
    let name = field.file_name().map(str::to_owned);
    let content_type = field.content_type().map(str::to_owned);
    let mut file = tokio::fs::File::from_std(tempfile::tempfile_in(dir).map_err(disk)?);
    let mut size = 0u64;
    while let Some(chunk) = field.chunk().await.map_err(multipart_error)? {
        size += chunk.len() as u64;
        *total += chunk.len() as u64;
        attachments::check_file(size)?;
        attachments::check_message(limits.files, *total)?;
        if let Some(held) = limits.held {
            attachments::check_session(held, *total)?;
        }
        file.write_all(&chunk).await.map_err(disk)?;
    }
    file.flush().await.map_err(disk)?;
    Ok(ReceivedFile {
        name,
        content_type,
        file,
        size,
    })
}

fn multipart_error(e: axum::extract::multipart::MultipartError) -> Error {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        body_too_large()
    } else {
        Error::invalid(format!("Invalid multipart body: {}.", e.body_text()))
    }
}

/// Download a turn's file (by the host or the owner).
///
/// The bytes of the file at `position` (0, 1, … as listed in the turn's
/// `attachments`), with the owner token. An image recognized by its bytes
/// (PNG, JPEG, GIF, WebP) is served as its type, `inline`; anything else as
/// `application/octet-stream` with `Content-Disposition: attachment`, never
/// as HTML or script, whatever its name or declared type. Every answer
/// carries `X-Content-Type-Options: nosniff` and a `Content-Security-Policy`
/// that runs nothing. 404 for an unknown session, turn or position, or a
/// turn of another session.
#[utoipa::path(get, path = "/v1/sessions/{session_id}/turns/{turn_id}/attachments/{position}", operation_id = "downloadAttachment", tag = "turns",
    params(
        ("session_id" = String, Path, description = "The session id."),
        ("turn_id" = String, Path, description = "The turn id."),
        ("position" = u32, Path, description = "The file's position in the turn's `attachments`."),
    ),
    responses(
        (status = 200, description = "The file's bytes: an image recognized by its bytes as its type, anything else as `application/octet-stream`.",
            content(
                (Vec<u8> = "application/octet-stream"),
                (Vec<u8> = "image/png"),
                (Vec<u8> = "image/jpeg"),
                (Vec<u8> = "image/gif"),
                (Vec<u8> = "image/webp"),
            ),
            headers(
                ("Content-Disposition" = String, description = "`inline` for a recognized image, else `attachment`; with the file's safe name."),
                ("X-Content-Type-Options" = String, description = "`nosniff`."),
            )),
        (status = 400, description = "`invalid_request` (a position that is not a number).", body = ErrorBody),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
    ))]
pub async fn download(
    State(state): State<AppState>,
    AppPath((session_id, turn_id, position)): AppPath<(String, String, u32)>,
) -> Result<Response> {
    let file = state
        .broker
        .attachment(&session_id, &turn_id, position)
        .await?;
    // Served as what its bytes are, not as what it was stored as.
    let content_type = attachments::served_type(&file.bytes);
    let disposition = if content_type == attachments::OCTET_STREAM {
        "attachment"
    } else {
        "inline"
    };
    let disposition = content_disposition(disposition, &file.name);
    let mut response = file.bytes.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; sandbox"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, max-age=3600"),
    );
    if let Ok(value) = HeaderValue::from_str(&disposition) {
        headers.insert(header::CONTENT_DISPOSITION, value);
    }
    Ok(response)
}

/// `attachment; filename="…"; filename*=UTF-8''…` (RFC 6266): an ASCII
/// fallback without quotes or backslashes, and the UTF-8 name
/// percent-encoded.
fn content_disposition(kind: &str, name: &str) -> String {
    let fallback: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let encoded: String = name
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    format!("{kind}; filename=\"{fallback}\"; filename*=UTF-8''{encoded}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn content_disposition_quotes_nothing_unsafe() {
        assert_eq!(
            super::content_disposition("attachment", "a\"b é.txt"),
            "attachment; filename=\"a_b _.txt\"; filename*=UTF-8''a%22b%20%C3%A9.txt"
        );
    }
}
