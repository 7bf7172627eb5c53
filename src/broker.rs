//! The broker core: validates what the store cannot (identifiers, sizes,
//! limits), hands each decision to the store, and parks claims on an empty
//! queue until a turn is committed, the session closes, the wait ends or the
//! broker shuts down. It knows nothing of HTTP.
//!
//! The wake path: every waiter (a parked claim, a permission wait, an event
//! stream) subscribes to its session's signal ([`Wakeups`]) before it reads
//! the store; the store's change feed ([`crate::store::ChangeFeed`]: what a
//! committed decision changed, or on PostgreSQL what another replica
//! announced) is the one place that fires those signals ([`Broker::new`]).
//! On SQLite an enqueue that finds a parked claim ([`crate::handoff`]) has
//! the store claim for it in the enqueue's own commit and hands it the
//! outcome directly ([`Broker::enqueue`], [`Broker::claim`]).

mod devices;
mod holders;
mod permissions;
mod push;
mod push_sender;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::decide::lark::{Clicked, LarkClick};
use crate::decide::lark::{LarkEvent, LarkIngest};
use crate::decide::pairing;
use crate::decide::session::Bound;
use crate::decide::turn::ClaimOutcome;
use crate::decide::turn::Releaser;
use crate::error::{Error, ErrorCode, Result};
use crate::handoff::{Delivery, Handoffs, Parked};
use crate::ids::check;
use crate::lark::LarkConfig;
use crate::lark::dispatcher::Dispatcher;
use crate::metrics::{Metrics, Open};
use crate::model::HostIdentity;
use crate::model::{AgentNotification, Changes, FileChanges, ReportAgentState, ReportChanges};
use crate::model::{
    BindPreview, BindRequest, Capabilities, ClaimAnswer, ClaimRequest, Claimed, CloseRequest,
    CompleteRequest, EnqueueRequest, Enqueued, ListSessions, ListTurns, NotClaimed, Origin,
    Receipt, RegisterAgentThread, Registered, ReleaseRequest, Released, ReleasedBy, Session,
    SessionList, SessionPreview, SessionState, Turn, TurnList,
};
use crate::model::{LarkLink, LarkLinkRequest, LarkPairCode};
use crate::store::{Change, Command, Done, Store};
use crate::time::rfc3339;
use crate::wakeup::Wakeups;

/// How long a holder that names its claim may be silent: five missed
/// heartbeats of a minute each (`--holder-silence`; `holders.rs` watches).
pub const DEFAULT_HOLDER_SILENCE: Duration = Duration::from_secs(5 * 60);
/// How long a working agent may go without a hook event before it is
/// announced stalled (`--stall-after`).
pub const DEFAULT_STALL_AFTER: Duration = Duration::from_secs(10 * 60);
/// How long after its agent exited an idle session closes itself.
pub const DEFAULT_CLOSE_EXITED_AFTER: Duration = Duration::from_secs(5 * 60);
/// The longest a claim parks, in seconds; longer waits are capped.
pub const MAX_WAIT_SECONDS: u64 = 1800;
/// How often a parked claim re-checks the store anyway, so that its host
/// counts as heard from (presence) however long it parks.
const PARKED_HEARD_EVERY: Duration = Duration::from_secs(60);
/// The largest request body, in bytes (an HTTP request, a Lark event).
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;
pub use crate::decide::text::{MAX_TEXT_BYTES, fit_text};
/// The longest completion response (serialized JSON), in bytes.
pub const MAX_RESPONSE_BYTES: usize = 1024 * 1024;

