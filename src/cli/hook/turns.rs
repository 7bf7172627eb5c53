//! `stop` and `session-end`: people's messages at the end of each turn.
//!
//! Which turn a previous `stop` delivered is the broker's to say, not a local
//! file's: it is the active claim this host identity holds, which only the
//! same host identity can see (a claim answers 409 `claim_active` with its
//! id, and claiming with that id again replays its turn). A hook's claim ids
//! start with `hook-` and end with a fingerprint of the agent's turn when
//! the turn was delivered, so a `stop` repeated with the same input delivers
//! the same turn again instead of answering it with the answer to the turn
//! before, while two turns that ended with the same words are told apart.
//! Where a waker types into the agent, `stop` answers the turn it held and
//! hands nothing over: the waker types the next message in once the turn
//! has ended ([`crate::cli::wake::Seat::typed_in`]).

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::{Failure, Hook};
use crate::client::ClientError;
use crate::model::{
    AgentState, ClaimAnswer, ClaimRequest, Claimed, CompleteRequest, Origin, ReleaseRequest,
    ReportAgentState, TurnState,
};

/// The longest parked wait for a message (the broker's cap).
const MAX_WAIT_SECONDS: u64 = 1800;
const CLAIM_PREFIX: &str = "hook-";
/// The fingerprint of a typed turn's claim: never one of a `stop`'s, so the
/// `stop` that ends the typed turn answers it.
const TYPED: &str = "typed";

/// What this host identity holds on the session.
enum Holding {
    /// A turn a hook delivered (its claim replayed).
    Delivered(Claimed),
    /// A turn someone else of this host holds (a `loopx mcp` bridge).
    Other,
    /// Nothing: a fresh turn was claimed by the probe, or nothing is queued.
    Nothing(Option<Claimed>),
}

/// The Stop hook (HOOKS.md "stop").
pub async fn stop(hook: &Hook) -> Result<Option<String>, Failure> {
    let last = hook.field("last_assistant_message").unwrap_or_default();
    let fingerprint = fingerprint(hook);
    let typed_in = hook.seat().typed_in() || hook.bridged();
    let fresh = match holding(hook, &fingerprint, 0).await? {
        // The Codex bridge delivered the turn: it answers it.
        Holding::Other if hook.bridged() => return blocked(hook, None).await,
        Holding::Other => return Err("another bridge of this host holds a turn".into()),
        Holding::Nothing(claimed) => claimed,
        Holding::Delivered(held) if claim_fingerprint(&held.claim_id) == fingerprint => {
            // This stop ran before (the same last message): the same turn
            // again.
            return blocked(hook, Some(held)).await;
        }
        Holding::Delivered(held) => {
            hand_back(hook, &held, last).await?;
            match holding(hook, &fingerprint, 0).await? {
                Holding::Nothing(claimed) => claimed,
                _ => return Err("the session still holds a turn".into()),
            }
        }
    };
    let claimed = match fresh {
        // A waker types into this agent: the message goes back to the front
        // of the queue and is typed in once the turn has ended, as the
        // person's prompt would be (a Stop block shows at the terminal as a
        // hook's error).
        Some(claimed) if typed_in => {
            release(hook, &claimed.session_id, &claimed.claim_id).await?;
            None
        }
        Some(claimed) => Some(claimed),
        None if typed_in => None,
        None => wait(hook, &fingerprint).await?,
    };
    blocked(hook, claimed).await
}

/// Reports the agent's state and blocks with `claimed`, if any.
async fn blocked(hook: &Hook, claimed: Option<Claimed>) -> Result<Option<String>, Failure> {
    let state = match claimed {
        Some(_) => AgentState::Working,
        None => AgentState::Waiting,
    };
    hook.send_report(answered(hook, state)).await?;
    let files = match &claimed {
        Some(c) => saved_files(hook, c).await,
        None => Vec::new(),
    };
    Ok(claimed.as_ref().map(|c| block(c, &files)))
}

