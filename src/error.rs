//! The one error of the broker: every failure, from a malformed body to a
//! store outage, becomes `{"error": {"code", "message", ...details}}` with the
//! contract's status. Store failures are logged here with context and answered
//! without detail; nothing else in the crate builds an error body.

use std::borrow::Cow;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

/// Every error code the broker answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 400: malformed JSON, a missing or mistyped field, an unknown field, a bad identifier or a value out of range.
    InvalidRequest,
    /// 400: `executor_endpoint_id` equals `agent_id`.
    IdentityConflated,
    /// 401: missing or wrong owner token (or, for the Lark webhook, a failed verification).
    Unauthorized,
    /// 403: the exact (goal, agent, host surface, host session) is not registered.
    NotRegistered,
    /// 403: the host identity differs from the session's binding.
    HostMismatch,
    /// 403: a device credential on a route only the owner token may use
    /// (sign-in links, devices).
    OwnerOnly,
    /// 404: unknown route, session, turn or claim.
    NotFound,
    /// 405: the route exists but not with this method.
    MethodNotAllowed,
    /// 409: the tuple is bound to an open session with another executor endpoint.
    SessionExists,
    /// 409: the session is closed.
    SessionClosed,
    /// 409: live steering is not available; nothing was queued instead.
    LiveSteeringUnavailable,
    /// 409: another claim is active on the session.
    ClaimActive,
    /// 409: the Lark chat is linked to another open session. No longer
    /// answered (a chat holds several sessions); kept in the list of codes
    /// so that clients which know it still read it.
    ChatLinked,
    /// 409: the claim id was used on another session.
    ClaimIdReused,
    /// 409: the claim id's turn was released; the claim id is spent.
    ClaimReleased,
    /// 409: the turn is already completed (by another completion id).
    AlreadyCompleted,
    /// 409: the turn is queued or cancelled, not claimed.
    NotClaimed,
    /// 409: the turn is held by another claim id.
    ClaimMismatch,
    /// 409: a close `if_idle` found messages waiting (queued, or one
    /// delivered and unanswered): the session stays open.
    MessagesWaiting,
    /// 408: the request body did not arrive within the server's body timeout.
    RequestTimeout,
    /// 409: the permission request was answered otherwise, or expired (`state` says which).
    PermissionAlreadyAnswered,
    /// 409: the permission request has no answer to relay: pending or expired (`state` says which).
    PermissionNotAnswered,
    /// 409: 50 devices are signed in already; revoke one first.
    TooManyDevices,
    /// 409: the caller holds 10 push subscriptions already; remove one first.
    TooManySubscriptions,
    /// 413: the request body is over 2 MiB.
    PayloadTooLarge,
    /// 415: the request body is not `application/json`.
    UnsupportedMediaType,
    /// 422: an idempotency key (client_message_id or completion_id) was reused with another body.
    IdempotencyKeyReused,
    /// 429: the session already has 10,000 queued turns.
    QueueFull,
    /// 429: prompts typed at the session's terminal come faster than 10 at
    /// once and 30 a minute; retry after `Retry-After` seconds.
    TooManyPrompts,
    /// 429: too many wrong sign-in codes lately, or 20 sign-in links open
    /// at once; retry after `Retry-After` seconds.
    TooManyAttempts,
    /// 503: the store did not answer; retry later.
    StoreUnavailable,
    /// 503: the broker holds as many connections as it may; retry after `Retry-After` seconds.
    Overloaded,
}

impl ErrorCode {
    pub fn status(self) -> StatusCode {
        use ErrorCode::*;
        match self {
            InvalidRequest | IdentityConflated => StatusCode::BAD_REQUEST,
            Unauthorized => StatusCode::UNAUTHORIZED,
            NotRegistered | HostMismatch | OwnerOnly => StatusCode::FORBIDDEN,
            NotFound => StatusCode::NOT_FOUND,
            MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            SessionExists
            | SessionClosed
            | LiveSteeringUnavailable
            | ClaimActive
            | ChatLinked
            | ClaimIdReused
            | ClaimReleased
            | AlreadyCompleted
            | NotClaimed
            | ClaimMismatch
            | MessagesWaiting
            | PermissionAlreadyAnswered
            | PermissionNotAnswered
            | TooManyDevices
            | TooManySubscriptions => StatusCode::CONFLICT,
            RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            IdempotencyKeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            QueueFull | TooManyPrompts | TooManyAttempts => StatusCode::TOO_MANY_REQUESTS,
            StoreUnavailable | Overloaded => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// A failure with the contract's code, a human sentence and, for
/// `claim_active`, the active claim's id and time.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct Error {
    pub code: ErrorCode,
    pub message: Cow<'static, str>,
    pub active_claim: Option<ActiveClaim>,
    /// Sent as `Retry-After` (seconds) when set.
    pub retry_after_seconds: Option<u32>,
    /// For `permission_already_answered`: the request's final state.
    pub permission_state: Option<crate::model::PermissionState>,
    /// An `invalid_request` that is well formed but does not fit what it
    /// answers (a question allowed without its answers): 422, not 400.
    pub unfit: bool,
}

/// The details of a `claim_active` conflict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveClaim {
    pub claim_id: String,
    pub claimed_at_ms: i64,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(code: ErrorCode, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            code,
            message: message.into(),
            active_claim: None,
            retry_after_seconds: None,
            permission_state: None,
            unfit: false,
        }
    }

