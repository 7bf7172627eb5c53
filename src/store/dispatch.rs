//! Each [`Command`] to its rule, once for every store: the rows the rule
//! needs, loaded through the backend's [`Tx`], the rule of [`crate::decide`]
//! called, and the [`Writes`] it returns handed back to the backend to
//! apply, all in the backend's one transaction. A backend keeps its SQL (the
//! loads, the writes, the bookkeeping statements) and decides nothing; which
//! rows a rule reads, in what order, and which session is locked before
//! which row is read, is said here once.
//!
//! On SQLite every step runs at once on the thread holding the writer (its
//! futures are never pending: [`at_once`] drives them); on PostgreSQL each
//! is a round trip in the call's transaction.

use std::future::Future;
use std::task::{Context, Poll, Waker};

use crate::decide::chat::{ChatRows, ChatSession};
use crate::decide::lark::{
    self, ClickRows, EventRows, Fetched, LarkClick, LarkEvent, LinkOptions, LinkRow, LinkRows,
};
use crate::decide::pairing::{self, ChatRow, PairCodeRow, PairRows};
use crate::decide::permission::{self, AnswerRows, CreateRows};
use crate::decide::presence::{self, Report, ReportRows};
use crate::decide::session::{self, BindRows, Bound, CloseRows};
use crate::decide::turn::{self, ClaimRows, CompleteRows, ReleaseRows, Releaser};
use crate::decide::{Decided, SessionRow, TurnRow, Writes};
use crate::devices::{self, DeviceRow, NewDevice};
use crate::error::{Error, ErrorCode};
use crate::ids::Minter;
use crate::model::{
    AnswerPermission, AnsweredVia, BindRequest, CloseRequest, CompleteRequest,
    CreatePermissionRequest, EnqueueRequest, HostIdentity, NewPushSubscription, NotificationKind,
    RegisterAgentThread,
};
use crate::permission::PermissionRow;
use crate::push::{self, PushSubscriptionRow};
use crate::store::retention::PruneStep;
use crate::store::statement::{self, Statement};
use crate::store::{Blob, Command, Done};
use crate::time::now_ms;

/// A backend's transaction, as the decisions use it: the rows they read
/// (a session read to decide on is locked, on a store that other processes
/// share), the writes they return applied, and the bookkeeping statements
/// no rule decides. Each method is one step of the caller's transaction.
#[allow(async_fn_in_trait)]
pub(crate) trait Tx {
    /// How a step fails: the contract's refusal (an [`Error`] a rule
    /// returned) or the database's own failure.
    type Fail: From<Error>;

    /// The session, and its turn enqueued with `client_message_id`.
    async fn enqueue_rows(
        &mut self,
        session_id: &str,
        client_message_id: Option<&str>,
    ) -> Result<(Option<SessionRow>, Option<TurnRow>), Self::Fail>;
    async fn claim_rows(
        &mut self,
        session_id: &str,
        claim_id: &str,
    ) -> Result<ClaimRows, Self::Fail>;
    async fn complete_rows(
        &mut self,
        session_id: &str,
        turn_id: &str,
        completion_id: &str,
    ) -> Result<CompleteRows, Self::Fail>;
    async fn release_rows(
        &mut self,
        session_id: &str,
        claim_id: &str,
    ) -> Result<ReleaseRows, Self::Fail>;
    async fn close_rows(&mut self, session_id: &str) -> Result<CloseRows, Self::Fail>;
    async fn bind_rows(&mut self, bind: &BindRequest) -> Result<BindRows, Self::Fail>;