pub struct Broker {
    store: Arc<dyn Store>,
    /// Parked claims, woken when a turn may have become claimable or the session closed.
    claimable: Arc<Wakeups>,
    /// Event streams, woken on every change to a session.
    changes: Arc<Wakeups>,
    /// Parked claims an enqueue may hand its turn to (stores that hand off).
    handoffs: Arc<Handoffs>,
    metrics: Arc<Metrics>,
    /// The Lark reply dispatcher, woken by completions.
    outbox: Arc<tokio::sync::Notify>,
    /// Wakes the Lark download jobs' fetcher.
    fetches: Arc<tokio::sync::Notify>,
    /// The wait cap: 1800 s, lowered only for fuzzing a live broker.
    max_wait_seconds: u64,
    /// How long a holder that names its claim may be silent before the
    /// broker releases its turn ([`crate::decide::turn::holder_gone`]).
    holder_silence: Duration,
    /// How long a working agent may go without a hook event before the
    /// broker announces it stalled (zero: never;
    /// [`crate::decide::presence::stalls`]).
    stall_after: Duration,
    close_exited_after: Duration,
    shutdown: CancellationToken,
    /// Each session's terminal prompts, at most
    /// [`crate::decide::terminal::PROMPT_BURST`] at once and
    /// [`crate::decide::terminal::PROMPTS_PER_MINUTE`] a minute (per replica).
    prompts: governor::DefaultKeyedRateLimiter<String>,
    /// Wrong sign-in codes lately, for all callers ([`crate::devices::Throttle`]).
    sign_ins: crate::devices::Throttle,
    /// Whether any browser is subscribed to Web Push: the sender reads
    /// nothing while none is ([`push_sender`]).
    push_wanted: Arc<std::sync::atomic::AtomicBool>,
    /// When each device's last sighting was written (at most once a minute).
    seen: std::sync::Mutex<std::collections::HashMap<String, i64>>,
}

/// One entry of a session's event log, as the stream sends it.
#[derive(Debug, Clone, PartialEq)]
pub struct LoggedEvent {
    /// The per-session event number (the SSE `id:`).
    pub id: i64,
    /// `turn`, `session`, `permission`, `agent` or `notification` (the SSE `event:`).
    pub name: &'static str,
    /// `{"turn_id", "seq", "state"}`, `{"state": "closed"}` or `{"request_id", "state"}`.
    pub data: serde_json::Value,
}