    /// 422 `invalid_request`: a well-formed body that does not fit the
    /// resource it answers.
    pub fn unfit(message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            unfit: true,
            ..Self::invalid(message)
        }
    }

    pub fn invalid(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorCode::InvalidRequest, message)
    }

    pub fn not_found(what: &'static str) -> Self {
        Self::new(ErrorCode::NotFound, format!("No such {what}."))
    }

    pub fn claim_active(claim_id: String, claimed_at_ms: i64) -> Self {
        Self {
            active_claim: Some(ActiveClaim {
                claim_id,
                claimed_at_ms,
            }),
            ..Self::new(
                ErrorCode::ClaimActive,
                "Another claim is active on this session; complete or release it first.",
            )
        }
    }

    /// The connection cap is reached: the refusal a connection past the cap
    /// gets before it is closed.
    pub fn overloaded(retry_after_seconds: u32) -> Self {
        Self {
            retry_after_seconds: Some(retry_after_seconds),
            ..Self::new(
                ErrorCode::Overloaded,
                "The broker holds as many connections as it may; retry after the Retry-After seconds.",
            )
        }
    }

    /// A terminal's prompts over their rate: retry after `retry_after_seconds`.
    pub fn too_many_prompts(retry_after_seconds: u32) -> Self {
        Self {
            retry_after_seconds: Some(retry_after_seconds),
            ..Self::new(
                ErrorCode::TooManyPrompts,
                "Prompts come faster than a person types: nothing was recorded; retry after the Retry-After seconds.",
            )
        }
    }

    pub fn host_mismatch() -> Self {
        Self::new(
            ErrorCode::HostMismatch,
            "The host identity does not match this session's binding.",
        )
    }

    pub fn permission_not_answered(state: crate::model::PermissionState) -> Self {
        Self {
            permission_state: Some(state),
            ..Self::new(
                ErrorCode::PermissionNotAnswered,
                "This permission request has no answer to relay: it is pending or expired.",
            )
        }
    }

    pub fn permission_already_answered(state: crate::model::PermissionState) -> Self {
        Self {
            permission_state: Some(state),
            ..Self::new(
                ErrorCode::PermissionAlreadyAnswered,
                "This permission request is already answered or expired; the first answer is final.",
            )
        }
    }

    /// A store failure: logged with what was being done, where, and the
    /// kind of its cause, answered as 503 without detail.
    #[track_caller]
    pub fn store(context: &'static str, cause: impl StoreCause) -> Self {
        let at = std::panic::Location::caller();
        tracing::error!(cause = %cause.describe(), %at, "store failure: {context}");
        Self::new(
            ErrorCode::StoreUnavailable,
            "The broker's store is unavailable; retry later.",
        )
    }

    pub fn status(&self) -> StatusCode {
        if self.unfit {
            return StatusCode::UNPROCESSABLE_ENTITY;
        }
        self.code.status()
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                code: self.code,
                message: self.message.to_string(),
                active_claim_id: self.active_claim.as_ref().map(|a| a.claim_id.clone()),
                claimed_at: self
                    .active_claim
                    .as_ref()
                    .map(|a| crate::time::rfc3339(a.claimed_at_ms)),
                state: self.permission_state,
            },
        }
    }
}

// `?` passes its own location to a `#[track_caller]` `from`, so the log
// names the statement that failed.
impl From<sqlx::Error> for Error {
    #[track_caller]
    fn from(e: sqlx::Error) -> Self {
        Self::store("query failed", e)
    }
}

impl From<rusqlite::Error> for Error {
    #[track_caller]
    fn from(e: rusqlite::Error) -> Self {
        Self::store("statement failed", e)
    }
}

/// What a store failure's log may say of its cause: the kind of failure and
/// its codes (SQLSTATE or SQLite's extended result code, the constraint's
/// name, an I/O error's kind). Never a driver's message, which can quote a
/// stored value.
pub trait StoreCause {
    fn describe(&self) -> String;
}

impl<T: StoreCause + ?Sized> StoreCause for &T {
    fn describe(&self) -> String {
        (**self).describe()
    }
}

/// The broker's own sentences (an invariant that did not hold).
impl StoreCause for str {
    fn describe(&self) -> String {
        self.to_owned()
    }
}

/// A journal record that does not (de)serialize: its kind and position,
/// never its content.
impl StoreCause for serde_json::Error {
    fn describe(&self) -> String {
        format!("{:?} error at column {}", self.classify(), self.column())
    }
}

impl StoreCause for std::io::Error {
    fn describe(&self) -> String {
        match self.raw_os_error() {
            Some(errno) => format!("I/O error: {} (os error {errno})", self.kind()),
            None => format!("I/O error: {}", self.kind()),
        }
    }
}