    /// The session, locked for the decision.
    async fn lock_session(&mut self, session_id: &str) -> Result<Option<SessionRow>, Self::Fail>;
    /// The session as it stands, not locked.
    async fn session(&mut self, session_id: &str) -> Result<Option<SessionRow>, Self::Fail>;
    async fn turn(
        &mut self,
        session_id: &str,
        turn_id: &str,
    ) -> Result<Option<TurnRow>, Self::Fail>;
    /// The session's turn enqueued with this `client_message_id`.
    async fn earlier_turn(
        &mut self,
        session_id: &str,
        client_message_id: &str,
    ) -> Result<Option<TurnRow>, Self::Fail>;
    async fn permission(
        &mut self,
        session_id: &str,
        request_id: &str,
    ) -> Result<Option<PermissionRow>, Self::Fail>;
    /// The bytes the session's files hold.
    async fn attachment_bytes(&mut self, session_id: &str) -> Result<u64, Self::Fail>;
    /// Whether the turn's Lark download job is pending.
    async fn fetching(&mut self, turn_id: &str) -> Result<bool, Self::Fail>;
    /// The chat the session's link sends terminal turns to.
    async fn terminal_feed(&mut self, session_id: &str) -> Result<Option<String>, Self::Fail>;
    async fn session_link(&mut self, session_id: &str) -> Result<Option<LinkRow>, Self::Fail>;
    /// The session's latest report of its working tree as kept (its body
    /// and when).
    async fn changes(&mut self, session_id: &str) -> Result<Option<(Vec<u8>, i64)>, Self::Fail>;
    async fn chat(&mut self, chat_id: &str) -> Result<Option<ChatRow>, Self::Fail>;
    /// The chat's open sessions (id, approvers), in link order.
    async fn chat_links(&mut self, chat_id: &str) -> Result<Vec<(String, String)>, Self::Fail>;
    /// The session a message the broker sent was for.
    async fn sent_for(&mut self, message_id: &str) -> Result<Option<String>, Self::Fail>;
    /// The session of the chat's linked sessions that asked `request_id`.
    async fn asked_in_chat(
        &mut self,
        chat_id: &str,
        request_id: &str,
    ) -> Result<Option<String>, Self::Fail>;
    /// Whether a Lark event was seen: by its event id, or its message's id.
    async fn event_seen(
        &mut self,
        app_id: &str,
        event_id: &str,
        message_id: Option<&str>,
    ) -> Result<bool, Self::Fail>;
    async fn pair_code(&mut self, code_hash: &str) -> Result<Option<PairCodeRow>, Self::Fail>;
    /// A permission request's card: its chat, and who answered on it.
    async fn card(
        &mut self,
        session_id: &str,
        request_id: &str,
    ) -> Result<Option<(String, Option<String>)>, Self::Fail>;

    /// Applies a decision's writes (or, on SQLite, journals them).
    async fn apply(&mut self, writes: Writes) -> Result<(), Self::Fail>;
    /// Runs one of the statements both stores share; the rows it changed.
    async fn execute(&mut self, statement: Statement) -> Result<u64, Self::Fail>;

    /// The bookkeeping no rule decides that is not a shared statement.
    async fn prune_step(&mut self, cutoff_ms: i64) -> Result<PruneStep, Self::Fail>;
}

/// Applies a decision's writes and answers its answer.
async fn decided<X: Tx, T>(tx: &mut X, decided: Decided<T>) -> Result<T, X::Fail> {
    tx.apply(decided.writes).await?;
    Ok(decided.answer)
}

/// Stores, in the decision's transaction, the bytes of each file a turn's
/// attachments JSON (`named`) lists: a blob it does not name is not written,
/// so nothing refused or dropped leaves bytes behind.
async fn put_blobs<X: Tx>(
    tx: &mut X,
    blobs: &[crate::store::Blob],
    named: Option<&str>,
) -> Result<(), X::Fail> {
    let named = crate::attachments::parse_list(named);
    let mut written = std::collections::HashSet::new();
    for blob in blobs {
        let wanted = named.iter().any(|file| file.sha256 == blob.sha256);
        if wanted && written.insert(blob.sha256.as_str()) {
            tx.execute(statement::put_blob(blob)).await?;
        }
    }
    Ok(())
}

