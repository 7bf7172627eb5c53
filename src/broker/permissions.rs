//! The broker's side of permission requests: validation, metrics, wake-ups
//! and the host's parked wait for an answer. The rules themselves are
//! [`crate::decide::permission`]'s; the store applies them in its transaction.

use std::time::Duration;

use tokio::time::Instant;

use super::{Answer, Broker, MAX_TEXT_BYTES, checked_host};
use crate::decide;
use crate::decide::permission::{Decision, WITHDRAWN, answered_state};
use crate::error::Result;
use crate::ids::check;
use crate::model::HostIdentity;
use crate::model::{
    AnswerPermission, AnsweredVia, CreatePermissionRequest, ListPermissions, PermissionList,
    PermissionRequest, RelayedPermission, WaitPermission, WithdrawPermission, wire,
};
use crate::permission;

impl Broker {
    /// Records the host's permission request (201), or replays it (200).
    pub async fn create_permission(
        &self,
        session_id: &str,
        request: CreatePermissionRequest,
    ) -> Result<Answer<PermissionRequest>> {
        check("host_surface", &request.host_surface)?;
        check("host_session_id", &request.host_session_id)?;
        check("request_id", &request.request_id)?;
        check("tool_name", &request.tool_name)?;
        for (field, value) in [
            ("description", &request.description),
            ("input_preview", &request.input_preview),
        ] {
            crate::permission::too_long(field, value, MAX_TEXT_BYTES)?;
        }
        crate::permission::detail_of(&request)?;
        let host = HostIdentity {
            host_surface: request.host_surface.clone(),
            host_session_id: request.host_session_id.clone(),
        };
        let decision = self
            .store
            .create_permission(session_id.to_owned(), host, request)
            .await?;
        Ok(self.decided(decision, "created"))
    }

    /// Answers a permission request; the first answer wins.
    pub async fn answer_permission(
        &self,
        session_id: &str,
        request_id: &str,
        answer: AnswerPermission,
        via: AnsweredVia,
    ) -> Result<Answer<PermissionRequest>> {
        check("request_id", request_id)?;
        let outcome = wire(&answered_state(answer.behavior));
        let decision = self
            .store
            .answer_permission(session_id.to_owned(), request_id.to_owned(), answer, via)
            .await?;
        Ok(self.decided(decision, &outcome))
    }

    /// The host withdraws its unanswered request (it becomes `expired`).
    pub async fn withdraw_permission(
        &self,
        session_id: &str,
        request_id: &str,
        host: WithdrawPermission,
    ) -> Result<Answer<PermissionRequest>> {
        check("request_id", request_id)?;
        let at_terminal = host.answered_at_terminal;
        let host = checked_host(host.host_surface, host.host_session_id)?;
        let decision = self
            .store
            .withdraw_permission(
                session_id.to_owned(),
                request_id.to_owned(),
                host,
                at_terminal,
            )
            .await?;
        Ok(self.decided(decision, WITHDRAWN.as_str()))
    }

    /// The host relayed the request's answer to its agent.
    pub async fn relayed_permission(
        &self,
        session_id: &str,
        request_id: &str,
        relayed: RelayedPermission,
    ) -> Result<Answer<PermissionRequest>> {
        check("request_id", request_id)?;
        let host = checked_host(relayed.host_surface, relayed.host_session_id)?;
        let decision = self
            .store
            .relayed_permission(session_id.to_owned(), request_id.to_owned(), host)
            .await?;
        Ok(Answer {
            replayed: matches!(decision, Decision::Replayed(_)),
            body: decision.into_row().readback(),
        })
    }

    /// Counts a written decision; a replay changes nothing.
    fn decided(&self, decision: Decision, outcome: &str) -> Answer<PermissionRequest> {
        self.count(&decision, outcome);
        let replayed = matches!(decision, Decision::Replayed(_));
        Answer {
            body: decision.into_row().readback(),
            replayed,
        }
    }

    /// Counts a decision once it is written (a create, an answer from the
    /// API or from Lark); a replay changes nothing. (Its waiters are woken by
    /// the store's change feed.)
    pub(super) fn count(&self, decision: &Decision, outcome: &str) {
        if let Decision::Write(_) = decision {
            self.count_written(outcome);
        }
    }

    /// Counts a decision that was written.
    pub(super) fn count_written(&self, outcome: &str) {
        self.metrics.permission(outcome, 1);
        // A request's card (or message) in a linked Lark chat follows it.
        self.outbox.notify_one();
    }

    pub async fn permission(
        &self,
        session_id: &str,
        request_id: &str,
    ) -> Result<PermissionRequest> {
        check("request_id", request_id)?;
        Ok(self
            .store
            .permission(session_id, request_id)
            .await?
            .readback())
    }

    pub async fn permissions(
        &self,
        session_id: &str,
        filter: ListPermissions,
    ) -> Result<PermissionList> {
        let rows = self.store.permissions(session_id, filter.state).await?;
        Ok(PermissionList {
            permission_requests: rows.iter().map(|r| r.readback()).collect(),
        })
    }

    /// The host parks until the request is answered or expires, up to
    /// `wait_seconds` (capped like a claim), on the session's change signal;
    /// at the deadline or on shutdown it answers the request still pending.
    pub async fn wait_permission(
        &self,
        session_id: &str,
        request_id: &str,
        wait: WaitPermission,
    ) -> Result<PermissionRequest> {
        check("request_id", request_id)?;
        let host = checked_host(wait.host_surface, wait.host_session_id)?;
        let seconds = wait.wait_seconds.min(self.max_wait_seconds);
        let deadline = Instant::now() + Duration::from_secs(seconds);
        let subscription = self.changes.subscribe(session_id);
        loop {
            // Enabled before the store is read, as for parked claims.
            let woken = subscription.signal().notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let row = self
                .hosted_permission(session_id, request_id, &host)
                .await?;
            if permission::is_settled(&row) || Instant::now() >= deadline {
                return Ok(row.readback());
            }
            tokio::select! {
                _ = woken => {}
                _ = tokio::time::sleep_until(deadline) => {}
                _ = self.shutdown.cancelled() => return Ok(row.readback()),
            }
        }
    }

    /// The request, once the host identity is the session's (404, then 403).
    async fn hosted_permission(
        &self,
        session_id: &str,
        request_id: &str,
        host: &HostIdentity,
    ) -> Result<permission::PermissionRow> {
        let session = decide::existing(self.store.session(session_id).await?)?;
        let row = self.store.permission(session_id, request_id).await?;
        decide::hosted_item(&session, row, host)
    }
}