/// How many events an event stream reads from the store at a time: the most
/// it holds in memory, however far behind its client is.
const EVENT_PAGE: u32 = 64;

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
        let claimable: Arc<Wakeups> = Default::default();
        let changes: Arc<Wakeups> = Default::default();
        // Every wake-up comes from here: what the store's committed
        // decisions (this broker's, or another replica's) changed.
        let (wake_claims, wake_streams) = (claimable.clone(), changes.clone());
        store
            .feed()
            .subscribe(Arc::new(move |change: &Change| match change {
                Change::Session(changed) => {
                    if changed.claimable {
                        wake_claims.wake(&changed.session_id);
                    }
                    wake_streams.wake(&changed.session_id);
                }
                Change::Unknown => {
                    wake_claims.wake_all();
                    wake_streams.wake_all();
                }
            }));
        Self {
            store,
            claimable,
            changes,
            handoffs: Default::default(),
            metrics: Default::default(),
            outbox: Default::default(),
            fetches: Default::default(),
            max_wait_seconds: MAX_WAIT_SECONDS,
            prompts: governor::RateLimiter::keyed(
                governor::Quota::per_minute(nonzero(crate::decide::terminal::PROMPTS_PER_MINUTE))
                    .allow_burst(nonzero(crate::decide::terminal::PROMPT_BURST)),
            ),
            holder_silence: DEFAULT_HOLDER_SILENCE,
            stall_after: DEFAULT_STALL_AFTER,
            close_exited_after: DEFAULT_CLOSE_EXITED_AFTER,
            shutdown,
            sign_ins: Default::default(),
            push_wanted: Default::default(),
            seen: Default::default(),
        }
    }

    /// Lowers the wait cap (never raises it above 1800 s).
    pub fn with_max_wait_seconds(mut self, seconds: u64) -> Self {
        self.max_wait_seconds = seconds.min(MAX_WAIT_SECONDS);
        self
    }

    pub fn store(&self) -> &dyn Store {
        self.store.as_ref()
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The Prometheus text, with the queue gauges read from the store.
    pub async fn render_metrics(&self) -> Result<String> {
        let (queued, oldest) = self.store.queue_stats().await?;
        self.metrics.queued.set(queued);
        let age_ms = oldest.map_or(0, |at| (crate::time::now_ms() - at).max(0));
        self.metrics
            .oldest_queued_age_seconds
            .set(age_ms as f64 / 1000.0);
        Ok(self.metrics.render())
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
        if let Some(terminal) = &bind.terminal {
            check("terminal", terminal)?;
        }
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
            Bound::Created(row) => {
                if row.continued_from.is_some() {
                    // The continued session's Lark chat is told, once.
                    self.outbox.notify_one();
                }
                BindAnswer::Created(row.projection())
            }
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
        let row = self
            .store
            .session(session_id)
            .await?
            .ok_or_else(|| Error::not_found("session"))?;
        let asking = self.store.asking_sessions(session_id, session_id).await?;
        Ok(row.projection_asking(!asking.is_empty()))
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
        let asking = match (rows.first(), rows.last()) {
            (Some(first), Some(last)) => {
                self.store
                    .asking_sessions(&first.session_id, &last.session_id)
                    .await?
            }
            _ => Vec::new(),
        };
        Ok(SessionList {
            next_cursor: more
                .then(|| rows.last().map(|s| s.session_id.clone()))
                .flatten(),
            sessions: rows
                .iter()
                .map(|row| row.projection_asking(asking.contains(&row.session_id)))
                .collect(),
        })
    }

    /// An enqueue with files: checked against every limit (per file, per
    /// message, per session) and the message's own rules before anything is
    /// written; then the turn, naming them, is enqueued as [`Broker::enqueue`]
    /// does (the same idempotency: a replay must name the same files), and
    /// each file's bytes are stored under their sha256 in the enqueue's own
    /// transaction: a replay, a reused `client_message_id` (422) or an
    /// upload that loses the race for the session's last bytes (413) stores
    /// nothing. The session's limit is read here first, so an upload over it
    /// is refused early; the enqueue checks it again under the session's
    /// lock ([`crate::decide::turn::enqueue_within`]), so uploads racing for
    /// the last bytes never pass it together.
    pub async fn enqueue_with_attachments(
        &self,
        session_id: &str,
        mut message: EnqueueRequest,
        uploads: Vec<crate::attachments::Upload>,
    ) -> Result<Answer<Enqueued>> {
        use crate::attachments;
        let total: u64 = uploads.iter().map(|u| u.stored.size).sum();
        uploads
            .iter()
            .try_for_each(|u| attachments::check_file(u.stored.size))?;
        attachments::check_message(uploads.len(), total)?;
        check_message(&message)?;
        let session = crate::decide::existing(self.store.session(session_id).await?)?;
        crate::decide::open(&session)?;
        let held = self.store.session_attachment_bytes(session_id).await?;
        if let Err(over) = attachments::check_session(held, total) {
            // A replay's files are counted already: it answers as a replay
            // (or 422), never 413.
            let replay = match &message.client_message_id {
                Some(id) => self.store.has_client_message_id(session_id, id).await?,
                None => false,
            };
            if !replay {
                return Err(over);
            }
        }
        message.attachments = uploads.iter().map(|u| u.stored.clone()).collect();
        let blobs = crate::store::blobs(&uploads);
        drop(uploads);
        self.enqueue_files(session_id, message, blobs).await
    }

    /// What an upload is checked against before its body is read: the
    /// session exists (404) and is open (409); the bytes its files hold.
    pub async fn attachments_held(&self, session_id: &str) -> Result<u64> {
        let session = crate::decide::existing(self.store.session(session_id).await?)?;
        crate::decide::open(&session)?;
        self.store.session_attachment_bytes(session_id).await
    }

    /// Whether the session holds a turn enqueued with `client_message_id`
    /// (an upload that replays it: its files are counted already).
    pub async fn holds_client_message_id(
        &self,
        session_id: &str,
        client_message_id: &str,
    ) -> Result<bool> {
        self.store
            .has_client_message_id(session_id, client_message_id)
            .await
    }

    /// A turn's file at `position`, for its download (404 when none).
    pub async fn attachment(
        &self,
        session_id: &str,
        turn_id: &str,
        position: u32,
    ) -> Result<crate::store::AttachmentBytes> {
        self.store
            .attachment(session_id, turn_id, position)
            .await?
            .ok_or_else(|| Error::not_found("attachment"))
    }

    pub async fn enqueue(
        &self,
        session_id: &str,
        message: EnqueueRequest,
    ) -> Result<Answer<Enqueued>> {
        self.enqueue_files(session_id, message, Vec::new()).await
    }

    /// [`Broker::enqueue`], with the bytes of the files the message names,
    /// stored in the enqueue's transaction when it queues a new turn.
    async fn enqueue_files(
        &self,
        session_id: &str,
        message: EnqueueRequest,
        blobs: Vec<crate::store::Blob>,
    ) -> Result<Answer<Enqueued>> {
        check_message(&message)?;
        let started = Instant::now();
        let taken = match self.store.shared() {
            false => self.handoffs.take(session_id, started),
            true => None,
        };
        let done = match taken {
            // A claim parked on the session: claimed for in this enqueue's
            // commit. Should the enqueue fail, `taken` is dropped and the
            // parked claim re-checks the store.
            Some(taken) => {
                let enqueue = Command::Enqueue {
                    session_id: session_id.to_owned(),
                    message,
                    blobs,
                };
                let claim = Command::Claim {
                    session_id: session_id.to_owned(),
                    host: taken.host.clone(),
                    claim_id: taken.claim_id.clone(),
                };
                let (done, claimed) = self.store.together(enqueue, claim).await?;
                taken.deliver(claimed.and_then(Done::claimed));
                done.enqueued()?
            }
            None => {
                let session_id = session_id.to_owned();
                self.store.enqueue(session_id, message, blobs).await?
            }
        };
        if !done.duplicate {
            self.metrics.turn("enqueued", 1);
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
        let deadline = started + Duration::from_secs(claim.wait_seconds.min(self.max_wait_seconds));
        let subscription = self.claimable.subscribe(session_id);
        let mut parked: Option<Open> = None;
        let mut woken_at: Option<Instant> = None;
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
                .await;
            if let Some(answer) =
                self.claim_answer(session_id, &claim.claim_id, outcome, &parked, woken_at)?
            {
                return Ok(answer);
            }
            if Instant::now() >= deadline || self.shutdown.is_cancelled() {
                break;
            }
            parked.get_or_insert_with(|| Open::new(&self.metrics.parked_claims));
            self.heard(session_id, &host).await;
            let (delivered, wake) = self
                .park(session_id, &host, &claim.claim_id, woken, deadline)
                .await;
            if let Some((enqueue_started, outcome)) = delivered {
                let answer = self.claim_answer(
                    session_id,
                    &claim.claim_id,
                    outcome,
                    &parked,
                    Some(enqueue_started),
                )?;
                if let Some(answer) = answer {
                    return Ok(answer);
                }
            }
            match wake {
                Wake::Woken => woken_at = Some(Instant::now()),
                Wake::Again => {}
                Wake::Ended => break,
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

    /// Sleeps a parked claim until an enqueue hands it an outcome (on a
    /// store that hands off), its session's signal fires (`woken`), a
    /// presence refresh is due, its deadline or shutdown. Leaving the
    /// hand-off registry, it takes an outcome an enqueue delivered meanwhile.
    async fn park(
        &self,
        session_id: &str,
        host: &HostIdentity,
        claim_id: &str,
        woken: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
        deadline: Instant,
    ) -> (Option<Delivery>, Wake) {
        // Registered after the store said empty: an enqueue committed
        // before this point wakes `woken` instead.
        let mut handoff: Option<Parked> = (!self.store.shared()).then(|| {
            self.handoffs
                .park(session_id, host.clone(), claim_id.to_owned())
        });
        let (delivered, wake) = tokio::select! {
            delivery = handed_off(&mut handoff) => (delivery, Wake::Again),
            _ = woken => (None, Wake::Woken),
            // A long park is heard from now and then (presence).
            _ = tokio::time::sleep(PARKED_HEARD_EVERY) => (None, Wake::Again),
            _ = tokio::time::sleep_until(deadline) => (None, Wake::Ended),
            _ = self.shutdown.cancelled() => (None, Wake::Ended),
        };
        // Leaving the registry: if an enqueue took this claim meanwhile,
        // its outcome is on the way and is this claim's answer.
        let delivered = match (delivered, handoff) {
            (Some(delivery), _) => Some(delivery),
            (None, Some(handoff)) => handoff.leave().await,
            (None, None) => None,
        };
        (delivered, wake)
    }

    /// A claim's answer from what the store found: `None` to keep parking
    /// (an empty queue, or a store outage once parked: the claim re-checks
    /// and ends `claimed: false` at its deadline; only a first look answers
    /// 503). `woken_at` starts the wake-latency sample.
    fn claim_answer(
        &self,
        session_id: &str,
        claim_id: &str,
        outcome: Result<ClaimOutcome>,
        parked: &Option<Open>,
        woken_at: Option<Instant>,
    ) -> Result<Option<Answer<ClaimAnswer>>> {
        let (turn, attempt, replayed) = match outcome {
            Ok(ClaimOutcome::Claimed {
                turn,
                attempt,
                replayed,
            }) => (turn, attempt, replayed),
            Ok(ClaimOutcome::Empty) => return Ok(None),
            Err(e) if parked.is_some() && e.code == ErrorCode::StoreUnavailable => {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        if !replayed {
            self.metrics.turn("claimed", 1);
        }
        if let Some(woken_at) = woken_at {
            self.metrics
                .claim_wake_seconds
                .observe(woken_at.elapsed().as_secs_f64());
        }
        Ok(Some(Answer {
            body: ClaimAnswer::Claimed(Claimed {
                claimed: true,
                session_id: session_id.to_owned(),
                claim_id: claim_id.to_owned(),
                turn: turn.claimed_turn(attempt),
                turn_state: turn.state,
            }),
            replayed,
        }))
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
        crate::decide::turn::answer_text(completion.response.get("message"))?;
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
        if !receipt.replayed {
            self.metrics.turn("completed", 1);
            self.outbox.notify_one();
        }
        Ok(Answer {
            replayed: receipt.replayed,
            body: receipt,
        })
    }

    pub async fn release(
        &self,
        session_id: &str,
        claim_id: &str,
        by: ReleaseRequest,
    ) -> Result<Released> {
        check("claim_id", claim_id)?;
        let by = match (by.by, by.host_surface, by.host_session_id) {
            (Some(ReleasedBy::Owner), None, None) => Releaser::Owner,
            (None, Some(host_surface), Some(host_session_id)) => {
                Releaser::Host(checked_host(host_surface, host_session_id)?)
            }
            _ => {
                return Err(Error::invalid(
                    "Give the host identity (`host_surface` and `host_session_id`), or `\"by\": \"owner\"` alone.",
                ));
            }
        };
        let released = self
            .store
            .release(session_id.to_owned(), claim_id.to_owned(), by)
            .await?;
        Ok(released)
    }

    pub async fn close(&self, session_id: &str, close: CloseRequest) -> Result<Session> {
        let closed = self.store.close(session_id.to_owned(), close).await?;
        self.metrics.turn("cancelled", closed.cancelled);
        self.metrics.permission("expired", closed.expired);
        // A linked Lark chat is told the session left it, and the expired
        // requests' cards show them expired.
        self.outbox.notify_one();
        Ok(closed.session.projection())
    }

    /// The host reports its agent's state; answers the session projection.
    pub async fn report_agent(
        &self,
        session_id: &str,
        report: ReportAgentState,
    ) -> Result<Session> {
        let said = crate::decide::presence::Report::checked(&report)?;
        let host = checked_host(report.host_surface, report.host_session_id)?;
        if matches!(said.said, Some(crate::decide::terminal::Said::Prompt(_))) {
            // The session's own refusals (404, 403, 409) come before its rate.
            let session = crate::decide::hosted(self.store.session(session_id).await?, &host)?;
            crate::decide::open(&session)?;
            self.prompt_allowed(session_id)?;
        }
        // A terminal turn answered may have a card for a linked chat; an
        // interrupted Lark turn is told so.
        let answered =
            matches!(said.said, Some(crate::decide::terminal::Said::Answer(_))) || said.interrupted;
        let reported = self
            .store
            .report_agent(session_id.to_owned(), host, said)
            .await?;
        if answered {
            self.outbox.notify_one();
        }
        // An agent that left may leave a turn behind: released now.
        self.release_if_left(&reported.session).await;
        Ok(reported.session.projection())
    }

    /// A terminal prompt for the session within its rate, or 429
    /// `too_many_prompts` with the seconds until the next one fits.
    fn prompt_allowed(&self, session_id: &str) -> Result<()> {
        use governor::clock::{Clock, DefaultClock};
        if self.prompts.len() > 10_000 {
            // Sessions whose prompts are all forgotten take no room.
            self.prompts.retain_recent();
        }
        match self.prompts.check_key(&session_id.to_owned()) {
            Ok(()) => Ok(()),
            Err(not_until) => {
                let wait = not_until.wait_time_from(DefaultClock::default().now());
                Err(Error::too_many_prompts(wait.as_secs().max(1) as u32))
            }
        }
    }

    /// The host's agent waits at its terminal: a `notification` event.
    pub async fn notify(&self, session_id: &str, notice: AgentNotification) -> Result<Session> {
        let host = checked_host(notice.host_surface, notice.host_session_id)?;
        let session = self
            .store
            .notify(session_id.to_owned(), host, notice.kind)
            .await?;
        Ok(session.projection())
    }

    /// The host reports its agent's working tree (HOOKS.md, "What the
    /// agent changed"): its limits first, then the session's refusals.
    pub async fn report_changes(&self, session_id: &str, report: ReportChanges) -> Result<()> {
        crate::decide::changes::check(&report)?;
        let host = checked_host(report.host_surface.clone(), report.host_session_id.clone())?;
        self.store
            .report_changes(session_id.to_owned(), host, report)
            .await
    }

    /// The session's latest report of its working tree.
    pub async fn changes(&self, session_id: &str) -> Result<Changes> {
        self.store.changes(session_id).await
    }

    /// One file of the session's latest report, with its diff.
    pub async fn file_changes(&self, session_id: &str, path: &str) -> Result<FileChanges> {
        self.store.file_changes(session_id, path).await
    }

    /// A parked claim counts as hearing from its host (presence), with no
    /// state of its own. Read first, so that it costs no write while the
    /// host was heard from lately; a failure only loses the refresh.
    async fn heard(&self, session_id: &str, host: &HostIdentity) {
        let now = crate::time::now_ms();
        match self.store.session(session_id).await {
            Ok(Some(row)) if crate::decide::presence::is_news(&row, None, now) => {}
            _ => return,
        }
        if let Err(e) = self
            .store
            .report_agent(session_id.to_owned(), host.clone(), Default::default())
            .await
        {
            tracing::debug!(code = ?e.code, "a parked claim's presence was not recorded");
        }
    }

    /// Starts the Lark reply dispatcher; it stops with the broker.
    pub fn spawn_lark_dispatcher(&self, config: LarkConfig) -> tokio::task::JoinHandle<()> {
        let dispatcher = Dispatcher::new(
            self.store.clone(),
            config,
            self.outbox.clone(),
            self.shutdown.clone(),
            self.metrics.clone(),
        );
        tokio::spawn(dispatcher.run())
    }

    /// Starts the Lark download jobs' fetcher ([`crate::lark::resources::Fetcher`]);
    /// it stops with the broker.
    pub fn spawn_lark_fetcher(&self, config: LarkConfig) -> tokio::task::JoinHandle<()> {
        let fetcher = crate::lark::resources::Fetcher::new(
            self.store.clone(),
            config,
            self.fetches.clone(),
            self.shutdown.clone(),
        );
        tokio::spawn(fetcher.run())
    }

    /// Records a verified Lark event once and enqueues its text into the
    /// linked session, in one transaction.
    pub async fn lark_event(&self, event: LarkEvent) -> Result<LarkIngest> {
        let ingest = self.store.lark_event(event).await?;
        match &ingest {
            LarkIngest::Enqueued { .. } => {
                self.metrics.turn("enqueued", 1);
                // Its files, if any, are fetched now.
                self.fetches.notify_one();
            }
            LarkIngest::Answered { decision, .. } => {
                self.count(decision, decision.row().state.as_str())
            }
            LarkIngest::Command(_) => self.outbox.notify_one(),
            _ => {}
        }
        Ok(ingest)
    }

    /// Takes a click on a permission card once: an approver's answers the
    /// request, in one transaction.
    pub async fn lark_click(&self, click: LarkClick) -> Result<Clicked> {
        let clicked = self.store.lark_click(click).await?;
        if let Clicked::Answered { row, .. } = &clicked {
            self.count_written(row.state.as_str());
        }
        Ok(clicked)
    }

    pub async fn lark_link(&self, session_id: &str, link: LarkLinkRequest) -> Result<LarkLink> {
        check("chat_id", &link.chat_id)?;
        let options = crate::decide::lark::LinkOptions {
            approvers: crate::permission::approvers(link.approvers)?,
            terminal_turns: Some(link.terminal_turns),
        };
        self.store
            .lark_link(session_id.to_owned(), link.chat_id, options)
            .await
    }

    /// A one-time code that links a Lark chat to the session when sent to
    /// the bot as `/link <code>` ([`crate::decide::pairing`]); only its hash
    /// is stored.
    pub async fn lark_pair_code(&self, session_id: &str) -> Result<LarkPairCode> {
        let mut random = [0u8; pairing::CODE_LEN];
        getrandom::fill(&mut random)
            .map_err(|_| Error::store("minting a pairing code", "no randomness"))?;
        let code = pairing::code_from(random);
        let expires_at = self
            .store
            .lark_pair_code(session_id.to_owned(), pairing::code_hash(&code))
            .await?;
        Ok(LarkPairCode {
            session_id: session_id.to_owned(),
            command: format!("/link {code}"),
            code,
            expires_at: rfc3339(expires_at),
        })
    }

    pub async fn lark_unlink(&self, session_id: &str) -> Result<LarkLink> {
        self.store.lark_unlink(session_id.to_owned()).await
    }

    pub async fn lark_link_status(&self, session_id: &str) -> Result<LarkLink> {
        self.store.lark_link_status(session_id).await
    }

    /// Where a new event stream starts: after `last_event_id` when the client
    /// resumes, else after the latest event (the stream starts from now).
    /// 404 for an unknown session.
    /// Also answers whether the stream is over before it starts: a closed
    /// session whose log the client has seen to the end.
    pub async fn events_start(
        &self,
        session_id: &str,
        last_event_id: Option<i64>,
    ) -> Result<(i64, bool)> {
        let latest = self.store.last_event_no(session_id).await?;
        let after = last_event_id.unwrap_or(latest);
        let closed = self
            .store
            .session(session_id)
            .await?
            .is_some_and(|s| s.state == SessionState::Closed);
        Ok((after, closed && after >= latest))
    }

    /// The session's events after `after`, then each new one as it is
    /// committed; ends after the session's `closed` event, on shutdown, or on a
    /// store failure (the client resumes with `Last-Event-ID`). Events are read
    /// from the durable log a page at a time, only as fast as the client takes
    /// them, so a stalled client holds at most one page in memory.
    pub fn events(
        self: &Arc<Self>,
        session_id: String,
        (after, ended): (i64, bool),
    ) -> impl futures_util::Stream<Item = LoggedEvent> + Send + 'static {
        let cursor = EventCursor {
            _open: Open::new(&self.metrics.sse_streams),
            subscription: self.changes.subscribe(&session_id),
            broker: self.clone(),
            session_id,
            after,
            pending: Default::default(),
            finished: ended,
        };
        futures_util::stream::unfold(cursor, EventCursor::next)
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

/// An enqueued message's own rules: its text, its ids, its origin and its
/// Lark reference (400).
fn check_message(message: &EnqueueRequest) -> Result<()> {
    if message.text.is_empty() || message.text.len() > MAX_TEXT_BYTES {
        return Err(Error::invalid(format!(
            "`text` must be 1 to {MAX_TEXT_BYTES} bytes."
        )));
    }
    if let Some(id) = &message.client_message_id {
        check("client_message_id", id)?;
    }
    if message.origin == Origin::Terminal {
        return Err(Error::invalid(
            "Origin \"terminal\" is recorded by the agent's host (its `agent-state` report's `prompt`), never queued.",
        ));
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
    Ok(())
}

/// The host identity a host call presents, its two ids checked.
pub(crate) fn checked_host(host_surface: String, host_session_id: String) -> Result<HostIdentity> {
    check("host_surface", &host_surface)?;
    check("host_session_id", &host_session_id)?;
    Ok(HostIdentity {
        host_surface,
        host_session_id,
    })
}

/// Why a parked claim woke.
enum Wake {
    /// Its session's signal fired: the store is read again, and the wake-up
    /// latency sampled.
    Woken,
    /// A hand-off or a presence refresh: the store is read again.
    Again,
    /// Its deadline, or shutdown.
    Ended,
}

/// A parked claim's hand-off, if it has one, once an enqueue has taken it:
/// its outcome, or `None` when the enqueue failed (the claim re-checks the
/// store).
async fn handed_off(handoff: &mut Option<Parked>) -> Option<Delivery> {
    match handoff {
        Some(parked) => parked.delivered().await,
        None => std::future::pending().await,
    }
}

fn page_limit(limit: Option<u32>, default: u32, max: u32) -> Result<u32> {
    match limit.unwrap_or(default) {
        n if (1..=max).contains(&n) => Ok(n),
        _ => Err(Error::invalid(format!("`limit` must be 1 to {max}."))),
    }
}

/// A log entry as the stream sends it: content-free.
fn logged_event(row: crate::decide::EventRow) -> LoggedEvent {
    let (name, data) = match (row.kind.as_str(), row.turn_id, row.request_id) {
        ("turn", turn_id, _) => (
            "turn",
            serde_json::json!({"turn_id": turn_id, "seq": row.seq, "state": row.state}),
        ),
        ("permission", _, request_id) => (
            "permission",
            serde_json::json!({"request_id": request_id, "state": row.state}),
        ),
        ("agent", ..) => (
            "agent",
            serde_json::json!({"state": row.state, "since": rfc3339(row.at)}),
        ),
        ("notification", ..) => ("notification", serde_json::json!({"state": row.state})),
        _ => ("session", serde_json::json!({"state": row.state})),
    };
    LoggedEvent {
        id: row.event_no,
        name,
        data,
    }
}

struct EventCursor {
    _open: Open,
    broker: Arc<Broker>,
    subscription: crate::wakeup::Subscription,
    session_id: String,
    after: i64,
    pending: std::collections::VecDeque<LoggedEvent>,
    finished: bool,
}

impl EventCursor {
    async fn next(mut self) -> Option<(LoggedEvent, Self)> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                self.finished |= event.name == "session";
                return Some((event, self));
            }
            if self.finished {
                return None;
            }
            let broker = self.broker.clone();
            // Enabled before the store is read, as for parked claims.
            let changed = self.subscription.signal().notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let rows = broker
                .store
                .events(&self.session_id, self.after, EVENT_PAGE)
                .await
                .ok()?;
            if let Some(last) = rows.last() {
                self.after = last.event_no;
                self.pending.extend(rows.into_iter().map(logged_event));
                continue;
            }
            tokio::select! {
                _ = changed => {}
                _ = broker.shutdown.cancelled() => return None,
            }
        }
    }
}

/// A limit that is not zero, as governor takes it.
fn nonzero(n: u32) -> std::num::NonZeroU32 {
    std::num::NonZeroU32::new(n).unwrap_or(std::num::NonZeroU32::MIN)
}
