//! The typed HTTP client of the broker: the CLI's commands and the integration
//! tests both talk to the broker through it, so there is one client to trust.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::ErrorBody;
use crate::model::{
    AgentNotification, AnswerPermission, Behavior, CreatePermissionRequest, ListPermissions,
    PermissionList, PermissionRequest, RelayedPermission, ReportAgentState, WaitPermission,
    WithdrawPermission,
};
use crate::model::{
    BindPreview, BindRequest, ClaimAnswer, ClaimRequest, CloseRequest, CompleteRequest, DeviceLink,
    DeviceList, EnqueueRequest, Enqueued, LarkConnector, LarkLink, LarkLinkRequest, LarkPairCode,
    ListSessions, ListTurns, Receipt, RegisterAgentThread, Registered, ReleaseRequest, Released,
    Session, SessionList, SignIn, SignedIn, Turn, TurnList,
};

/// The default broker URL.
pub const DEFAULT_BROKER_URL: &str = "http://127.0.0.1:7317";

/// A client of one broker, with the owner token.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    /// A parked call's HTTP timeout is its wait plus this: 30 s, or the
    /// timeout set by `with_timeout` (a hook's budget is 5 s, wait or not).
    slack: Duration,
}

/// The time a parked call's HTTP timeout allows above its wait by default.
const PARKED_SLACK: Duration = Duration::from_secs(30);

/// A session's event stream as it arrives.
pub type EventStream = std::pin::Pin<
    Box<
        dyn futures_util::Stream<
                Item = Result<
                    eventsource_stream::Event,
                    eventsource_stream::EventStreamError<reqwest::Error>,
                >,
            > + Send,
    >,
>;

/// A non-2xx answer: the broker's JSON error, or something else.
fn refusal(reply: Reply) -> ClientError {
    match serde_json::from_str::<ErrorBody>(&reply.text) {
        Ok(error) => ClientError::Refused { reply, error },
        Err(e) => ClientError::Unexpected {
            reason: format!("not the JSON error body: {e}"),
            reply,
        },
    }
}

/// A raw answer: status, whether it replays an earlier request, and the body as sent.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub replayed: bool,
    pub content_type: String,
    pub text: String,
}

impl Reply {
    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.text).unwrap_or(serde_json::Value::Null)
    }
}

/// A 2xx [`Reply`] decoded into `T`, with the raw reply kept (status, the
/// replay header, the text as sent). Not [`crate::broker::Answer`]: that is
/// the core's answer, before there is any HTTP.
#[derive(Debug, Clone)]
pub struct TypedReply<T> {
    pub body: T,
    pub reply: Reply,
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No HTTP answer: the broker is down, or the URL is wrong.
    #[error("the broker at {url} is unreachable: {reason}")]
    Unreachable { url: String, reason: String },
    /// The broker answered with its JSON error.
    #[error("the broker refused ({}): {} {}", .reply.status, .error.error.code_str(), .error.error.message)]
    Refused { reply: Reply, error: ErrorBody },
    /// The broker answered something this client does not understand.
    #[error("unexpected answer from the broker ({}): {reason}", .reply.status)]
    Unexpected { reply: Reply, reason: String },
}

impl crate::error::ErrorDetail {
    /// The snake_case code, as on the wire.
    pub fn code_str(&self) -> String {
        crate::model::wire(&self.code)
    }
}

impl Client {
    pub fn new(base: impl Into<String>, token: Option<String>) -> Self {
        Self {
            http: reqwest::Client::builder()
                .pool_idle_timeout(Duration::from_secs(30))
                .build()
                .expect("a plain HTTP client builds"),
            base: base.into().trim_end_matches('/').to_owned(),
            token,
            slack: PARKED_SLACK,
        }
    }