impl StoreCause for sqlx::Error {
    fn describe(&self) -> String {
        use sqlx::Error::*;
        match self {
            Database(e) => {
                let kind = match e.kind() {
                    sqlx::error::ErrorKind::UniqueViolation => "unique violation",
                    sqlx::error::ErrorKind::ForeignKeyViolation => "foreign key violation",
                    sqlx::error::ErrorKind::NotNullViolation => "not-null violation",
                    sqlx::error::ErrorKind::CheckViolation => "check violation",
                    _ => "database error",
                };
                let code = e.code().unwrap_or_default();
                match e.constraint() {
                    Some(constraint) => format!("{kind} {code} on {constraint}"),
                    None => format!("{kind} {code}"),
                }
            }
            Io(e) => e.describe(),
            PoolTimedOut => "timed out waiting for a pooled connection".into(),
            PoolClosed => "the connection pool is closed".into(),
            WorkerCrashed => "the connection's worker crashed".into(),
            // The URL's own parse errors: no part of the URL in them.
            Configuration(e) => format!("configuration: {e}"),
            Tls(_) => "TLS error".into(),
            Protocol(_) => "protocol error".into(),
            RowNotFound => "no row where one was expected".into(),
            ColumnDecode { index, .. } => format!("cannot decode column {index}"),
            Migrate(e) => e.describe(),
            _ => "driver error".into(),
        }
    }
}

impl StoreCause for sqlx::migrate::MigrateError {
    fn describe(&self) -> String {
        use sqlx::migrate::MigrateError::*;
        match self {
            Execute(e) => format!("migrating: {}", e.describe()),
            ExecuteMigration(e, version) => format!("migration {version}: {}", e.describe()),
            Source(_) => "reading the migrations".into(),
            // The rest name migration versions only.
            other => other.to_string(),
        }
    }
}

impl StoreCause for rusqlite::Error {
    fn describe(&self) -> String {
        use rusqlite::Error::*;
        match self {
            SqliteFailure(e, _) => format!("sqlite error {} ({:?})", e.extended_code, e.code),
            QueryReturnedNoRows => "no row where one was expected".into(),
            FromSqlConversionFailure(column, from, _) => {
                format!("cannot convert column {column} from {from}")
            }
            InvalidColumnType(column, _, from) => format!("column {column} holds a {from}"),
            _ => "statement error".into(),
        }
    }
}

/// The error body every failing route answers with.
#[derive(Debug, Serialize, serde::Deserialize, ToSchema)]
#[schema(example = json!({"error": {"code": "claim_active", "message": "Another claim is active on this session; complete or release it first.", "active_claim_id": "claim-1", "claimed_at": "2026-11-30T10:00:00.000Z"}}))]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// The code, a human sentence, and the details the code names.
#[derive(Debug, Serialize, serde::Deserialize, ToSchema)]
pub struct ErrorDetail {
    pub code: ErrorCode,
    pub message: String,
    /// Only with `claim_active`: the claim that holds the session.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub active_claim_id: Option<String>,
    /// Only with `claim_active`: when that claim was made.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub claimed_at: Option<String>,
    /// Only with `permission_already_answered` and `permission_not_answered`: the request's state.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub state: Option<crate::model::PermissionState>,
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let retry_after = self
            .retry_after_seconds
            .map(|seconds| [(axum::http::header::RETRY_AFTER, seconds.to_string())]);
        (self.status(), retry_after, axum::Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use sqlx::Connection;

    /// What `f` logs, as text.
    async fn logs_of<F: Future>(f: F) -> String {
        #[derive(Clone, Default)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        f.await;
        String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap()
    }

    #[tokio::test]
    async fn a_store_failure_logs_its_kind_and_place_but_never_the_drivers_message() {
        let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:")
            .await
            .unwrap();
        let setup = "create table t (x text unique); insert into t values ('hunter2')";
        sqlx::raw_sql(setup).execute(&mut conn).await.unwrap();
        let logs = logs_of(async {
            let duplicate = async {
                sqlx::query("insert into t values ('hunter2')")
                    .execute(&mut conn)
                    .await?;
                Ok::<_, super::Error>(())
            };
            let error = duplicate.await.unwrap_err();
            assert_eq!(error.code, super::ErrorCode::StoreUnavailable);
            let rusqlite = || -> super::Result<()> {
                let conn = rusqlite::Connection::open_in_memory()?;
                conn.execute("select * from \"hunter2-table\"", [])?;
                Ok(())
            };
            rusqlite().unwrap_err();
        })
        .await;
        assert!(logs.contains("unique violation 2067"), "{logs}");
        assert!(logs.contains("sqlite error 1 (Unknown)"), "{logs}");
        assert_eq!(logs.matches("src/error.rs:").count(), 2, "{logs}");
        assert!(!logs.contains("hunter2"), "{logs}");
        assert!(!logs.contains("UNIQUE constraint failed"), "{logs}");
    }
}
