//! What the agent changed: the host's report of its working tree, the
//! latest report, one file's diff.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};

use super::{AppJson, AppPath, AppState};
use crate::error::{ErrorBody, Result};
use crate::model::{Changes, FileChanges, ReportChanges};

pub fn router() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/v1/sessions/{session_id}/changes", post(report).get(read))
        .route("/v1/sessions/{session_id}/changes/files/{*path}", get(file))
}

/// Report the agent's working tree (by the host).
///
/// The hooks read the working tree of the agent's directory with git at the
/// end of each turn and after a tool that writes (at most once per 10 s),
/// within 2 s, and report it: the branch, `HEAD`, ahead and behind of its
/// upstream, the changed files with lines added and removed against `HEAD`
/// (untracked files as added), and the unified diff. It replaces the
/// session's latest report. `turn_files` are the files the tools of the
/// turn the agent works on wrote so far (the turn typed at its terminal, or
/// the one it holds a claim on): they become that turn's, with their counts
/// in this report (0 for a file no longer changed, committed or restored
/// since); with no such turn, they are dropped. Content, like message text:
/// never logged, in no projection or metric, pruned with the session.
/// Limits (400 `invalid_request`, saying which): 1,000 `files` and 1,000
/// `turn_files`, a path 1 to 4,096 bytes without U+0000, a `diff` of at most
/// 1 MiB (a file's over 256 KiB or a binary one is listed with its counts
/// only, `truncated` or `binary`), `branch` 256 bytes, `head` 64; the body
/// 2 MiB (413). 204 when kept. Order of checks: 400, 404, 403
/// `host_mismatch`, 409 `session_closed`.
#[utoipa::path(post, path = "/v1/sessions/{session_id}/changes", operation_id = "reportChanges", tag = "sessions",
    params(("session_id" = String, Path, description = "The session id.")),
    request_body = ReportChanges,
    responses(
        (status = 204, description = "Kept as the session's latest report."),
        (status = 400, description = "`invalid_request`.", body = ErrorBody),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 403, description = "`host_mismatch`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
        (status = 409, description = "`session_closed`.", body = ErrorBody),
        (status = 413, description = "`payload_too_large`.", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`.", body = ErrorBody),
    ))]
pub async fn report(
    State(state): State<AppState>,
    AppPath(session_id): AppPath<String>,
    AppJson(report): AppJson<ReportChanges>,
) -> Result<StatusCode> {
    state.broker.report_changes(&session_id, report).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// What the agent changed.
///
/// The session's latest report of its working tree (`reported_at`: when it
/// came), the files' totals, and the latest 50 turns whose tools wrote files,
/// newest first, each with its files and totals (what the Web page shows
/// under an answered turn: "3 files changed (+40 −12)"). 404 for an unknown
/// session, or one whose hooks reported nothing (outside a git repository,
/// they report nothing).
#[utoipa::path(get, path = "/v1/sessions/{session_id}/changes", operation_id = "getChanges", tag = "sessions",
    params(("session_id" = String, Path, description = "The session id.")),
    responses(
        (status = 200, description = "The latest report.", body = Changes),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
    ))]
pub async fn read(
    State(state): State<AppState>,
    AppPath(session_id): AppPath<String>,
) -> Result<Json<Changes>> {
    Ok(Json(state.broker.changes(&session_id).await?))
}

/// One changed file's diff.
///
/// A file of the latest report (its path from the repository's root,
/// URL-encoded: `%2F` or `/` between its parts), with its section of the
/// unified diff, empty for one listed `binary` or `truncated`. 404 for an
/// unknown session, no report, or a file not in it.
#[utoipa::path(get, path = "/v1/sessions/{session_id}/changes/files/{path}", operation_id = "getChangedFile", tag = "sessions",
    params(
        ("session_id" = String, Path, description = "The session id."),
        ("path" = String, Path, description = "The file's path from the repository's root, URL-encoded."),
    ),
    responses(
        (status = 200, description = "The file and its diff.", body = FileChanges),
        (status = 401, description = "`unauthorized`.", body = ErrorBody),
        (status = 404, description = "`not_found`.", body = ErrorBody),
    ))]
pub async fn file(
    State(state): State<AppState>,
    AppPath((session_id, path)): AppPath<(String, String)>,
) -> Result<Json<FileChanges>> {
    Ok(Json(state.broker.file_changes(&session_id, &path).await?))
}