    /// The same client with every request bounded by `timeout`, and a parked
    /// call (a claim, a permission wait) by its wait plus `timeout`.
    pub fn with_timeout(self, timeout: Duration) -> Self {
        Self {
            http: reqwest::Client::builder()
                .pool_idle_timeout(Duration::from_secs(30))
                .connect_timeout(timeout)
                .timeout(timeout)
                .build()
                .expect("a plain HTTP client builds"),
            slack: timeout,
            ..self
        }
    }

    /// The HTTP timeout of a call parked for `wait_seconds` (at most 1,800).
    fn parked(&self, wait_seconds: u64) -> Duration {
        Duration::from_secs(wait_seconds.min(1800)) + self.slack
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// Sends one request and returns whatever the broker answered.
    /// `timeout` bounds the whole exchange (set it above a claim's wait).
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
        timeout: Option<Duration>,
    ) -> Result<Reply, ClientError> {
        let url = format!("{}{}", self.base, path);
        let mut request = self.http.request(method, &url);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        if let Some(timeout) = timeout {
            request = request.timeout(timeout);
        }
        self.finish(request).await
    }

    /// Sends and decodes a 2xx answer as `T`; a JSON error becomes `Refused`.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
        timeout: Option<Duration>,
    ) -> Result<TypedReply<T>, ClientError> {
        let reply = self.send(method, path, body, timeout).await?;
        if !reply.status.is_success() {
            return Err(refusal(reply));
        }
        match serde_json::from_str(&reply.text) {
            Ok(body) => Ok(TypedReply { body, reply }),
            Err(e) => Err(ClientError::Unexpected {
                reason: e.to_string(),
                reply,
            }),
        }
    }

    /// The session's event stream (SSE) after event `last_event_id` (0:
    /// from the first; `None`: from now), its events as they come. A refusal
    /// is the broker's JSON error.
    pub async fn events(
        &self,
        session_id: &str,
        last_event_id: Option<i64>,
    ) -> Result<EventStream, ClientError> {
        use eventsource_stream::Eventsource;
        let url = format!("{}{}", self.base, session_path(session_id, "/events"));
        let mut request = self
            .http
            .get(&url)
            .header(reqwest::header::ACCEPT, "text/event-stream");
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id.to_string());
        }
        let unreachable = |e: reqwest::Error| ClientError::Unreachable {
            url: self.base.clone(),
            reason: error_chain(&e),
        };
        let response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        if !status.is_success() {
            let text = response.text().await.map_err(unreachable)?;
            return Err(refusal(Reply {
                status,
                replayed: false,
                content_type: "application/json".into(),
                text,
            }));
        }
        Ok(Box::pin(response.bytes_stream().eventsource()))
    }

    pub async fn healthz(&self) -> Result<TypedReply<serde_json::Value>, ClientError> {
        self.call(Method::GET, "/healthz", NO_BODY, None).await
    }

    pub async fn register(
        &self,
        thread: &RegisterAgentThread,
    ) -> Result<TypedReply<Registered>, ClientError> {
        self.call(Method::POST, "/v1/agent-threads", Some(thread), None)
            .await
    }

    pub async fn bind(&self, bind: &BindRequest) -> Result<TypedReply<Session>, ClientError> {
        self.call(Method::POST, "/v1/sessions", Some(bind), None)
            .await
    }

    /// A dry-run bind (`dry_run` is forced on).
    pub async fn preview_bind(
        &self,
        bind: &BindRequest,
    ) -> Result<TypedReply<BindPreview>, ClientError> {
        let bind = BindRequest {
            dry_run: true,
            ..bind.clone()
        };
        self.call(Method::POST, "/v1/sessions", Some(&bind), None)
            .await
    }

    pub async fn sessions(
        &self,
        filter: &ListSessions,
    ) -> Result<TypedReply<SessionList>, ClientError> {
        let query = serde_urlencoded(filter);
        self.call(Method::GET, &format!("/v1/sessions{query}"), NO_BODY, None)
            .await
    }

    pub async fn session(&self, session_id: &str) -> Result<TypedReply<Session>, ClientError> {
        self.call(Method::GET, &session_path(session_id, ""), NO_BODY, None)
            .await
    }

    pub async fn enqueue(
        &self,
        session_id: &str,
        message: &EnqueueRequest,
    ) -> Result<TypedReply<Enqueued>, ClientError> {
        self.call(
            Method::POST,
            &session_path(session_id, "/messages"),
            Some(message),
            None,
        )
        .await
    }

    /// Enqueues a message with files (`multipart/form-data`: the message as
    /// its `message` part, each file a `file` part).
    pub async fn enqueue_with_attachments(
        &self,
        session_id: &str,
        message: &EnqueueRequest,
        files: &[OutgoingFile],
    ) -> Result<TypedReply<Enqueued>, ClientError> {
        let boundary = format!("loopx-{}", ulid::Ulid::new());
        let body = multipart_body(&boundary, message, files);
        let url = format!(
            "{}{}",
            self.base,
            session_path(session_id, "/messages/with-attachments")
        );
        let mut request = self
            .http
            .post(&url)
            .header(
                reqwest::header::CONTENT_TYPE,
                format!("multipart/form-data; boundary={boundary}"),
            )
            .body(body);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let reply = self.finish(request).await?;
        if !reply.status.is_success() {
            return Err(refusal(reply));
        }
        match serde_json::from_str(&reply.text) {
            Ok(body) => Ok(TypedReply { body, reply }),
            Err(e) => Err(ClientError::Unexpected {
                reason: e.to_string(),
                reply,
            }),
        }
    }

    /// A turn's file, by its `download` path: its bytes and content type.
    pub async fn download(&self, path: &str) -> Result<(Vec<u8>, String), ClientError> {
        let url = format!("{}{}", self.base, path);
        let mut request = self.http.get(&url);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let unreachable = |e: reqwest::Error| ClientError::Unreachable {
            url: self.base.clone(),
            reason: error_chain(&e),
        };
        let response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        if !status.is_success() {
            let text = response.text().await.map_err(unreachable)?;
            return Err(refusal(Reply {
                status,
                replayed: false,
                content_type,
                text,
            }));
        }
        let bytes = response.bytes().await.map_err(unreachable)?;
        Ok((bytes.to_vec(), content_type))
    }

    /// Sends a built request; the answer as a [`Reply`].
    async fn finish(&self, request: reqwest::RequestBuilder) -> Result<Reply, ClientError> {
        let unreachable = |e: reqwest::Error| ClientError::Unreachable {
            url: self.base.clone(),
            reason: error_chain(&e),
        };
        let response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let replayed = header("idempotent-replayed") == "true";
        let content_type = header("content-type");
        let text = response.text().await.map_err(unreachable)?;
        Ok(Reply {
            status,
            replayed,
            content_type,
            text,
        })
    }

    /// Claims, with an HTTP timeout above the wait.
    pub async fn claim(
        &self,
        session_id: &str,
        claim: &ClaimRequest,
    ) -> Result<TypedReply<ClaimAnswer>, ClientError> {
        let timeout = self.parked(claim.wait_seconds);
        self.call(
            Method::POST,
            &session_path(session_id, "/claims"),
            Some(claim),
            Some(timeout),
        )
        .await
    }

    pub async fn complete(
        &self,
        session_id: &str,
        turn_id: &str,
        completion: &CompleteRequest,
    ) -> Result<TypedReply<Receipt>, ClientError> {
        let path = session_path(session_id, &format!("/turns/{}/complete", segment(turn_id)));
        self.call(Method::POST, &path, Some(completion), None).await
    }

    pub async fn release(
        &self,
        session_id: &str,
        claim_id: &str,
        host: &ReleaseRequest,
    ) -> Result<TypedReply<Released>, ClientError> {
        let path = session_path(
            session_id,
            &format!("/claims/{}/release", segment(claim_id)),
        );
        self.call(Method::POST, &path, Some(host), None).await
    }

    pub async fn close(&self, session_id: &str) -> Result<TypedReply<Session>, ClientError> {
        self.call(
            Method::POST,
            &session_path(session_id, "/close"),
            NO_BODY,
            None,
        )
        .await
    }

    /// A close with a body (`release_active_claim`, `if_idle`).
    pub async fn close_with(
        &self,
        session_id: &str,
        close: &CloseRequest,
    ) -> Result<TypedReply<Session>, ClientError> {
        let path = session_path(session_id, "/close");
        self.call(Method::POST, &path, Some(close), None).await
    }

    pub async fn turn(
        &self,
        session_id: &str,
        turn_id: &str,
    ) -> Result<TypedReply<Turn>, ClientError> {
        let path = session_path(session_id, &format!("/turns/{}", segment(turn_id)));
        self.call(Method::GET, &path, NO_BODY, None).await
    }

    /// Links a chat without approvers (nobody on it can answer permission requests).
    pub async fn lark_link(
        &self,
        session_id: &str,
        chat_id: &str,
    ) -> Result<TypedReply<LarkLink>, ClientError> {
        self.lark_link_approved(session_id, chat_id, &[]).await
    }

    /// Links a chat whose `approvers` (Lark open ids) may answer permission
    /// requests; replaces the link and its list.
    pub async fn lark_link_approved(
        &self,
        session_id: &str,
        chat_id: &str,
        approvers: &[String],
    ) -> Result<TypedReply<LarkLink>, ClientError> {
        let body = LarkLinkRequest {
            chat_id: chat_id.to_owned(),
            approvers: approvers.to_vec(),
            terminal_turns: false,
        };
        self.lark_link_with(session_id, &body).await
    }

    /// Links a chat as `body` asks; replaces the link, its list and its
    /// options.
    pub async fn lark_link_with(
        &self,
        session_id: &str,
        body: &LarkLinkRequest,
    ) -> Result<TypedReply<LarkLink>, ClientError> {
        self.call(
            Method::PUT,
            &session_path(session_id, "/lark-link"),
            Some(&body),
            None,
        )
        .await
    }

    /// A one-time code that links the Lark chat it is sent in (`/link <code>`).
    pub async fn lark_pair_code(
        &self,
        session_id: &str,
    ) -> Result<TypedReply<LarkPairCode>, ClientError> {
        self.call(
            Method::POST,
            &session_path(session_id, "/lark-link/codes"),
            NO_BODY,
            None,
        )
        .await
    }

    /// A one-time sign-in code for a device (owner token only).
    pub async fn device_link(&self) -> Result<TypedReply<DeviceLink>, ClientError> {
        self.call(Method::POST, "/v1/devices/links", NO_BODY, None)
            .await
    }

    /// Trades a sign-in code for a device credential (no bearer needed).
    pub async fn sign_in_device(&self, body: &SignIn) -> Result<TypedReply<SignedIn>, ClientError> {
        self.call(Method::POST, "/v1/devices", Some(body), None)
            .await
    }

    /// The devices signed in (owner token only).
    pub async fn devices(&self) -> Result<TypedReply<DeviceList>, ClientError> {
        self.call(Method::GET, "/v1/devices", NO_BODY, None).await
    }

    /// Revokes a device (owner token only): its next request is 401.
    pub async fn revoke_device(&self, device_id: &str) -> Result<Reply, ClientError> {
        let path = format!("/v1/devices/{}", segment(device_id));
        let reply = self.send(Method::DELETE, &path, NO_BODY, None).await?;
        if !reply.status.is_success() {
            return Err(refusal(reply));
        }
        Ok(reply)
    }

    pub async fn lark_unlink(&self, session_id: &str) -> Result<TypedReply<LarkLink>, ClientError> {
        self.call(
            Method::DELETE,
            &session_path(session_id, "/lark-link"),
            NO_BODY,
            None,
        )
        .await
    }

    pub async fn lark_link_status(
        &self,
        session_id: &str,
    ) -> Result<TypedReply<LarkLink>, ClientError> {
        self.call(
            Method::GET,
            &session_path(session_id, "/lark-link"),
            NO_BODY,
            None,
        )
        .await
    }

    /// The Lark connector's state (`GET /v1/connectors/lark`).
    pub async fn lark_connector(&self) -> Result<TypedReply<LarkConnector>, ClientError> {
        self.call(Method::GET, "/v1/connectors/lark", NO_BODY, None)
            .await
    }

    pub async fn turns(
        &self,
        session_id: &str,
        page: &ListTurns,
    ) -> Result<TypedReply<TurnList>, ClientError> {
        let path = session_path(session_id, &format!("/turns{}", serde_urlencoded(page)));
        self.call(Method::GET, &path, NO_BODY, None).await
    }

    pub async fn create_permission(
        &self,
        session_id: &str,
        request: &CreatePermissionRequest,
    ) -> Result<TypedReply<PermissionRequest>, ClientError> {
        let path = session_path(session_id, "/permission-requests");
        self.call(Method::POST, &path, Some(request), None).await
    }

    pub async fn permissions(
        &self,
        session_id: &str,
        filter: &ListPermissions,
    ) -> Result<TypedReply<PermissionList>, ClientError> {
        let query = serde_urlencoded(filter);
        let path = session_path(session_id, &format!("/permission-requests{query}"));
        self.call(Method::GET, &path, NO_BODY, None).await
    }

    pub async fn permission(
        &self,
        session_id: &str,
        request_id: &str,
    ) -> Result<TypedReply<PermissionRequest>, ClientError> {
        self.call(
            Method::GET,
            &permission_path(session_id, request_id, ""),
            NO_BODY,
            None,
        )
        .await
    }

    /// Answers as the owner.
    pub async fn answer_permission(
        &self,
        session_id: &str,
        request_id: &str,
        behavior: Behavior,
    ) -> Result<TypedReply<PermissionRequest>, ClientError> {
        let answer = AnswerPermission::plain(behavior);
        self.answer_permission_with(session_id, request_id, &answer)
            .await
    }

    /// Answers as the owner, with what is chosen beyond allow or deny (a
    /// question's answers, a suggestion, a plan's mode, a message).
    pub async fn answer_permission_with(
        &self,
        session_id: &str,
        request_id: &str,
        answer: &AnswerPermission,
    ) -> Result<TypedReply<PermissionRequest>, ClientError> {
        let path = permission_path(session_id, request_id, "/answer");
        self.call(Method::POST, &path, Some(answer), None).await
    }

    /// Withdraws the host's unanswered request.
    pub async fn withdraw_permission(
        &self,
        session_id: &str,
        request_id: &str,
        host: &WithdrawPermission,
    ) -> Result<TypedReply<PermissionRequest>, ClientError> {
        let path = permission_path(session_id, request_id, "/withdraw");
        self.call(Method::POST, &path, Some(host), None).await
    }

    /// Reports the host's agent state (presence).
    pub async fn report_agent(
        &self,
        session_id: &str,
        report: &ReportAgentState,
    ) -> Result<TypedReply<Session>, ClientError> {
        let path = session_path(session_id, "/agent-state");
        self.call(Method::POST, &path, Some(report), None).await
    }

    /// Says the host's agent waits at its terminal.
    pub async fn notify(
        &self,
        session_id: &str,
        notice: &AgentNotification,
    ) -> Result<TypedReply<Session>, ClientError> {
        let path = session_path(session_id, "/notifications");
        self.call(Method::POST, &path, Some(notice), None).await
    }

    /// Reports the agent's working tree (204 when kept).
    pub async fn report_changes(
        &self,
        session_id: &str,
        report: &crate::model::ReportChanges,
    ) -> Result<(), ClientError> {
        let path = session_path(session_id, "/changes");
        let reply = self.send(Method::POST, &path, Some(report), None).await?;
        match reply.status.is_success() {
            true => Ok(()),
            false => Err(refusal(reply)),
        }
    }

    /// The session's latest report of its working tree.
    pub async fn changes(
        &self,
        session_id: &str,
    ) -> Result<TypedReply<crate::model::Changes>, ClientError> {
        let path = session_path(session_id, "/changes");
        self.call(Method::GET, &path, NO_BODY, None).await
    }

    /// One file of the latest report, with its diff (`path` from the
    /// repository's root, encoded as one segment).
    pub async fn changed_file(
        &self,
        session_id: &str,
        path: &str,
    ) -> Result<TypedReply<crate::model::FileChanges>, ClientError> {
        let path = session_path(session_id, &format!("/changes/files/{}", segment(path)));
        self.call(Method::GET, &path, NO_BODY, None).await
    }

    /// Waits for the answer, with an HTTP timeout above the wait.
    pub async fn wait_permission(
        &self,
        session_id: &str,
        request_id: &str,
        wait: &WaitPermission,
    ) -> Result<TypedReply<PermissionRequest>, ClientError> {
        let timeout = self.parked(wait.wait_seconds);
        let path = permission_path(session_id, request_id, "/wait");
        self.call(Method::POST, &path, Some(wait), Some(timeout))
            .await
    }
}

