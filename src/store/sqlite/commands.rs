//! Each [`Command`] to its SQLite decision (the rows it loads, the rule it
//! calls, the writes it applies), on the writer's connection inside the
//! job's transaction; and the Lark outbox's bookkeeping, which no rule
//! decides.

use rusqlite::Connection;

use super::{cards, decisions, lark, permissions, sql};
use crate::decide;
use crate::error::Result;
use crate::ids::Minter;
use crate::model::RegisterAgentThread;
use crate::store::{Blob, CardUpdateJob, Command, Done, Outbound, ReplyUpdate};
use crate::time::now_ms;

/// Takes `command` on `conn`: what it decided.
pub(super) fn command(conn: &Connection, command: Command, minter: &Minter) -> Result<Done> {
    Ok(match command {
        Command::Register { thread } => Done::Register(Box::new(register(conn, &thread)?)),
        Command::PreviewBind { bind } => Done::PreviewBind(Box::new(decide::session::check_bind(
            decisions::bind_rows(conn, &bind)?,
            &bind,
        )?)),
        Command::Bind { bind } => Done::Bind(Box::new(decisions::bind(conn, bind, minter)?)),
        Command::Enqueue {
            session_id,
            message,
        } => Done::Enqueue(Box::new(decisions::enqueue(
            conn, session_id, message, minter,
        )?)),
        Command::Claim {
            session_id,
            host,
            claim_id,
        } => Done::Claim(Box::new(decisions::claim(
            conn, session_id, host, claim_id,
        )?)),
        Command::Complete {
            session_id,
            turn_id,
            completion,
        } => Done::Complete(Box::new(decisions::complete(
            conn, session_id, turn_id, completion,
        )?)),
        Command::Release {
            session_id,
            claim_id,
            by,
        } => Done::Release(Box::new(decisions::release(
            conn, session_id, claim_id, &by,
        )?)),
        Command::Close {
            session_id,
            release_active_claim,
        } => Done::Close(Box::new(decisions::close(
            conn,
            session_id,
            release_active_claim,
        )?)),
        Command::CreatePermission {
            session_id,
            host,
            request,
        } => Done::CreatePermission(Box::new(permissions::create(
            conn, session_id, host, request,
        )?)),
        Command::AnswerPermission {
            session_id,
            request_id,
            behavior,
            via,
        } => Done::AnswerPermission(Box::new(permissions::answer(
            conn,
            session_id,
            request_id,
            (behavior, via),
        )?)),
        Command::WithdrawPermission {
            session_id,
            request_id,
            host,
        } => Done::WithdrawPermission(Box::new(permissions::withdraw(
            conn, session_id, request_id, host,
        )?)),
        Command::RelayedPermission {
            session_id,
            request_id,
            host,
        } => Done::RelayedPermission(Box::new(permissions::relayed(
            conn, session_id, request_id, &host,
        )?)),
        Command::ReportAgent {
            session_id,
            host,
            report,
        } => Done::ReportAgent(Box::new(decisions::report_agent(
            conn, session_id, host, &report, minter,
        )?)),
        Command::LapseAgent {
            session_id,
            stall_after_ms,
            now,
        } => Done::LapseAgent(Box::new(decisions::lapse_agent(
            conn,
            &session_id,
            stall_after_ms,
            now,
        )?)),
        Command::Notify {
            session_id,
            host,
            kind,
        } => Done::Notify(Box::new(decisions::notify(conn, session_id, host, kind)?)),
        Command::LarkLink {
            session_id,
            chat_id,
            options,
        } => Done::LarkLink(Box::new(lark::link(conn, session_id, chat_id, options)?)),
        Command::LarkPairCode {
            session_id,
            code_hash,
        } => Done::LarkPairCode(Box::new(lark::pair_code(conn, &session_id, code_hash)?)),
        Command::LarkUnlink { session_id } => {
            Done::LarkUnlink(Box::new(lark::unlink(conn, session_id)?))
        }
        Command::LarkEvent { event } => {
            Done::LarkEvent(Box::new(lark::event(conn, event, minter)?))
        }
        Command::LarkClick { click } => Done::LarkClick(Box::new(cards::click(conn, click)?)),
        Command::RecordReply { outbound, update } => {
            Done::RecordReply(Box::new(record_reply(conn, outbound, &update)?))
        }
        Command::LarkMessageSent {
            message_id,
            session_id,
            chat_id,
        } => Done::LarkMessageSent(Box::new(message_sent(
            conn,
            &message_id,
            &session_id,
            &chat_id,
        )?)),
        Command::LarkCardSent {
            session_id,
            request_id,
            message_id,
        } => Done::LarkCardSent(Box::new(cards::sent(
            conn,
            &session_id,
            &request_id,
            &message_id,
        )?)),
        Command::RecordCardUpdate { job, update } => {
            Done::RecordCardUpdate(Box::new(record_card_update(conn, &job, &update)?))
        }
        Command::PruneStep { cutoff_ms } => {
            Done::PruneStep(Box::new(super::prune_step(conn, cutoff_ms)?))
        }
        Command::PutBlob { blob } => Done::PutBlob(Box::new(put_blob(conn, &blob)?)),
        Command::LarkFetched { fetched } => {
            Done::LarkFetched(Box::new(lark::fetched(conn, fetched)?))
        }
        Command::RecordFetch {
            turn_id,
            failures,
            next_attempt_at,
        } => {
            sql::query(crate::store::RECORD_FETCH)
                .bind(failures)
                .bind(next_attempt_at)
                .bind(&turn_id)
                .execute(conn)?;
            Done::RecordFetch(Box::new(()))
        }
    })
}

