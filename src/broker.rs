//! The broker core: validates what the store cannot (identifiers, sizes,
//! limits), hands each decision to the store, and parks claims on an empty
//! queue until a turn is committed, the session closes, the wait ends or the
//! broker shuts down. It knows nothing of HTTP.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, ErrorCode, Result};
use crate::ids::check;
use crate::model::{
    BindPreview, BindRequest, Capabilities, ClaimAnswer, ClaimRequest, Claimed, CompleteRequest,
    EnqueueRequest, Enqueued, ListSessions, ListTurns, NotClaimed, Origin, Receipt,
    RegisterAgentThread, Registered, ReleaseRequest, Released, Session, SessionList,
    SessionPreview, SessionState, Turn, TurnList,
};
use crate::store::{Bound, ClaimOutcome, HostIdentity, Store};
use crate::time::rfc3339;
use crate::wakeup::Wakeups;

/// The longest a claim parks, in seconds; longer waits are capped.
pub const MAX_WAIT_SECONDS: u64 = 1800;
/// The longest message text, in bytes.
pub const MAX_TEXT_BYTES: usize = 64 * 1024;
/// The longest completion response (serialized JSON), in bytes.
pub const MAX_RESPONSE_BYTES: usize = 1024 * 1024;

pub struct Broker {
    store: Arc<dyn Store>,
    wakeups: Wakeups,
    shutdown: CancellationToken,
}

/// An answer that may replay an earlier request (`Idempotent-Replayed: true`).
pub struct Answer<T> {
    pub body: T,
    pub replayed: bool,
}

/// What a bind answered.
pub enum BindAnswer {
    Created(Session),
    Existing(Session),
    Preview(BindPreview),
}

impl Broker {
    /// `shutdown` ends parked claims with `claimed: false`.
    pub fn new(store: Arc<dyn Store>, shutdown: CancellationToken) -> Self {
        Self {
            store,
            wakeups: Wakeups::default(),
            shutdown,
        }
    }

    pub fn store(&self) -> &dyn Store {
        self.store.as_ref()
    }

    /// How many sessions have a parked claim now.
    pub fn parked_sessions(&self) -> usize {
        self.wakeups.sessions_waited_on()
    }

    pub async fn register(&self, thread: RegisterAgentThread) -> Result<Answer<Registered>> {
        check("goal_id", &thread.goal_id)?;
        check("agent_id", &thread.agent_id)?;
        check("host_surface", &thread.host_surface)?;
        check("host_session_id", &thread.host_session_id)?;
        let body = Registered {
            registered: true,
            goal_id: thread.goal_id.clone(),
            agent_id: thread.agent_id.clone(),
            host_surface: thread.host_surface.clone(),
        };
        let created = self.store.register(thread).await?;
        Ok(Answer {
            body,
            replayed: !created,
        })
    }

    pub async fn bind(&self, bind: BindRequest) -> Result<BindAnswer> {
        check("goal_id", &bind.goal_id)?;
        check("agent_id", &bind.agent_id)?;
        check("host_surface", &bind.host_surface)?;
        check("host_session_id", &bind.host_session_id)?;
        check("executor_endpoint_id", &bind.executor_endpoint_id)?;
        if bind.executor_endpoint_id == bind.agent_id {
            return Err(Error::new(
                ErrorCode::IdentityConflated,
                "executor_endpoint_id must differ from agent_id: they name different identities.",
            ));
        }
        if bind.dry_run {
            return self.preview_bind(bind).await;
        }
        Ok(match self.store.bind(bind).await? {
            Bound::Created(row) => BindAnswer::Created(row.projection()),
            Bound::Existing(row) => BindAnswer::Existing(row.projection()),
        })
    }