/// Takes `command` in the caller's transaction: what it decided. A table:
/// each command hands its fields to the function that loads its rows,
/// calls its rule and applies what the rule returns; the bookkeeping that
/// no rule decides is one statement each.
pub(crate) async fn command<X: Tx>(
    tx: &mut X,
    command: Command,
    minter: &Minter,
) -> Result<Done, X::Fail> {
    let now = now_ms();
    match command {
        Command::Register { thread } => register(tx, &thread, now).await,
        Command::PreviewBind { bind } => preview_bind(tx, &bind).await,
        Command::Bind { bind } => bind_session(tx, bind, minter, now).await,
        Command::Enqueue {
            session_id,
            message,
            blobs,
        } => enqueue(tx, &session_id, message, &blobs, minter, now).await,
        Command::Claim {
            session_id,
            host,
            claim_id,
        } => claim(tx, &session_id, &host, &claim_id, now).await,
        Command::Complete {
            session_id,
            turn_id,
            completion,
        } => complete(tx, &session_id, &turn_id, completion, now).await,
        Command::Release {
            session_id,
            claim_id,
            by,
        } => release(tx, &session_id, &claim_id, &by, now).await,
        Command::Close { session_id, how } => close(tx, &session_id, &how, now).await,
        Command::CreatePermission {
            session_id,
            host,
            request,
        } => create_permission(tx, &session_id, &host, request, now).await,
        Command::AnswerPermission {
            session_id,
            request_id,
            answer,
            via,
        } => answer_permission(tx, &session_id, &request_id, &answer, via, now).await,
        Command::WithdrawPermission {
            session_id,
            request_id,
            host,
            at_terminal,
        } => withdraw_permission(tx, &session_id, &request_id, &host, at_terminal, now).await,
        Command::RelayedPermission {
            session_id,
            request_id,
            host,
        } => relayed_permission(tx, &session_id, &request_id, &host, now).await,
        Command::ReportAgent {
            session_id,
            host,
            report,
        } => report_agent(tx, &session_id, &host, &report, minter, now).await,
        Command::LapseAgent {
            session_id,
            stall_after_ms,
            now,
        } => lapse_agent(tx, &session_id, stall_after_ms, now).await,
        Command::Notify {
            session_id,
            host,
            kind,
        } => notify(tx, &session_id, &host, kind, now).await,
        Command::ReportChanges {
            session_id,
            host,
            report,
        } => report_changes(tx, &session_id, &host, report, now).await,
        Command::LarkLink {
            session_id,
            chat_id,
            options,
        } => lark_link(tx, &session_id, chat_id, options, now).await,
        Command::LarkPairCode {
            session_id,
            code_hash,
        } => pair_code(tx, &session_id, code_hash, now).await,
        Command::LarkUnlink { session_id } => unlink(tx, &session_id).await,
        Command::LarkEvent { event } => lark_event(tx, event, minter, now).await,
        Command::LarkClick { click } => lark_click(tx, click, now).await,
        Command::LarkFetched { fetched, blobs } => lark_fetched(tx, fetched, &blobs, now).await,
        Command::RecordReply { outbound, update } => {
            tx.execute(statement::record_reply(outbound, update, now))
                .await?;
            Ok(Done::RecordReply(Box::new(())))
        }
        Command::LarkMessageSent {
            message_id,
            session_id,
            chat_id,
        } => {
            tx.execute(statement::message_sent(
                &message_id,
                &session_id,
                &chat_id,
                now,
            ))
            .await?;
            Ok(Done::LarkMessageSent(Box::new(())))
        }
        Command::LarkCardSent {
            session_id,
            request_id,
            message_id,
        } => {
            tx.execute(statement::card_sent(&session_id, &request_id, &message_id))
                .await?;
            Ok(Done::LarkCardSent(Box::new(())))
        }
        Command::RecordCardUpdate { job, update } => {
            tx.execute(statement::record_card_update(&job, update))
                .await?;
            Ok(Done::RecordCardUpdate(Box::new(())))
        }
        Command::PruneStep { cutoff_ms } => {
            Ok(Done::PruneStep(Box::new(tx.prune_step(cutoff_ms).await?)))
        }
        Command::SweepBlobs { cutoff_ms } => {
            let sweep = Statement::new(crate::store::retention::DELETE_UNNAMED_BLOBS);
            Ok(Done::SweepBlobs(Box::new(
                tx.execute(sweep.bind(cutoff_ms)).await?,
            )))
        }
        Command::RecordFetch {
            turn_id,
            failures,
            next_attempt_at,
        } => {
            tx.execute(statement::record_fetch(&turn_id, failures, next_attempt_at))
                .await?;
            Ok(Done::RecordFetch(Box::new(())))
        }
        Command::MintDeviceLink { code_hash } => mint_device_link(tx, &code_hash, now).await,
        Command::SignInDevice { code_hash, device } => {
            sign_in_device(tx, &code_hash, device, minter, now).await
        }
        Command::RevokeDevice { device_id } => {
            let [device, subscriptions] = statement::revoke_device(&device_id);
            let gone = tx.execute(device).await?;
            tx.execute(subscriptions).await?;
            Ok(Done::RevokeDevice(Box::new(gone > 0)))
        }
        Command::Subscribe {
            device_id,
            subscription,
        } => subscribe(tx, device_id.as_deref(), &subscription, minter, now).await,
        Command::Unsubscribe {
            subscription_id,
            device_id,
        } => {
            let unsubscribe = statement::unsubscribe(&subscription_id, device_id.as_deref());
            let gone = tx.execute(unsubscribe).await?;
            Ok(Done::Unsubscribe(Box::new(gone > 0)))
        }
        Command::DeviceSeen { device_id, at } => {
            tx.execute(statement::device_seen(&device_id, at)).await?;
            Ok(Done::DeviceSeen(Box::new(())))
        }
    }
}