fn register(conn: &Connection, thread: &RegisterAgentThread) -> Result<bool> {
    let inserted = sql::query(
        "insert into agent_threads (goal_id, agent_id, host_surface, host_session_id, registered_at)
         values (?, ?, ?, ?, ?) on conflict do nothing",
    )
    .bind(&thread.goal_id)
    .bind(&thread.agent_id)
    .bind(&thread.host_surface)
    .bind(&thread.host_session_id)
    .bind(now_ms())
    .execute(conn)?;
    Ok(inserted.rows_affected() == 1)
}

fn record_reply(conn: &Connection, outbound: Outbound, update: &ReplyUpdate) -> Result<()> {
    let (statement, keys) = crate::store::record_outbox(outbound);
    let mut query = sql::query(statement)
        .bind(update.parts_sent)
        .bind(update.state)
        .bind(update.attempts)
        .bind(update.failures)
        .bind(update.error.clone())
        .bind(update.next_attempt_at)
        .bind(now_ms());
    for key in keys {
        query = query.bind(key);
    }
    query.execute(conn)?;
    Ok(())
}

fn message_sent(
    conn: &Connection,
    message_id: &str,
    session_id: &str,
    chat_id: &str,
) -> Result<()> {
    sql::query(crate::store::INSERT_SENT)
        .bind(message_id)
        .bind(session_id)
        .bind(chat_id)
        .bind(now_ms())
        .execute(conn)?;
    Ok(())
}

fn record_card_update(conn: &Connection, job: &CardUpdateJob, update: &ReplyUpdate) -> Result<()> {
    sql::query(cards::RECORD_CARD_UPDATE)
        .bind(update.state)
        .bind(update.attempts)
        .bind(update.failures)
        .bind(update.error.clone())
        .bind(update.next_attempt_at)
        .bind(&job.session_id)
        .bind(&job.request_id)
        .execute(conn)?;
    Ok(())
}

fn put_blob(conn: &Connection, blob: &Blob) -> Result<()> {
    sql::query(crate::store::UPSERT_BLOB)
        .bind(&blob.sha256)
        .bind(blob.bytes.len() as i64)
        .bind(blob.sniffed_type)
        .bind(blob.bytes.clone())
        .bind(blob.at)
        .execute(conn)?;
    Ok(())
}
