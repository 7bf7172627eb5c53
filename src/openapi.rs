//! The OpenAPI 3.1 document, generated from the handlers' annotations and doc
//! comments. `openapi/openapi.json` is this document, committed; a test fails
//! when the two differ.

use serde_json::{Value, json};
use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::path::Operation;
use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, HeaderBuilder, Ref, RefOr, Response, ResponseBuilder};
use utoipa::{Modify, OpenApi, PartialSchema, ToSchema};

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
`Authorization: Bearer <owner token>` (the scheme name is case-insensitive). A method a path \
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
        http::lark_events::events,
        http::lark_connector::status,
        http::turns::complete,
        http::turns::read,
        http::turns::list,
    ),
    components(schemas(http::sessions::BindOrPreview, ErrorBody, ErrorDetail, ErrorCode, Origin, Ingress, SessionState, TurnState, CancelReason, PermissionState, Behavior, AnsweredVia, TurnChange, TurnEventData, SessionEventData, PermissionEventData, AgentState, AgentEventData, NotificationEventData, NotificationKind)),
    modifiers(&OwnerTokenAuth, &SharedAnswers),
    security(("owner_token" = [])),
    tags(
        (name = "sessions", description = "Register host sessions, bind, list and close attached sessions."),
        (name = "turns", description = "Enqueue, claim, complete, release and read back turns."),
        (name = "permissions", description = "Tool-approval requests of the agent CLI, answered from the Web page, the API or Lark."),
        (name = "lark", description = "The Lark (Feishu) connector: its state, chat links and Lark's event webhook."),
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
                        "The owner token: `LOOPX_TOKEN`, the `--token-file`, or `<data dir>/owner.token`.",
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
        .schema(constant(json!("true"), Type::String))
        .description(Some(
            "`true` when this answer replays an earlier request (the same idempotency key): \
             nothing new was written. Absent on a first answer.",
        ))
        .build()
}

/// A schema with one allowed value (`const`), so a typed client can narrow a
/// union on it. utoipa has no attribute for `const`; JSON Schema 2020-12 (and
/// so OpenAPI 3.1) does.
fn constant(value: Value, schema_type: Type) -> Schema {
    let keyword: Extensions = [("const", value)].into_iter().collect();
    ObjectBuilder::new()
        .schema_type(schema_type)
        .extensions(Some(keyword))
        .build()
        .into()
}

/// For `#[schema(schema_with = …)]` on a field that is always `true`.
pub(crate) fn always_true() -> Schema {
    constant(json!(true), Type::Boolean)
}

/// For `#[schema(schema_with = …)]` on a field that is always `false`.
pub(crate) fn always_false() -> Schema {
    constant(json!(false), Type::Boolean)
}

/// A turn's response: the document's name for the JSON object a host
/// completes a turn with (the code keeps it as a JSON map, exactly as given).
pub struct TurnResponse;

impl PartialSchema for TurnResponse {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(
                "The host's response: a JSON object with at least a string `message` that is not blank (not empty, not only whitespace: 400 `invalid_request`); \
                 other fields are kept and read back exactly as given.",
            ))
            .property(
                "message",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .min_length(Some(1))
                    .pattern(Some(r"\S"))
                    .description(Some("The answer for the people in the chat: not blank.")),
            )
            .required("message")
            .additional_properties(Some(AdditionalProperties::FreeForm(true)))
            .examples([
                json!({"message": "The test fails because the fixture is stale.", "tokens": 812}),
            ])
            .into()
    }
}

impl ToSchema for TurnResponse {}

/// A Lark open id, as a chat link's approver (checked by
/// [`crate::permission::approvers`]).
pub struct LarkOpenId;

impl PartialSchema for LarkOpenId {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(4))
            .max_length(Some(crate::permission::MAX_OPEN_ID_BYTES))
            .pattern(Some(r"^ou_[0-9A-Za-z_-]+$"))
            .description(Some(
                "A Lark user's open id (`ou_…`), as in an event's `sender.sender_id.open_id`.",
            ))
            .into()
    }
}