async fn register<X: Tx>(
    tx: &mut X,
    thread: &RegisterAgentThread,
    now: i64,
) -> Result<Done, X::Fail> {
    let inserted = tx.execute(statement::register(thread, now)).await?;
    Ok(Done::Register(Box::new(inserted == 1)))
}

async fn preview_bind<X: Tx>(tx: &mut X, bind: &BindRequest) -> Result<Done, X::Fail> {
    let rows = tx.bind_rows(bind).await?;
    Ok(Done::PreviewBind(Box::new(session::check_bind(
        rows, bind,
    )?)))
}

async fn bind_session<X: Tx>(
    tx: &mut X,
    bind: BindRequest,
    minter: &Minter,
    now: i64,
) -> Result<Done, X::Fail> {
    let rows = tx.bind_rows(&bind).await?;
    // The session a new one from the same terminal continues,
    // locked, with what its close reads.
    let predecessor = match rows.predecessor.clone().filter(|_| rows.registered) {
        Some(session_id) => Some(tx.close_rows(&session_id).await?),
        None => None,
    };
    let decided = session::bind(rows, predecessor, bind, minter, now)?;
    if let Bound::Created(s) = &decided.answer {
        tx.execute(statement::insert_session(s)).await?;
    }
    if decided.writes.continuation.is_some() {
        tx.apply(decided.writes).await?;
    }
    Ok(Done::Bind(Box::new(decided.answer)))
}

/// A message, and in the same transaction the bytes of the files its new
/// turn names (none for a replay or a refusal).
async fn enqueue<X: Tx>(
    tx: &mut X,
    session_id: &str,
    message: EnqueueRequest,
    blobs: &[Blob],
    minter: &Minter,
    now: i64,
) -> Result<Done, X::Fail> {
    let client_message_id = message.client_message_id.as_deref();
    let (session, earlier) = tx.enqueue_rows(session_id, client_message_id).await?;
    // Only a message with files counts the session's.
    let held = match (&session, message.attachments.is_empty()) {
        (Some(_), false) => tx.attachment_bytes(session_id).await?,
        _ => 0,
    };
    let decision = turn::enqueue_within(session, earlier, message, held, minter, now)?;
    let enqueued = decided(tx, decision).await?;
    if !enqueued.duplicate {
        put_blobs(tx, blobs, enqueued.turn.attachments.as_deref()).await?;
    }
    Ok(Done::Enqueue(Box::new(enqueued)))
}

async fn claim<X: Tx>(
    tx: &mut X,
    session_id: &str,
    host: &HostIdentity,
    claim_id: &str,
    now: i64,
) -> Result<Done, X::Fail> {
    let rows = tx.claim_rows(session_id, claim_id).await?;
    let decision = turn::claim(rows, host, claim_id, now)?;
    Ok(Done::Claim(Box::new(decided(tx, decision).await?)))
}

async fn complete<X: Tx>(
    tx: &mut X,
    session_id: &str,
    turn_id: &str,
    completion: CompleteRequest,
    now: i64,
) -> Result<Done, X::Fail> {
    let completion_id = &completion.completion_id;
    let rows = tx.complete_rows(session_id, turn_id, completion_id).await?;
    let decision = turn::complete(rows, completion, now)?;
    Ok(Done::Complete(Box::new(decided(tx, decision).await?)))
}

async fn release<X: Tx>(
    tx: &mut X,
    session_id: &str,
    claim_id: &str,
    by: &Releaser,
    now: i64,
) -> Result<Done, X::Fail> {
    let rows = tx.release_rows(session_id, claim_id).await?;
    let decision = turn::release(rows, by, now)?;
    Ok(Done::Release(Box::new(decided(tx, decision).await?)))
}

