//! Permission cards due for their final form on PostgreSQL, taken and
//! leased like replies.

use sqlx::postgres::PgPool;

use crate::store::CardUpdateJob;

/// How long a dispatcher holds the card updates it took before another may.
const LEASE_MS: i64 = 30_000;

/// Takes and leases the cards whose request was settled after they were
/// sent and that are not updated yet (`$1` now, `$2` limit, `$3` lease).
const LEASE_CARD_UPDATES: &str = "with due as (
         select m.session_id, m.request_id from lark_permission_messages m
         join permission_requests p
             on p.session_id = m.session_id and p.request_id = m.request_id
         where m.update_state = 'pending' and m.message_id is not null
             and m.update_next_at <= $1 and p.state <> 'pending'
         order by m.update_next_at limit $2
         for update of m skip locked
     )
     update lark_permission_messages m set update_next_at = $1 + $3
     from due where m.session_id = due.session_id and m.request_id = due.request_id
     returning m.session_id, m.request_id, m.chat_id, m.message_id, m.answered_by,
               m.update_attempts, m.update_failures";

pub(super) async fn due(
    pool: &PgPool,
    now_ms: i64,
    limit: u32,
) -> sqlx::Result<Vec<CardUpdateJob>> {
    sqlx::query_as(LEASE_CARD_UPDATES)
        .bind(now_ms)
        .bind(i64::from(limit))
        .bind(LEASE_MS)
        .fetch_all(pool)
        .await
}
