//! The permission relay of channel mode (MCP.md "Permission relay"): each
//! `notifications/claude/channel/permission_request` from Claude Code is
//! recorded on the session, waited for parked, and answered with exactly one
//! `notifications/claude/channel/permission` once someone allows or denies it
//! (on the Web page, the API or Lark). A request that expires (its session
//! closed) is answered by nobody: the terminal's own dialog stays open. After
//! a restart the bridge waits again for the session's pending requests, so
//! an answer given meanwhile still reaches the agent. Never logs a request's
//! description or preview.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use backon::Retryable;
use rmcp::model::{CustomNotification, ServerNotification};
use rmcp::{Peer, RoleServer};
use serde::Deserialize;
use serde_json::json;

use super::host::{Host, Problem};
use super::server::{backoff, log_problem};
use crate::model::PermissionState;

/// The capability that turns the relay on, and its two notifications.
pub const CAPABILITY: &str = "claude/channel/permission";
pub const REQUEST: &str = "notifications/claude/channel/permission_request";
const ANSWER: &str = "notifications/claude/channel/permission";
/// Each wait parks up to the broker's cap, then waits again.
const WAIT_SECONDS: u64 = 1800;

/// What Claude Code sends (all strings).
#[derive(Debug, Deserialize)]
pub struct PermissionRequestParams {
    pub request_id: String,
    pub tool_name: String,
    pub description: String,
    pub input_preview: String,
}

/// The requests this bridge is relaying or has relayed: each is waited for
/// by one task, and answered once.
#[derive(Clone, Default)]
pub struct Relay {
    taken: Arc<Mutex<HashSet<String>>>,
}

impl Relay {
    /// Records a new request and relays its answer; a request id seen before
    /// (Claude Code repeating itself) is already being relayed.
    pub fn request(
        &self,
        host: Arc<Host>,
        peer: Peer<RoleServer>,
        params: PermissionRequestParams,
    ) {
        if !self.take(&params.request_id) {
            return;
        }
        tokio::spawn(async move {
            let created = (|| {
                host.create_permission(
                    &params.request_id,
                    &params.tool_name,
                    &params.description,
                    &params.input_preview,
                )
            })
            .retry(backoff())
            .when(Problem::is_transient)
            .notify(log_problem)
            .await;
            match created {
                Ok(_) => relay_answer(&host, &peer, &params.request_id).await,
                Err(problem) => {
                    tracing::warn!(request_id = %params.request_id, "cannot record the permission request: {}", problem.log_line());
                }
            }
        });
    }

    /// After a (re)start: waits again for the session's pending requests.
    pub fn resume(&self, host: Arc<Host>, peer: Peer<RoleServer>) {
        let relay = self.clone();
        tokio::spawn(async move {
            let pending = (|| host.pending_permissions())
                .retry(backoff())
                .when(Problem::is_transient)
                .notify(log_problem)
                .await;
            let pending = match pending {
                Ok(pending) => pending,
                Err(problem) => {
                    tracing::warn!(
                        "cannot list pending permission requests: {}",
                        problem.log_line()
                    );
                    return;
                }
            };
            for request in pending {
                if relay.take(&request.request_id) {
                    tracing::info!(request_id = %request.request_id, "waiting again for a pending permission request");
                    let (host, peer) = (host.clone(), peer.clone());
                    tokio::spawn(
                        async move { relay_answer(&host, &peer, &request.request_id).await },
                    );
                }
            }
        });
    }

    fn take(&self, request_id: &str) -> bool {
        let mut taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        taken.insert(request_id.to_owned())
    }
}

/// Waits, parked, until the request is answered or expires, and sends the
/// answer once.
async fn relay_answer(host: &Host, peer: &Peer<RoleServer>, request_id: &str) {
    loop {
        let waited = (|| host.wait_permission(request_id, WAIT_SECONDS))
            .retry(backoff())
            .when(Problem::is_transient)
            .notify(log_problem)
            .await;
        let behavior = match waited.map(|r| r.state) {
            Ok(PermissionState::Pending) => continue,
            Ok(PermissionState::Allowed) => "allow",
            Ok(PermissionState::Denied) => "deny",
            Ok(PermissionState::Expired) => {
                tracing::info!(request_id, "the permission request expired unanswered");
                return;
            }
            Err(problem) => {
                tracing::warn!(
                    request_id,
                    "stopped waiting for the permission request: {}",
                    problem.log_line()
                );
                return;
            }
        };
        let params = json!({"request_id": request_id, "behavior": behavior});
        let answer = CustomNotification::new(ANSWER, Some(params));
        match peer
            .send_notification(ServerNotification::CustomNotification(answer))
            .await
        {
            Ok(()) => tracing::info!(request_id, behavior, "relayed the permission answer"),
            Err(e) => tracing::info!("the MCP client is gone ({e}); the answer is not relayed"),
        }
        return;
    }
}