async fn close<X: Tx>(
    tx: &mut X,
    session_id: &str,
    how: &CloseRequest,
    now: i64,
) -> Result<Done, X::Fail> {
    let rows = tx.close_rows(session_id).await?;
    let decision = session::close(rows, how, now)?;
    Ok(Done::Close(Box::new(decided(tx, decision).await?)))
}

/// A host's request: the session (locked), the request if it exists, and
/// the chat the session is linked to (its card goes there).
async fn create_permission<X: Tx>(
    tx: &mut X,
    session_id: &str,
    host: &HostIdentity,
    request: CreatePermissionRequest,
    now: i64,
) -> Result<Done, X::Fail> {
    let session = tx.lock_session(session_id).await?;
    let existing = tx.permission(session_id, &request.request_id).await?;
    let chat_id = match &session {
        Some(_) => tx.session_link(session_id).await?.map(|l| l.chat_id),
        None => None,
    };
    let rows = CreateRows {
        session,
        existing,
        chat_id,
    };
    let decision = permission::create(rows, host, request, now)?;
    Ok(Done::CreatePermission(Box::new(
        decided(tx, decision).await?,
    )))
}

async fn answer_permission<X: Tx>(
    tx: &mut X,
    session_id: &str,
    request_id: &str,
    answer: &AnswerPermission,
    via: AnsweredVia,
    now: i64,
) -> Result<Done, X::Fail> {
    let rows = answer_rows(tx, session_id, request_id).await?;
    let decision = permission::answer(rows, answer, via, now)?;
    Ok(Done::AnswerPermission(Box::new(
        decided(tx, decision).await?,
    )))
}

async fn withdraw_permission<X: Tx>(
    tx: &mut X,
    session_id: &str,
    request_id: &str,
    host: &HostIdentity,
    at_terminal: bool,
    now: i64,
) -> Result<Done, X::Fail> {
    let rows = answer_rows(tx, session_id, request_id).await?;
    let decision = permission::withdraw(rows, host, at_terminal, now)?;
    Ok(Done::WithdrawPermission(Box::new(
        decided(tx, decision).await?,
    )))
}

async fn relayed_permission<X: Tx>(
    tx: &mut X,
    session_id: &str,
    request_id: &str,
    host: &HostIdentity,
    now: i64,
) -> Result<Done, X::Fail> {
    let rows = answer_rows(tx, session_id, request_id).await?;
    let decision = permission::relayed(rows, host, now)?;
    Ok(Done::RelayedPermission(Box::new(
        decided(tx, decision).await?,
    )))
}

/// A host's report: the session (locked), its open terminal turn, and the
/// chat its terminal turns go to when the report may answer one.
async fn report_agent<X: Tx>(
    tx: &mut X,
    session_id: &str,
    host: &HostIdentity,
    report: &Report,
    minter: &Minter,
    now: i64,
) -> Result<Done, X::Fail> {
    let session = tx.lock_session(session_id).await?;
    let terminal = match session.as_ref().and_then(|s| s.terminal_turn_id.as_deref()) {
        Some(turn_id) => tx.turn(session_id, turn_id).await?,
        None => None,
    };
    let terminal_feed = if ReportRows::feeds(session.as_ref(), report) {
        tx.terminal_feed(session_id).await?
    } else {
        None
    };
    let active = session.as_ref().and_then(|s| s.active_claim_id.clone());
    let interrupted = match active.filter(|_| report.interrupted) {
        Some(claim_id) => {
            let rows = tx.release_rows(session_id, &claim_id).await?;
            rows.claim.zip(rows.turn)
        }
        None => None,
    };
    let rows = ReportRows {
        session,
        terminal,
        terminal_feed,
        interrupted,
    };
    let decision = presence::report(rows, host, report, minter, now)?;
    Ok(Done::ReportAgent(Box::new(decided(tx, decision).await?)))
}

async fn lapse_agent<X: Tx>(
    tx: &mut X,
    session_id: &str,
    stall_after_ms: i64,
    now: i64,
) -> Result<Done, X::Fail> {
    let session = tx.lock_session(session_id).await?;
    let lark_chat = tx.session_link(session_id).await?.map(|l| l.chat_id);
    let decision = presence::lapse(session, lark_chat, stall_after_ms, now)?;
    Ok(Done::LapseAgent(Box::new(decided(tx, decision).await?)))
}

