//! The OpenAPI 3.1 document, generated from the handlers' annotations and doc
//! comments. `openapi/openapi.json` is this document, committed; a test fails
//! when the two differ.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

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
`Authorization: Bearer <owner token>` (the scheme name is case-insensitive).\n\n\
Transport-level rejections come before the router, from the HTTP layer, with an empty body, and \
close the connection: 400 for a malformed request line or header, 414 for a request target over \
65,534 bytes, 431 for a request head over about 400 KiB or with more than 100 header fields. A \
connection whose request head does not arrive within the server's header timeout (60 s by \
default, also for idle keep-alive connections) is closed without an answer. A request body that \
does not arrive within the body timeout is `408 request_timeout`. Past the connection cap a new \
connection gets `503 overloaded` with `Retry-After` and is closed.",
        license(name = "MIT"),
    ),
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
        http::claims::claim,
        http::claims::release,
        http::events::events,
        http::permissions::create,
        http::permissions::list,
        http::permissions::read,
        http::permissions::answer,
        http::permissions::wait,
        http::lark_links::link,
        http::lark_links::status,
        http::lark_links::unlink,
        crate::lark::webhook::events,
        http::turns::complete,
        http::turns::read,
        http::turns::list,
    ),
    components(schemas(http::sessions::BindOrPreview, ErrorBody, ErrorDetail, ErrorCode, Origin, Ingress, SessionState, TurnState, CancelReason, PermissionState, Behavior, AnsweredVia)),
    modifiers(&OwnerTokenAuth),
    security(("owner_token" = [])),
    tags(
        (name = "sessions", description = "Register host sessions, bind, list and close attached sessions."),
        (name = "turns", description = "Enqueue, claim, complete, release and read back turns."),
        (name = "permissions", description = "Tool-approval requests of the agent CLI, answered from the Web page, the API or Lark."),
        (name = "lark", description = "The Lark (Feishu) connector: chat links and Lark's event webhook."),
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
