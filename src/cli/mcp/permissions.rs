//! The permission relay of channel mode (MCP.md "Permission relay"): each
//! `notifications/claude/channel/permission_request` from Claude Code is
//! recorded on the session, waited for parked, and answered with exactly one
//! `notifications/claude/channel/permission` once someone allows or denies it
//! (on the Web page, the API or Lark). A request that expires (its session
//! closed) is answered by nobody: the terminal's own dialog stays open. Each
//! relayed answer is recorded on the broker (`relayed_at`), after it is sent:
//! after a restart the bridge relays the answers committed and not relayed
//! (given while it was away, or between the commit and the relay) and waits
//! again for the pending requests, so every answer reaches the agent. Only a
//! crash between the send and the record could send one twice, and Claude
//! Code drops an answer to a request it no longer has. Never logs a
//! request's description or preview.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use backon::Retryable;
use rmcp::model::{CustomNotification, ServerNotification};
use rmcp::{Peer, RoleServer};
use serde::Deserialize;
use serde_json::json;

use super::host::{Host, Problem, backoff, log_problem};
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
                    &crate::permission::PLAIN,
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

    /// After a (re)start: relays the answers not relayed yet and waits again
    /// for the pending requests.
    pub fn resume(&self, host: Arc<Host>, peer: Peer<RoleServer>) {
        let relay = self.clone();
        tokio::spawn(async move {
            let pending = (|| host.permissions())
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
                let owed = crate::decide::permission::owed(&request);
                if !(owed || request.state == PermissionState::Pending)
                    || !relay.take(&request.request_id)
                {
                    continue;
                }
                let (host, peer) = (host.clone(), peer.clone());
                tokio::spawn(async move {
                    match (owed, behavior_of(request.state)) {
                        (true, Some(behavior)) => {
                            tracing::info!(request_id = %request.request_id, "relaying an answer given while the bridge was away");
                            deliver(&host, &peer, &request.request_id, behavior).await;
                        }
                        _ => {
                            tracing::info!(request_id = %request.request_id, "waiting again for a pending permission request");
                            relay_answer(&host, &peer, &request.request_id).await;
                        }
                    }
                });
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
            Ok(state @ (PermissionState::Allowed | PermissionState::Denied)) => {
                behavior_of(state).unwrap_or("deny")
            }
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
        deliver(host, peer, request_id, behavior).await;
        return;
    }
}

/// The answer a notification carries.
fn behavior_of(state: PermissionState) -> Option<&'static str> {
    match state {
        PermissionState::Allowed => Some("allow"),
        PermissionState::Denied => Some("deny"),
        PermissionState::Pending | PermissionState::Expired => None,
    }
}

/// Sends the answer to the agent, then records on the broker that it was
/// relayed (so a restart does not send it again).
async fn deliver(host: &Host, peer: &Peer<RoleServer>, request_id: &str, behavior: &str) {
    let params = json!({"request_id": request_id, "behavior": behavior});
    let answer = CustomNotification::new(ANSWER, Some(params));
    if let Err(e) = peer
        .send_notification(ServerNotification::CustomNotification(answer))
        .await
    {
        tracing::info!("the MCP client is gone ({e}); the answer is not relayed");
        return;
    }
    tracing::info!(request_id, behavior, "relayed the permission answer");
    let recorded = (|| host.relayed_permission(request_id))
        .retry(backoff())
        .when(Problem::is_transient)
        .notify(log_problem)
        .await;
    if let Err(problem) = recorded {
        tracing::warn!(
            request_id,
            "cannot record the relay: {}",
            problem.log_line()
        );
    }
}