async fn notify<X: Tx>(
    tx: &mut X,
    session_id: &str,
    host: &HostIdentity,
    kind: NotificationKind,
    now: i64,
) -> Result<Done, X::Fail> {
    let session = tx.lock_session(session_id).await?;
    let decision = presence::notify(session, host, kind, now)?;
    Ok(Done::Notify(Box::new(decided(tx, decision).await?)))
}

async fn report_changes<X: Tx>(
    tx: &mut X,
    session_id: &str,
    host: &HostIdentity,
    report: crate::model::ReportChanges,
    now: i64,
) -> Result<Done, X::Fail> {
    let session = tx.lock_session(session_id).await?;
    // The turn it holds a claim on may be the one the agent works on.
    let claim = match session.as_ref().and_then(|s| s.active_claim_id.clone()) {
        Some(claim_id) => tx.release_rows(session_id, &claim_id).await?.claim,
        None => None,
    };
    let rows = crate::decide::changes::ReportRows { session, claim };
    let decision = crate::decide::changes::report(rows, host, report, now)?;
    Ok(Done::ReportChanges(Box::new(decided(tx, decision).await?)))
}

async fn lark_link<X: Tx>(
    tx: &mut X,
    session_id: &str,
    chat_id: String,
    options: LinkOptions,
    now: i64,
) -> Result<Done, X::Fail> {
    let rows = LinkRows {
        session: tx.lock_session(session_id).await?,
        link: tx.session_link(session_id).await?,
        chat: tx.chat(&chat_id).await?,
    };
    let decision = lark::link(rows, chat_id, options, now)?;
    Ok(Done::LarkLink(Box::new(decided(tx, decision).await?)))
}

async fn pair_code<X: Tx>(
    tx: &mut X,
    session_id: &str,
    code_hash: String,
    now: i64,
) -> Result<Done, X::Fail> {
    let session = tx.lock_session(session_id).await?;
    let decision = pairing::new_code(session, code_hash, now)?;
    Ok(Done::LarkPairCode(Box::new(decided(tx, decision).await?)))
}

/// A sign-in link, unless too many are open: when it expires.
async fn mint_device_link<X: Tx>(tx: &mut X, code_hash: &str, now: i64) -> Result<Done, X::Fail> {
    let [expired, insert] = statement::mint_device_link(code_hash, now, devices::MAX_OPEN_LINKS);
    tx.execute(expired).await?;
    if tx.execute(insert).await? == 0 {
        let mut refused = Error::new(
            ErrorCode::TooManyAttempts,
            "Too many sign-in links are open: use one, or wait until they expire.",
        );
        refused.retry_after_seconds = Some((devices::LINK_TTL_MS / 1000) as u32);
        return Err(refused.into());
    }
    Ok(Done::MintDeviceLink(Box::new(now + devices::LINK_TTL_MS)))
}

/// Spends the link and signs the device in: the link's conditions (unused,
/// unexpired) and the devices' limit are each one statement's condition, so
/// two phones racing for one link sign in one.
async fn sign_in_device<X: Tx>(
    tx: &mut X,
    code_hash: &str,
    device: NewDevice,
    minter: &Minter,
    now: i64,
) -> Result<Done, X::Fail> {
    if tx
        .execute(statement::spend_device_link(code_hash, now))
        .await?
        == 0
    {
        return Err(devices::bad_code().into());
    }
    let device_id = minter.mint("dev");
    let insert = statement::insert_device(&device_id, &device, now, devices::MAX_DEVICES);
    if tx.execute(insert).await? == 0 {
        // Undone with the link's spending: the link stays good.
        return Err(Error::new(
            ErrorCode::TooManyDevices,
            format!(
                "{} devices are signed in already: revoke one first.",
                devices::MAX_DEVICES
            ),
        )
        .into());
    }
    Ok(Done::SignInDevice(Box::new(DeviceRow {
        device_id,
        name: device.name,
        created_at: now,
        last_seen_at: None,
    })))
}

