//! The broker's side of gone holders: a claim whose holder is gone is
//! released by the broker, so no turn stays stranded when an agent dies
//! mid-turn. Whether a holder is gone is [`holder_gone`]'s to say (time
//! alone never is: a holder that says it works on its claim keeps it); this
//! module only looks for candidates, on a sweep that runs until shutdown and
//! after an `away` report, and asks the store to release them through the
//! release decision, which checks again on the locked rows. The same sweep
//! announces an agent silent for 10 minutes `away` (an `agent` event), as
//! the projection already shows it, and a working agent with no hook event
//! for `--stall-after` `stalled` ([`crate::decide::presence::lapse`]).

use std::sync::Arc;
use std::time::Duration;

use super::Broker;
use crate::decide::SessionRow;
use crate::decide::presence::AWAY_AFTER_MS;
use crate::decide::turn::{Releaser, holder_gone};
use crate::error::Result;
use crate::model::AgentState;

impl Broker {
    /// Sets how long a working agent may go without a hook event before the
    /// broker announces it stalled (zero: never).
    pub fn with_stall_after(mut self, stall_after: Duration) -> Self {
        self.stall_after = stall_after;
        self
    }

    /// Sets how long after its agent exited an idle session closes (zero:
    /// never).
    pub fn with_close_exited_after(mut self, after: Duration) -> Self {
        self.close_exited_after = after;
        self
    }

    fn stall_after_ms(&self) -> i64 {
        i64::try_from(self.stall_after.as_millis()).unwrap_or(i64::MAX)
    }

    /// Sets how long a holder that names its claim may be silent before the
    /// broker releases its turn.
    pub fn with_holder_silence(mut self, silence: Duration) -> Self {
        self.holder_silence = silence.max(Duration::from_millis(1));
        self
    }

    fn silence_ms(&self) -> i64 {
        i64::try_from(self.holder_silence.as_millis()).unwrap_or(i64::MAX)
    }

    /// Sweeps for gone holders until shutdown, a few times per silence (at
    /// least every 15 s).
    pub async fn sweep_holders(self: Arc<Self>) {
        let shortest = [self.stall_after, self.close_exited_after]
            .into_iter()
            .filter(|d| !d.is_zero())
            .fold(self.holder_silence, Duration::min);
        let every = (shortest / 4).clamp(Duration::from_millis(100), Duration::from_secs(15));
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            match self.release_gone_holders().await {
                Ok(0) => {}
                Ok(released) => tracing::info!(released, "released the turns of gone holders"),
                Err(e) => {
                    tracing::warn!(code = ?e.code, "the sweep for gone holders failed: {}", e.message)
                }
            }
            if let Err(e) = self.announce_silent_agents(crate::time::now_ms()).await {
                tracing::warn!(code = ?e.code, "announcing silent agents failed: {}", e.message);
            }
            match self.close_exited_sessions(crate::time::now_ms()).await {
                Ok(0) => {}
                Ok(closed) => tracing::info!(closed, "closed the sessions whose agent exited"),
                Err(e) => {
                    tracing::warn!(code = ?e.code, "closing exited sessions failed: {}", e.message)
                }
            }
        }
    }

    /// Announces `away` (an `agent` event) for each waiting agent silent
    /// for [`AWAY_AFTER_MS`] at `now`, and `stalled` for each working one
    /// silent for `--stall-after`, not announced yet; answers how many.
    pub async fn announce_silent_agents(&self, now: i64) -> Result<usize> {
        let mut announced = 0;
        let stall_after = self.stall_after_ms();
        let stalled_before = match stall_after {
            0 => i64::MIN,
            after => now.saturating_sub(after),
        };
        let silent = self
            .store
            .silent_sessions(now - AWAY_AFTER_MS, stalled_before)
            .await?;
        for session_id in silent {
            match self
                .store
                .lapse_agent(session_id.clone(), stall_after, now)
                .await
            {
                Ok(reported) if reported.changed => {
                    announced += 1;
                    // A stall may have a note for the linked Lark chat.
                    self.outbox.notify_one();
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(%session_id, code = ?e.code, "a silent agent was not announced")
                }
            }
        }
        Ok(announced)
    }

    /// Closes each session whose agent exited `--close-exited-after` ago
    /// (a host's own `away`: its SessionEnd) with nothing waiting, as a
    /// close `if_idle` (HOOKS.md "The terminal's real life": sessions that
    /// are over close themselves); answers how many.
    pub async fn close_exited_sessions(&self, now: i64) -> Result<usize> {
        if self.close_exited_after.is_zero() {
            return Ok(0);
        }
        let after = i64::try_from(self.close_exited_after.as_millis()).unwrap_or(i64::MAX);
        let mut closed = 0;
        for session_id in self
            .store
            .exited_sessions(now.saturating_sub(after))
            .await?
        {
            let if_idle = crate::model::CloseRequest {
                if_idle: true,
                ..Default::default()
            };
            if self.close(&session_id, if_idle).await.is_ok() {
                closed += 1;
            }
        }
        Ok(closed)
    }

    /// Releases the claims whose holder is gone now; answers how many.
    pub async fn release_gone_holders(&self) -> Result<usize> {
        let now = crate::time::now_ms();
        let mut released = 0;
        for (session, claimed_at) in self.store.held_sessions().await? {
            if holder_gone(&session, claimed_at, self.silence_ms(), now)
                && self.release_gone(&session).await
            {
                released += 1;
            }
        }
        Ok(released)
    }

    /// After a report: a host that says its agent is away leaves no turn
    /// held (the release decision says whether it is gone).
    pub(super) async fn release_if_left(&self, session: &SessionRow) {
        if session.agent_state == AgentState::Away && session.active_claim_id.is_some() {
            self.release_gone(session).await;
        }
    }

    /// Releases the session's active claim as the broker; whether it did.
    async fn release_gone(&self, session: &SessionRow) -> bool {
        let Some(claim_id) = session.active_claim_id.clone() else {
            return false;
        };
        let by = Releaser::Broker {
            silence_ms: self.silence_ms(),
        };
        let session_id = &session.session_id;
        match self.store.release(session_id.clone(), claim_id, by).await {
            Ok(_) => {
                // The store's change feed wakes the session's waiters.
                tracing::info!(%session_id, "released a turn: its holder is gone");
                true
            }
            Err(e) => {
                tracing::debug!(%session_id, code = ?e.code, "a held turn stays held");
                false
            }
        }
    }
}
