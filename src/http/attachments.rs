//! Attachments: a message sent with files (multipart), and a turn's file
//! downloaded. The rules (limits, names, types) are `crate::attachments`'s;
//! this file reads the parts as they stream and serves the bytes safely.

use axum::extract::{FromRequest, Multipart, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, body::Bytes};
use bytes::BytesMut;

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
/// files together; the body itself at most 52 MiB). A file of 0 bytes is 400
/// `invalid_request`. A file's name is made safe (its last path component,
/// no control characters or leading dots, at most 200 bytes, `file` when
/// empty); its type is sniffed from its bytes (PNG, JPEG, GIF, WebP) and
/// anything else is served as `application/octet-stream`.
///
/// Files are stored in the database, content-addressed by SHA-256 (a file
/// sent twice is stored once), so every replica serves them; they are
/// pruned with their session by retention. Order of checks: 401, 413, 415
/// (not `multipart/form-data`), 400, 404, then the conflicts of
/// `enqueueMessage`.
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
    let deadline = request.extensions().get::<BodyDeadline>().copied();
    let (message, files) =
        super::within_body_deadline(deadline, read_parts(request, &state)).await??;
    let message: EnqueueRequest = serde_json::from_slice(&message)
        .map_err(|e| Error::invalid(format!("Invalid `message` part: {e}.")))?;
    let uploads = files
        .into_iter()
        .enumerate()
        .map(|(position, file)| {
            Upload::new(
                position as u32,
                file.name.as_deref(),
                file.content_type.as_deref(),
                file.bytes,
            )
        })
        .collect::<Result<Vec<_>>>()?;
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

/// A `file` part as received.
struct Received {
    name: Option<String>,
    content_type: Option<String>,
    bytes: Bytes,
}

/// The `message` part and the files, each file's size and the message's
/// checked as their bytes arrive (413 at the first byte too many). The
/// message's JSON is read after the last part, so that a limit (413) is
/// answered before a malformed message (400).
async fn read_parts(request: Request, state: &AppState) -> Result<(Bytes, Vec<Received>)> {
    let is_multipart = request
        .headers()
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
    let mut multipart = Multipart::from_request(request, state)
        .await
        .map_err(|e| Error::invalid(format!("Invalid multipart body: {}.", e.body_text())))?;
    let mut message: Option<Bytes> = None;
    let mut files: Vec<Received> = Vec::new();
    let mut total: u64 = 0;
    while let Some(mut field) = multipart.next_field().await.map_err(multipart_error)? {
        match field.name() {
            Some("message") if message.is_none() => {
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
                message = Some(bytes.freeze());
            }
            Some("file") => {
                attachments::check_message(files.len() + 1, total)?;
                let name = field.file_name().map(str::to_owned);
                let content_type = field.content_type().map(str::to_owned);
                let mut bytes = BytesMut::new();
                while let Some(chunk) = field.chunk().await.map_err(multipart_error)? {
                    bytes.extend_from_slice(&chunk);
                    total += chunk.len() as u64;
                    attachments::check_file(bytes.len() as u64)?;
                    attachments::check_message(files.len() + 1, total)?;
                }
                files.push(Received {
                    name,
                    content_type,
                    bytes: bytes.freeze(),
                });
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
    Ok((message, files))
}

fn multipart_error(e: axum::extract::multipart::MultipartError) -> Error {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        Error::new(
            ErrorCode::PayloadTooLarge,
            format!("The request body is over {MAX_UPLOAD_BODY_BYTES} bytes."),
        )
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