/// A push subscription for its caller, unless it holds too many.
async fn subscribe<X: Tx>(
    tx: &mut X,
    device_id: Option<&str>,
    subscription: &NewPushSubscription,
    minter: &Minter,
    now: i64,
) -> Result<Done, X::Fail> {
    let subscription_id = minter.mint("psb");
    let [earlier, insert] = statement::subscribe(
        &subscription_id,
        device_id,
        subscription,
        now,
        push::MAX_SUBSCRIPTIONS,
    );
    tx.execute(earlier).await?;
    if tx.execute(insert).await? == 0 {
        return Err(Error::new(
            ErrorCode::TooManySubscriptions,
            format!(
                "This caller holds {} push subscriptions already: remove one first.",
                push::MAX_SUBSCRIPTIONS
            ),
        )
        .into());
    }
    Ok(Done::Subscribe(Box::new(PushSubscriptionRow {
        subscription_id,
        device_id: device_id.map(str::to_owned),
        endpoint: subscription.endpoint.clone(),
        p256dh: subscription.keys.p256dh.clone(),
        auth: subscription.keys.auth.clone(),
        created_at: now,
    })))
}

async fn unlink<X: Tx>(tx: &mut X, session_id: &str) -> Result<Done, X::Fail> {
    let session = tx.lock_session(session_id).await?;
    Ok(Done::LarkUnlink(Box::new(
        decided(tx, lark::unlink(session)?).await?,
    )))
}

async fn lark_event<X: Tx>(
    tx: &mut X,
    event: LarkEvent,
    minter: &Minter,
    now: i64,
) -> Result<Done, X::Fail> {
    let rows = event_rows(tx, &event).await?;
    let decision = lark::event(rows, event, minter, now)?;
    Ok(Done::LarkEvent(Box::new(decided(tx, decision).await?)))
}

async fn lark_click<X: Tx>(tx: &mut X, click: LarkClick, now: i64) -> Result<Done, X::Fail> {
    let rows = click_rows(tx, &click).await?;
    let decision = lark::click(rows, click, now)?;
    Ok(Done::LarkClick(Box::new(decided(tx, decision).await?)))
}

/// A download job ended: the turn takes its files, and the bytes of those
/// it keeps are stored in the same transaction.
async fn lark_fetched<X: Tx>(
    tx: &mut X,
    fetched: Fetched,
    blobs: &[Blob],
    now: i64,
) -> Result<Done, X::Fail> {
    let rows = lark::FetchedRows {
        session: tx.lock_session(&fetched.session_id).await?,
        turn: tx.turn(&fetched.session_id, &fetched.turn_id).await?,
        pending: tx.fetching(&fetched.turn_id).await?,
        held: tx.attachment_bytes(&fetched.session_id).await?,
    };
    let decision = lark::fetched(rows, fetched, now);
    let named = match &decision.writes.fetch {
        Some(lark::FetchWrite::Finish {
            turn: Some(turn), ..
        }) => turn.attachments.clone(),
        _ => None,
    };
    put_blobs(tx, blobs, named.as_deref()).await?;
    Ok(Done::LarkFetched(Box::new(decided(tx, decision).await?)))
}

/// What an answer, a withdrawal or a relay of one request reads.
async fn answer_rows<X: Tx>(
    tx: &mut X,
    session_id: &str,
    request_id: &str,
) -> Result<AnswerRows, X::Fail> {
    Ok(AnswerRows {
        session: tx.lock_session(session_id).await?,
        existing: tx.permission(session_id, request_id).await?,
    })
}

/// A card's click: whether it was seen, and else its session (locked),
/// the session's link, the request and its card.
async fn click_rows<X: Tx>(tx: &mut X, click: &lark::LarkClick) -> Result<ClickRows, X::Fail> {
    if tx.event_seen(&click.app_id, &click.event_id, None).await? {
        return Ok(ClickRows {
            seen: true,
            ..ClickRows::default()
        });
    }
    let session = tx.lock_session(&click.session_id).await?;
    if session.is_none() {
        return Ok(ClickRows::default());
    }
    let link = tx.session_link(&click.session_id).await?;
    let card = tx.card(&click.session_id, &click.request_id).await?;
    Ok(ClickRows {
        seen: false,
        request: tx.permission(&click.session_id, &click.request_id).await?,
        session,
        link: link.map(|l| (l.chat_id, l.approvers)),
        card_chat: card.as_ref().map(|(chat, _)| chat.clone()),
        answered_by: card.and_then(|(_, by)| by),
    })
}

/// A chat's open sessions, each with its approvers.
async fn chat_sessions<X: Tx>(tx: &mut X, chat_id: &str) -> Result<Vec<ChatSession>, X::Fail> {
    let links = tx.chat_links(chat_id).await?;
    let mut sessions = Vec::with_capacity(links.len());
    for (session_id, approvers) in links {
        if let Some(session) = tx.session(&session_id).await? {
            sessions.push(ChatSession { session, approvers });
        }
    }
    Ok(sessions)
}