/// The turn's files, saved in the data dir's private attachments folder.
async fn saved_files(hook: &Hook, claimed: &Claimed) -> Vec<crate::cli::attachments::Saved> {
    let root = crate::cli::attachments::default_root(&hook.connection.data_dir());
    crate::cli::attachments::save(
        &hook.client,
        &root,
        &claimed.session_id,
        &claimed.turn.turn_id,
        &claimed.turn.attachments,
    )
    .await
}

/// A report of `state` that also answers the turn typed at the terminal,
/// if one is open, with the agent's last message (the broker ignores it
/// otherwise, and a repeat finds the turn answered).
fn answered(hook: &Hook, state: AgentState) -> ReportAgentState {
    ReportAgentState {
        answer: Some(
            hook.field("last_assistant_message")
                .unwrap_or_default()
                .to_owned(),
        ),
        ..hook.report_of(state)
    }
}

/// The UserPromptSubmit hook: the agent works on a prompt. A prompt a waker
/// typed for a queued turn (its marker names the turn) delivers that turn
/// now, claimed as a hook's: `stop` answers it at the end of this turn. A
/// prompt the person typed at the terminal becomes a turn of the session's
/// transcript (`origin: "terminal"`), never queued or claimed, which `stop`
/// answers with the agent's last message.
pub async fn prompt_submitted(hook: &Hook) -> Result<Option<String>, Failure> {
    let prompt = hook.field("prompt").unwrap_or_default();
    let report = match typed_by_waker(hook, prompt).await? {
        Some(seq) => {
            take_typed(hook, seq).await?;
            hook.report_of(AgentState::Working)
        }
        // An agent that runs this hook for a block it goes on with: the
        // delivered message is a turn already.
        None if is_block(prompt) => hook.report_of(AgentState::Working),
        None => ReportAgentState {
            prompt: Some(crate::broker::fit_text(prompt.to_owned()))
                .filter(|p| !p.trim().is_empty()),
            ..hook.report_of(AgentState::Working)
        },
    };
    hook.send_report(report).await?;
    Ok(None)
}

/// The turn a waker typed `prompt` for: its marker names it and the
/// waker's record says that is what it typed, whole. A marker typed at the
/// terminal by hand is the person's own prompt.
async fn typed_by_waker(hook: &Hook, prompt: &str) -> Result<Option<i64>, Failure> {
    use crate::cli::wake::{records_dir, text};
    let Some(seq) = text::typed_seq(prompt) else {
        return Ok(None);
    };
    let session_id = hook.host.session_id().await?;
    let dir = records_dir(&hook.connection.data_dir());
    match text::Record::read(&dir, &session_id) {
        Some(record) if record.delivers(prompt) => {
            text::Record::forget(&dir, &session_id);
            Ok(Some(seq))
        }
        _ => Ok(None),
    }
}

/// Claims the typed turn: the oldest queued, which is the one typed; any
/// other (the queue changed meanwhile) is handed straight back.
async fn take_typed(hook: &Hook, seq: i64) -> Result<(), Failure> {
    let session_id = hook.host.session_id().await?;
    let claim_id = format!("{CLAIM_PREFIX}{}-{TYPED}", ulid::Ulid::new());
    let claimed = match claim(hook, &session_id, &claim_id, 0).await {
        // The Codex bridge started this turn with the message it holds.
        Err(ClientError::Refused { error, .. })
            if error
                .error
                .active_claim_id
                .as_deref()
                .is_some_and(|id| id.starts_with(crate::cli::codex::CLAIM_PREFIX)) =>
        {
            return Ok(());
        }
        claimed => claimed.map_err(problem)?,
    };
    match claimed {
        ClaimAnswer::Claimed(c) if c.turn_state == TurnState::Claimed && c.turn.seq == seq => {
            Ok(())
        }
        ClaimAnswer::Claimed(c) if c.turn_state == TurnState::Claimed => {
            release(hook, &session_id, &claim_id).await?;
            Err(format!(
                "message {seq} was typed, but {} is the oldest queued",
                c.turn.seq
            ))
        }
        _ => Err(format!(
            "message {seq} was typed, but it is no longer queued"
        )),
    }
}