impl ToSchema for LarkOpenId {}

/// One Server-Sent Event of a stream, as the document describes it: its
/// `event:` name (a constant), its `id:` when it has one, and its `data:`
/// line, JSON of the named schema (`contentMediaType` + `contentSchema`).
fn sse_event<Data: ToSchema>(name: &str, with_id: bool, description: &str) -> Schema {
    let content_schema: Extensions = [(
        "contentSchema",
        json!({"$ref": format!("#/components/schemas/{}", Data::name())}),
    )]
    .into_iter()
    .collect();
    let mut event = ObjectBuilder::new()
        .schema_type(Type::Object)
        .title(Some(format!("event: {name}")))
        .description(Some(description))
        .property("event", constant(json!(name), Type::String))
        .required("event")
        .property(
            "data",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .content_media_type("application/json")
                .extensions(Some(content_schema)),
        )
        .required("data");
    if with_id {
        event = event
            .property(
                "id",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some("^[0-9]+$"))
                    .description(Some("The per-session event number: 1, 2, 3, …")),
            )
            .required("id");
    }
    event.build().into()
}

/// Lists `T` and what it refers to among the document's schemas, as a
/// derived `ToSchema` does for its fields.
fn register<T: ToSchema>(schemas: &mut Vec<(String, RefOr<Schema>)>) {
    schemas.push((T::name().into(), T::schema()));
    T::schemas(schemas);
}

/// A stream of events, described by the schema of one event: under OpenAPI
/// 3.1 a `text/event-stream` schema describes each event of the stream (what
/// 3.2 names `itemSchema`), and tools such as schemathesis check each event
/// against it.
fn sse_stream(description: &str, events: Vec<Schema>) -> RefOr<Schema> {
    events
        .into_iter()
        .fold(
            OneOfBuilder::new().description(Some(description)),
            |one_of, event| one_of.item(event),
        )
        .into()
}

/// The `text/event-stream` answer of a claim.
pub struct ClaimEventStream;

impl PartialSchema for ClaimEventStream {
    fn schema() -> RefOr<Schema> {
        sse_stream(
            "A claim answered as Server-Sent Events: a comment line every 15 s while the \
             claim is parked, then exactly one event, then the stream ends.",
            vec![
                sse_event::<ClaimAnswer>(
                    "claim",
                    false,
                    "The claim's answer, as the JSON mode answers it.",
                ),
                sse_event::<ErrorBody>(
                    "error",
                    false,
                    "The session closed while the claim was parked.",
                ),
            ],
        )
    }
}

impl ToSchema for ClaimEventStream {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        register::<ClaimAnswer>(schemas);
        register::<ErrorBody>(schemas);
    }
}

/// The `text/event-stream` answer of a session's event stream.
pub struct SessionEventStream;

impl PartialSchema for SessionEventStream {
    fn schema() -> RefOr<Schema> {
        sse_stream(
            "The session's event log as Server-Sent Events, in order; a comment line every \
             15 s keeps proxies open.",
            vec![
                sse_event::<TurnEventData>(
                    "turn",
                    true,
                    "A turn was queued, claimed, completed, released or cancelled.",
                ),
                sse_event::<PermissionEventData>(
                    "permission",
                    true,
                    "A permission request was made, answered or expired.",
                ),
                sse_event::<AgentEventData>(
                    "agent",
                    true,
                    "The session's agent presence changed (working, waiting, away).",
                ),
                sse_event::<NotificationEventData>(
                    "notification",
                    true,
                    "The agent waits for someone at its terminal (its text is not stored).",
                ),
                sse_event::<SessionEventData>(
                    "session",
                    true,
                    "The session closed; the stream then ends.",
                ),
            ],
        )
    }
}

impl ToSchema for SessionEventStream {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        register::<TurnEventData>(schemas);
        register::<PermissionEventData>(schemas);
        register::<AgentEventData>(schemas);
        register::<NotificationEventData>(schemas);
        register::<SessionEventData>(schemas);
    }
}
