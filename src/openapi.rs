//! The OpenAPI 3.1 document, generated from the handlers' annotations and doc
//! comments. `openapi/openapi.json` is this document, committed; a test fails
//! when the two differ.

use serde_json::json;
use utoipa::openapi::path::Operation;
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, HeaderBuilder, Ref, RefOr, Response, ResponseBuilder};
use utoipa::{Modify, OpenApi, ToSchema};

use crate::error::{ErrorBody, ErrorCode, ErrorDetail};
use crate::http;
use crate::model::*;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "LoopX attached session broker",
        description = "Lets the people and bots around an already-running AI agent session talk to it: \
Web and Lark messages join one ordered queue per session; the host bridge claims the oldest \
message (optionally parked for up to 30 minutes), answers it and completes the claim; the answer \
is read back. Every step is duplicate-safe and a 2xx means committed. The broker never starts, \
resumes or fakes an agent runtime.\n\n\
Every error is `{\"error\": {\"code\", \"message\", ...details}}`. When several errors apply, the \
first of these wins: 401, 413, 415, 400, 404, 403, then the route's conflicts in the order its \
description lists them. Request bodies reject unknown fields. Client-chosen identifiers are 1 to \
256 bytes of UTF-8 without control characters. Every `/v1` route needs \
`Authorization: Bearer <owner token>` (the scheme name is case-insensitive), or a signed-in \
device's own credential (`lxd_…`, see `POST /v1/devices`), which works everywhere but on the \
devices' routes. A method a path \
does not document answers 405 `method_not_allowed` (with `Allow`); a store outage answers 503 \
`store_unavailable`.\n\n\
Transport-level rejections come before the router, from the HTTP layer, with an empty body, and \
close the connection: 400 for a malformed request line or header, 414 for a request target over \
65,534 bytes, 431 for a request head over about 400 KiB or with more than 100 header fields. A \
connection whose request head does not arrive within the server's header timeout (60 s by \
default, also for idle keep-alive connections) is closed without an answer. A request body that \
does not arrive within the body timeout is `408 request_timeout`. Past the connection cap a new \
connection gets `503 overloaded` with `Retry-After` and is closed.\n\n\
Server-Sent Events streams (a claim with `Accept: text/event-stream`, and a session's events) are \
described as arrays of their events, in order: each item names its `event:`, its `id:` when it has \
one, and its `data:`, JSON of the schema its `contentSchema` names.",
        license(name = "MIT", identifier = "MIT"),
    ),
    servers((url = "http://127.0.0.1:7317", description = "The default listen address (`loopx serve`).")),
    paths(
        http::healthz,
        http::openapi_json,
        http::metrics,
        http::agent_threads::register,
        http::sessions::bind,
        http::sessions::list,
        http::sessions::read,
        http::sessions::enqueue,
        http::sessions::close,
        http::sessions::agent_state,
        http::sessions::notification,
        http::changes::report,
        http::changes::read,
        http::changes::file,
        http::claims::claim,
        http::claims::release,
        http::events::events,
        http::permissions::create,
        http::permissions::list,
        http::permissions::read,
        http::permissions::answer,
        http::permissions::wait,
        http::permissions::withdraw,
        http::permissions::relayed,
        http::lark_links::link,
        http::lark_links::status,
        http::lark_links::unlink,
        http::lark_links::pair_code,
        http::devices::make_link,
        http::devices::sign_in,
        http::devices::list,
        http::devices::revoke,
        http::push::key,
        http::push::subscribe,
        http::push::list,
        http::push::unsubscribe,
        http::lark_events::events,
        http::lark_connector::status,
        http::turns::complete,
        http::turns::read,
        http::turns::list,
        http::attachments::enqueue_with_attachments,
        http::attachments::download,
    ),
    components(schemas(http::sessions::BindOrPreview, Attachment, ErrorBody, ErrorDetail, ErrorCode, Origin, Ingress, SessionState, TurnState, CancelReason, PermissionState, Behavior, AnsweredVia, TurnChange, TurnEventData, SessionEventData, PermissionEventData, AgentState, AgentEventData, NotificationEventData, NotificationKind, FileStatus, ChangedFile, TurnFile, TurnChanges)),
    modifiers(&OwnerTokenAuth, &SharedAnswers),
    security(("owner_token" = [])),
    tags(
        (name = "sessions", description = "Register host sessions, bind, list and close attached sessions."),
        (name = "turns", description = "Enqueue, claim, complete, release and read back turns."),
        (name = "permissions", description = "Tool-approval requests of the agent CLI, answered from the Web page, the API or Lark."),
        (name = "lark", description = "The Lark (Feishu) connector: its state, chat links and Lark's event webhook."),
        (name = "devices", description = "Devices signed in with a one-time link: the link, the sign-in, the list, revocation."),
        (name = "push", description = "Web Push: the broker's VAPID key and the caller's push subscriptions."),
        (name = "operations", description = "Health and this document; no token needed."),
    )
)]
pub struct ApiDoc;