impl Client {
    /// The host relayed the request's answer to its agent.
    pub async fn relayed_permission(
        &self,
        session_id: &str,
        request_id: &str,
        relayed: &RelayedPermission,
    ) -> Result<TypedReply<PermissionRequest>, ClientError> {
        let path = permission_path(session_id, request_id, "/relayed");
        self.call(Method::POST, &path, Some(relayed), None).await
    }
}

fn permission_path(session_id: &str, request_id: &str, rest: &str) -> String {
    let request = format!("/permission-requests/{}{rest}", segment(request_id));
    session_path(session_id, &request)
}

/// No request body.
pub const NO_BODY: Option<&()> = None;

fn session_path(session_id: &str, rest: &str) -> String {
    format!("/v1/sessions/{}{rest}", segment(session_id))
}

/// One path segment, percent-encoded.
fn segment(value: &str) -> String {
    url::form_urlencoded::byte_serialize(value.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

/// `?a=1&b=2` from a struct of optional fields (empty when none is set).
fn serde_urlencoded(value: &impl Serialize) -> String {
    let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(value) else {
        return String::new();
    };
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    for (key, value) in fields {
        match value {
            serde_json::Value::Null => {}
            serde_json::Value::String(s) => {
                query.append_pair(&key, &s);
            }
            other => {
                query.append_pair(&key, &other.to_string());
            }
        }
    }
    let query = query.finish();
    if query.is_empty() {
        query
    } else {
        format!("?{query}")
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// A file to send with a message ([`Client::enqueue_with_attachments`]).
#[derive(Debug, Clone)]
pub struct OutgoingFile {
    pub name: String,
    pub content_type: String,
    pub bytes: Vec<u8>,
}

/// A `multipart/form-data` body: the message's JSON, then the files. A
/// name's quotes, backslashes and line breaks are replaced (they would end
/// its header).
fn multipart_body(boundary: &str, message: &EnqueueRequest, files: &[OutgoingFile]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"message\"\r\nContent-Type: application/json\r\n\r\n").as_bytes());
    body.extend_from_slice(&serde_json::to_vec(message).unwrap_or_default());
    for file in files {
        let name: String = file
            .name
            .chars()
            .map(|c| {
                if matches!(c, '"' | '\\' | '\r' | '\n') {
                    '_'
                } else {
                    c
                }
            })
            .collect();
        let content_type: String = file
            .content_type
            .chars()
            .filter(|c| !c.is_control())
            .collect();
        body.extend_from_slice(format!("\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: {content_type}\r\n\r\n").as_bytes());
        body.extend_from_slice(&file.bytes);
    }
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    body
}