/// Nothing queued: parked up to `--wait-seconds` (default 0) for a message.
async fn wait(hook: &Hook, fingerprint: &str) -> Result<Option<Claimed>, Failure> {
    let seconds = hook.wait_seconds.unwrap_or(0).min(MAX_WAIT_SECONDS);
    if seconds == 0 {
        return Ok(None);
    }
    hook.send_report(answered(hook, AgentState::Waiting))
        .await?;
    match holding(hook, fingerprint, seconds).await? {
        Holding::Nothing(claimed) => Ok(claimed),
        _ => Err("another claim took the session meanwhile".into()),
    }
}

/// The SessionEnd hook: a delivered turn not answered goes back to the
/// front of the queue; the agent is away. A session whose agent left closes
/// itself a while later with nothing waiting (the broker's
/// `--close-exited-after`), unless the same terminal's next session
/// continues it first (`/clear`, a restart).
pub async fn session_end(hook: &Hook) -> Result<Option<String>, Failure> {
    let session_id = hook.host.session_id().await?;
    if let Some(active) = active_claim(hook, &session_id).await?
        && active.starts_with(CLAIM_PREFIX)
    {
        release(hook, &session_id, &active).await?;
    }
    if hook.field("reason") != Some("clear") {
        // After `/clear` the agent goes on, in the session that continues
        // this one.
        hook.report(AgentState::Away).await?;
    }
    Ok(None)
}

/// Looks at what the host holds by claiming with a fresh hook claim id
/// (parked up to `wait_seconds`): a fresh turn, nothing, or the held claim.
async fn holding(hook: &Hook, fingerprint: &str, wait_seconds: u64) -> Result<Holding, Failure> {
    let session_id = hook.host.session_id().await?;
    let claim_id = format!("{CLAIM_PREFIX}{}-{fingerprint}", ulid::Ulid::new());
    match claim(hook, &session_id, &claim_id, wait_seconds).await {
        Ok(ClaimAnswer::Claimed(c)) if c.turn_state == TurnState::Claimed => {
            Ok(Holding::Nothing(Some(c)))
        }
        Ok(_) => Ok(Holding::Nothing(None)),
        Err(ClientError::Refused { error, .. }) if error.error.active_claim_id.is_some() => {
            let active = error.error.active_claim_id.unwrap_or_default();
            if !active.starts_with(CLAIM_PREFIX) {
                return Ok(Holding::Other);
            }
            match claim(hook, &session_id, &active, 0)
                .await
                .map_err(problem)?
            {
                ClaimAnswer::Claimed(c) if c.turn_state == TurnState::Claimed => {
                    Ok(Holding::Delivered(c))
                }
                _ => Ok(Holding::Nothing(None)),
            }
        }
        Err(e) => Err(problem(e)),
    }
}

/// The claim id this host holds on the session, if any (the claim it would
/// be refused with).
async fn active_claim(hook: &Hook, session_id: &str) -> Result<Option<String>, Failure> {
    // A claim id of its own: a turn it takes is handed straight back.
    let probe = format!("{CLAIM_PREFIX}{}-end", ulid::Ulid::new());
    match claim(hook, session_id, &probe, 0).await {
        Ok(ClaimAnswer::Claimed(_)) => {
            release(hook, session_id, &probe).await?;
            Ok(None)
        }
        Ok(ClaimAnswer::NotClaimed(_)) => Ok(None),
        Err(ClientError::Refused { error, .. }) if error.error.active_claim_id.is_some() => {
            Ok(error.error.active_claim_id)
        }
        Err(e) => Err(problem(e)),
    }
}