    async fn preview_bind(&self, bind: BindRequest) -> Result<BindAnswer> {
        let preview = SessionPreview {
            session_id: None,
            goal_id: bind.goal_id.clone(),
            agent_id: bind.agent_id.clone(),
            executor_endpoint_id: bind.executor_endpoint_id.clone(),
            host_surface: bind.host_surface.clone(),
            capabilities: Capabilities::ATTACHED,
            state: SessionState::Open,
            created_at: None,
            closed_at: None,
        };
        let existing = self.store.preview_bind(bind).await?;
        Ok(BindAnswer::Preview(BindPreview {
            dry_run: true,
            would_create: existing.is_none(),
            session: existing.map_or(preview, |row| row.projection().into()),
        }))
    }

    pub async fn session(&self, session_id: &str) -> Result<Session> {
        self.store
            .session(session_id)
            .await?
            .map(|row| row.projection())
            .ok_or_else(|| Error::not_found("session"))
    }

    pub async fn sessions(&self, filter: ListSessions) -> Result<SessionList> {
        let limit = page_limit(filter.limit, 100, 500)?;
        for (field, value) in [
            ("goal_id", &filter.goal_id),
            ("agent_id", &filter.agent_id),
            ("cursor", &filter.cursor),
        ] {
            if let Some(value) = value {
                check(field, value)?;
            }
        }
        let mut rows = self.store.sessions(filter, limit + 1).await?;
        let more = rows.len() > limit as usize;
        rows.truncate(limit as usize);
        Ok(SessionList {
            next_cursor: more
                .then(|| rows.last().map(|s| s.session_id.clone()))
                .flatten(),
            sessions: rows.iter().map(|row| row.projection()).collect(),
        })
    }

    pub async fn enqueue(
        &self,
        session_id: &str,
        message: EnqueueRequest,
    ) -> Result<Answer<Enqueued>> {
        if message.text.is_empty() || message.text.len() > MAX_TEXT_BYTES {
            return Err(Error::invalid(format!(
                "`text` must be 1 to {MAX_TEXT_BYTES} bytes."
            )));
        }
        if let Some(id) = &message.client_message_id {
            check("client_message_id", id)?;
        }
        if let Some(lark) = &message.lark {
            if message.origin != Origin::Lark {
                return Err(Error::invalid(
                    "`lark` is only allowed with origin \"lark\".",
                ));
            }
            check("lark.chat_id", &lark.chat_id)?;
            check("lark.message_id", &lark.message_id)?;
        }
        let done = self.store.enqueue(session_id.to_owned(), message).await?;
        if !done.duplicate {
            self.wakeups.wake(session_id);
        }
        let turn = done.turn;
        Ok(Answer {
            body: Enqueued {
                turn_id: turn.turn_id,
                seq: turn.seq,
                state: turn.state,
                origin: turn.origin,
                enqueued_at: rfc3339(turn.enqueued_at),
                duplicate: done.duplicate,
            },
            replayed: done.duplicate,
        })
    }

    /// Claims the oldest queued turn; on an empty queue, parks up to
    /// `wait_seconds` (capped at 1800) and answers `claimed: false` on
    /// timeout or shutdown.
    pub async fn claim(
        &self,
        session_id: &str,
        claim: ClaimRequest,
    ) -> Result<Answer<ClaimAnswer>> {
        check("host_surface", &claim.host_surface)?;
        check("host_session_id", &claim.host_session_id)?;
        check("claim_id", &claim.claim_id)?;
        let started = Instant::now();
        let deadline = started + Duration::from_secs(claim.wait_seconds.min(MAX_WAIT_SECONDS));
        let subscription = self.wakeups.subscribe(session_id);
        let host = HostIdentity {
            host_surface: claim.host_surface,
            host_session_id: claim.host_session_id,
        };
        loop {
            // Enabled before the store is read: a turn committed in between
            // still wakes this waiter.
            let woken = subscription.signal().notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let outcome = self
                .store
                .claim(session_id.to_owned(), host.clone(), claim.claim_id.clone())
                .await?;
            if let ClaimOutcome::Claimed {
                turn,
                attempt,
                replayed,
            } = outcome
            {
                return Ok(Answer {
                    body: ClaimAnswer::Claimed(Claimed {
                        claimed: true,
                        session_id: session_id.to_owned(),
                        claim_id: claim.claim_id,
                        turn: turn.claimed_turn(attempt),
                        turn_state: turn.state,
                    }),
                    replayed,
                });
            }
            if Instant::now() >= deadline || self.shutdown.is_cancelled() {
                break;
            }
            tokio::select! {
                _ = woken => {}
                _ = tokio::time::sleep_until(deadline) => break,
                _ = self.shutdown.cancelled() => break,
            }
        }
        Ok(Answer {
            body: ClaimAnswer::NotClaimed(NotClaimed {
                claimed: false,
                session_id: session_id.to_owned(),
                waited_ms: started.elapsed().as_millis() as u64,
            }),
            replayed: false,
        })
    }

