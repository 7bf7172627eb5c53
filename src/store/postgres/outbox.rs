//! The Lark outbox on PostgreSQL: due replies and permission messages taken
//! and leased in one statement per table (`for update skip locked`, so two
//! dispatchers never hold the same row); each attempt is recorded through
//! the decisions' transaction (`tx.rs`). It decides nothing about what is
//! sent.

use sqlx::Row;
use sqlx::postgres::PgPool;

use super::rows::utf8;
use crate::store::{FetchJob, OutboxRow, ReplyJob};

/// How long a dispatcher holds the replies it took before another may.
const REPLY_LEASE_MS: i64 = 30_000;
/// Takes and leases a batch of due replies (`$1` now, `$2` limit, `$3` lease).
const LEASE_REPLIES: &str = "with due as (
         select turn_id, next_attempt_at from lark_replies
         where state = 'pending' and next_attempt_at <= $1
         order by next_attempt_at limit $2
         for update skip locked
     )
     update lark_replies r set next_attempt_at = $1 + $3
     from due where r.turn_id = due.turn_id
     returning r.turn_id as key, r.message_id as target, r.chat_id, r.text, r.parts_sent,
               r.attempts, r.failures, due.next_attempt_at as due_at, r.session_id,
               1::bigint as reply,
               (select s.goal_id || ' · ' || s.agent_id from sessions s
                where s.session_id = r.session_id) as title";
/// The same for permission-request messages.
const LEASE_PERMISSION_MESSAGES: &str = "with due as (
         select session_id, request_id, next_attempt_at from lark_permission_messages
         where state = 'pending' and next_attempt_at <= $1
         order by next_attempt_at limit $2
         for update skip locked
     )
     update lark_permission_messages m set next_attempt_at = $1 + $3
     from due where m.session_id = due.session_id and m.request_id = due.request_id
     returning m.session_id as key, m.request_id as target, m.chat_id, m.text, m.parts_sent,
               m.attempts, m.failures, due.next_attempt_at as due_at, m.session_id,
               1::bigint as reply, null::text as title";

/// The same for the broker's answers to commands.
const LEASE_NOTES: &str = "with due as (
         select message_id, next_attempt_at from lark_notes
         where state = 'pending' and next_attempt_at <= $1
         order by next_attempt_at limit $2
         for update skip locked
     )
     update lark_notes n set next_attempt_at = $1 + $3
     from due where n.message_id = due.message_id
     returning n.message_id as key, n.message_id as target, n.chat_id, n.text, n.parts_sent,
               n.attempts, n.failures, due.next_attempt_at as due_at, n.session_id, n.reply,
               null::text as title";

/// Due replies, permission messages and notes, oldest first, each leased to this
/// dispatcher for [`REPLY_LEASE_MS`].
pub(super) async fn due(pool: &PgPool, now_ms: i64, limit: u32) -> sqlx::Result<Vec<ReplyJob>> {
    // Each table's due rows are taken and leased in one statement: rows
    // another dispatcher holds are skipped, and the lease keeps them from
    // the next batch of anyone.
    let mut jobs = Vec::new();
    for (statement, kind) in [
        (LEASE_REPLIES, "reply"),
        (LEASE_PERMISSION_MESSAGES, "permission"),
        (LEASE_NOTES, "note"),
    ] {
        let rows = sqlx::query(statement)
            .bind(now_ms)
            .bind(i64::from(limit))
            .bind(REPLY_LEASE_MS)
            .fetch_all(pool)
            .await?;
        for row in rows {
            jobs.push((
                row.try_get::<i64, _>("due_at")?,
                OutboxRow {
                    kind: kind.to_owned(),
                    key: row.try_get("key")?,
                    target: row.try_get("target")?,
                    chat_id: row.try_get("chat_id")?,
                    text: utf8(&row, "text")?,
                    parts_sent: row.try_get("parts_sent")?,
                    attempts: row.try_get("attempts")?,
                    failures: row.try_get("failures")?,
                    session_id: row.try_get("session_id")?,
                    title: row.try_get("title")?,
                    reply: row.try_get("reply")?,
                }
                .job(),
            ));
        }
    }
    // Oldest first over both; the rest of a batch over `limit` stays
    // leased and is sent after the lease, as after a dispatcher's death.
    jobs.sort_by_key(|(due_at, _)| *due_at);
    Ok(jobs.into_iter().map(|(_, job)| job).collect())
}

/// Takes and leases due download jobs (`$1` now, `$2` limit, `$3` lease).
const LEASE_FETCHES: &str = "with due as (
         select turn_id, next_attempt_at from lark_fetches
         where next_attempt_at <= $1
         order by next_attempt_at limit $2
         for update skip locked
     )
     update lark_fetches f set next_attempt_at = $1 + $3
     from due where f.turn_id = due.turn_id
     returning f.turn_id, f.session_id, f.message_id, f.resources, f.failures";

/// Due download jobs, each leased to this replica for
/// [`crate::store::FETCH_LEASE_MS`] (a replica that dies mid-download
/// leaves it to another after the lease).
pub(super) async fn due_fetches(
    pool: &PgPool,
    now_ms: i64,
    limit: u32,
) -> sqlx::Result<Vec<FetchJob>> {
    sqlx::query_as(LEASE_FETCHES)
        .bind(now_ms)
        .bind(i64::from(limit))
        .bind(crate::store::FETCH_LEASE_MS)
        .fetch_all(pool)
        .await
}