struct OwnerTokenAuth;

impl Modify for OwnerTokenAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "owner_token",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The owner token: `LOOPX_TOKEN`, the `--token-file`, or `<data dir>/owner.token`; \
                         or a signed-in device's own credential (`lxd_…`).",
                    ))
                    .build(),
            ),
        );
        // Close takes an empty body as well as `{}`.
        if let Some(body) = openapi
            .paths
            .paths
            .get_mut("/v1/sessions/{session_id}/close")
            .and_then(|item| item.post.as_mut())
            .and_then(|op| op.request_body.as_mut())
        {
            body.required = Some(utoipa::openapi::Required::False);
        }
        // Health and the document itself need no token.
        for path in ["/healthz", "/openapi.json", "/metrics"] {
            if let Some(op) = openapi
                .paths
                .paths
                .get_mut(path)
                .and_then(|item| item.get.as_mut())
            {
                op.security = Some(vec![
                    utoipa::openapi::security::SecurityRequirement::default(),
                ]);
            }
        }
    }
}

/// The document as served and committed: pretty JSON with a final newline.
pub fn document_json() -> String {
    let mut json = ApiDoc::openapi()
        .to_pretty_json()
        .expect("the OpenAPI document serializes");
    json.push('\n');
    json
}

/// What every operation shares and the annotations cannot say once: the 405
/// of any other method on a path, the 503 of a store outage or of the
/// connection cap, the 408 of a body that does not arrive, and the
/// `Idempotent-Replayed` header of the answers that can replay an earlier
/// request.
struct SharedAnswers;

/// The operations whose 200 may replay an earlier request.
const REPLAYING: [&str; 7] = [
    "registerAgentThread",
    "bindSession",
    "enqueueMessage",
    "claimTurn",
    "completeTurn",
    "createPermissionRequest",
    "answerPermissionRequest",
];

impl Modify for SharedAnswers {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let mut method_not_allowed = error_answer(
            "`method_not_allowed`: this path does not take the request's method. Any method \
             not documented on a path answers this.",
        );
        method_not_allowed.headers.insert(
            "Allow".into(),
            HeaderBuilder::new()
                .schema(ObjectBuilder::new().schema_type(Type::String).build())
                .description(Some("The methods this path takes, e.g. `GET,HEAD`."))
                .build(),
        );
        let mut unavailable = error_answer(
            "`store_unavailable`: the broker's store did not answer (routes that read it); or \
             `overloaded`: the broker holds as many connections as it may. Retry later.",
        );
        unavailable.headers.insert(
            "Retry-After".into(),
            HeaderBuilder::new()
                .schema(
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .minimum(Some(0))
                        .build(),
                )
                .description(Some("With `overloaded`: seconds to wait before retrying."))
                .build(),
        );
        let request_timeout = error_answer(
            "`request_timeout`: the request body did not arrive within the body timeout.",
        );
        for item in openapi.paths.paths.values_mut() {
            for op in operations(item) {
                let id = op.operation_id.clone().unwrap_or_default();
                let responses = &mut op.responses.responses;
                responses
                    .entry("405".into())
                    .or_insert_with(|| method_not_allowed.clone().into());
                responses.insert("503".into(), unavailable.clone().into());
                if op.request_body.is_some() {
                    responses
                        .entry("408".into())
                        .or_insert_with(|| request_timeout.clone().into());
                }
                if REPLAYING.contains(&id.as_str())
                    && let Some(RefOr::T(ok)) = responses.get_mut("200")
                {
                    ok.headers
                        .insert("Idempotent-Replayed".into(), replayed_header());
                }
            }
        }
    }
}

fn operations(item: &mut utoipa::openapi::PathItem) -> impl Iterator<Item = &mut Operation> {
    [
        item.get.as_mut(),
        item.put.as_mut(),
        item.post.as_mut(),
        item.delete.as_mut(),
        item.patch.as_mut(),
    ]
    .into_iter()
    .flatten()
}

/// An answer whose body is the error body.
fn error_answer(description: &str) -> Response {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name(ErrorBody::name())))
                .build(),
        )
        .build()
}

fn replayed_header() -> utoipa::openapi::Header {
    HeaderBuilder::new()
        .schema(crate::model::constant(json!("true"), Type::String))
        .description(Some(
            "`true` when this answer replays an earlier request (the same idempotency key): \
             nothing new was written. Absent on a first answer.",
        ))
        .build()
}
