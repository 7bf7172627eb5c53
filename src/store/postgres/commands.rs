//! Each [`Command`] to its PostgreSQL decision (the rows it loads and
//! locks, the rule it calls, the writes it applies) inside the call's
//! transaction; and the Lark outbox's bookkeeping, which no rule decides.

use sqlx::postgres::PgConnection;

use super::pool::Step;
use super::{cards, decisions, lark, outbox, permissions, reads};
use crate::decide;
use crate::ids::Minter;
use crate::store::{Command, Done};
use crate::time::now_ms;

/// Takes `command` on `conn`: what it decided.
pub(super) async fn command(
    conn: &mut PgConnection,
    command: &Command,
    minter: &Minter,
) -> Step<Done> {
    Ok(match command {
        Command::Register { thread } => {
            let inserted = sqlx::query(
                "insert into agent_threads (goal_id, agent_id, host_surface, host_session_id, registered_at)
                 values ($1, $2, $3, $4, $5) on conflict do nothing",
            )
            .bind(&thread.goal_id)
            .bind(&thread.agent_id)
            .bind(&thread.host_surface)
            .bind(&thread.host_session_id)
            .bind(now_ms())
            .execute(&mut *conn)
            .await?;
            Done::Register(Box::new(inserted.rows_affected() == 1))
        }
        Command::PreviewBind { bind } => {
            let rows = decisions::bind_rows(conn, bind).await?;
            Done::PreviewBind(Box::new(decide::session::check_bind(rows, bind)?))
        }
        Command::Bind { bind } => Done::Bind(Box::new(decisions::bind(conn, bind, minter).await?)),
        Command::Enqueue {
            session_id,
            message,
        } => Done::Enqueue(Box::new(
            decisions::enqueue(conn, session_id, message, minter).await?,
        )),
        Command::Claim {
            session_id,
            host,
            claim_id,
        } => Done::Claim(Box::new(
            decisions::claim(conn, session_id, host, claim_id).await?,
        )),
        Command::Complete {
            session_id,
            turn_id,
            completion,
        } => Done::Complete(Box::new(
            decisions::complete(conn, session_id, turn_id, completion).await?,
        )),
        Command::Release {
            session_id,
            claim_id,
            by,
        } => Done::Release(Box::new(
            decisions::release(conn, session_id, claim_id, by).await?,
        )),
        Command::Close {
            session_id,
            release_active_claim,
        } => Done::Close(Box::new(
            decisions::close(conn, session_id, *release_active_claim).await?,
        )),
        Command::CreatePermission {
            session_id,
            host,
            request,
        } => Done::CreatePermission(Box::new(
            permissions::create(conn, session_id, host, request).await?,
        )),
        Command::AnswerPermission {
            session_id,
            request_id,
            behavior,
            via,
        } => Done::AnswerPermission(Box::new(
            permissions::answer(conn, session_id, request_id, (*behavior, *via)).await?,
        )),
        Command::WithdrawPermission {
            session_id,
            request_id,
            host,
        } => Done::WithdrawPermission(Box::new(
            permissions::withdraw(conn, session_id, request_id, host).await?,
        )),
        Command::RelayedPermission {
            session_id,
            request_id,
            host,
        } => Done::RelayedPermission(Box::new(
            permissions::relayed(conn, session_id, request_id, host).await?,
        )),
        Command::ReportAgent {
            session_id,
            host,
            report,
        } => Done::ReportAgent(Box::new(
            decisions::report_agent(conn, session_id, host, report, minter).await?,
        )),
        Command::LapseAgent {
            session_id,
            stall_after_ms,
            now,
        } => Done::LapseAgent(Box::new(
            decisions::lapse_agent(conn, session_id, *stall_after_ms, *now).await?,
        )),
        Command::Notify {
            session_id,
            host,
            kind,
        } => Done::Notify(Box::new(
            decisions::notify(conn, session_id, host, *kind).await?,
        )),
        Command::LarkLink {
            session_id,
            chat_id,
            options,
        } => Done::LarkLink(Box::new(
            lark::link(conn, session_id, chat_id, options).await?,
        )),
        Command::LarkPairCode {
            session_id,
            code_hash,
        } => Done::LarkPairCode(Box::new(
            lark::pair_code(conn, session_id, code_hash).await?,
        )),
        Command::LarkUnlink { session_id } => {
            Done::LarkUnlink(Box::new(lark::unlink(conn, session_id).await?))
        }
        Command::LarkEvent { event } => {
            Done::LarkEvent(Box::new(lark::event(conn, event, minter).await?))
        }
        Command::LarkClick { click } => Done::LarkClick(Box::new(cards::click(conn, click).await?)),
        Command::RecordReply { outbound, update } => Done::RecordReply(Box::new(
            outbox::record(conn, outbound.clone(), update.clone()).await?,
        )),
        Command::LarkMessageSent {
            message_id,
            session_id,
            chat_id,
        } => {
            sqlx::query(crate::store::INSERT_SENT)
                .bind(message_id)
                .bind(session_id)
                .bind(chat_id)
                .bind(now_ms())
                .execute(&mut *conn)
                .await?;
            Done::LarkMessageSent(Box::new(()))
        }
        Command::LarkCardSent {
            session_id,
            request_id,
            message_id,
        } => Done::LarkCardSent(Box::new(
            cards::sent(conn, session_id, request_id, message_id).await?,
        )),
        Command::RecordCardUpdate { job, update } => Done::RecordCardUpdate(Box::new(
            cards::record(conn, job.clone(), update.clone()).await?,
        )),
        Command::PruneStep { cutoff_ms } => {
            Done::PruneStep(Box::new(reads::prune_step(conn, *cutoff_ms).await?))
        }
        Command::PutBlob { blob } => {
            sqlx::query(crate::store::UPSERT_BLOB)
                .bind(&blob.sha256)
                .bind(blob.bytes.len() as i64)
                .bind(blob.sniffed_type)
                .bind(blob.bytes.as_ref())
                .bind(blob.at)
                .execute(&mut *conn)
                .await?;
            Done::PutBlob(Box::new(()))
        }
        Command::LarkFetched { fetched } => {
            Done::LarkFetched(Box::new(lark::fetched(conn, fetched).await?))
        }
        Command::RecordFetch {
            turn_id,
            failures,
            next_attempt_at,
        } => {
            sqlx::query(crate::store::RECORD_FETCH)
                .bind(failures)
                .bind(next_attempt_at)
                .bind(turn_id)
                .execute(&mut *conn)
                .await?;
            Done::RecordFetch(Box::new(()))
        }
    })
}