/// Answers the held turn with the agent's last message (the completion id
/// derived from the turn: a repeat is a replay); an empty last message
/// releases it instead.
async fn hand_back(hook: &Hook, held: &Claimed, last: &str) -> Result<(), Failure> {
    if last.trim().is_empty() {
        return release(hook, &held.session_id, &held.claim_id).await;
    }
    let mut response = Map::new();
    response.insert("message".into(), Value::String(last.to_owned()));
    let completion = CompleteRequest {
        host_surface: hook.host_surface.clone(),
        host_session_id: hook.host_session_id.clone(),
        claim_id: held.claim_id.clone(),
        completion_id: format!("hook-stop-{}", held.turn.turn_id),
        response,
    };
    hook.client
        .complete(&held.session_id, &held.turn.turn_id, &completion)
        .await
        .map_err(problem)?;
    Ok(())
}

async fn release(hook: &Hook, session_id: &str, claim_id: &str) -> Result<(), Failure> {
    let host = ReleaseRequest::host(&hook.host_surface, &hook.host_session_id);
    hook.client
        .release(session_id, claim_id, &host)
        .await
        .map_err(problem)?;
    Ok(())
}

async fn claim(
    hook: &Hook,
    session_id: &str,
    claim_id: &str,
    wait_seconds: u64,
) -> Result<ClaimAnswer, ClientError> {
    let request = ClaimRequest {
        host_surface: hook.host_surface.clone(),
        host_session_id: hook.host_session_id.clone(),
        claim_id: claim_id.to_owned(),
        wait_seconds,
    };
    Ok(hook.client.claim(session_id, &request).await?.body)
}

fn problem(error: ClientError) -> Failure {
    super::Problem::from(error).log_line()
}

/// How a block's reason begins ([`block`]).
const BLOCK_OPENING: &str = "New message from ";

/// Whether `prompt` is the reason of a [`block`].
fn is_block(prompt: &str) -> bool {
    prompt.starts_with(BLOCK_OPENING) && prompt.contains("(LoopX session ")
}

/// The Stop hook's block: the message as the model's next instruction, who
/// wrote it, the files sent with it (saved on this host), and that this
/// turn's final message goes back to them.
pub fn block(claimed: &Claimed, files: &[crate::cli::attachments::Saved]) -> String {
    let who = match claimed.turn.origin {
        Origin::Web => "a person on the LoopX Web page",
        Origin::Lark => "a person in Lark",
        Origin::Terminal => "the person at your terminal",
    };
    let reason = format!(
        "{BLOCK_OPENING}{who} (LoopX session {session}, message {seq}):\n\n{text}\n\n\
         Work on it now. The final message of this turn is sent back to them as your answer.",
        session = claimed.session_id,
        seq = claimed.turn.seq,
        text = crate::cli::attachments::with_files(&claimed.turn.text, files),
    );
    json!({"decision": "block", "reason": reason}).to_string()
}

/// A short fingerprint of the turn that just ended: its last message, the
/// agent's `turn_id` (Codex) and the length of its transcript. A model may
/// answer two messages with the same words ("Done."), but the transcript
/// grows between them (the delivered message and the answer are written to
/// it), while a `stop` run again with the same input sees the same length.
fn fingerprint(hook: &Hook) -> String {
    let transcript = hook
        .field("transcript_path")
        .and_then(|path| std::fs::metadata(path).ok())
        .map_or(0, |meta| meta.len());
    let mut digest = Sha256::new();
    for part in [
        hook.field("last_assistant_message").unwrap_or_default(),
        hook.field("turn_id").unwrap_or_default(),
    ] {
        digest.update(part.as_bytes());
        digest.update([0]);
    }
    digest.update(transcript.to_le_bytes());
    hex::encode(&digest.finalize()[..6])
}

/// The fingerprint a hook claim id carries.
fn claim_fingerprint(claim_id: &str) -> &str {
    claim_id.rsplit('-').next().unwrap_or_default()
}