    pub async fn complete(
        &self,
        session_id: &str,
        turn_id: &str,
        completion: CompleteRequest,
    ) -> Result<Answer<Receipt>> {
        check("host_surface", &completion.host_surface)?;
        check("host_session_id", &completion.host_session_id)?;
        check("claim_id", &completion.claim_id)?;
        check("completion_id", &completion.completion_id)?;
        match completion.response.get("message") {
            Some(serde_json::Value::String(m)) if !m.is_empty() => {}
            _ => {
                return Err(Error::invalid(
                    "`response` must have a non-empty string `message`.",
                ));
            }
        }
        let size = serde_json::to_vec(&completion.response).map_or(usize::MAX, |v| v.len());
        if size > MAX_RESPONSE_BYTES {
            return Err(Error::invalid(format!(
                "`response` must be at most {MAX_RESPONSE_BYTES} bytes of JSON."
            )));
        }
        let receipt = self
            .store
            .complete(session_id.to_owned(), turn_id.to_owned(), completion)
            .await?;
        // The next queued turn is claimable now.
        self.wakeups.wake(session_id);
        Ok(Answer {
            replayed: receipt.replayed,
            body: receipt,
        })
    }

    pub async fn release(
        &self,
        session_id: &str,
        claim_id: &str,
        host: ReleaseRequest,
    ) -> Result<Released> {
        check("claim_id", claim_id)?;
        check("host_surface", &host.host_surface)?;
        check("host_session_id", &host.host_session_id)?;
        let host = HostIdentity {
            host_surface: host.host_surface,
            host_session_id: host.host_session_id,
        };
        let released = self
            .store
            .release(session_id.to_owned(), claim_id.to_owned(), host)
            .await?;
        self.wakeups.wake(session_id);
        Ok(released)
    }

    pub async fn close(&self, session_id: &str) -> Result<Session> {
        let row = self.store.close(session_id.to_owned()).await?;
        // Parked claims re-check and answer 409 session_closed.
        self.wakeups.wake(session_id);
        Ok(row.projection())
    }

    pub async fn turn(&self, session_id: &str, turn_id: &str) -> Result<Turn> {
        Ok(self.store.turn(session_id, turn_id).await?.readback())
    }

    pub async fn turns(&self, session_id: &str, page: ListTurns) -> Result<TurnList> {
        let limit = page_limit(page.limit, 50, 200)?;
        if page.after_seq.is_some_and(|s| s < 0) || page.before_seq.is_some_and(|s| s < 0) {
            return Err(Error::invalid(
                "`after_seq` and `before_seq` must be 0 or more.",
            ));
        }
        let (turns, has_more) = self.store.turns(session_id, page, limit).await?;
        Ok(TurnList {
            turns: turns.iter().map(|t| t.readback()).collect(),
            has_more,
        })
    }
}

fn page_limit(limit: Option<u32>, default: u32, max: u32) -> Result<u32> {
    match limit.unwrap_or(default) {
        n if (1..=max).contains(&n) => Ok(n),
        _ => Err(Error::invalid(format!("`limit` must be 1 to {max}."))),
    }
}