/// A chat's row and sessions, the session the message replies to, and the
/// one that asked what it answers; the session the message goes to locked
/// (and the chat's sessions read again under that lock, until the target
/// is the same: a link or unlink of another replica may have moved it).
async fn chat_rows<X: Tx>(
    tx: &mut X,
    chat_id: &str,
    event: &LarkEvent,
) -> Result<ChatRows, X::Fail> {
    let mut replied = None;
    for message_id in &event.replies_to {
        replied = tx.sent_for(message_id).await?;
        if replied.is_some() {
            break;
        }
    }
    let asked = match event.named_request() {
        Some(request_id) => tx.asked_in_chat(chat_id, request_id).await?,
        None => None,
    };
    let mut rows = ChatRows {
        chat: tx.chat(chat_id).await?,
        sessions: chat_sessions(tx, chat_id).await?,
        replied,
        asked,
        changes: None,
    };
    loop {
        let Some(target) = rows.target().map(|t| t.session.session_id.clone()) else {
            return Ok(rows);
        };
        let locked = tx.lock_session(&target).await?;
        rows.sessions = chat_sessions(tx, chat_id).await?;
        let still = rows.target().map(|t| t.session.session_id.clone());
        if still.as_deref() == Some(target.as_str()) {
            if let (Some(locked), Some(slot)) = (
                locked,
                rows.sessions
                    .iter_mut()
                    .find(|s| s.session.session_id == target),
            ) {
                slot.session = locked;
            }
            return Ok(rows);
        }
    }
}

/// What an incoming Lark message reads ([`EventRows`]).
async fn event_rows<X: Tx>(tx: &mut X, event: &LarkEvent) -> Result<EventRows, X::Fail> {
    let message_id = event.message_id.as_deref();
    if tx
        .event_seen(&event.app_id, &event.event_id, message_id)
        .await?
    {
        return Ok(EventRows {
            seen: true,
            ..EventRows::default()
        });
    }
    let pairing = match (event.link_code(), &event.chat_id) {
        (Some(code), Some(chat_id)) => pair_rows(tx, chat_id, code).await?,
        _ => PairRows::default(),
    };
    let chat = match &event.chat_id {
        Some(chat_id) => chat_rows(tx, chat_id, event).await?,
        None => ChatRows::default(),
    };
    let Some(session_id) = chat.target().map(|t| t.session.session_id.clone()) else {
        return Ok(EventRows {
            pairing,
            chat,
            ..EventRows::default()
        });
    };
    let request = match event.named_request() {
        Some(request_id) => tx.permission(&session_id, request_id).await?,
        None => None,
    };
    let mut chat = chat;
    if event.chat_command == Some(crate::decide::chat::ChatCommand::Changes) {
        chat.changes = tx.changes(&session_id).await?;
    }
    Ok(EventRows {
        seen: false,
        earlier: tx.earlier_turn(&session_id, &event.event_id).await?,
        chat,
        request,
        pairing,
    })
}

/// What a `/link <code>` from `chat_id` reads ([`PairRows`]): the code read
/// again under its session's lock (another replica may have spent it).
async fn pair_rows<X: Tx>(tx: &mut X, chat_id: &str, code: &str) -> Result<PairRows, X::Fail> {
    let hash = pairing::code_hash(code);
    let chat = tx.chat(chat_id).await?;
    let Some(found) = tx.pair_code(&hash).await? else {
        return Ok(PairRows {
            chat,
            ..PairRows::default()
        });
    };
    let session = tx.lock_session(&found.session_id).await?;
    Ok(PairRows {
        code: tx.pair_code(&hash).await?,
        session,
        link: tx.session_link(&found.session_id).await?,
        chat,
    })
}

/// Drives a step that never waits (the SQLite writer's, on its own thread)
/// to its end; one that would wait is the store's failure, not a hang.
pub(crate) fn at_once<T>(
    step: impl Future<Output = crate::error::Result<T>>,
) -> crate::error::Result<T> {
    let mut step = std::pin::pin!(step);
    match step.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(done) => done,
        Poll::Pending => Err(Error::store(
            "deciding",
            "a step of the writer's transaction waited",
        )),
    }
}
