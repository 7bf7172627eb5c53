//! The plain reads ([`Read`](super::Read)), written once for both stores:
//! the statements they run and what they answer from the rows (a 404 for
//! an unknown session, a page and whether more follow, a count). A store
//! gives them [`Rows`]: how it runs a [`Statement`] on its read
//! connections, how its rows decode into the store's rows, and the three
//! reads whose SQL is its own (PostgreSQL leases the due Lark jobs to the
//! replica that takes them; SQLite's one broker just selects them).

use async_trait::async_trait;
use sqlx::FromRow;

use super::statement::Statement;
use super::{AttachmentBytes, CardUpdateJob, FetchJob, Reader, ReplyJob, TurnPage};
use crate::decide::{self, EventRow, SessionRow, TurnRow};
use crate::devices::DeviceRow;
use crate::error::Result;
use crate::model::{LarkLink, ListSessions, ListTurns, PermissionState};
use crate::permission::{self, PermissionRow};
use crate::push::PushSubscriptionRow;

/// [`Reader::queue_stats`]: how many turns are queued over all sessions,
/// and when the oldest was enqueued, through a partial index of the queued
/// turns that the claims keep anyway (`turns_queued` on SQLite,
/// `turns_queued_at` on PostgreSQL): a scrape scans no whole table, and the
/// hot path keeps no index for it (an index on the sessions' `queued_count`
/// cost an index write per enqueue and claim, and on PostgreSQL made them
/// full updates of the session row: SQLite's migration 0014, PostgreSQL's
/// 0042).
pub(crate) const QUEUE_STATS: &str =
    "select count(*), min(enqueued_at) from turns where state = 'queued'";

/// The devices signed in, oldest first (at most [`crate::devices::MAX_DEVICES`]).
const DEVICES: &str = "select device_id, name, created_at, last_seen_at from devices \
     order by created_at, device_id";
/// The device whose credential's hash is `$1`.
const DEVICE_BY_TOKEN: &str =
    "select device_id, name, created_at, last_seen_at from devices where token_hash = $1";

/// A caller's (`$1`, null for the owner) push subscriptions, oldest first.
const PUSH_SUBSCRIPTIONS: &str = "select subscription_id, device_id, endpoint, p256dh, auth, \
     created_at from push_subscriptions where coalesce(device_id, '') = coalesce($1, '') \
     order by created_at, subscription_id";

/// Every push subscription, oldest first.
const ALL_PUSH_SUBSCRIPTIONS: &str = "select subscription_id, device_id, endpoint, p256dh, auth, \
     created_at from push_subscriptions order by created_at, subscription_id";

/// What a store gives the plain reads.
#[async_trait]
pub(crate) trait Rows: Sync {
    /// A row as the store's driver returns it.
    type Row: sqlx::Row;

    /// The rows `statement` selects, each decoded by `decode`.
    async fn rows<T: Send + 'static>(
        &self,
        statement: Statement,
        decode: for<'r> fn(&'r Self::Row) -> sqlx::Result<T>,
    ) -> Result<Vec<T>>;

    /// A session's row (`session_columns!`).
    fn session_row(row: &Self::Row) -> sqlx::Result<SessionRow>;
    /// A turn's row with its reply's state (`turn_readback!`).
    fn turn_row(row: &Self::Row) -> sqlx::Result<TurnRow>;
    /// A permission request's row (`permission_columns!`).
    fn permission_row(row: &Self::Row) -> sqlx::Result<PermissionRow>;

    /// [`Reader::due_replies`].
    async fn replies_due(&self, now_ms: i64, limit: u32) -> Result<Vec<ReplyJob>>;
    /// [`Reader::due_card_updates`].
    async fn card_updates_due(&self, now_ms: i64, limit: u32) -> Result<Vec<CardUpdateJob>>;
    /// [`Reader::due_fetches`].
    async fn fetches_due(&self, now_ms: i64, limit: u32) -> Result<Vec<FetchJob>>;

    /// The first row `statement` selects, if any.
    async fn first<T: Send + 'static>(
        &self,
        statement: Statement,
        decode: for<'r> fn(&'r Self::Row) -> sqlx::Result<T>,
    ) -> Result<Option<T>> {
        Ok(self.rows(statement, decode).await?.into_iter().next())
    }
}

/// A session's (`$1`) latest `$2` turns' files, newest first.
const TURN_CHANGES: &str = "select turn_id, files from turn_changes where session_id = $1 \
     order by updated_at desc, turn_id desc limit $2";

const SESSION: &str = concat!(
    "select ",
    session_columns!(),
    " from sessions where session_id = $1"
);
/// A filter left out (null) matches every session.
const SESSIONS: &str = concat!(
    "select ",
    session_columns!(),
    " from sessions
     where (cast($1 as text) is null or state = $1) and (cast($2 as text) is null or goal_id = $2)
       and (cast($3 as text) is null or agent_id = $3)
       and (cast($4 as text) is null or session_id > $4)
     order by session_id limit $5"
);
const PERMISSION: &str = concat!(
    "select ",
    permission_columns!(),
    " from permission_requests where session_id = $1 and request_id = $2"
);
/// The page's sessions (a range of ids) that have a pending request: the
/// primary key's `session_id` prefix bounds the scan.
const ASKING: &str = "select distinct session_id from permission_requests
     where session_id >= $1 and session_id <= $2 and state = 'pending'";
const PERMISSIONS: &str = concat!(
    "select ",
    permission_columns!(),
    " from permission_requests
     where session_id = $1 and (cast($2 as text) is null or state = $2)
     order by state = 'pending' desc, created_at desc, request_id desc limit $3"
);
/// `$1` waiting cut-off, `$2` the silence that counts, `$3` working cut-off
/// ([`Reader::silent_sessions`]).
const SILENT_SESSIONS: &str = "select session_id from sessions
     where state = 'open' and (
       (agent_state = 'waiting' and agent_heard_at <= $1
         and (agent_since is null or agent_since < agent_heard_at + $2))
       or (agent_state = 'working' and stalled_at is null and agent_heard_at <= $3))";
/// `$1` the exit cut-off ([`Reader::exited_sessions`]): open, the agent
/// reported `away` (only a host's own word stores it: its SessionEnd)
/// before it, nothing queued or held.
const EXITED_SESSIONS: &str = "select session_id from sessions
     where state = 'open' and agent_state = 'away' and agent_since <= $1
       and queued_count = 0 and active_claim_id is null";
const NEXT_EVENT_NO: &str = "select next_event_no from sessions where session_id = $1";
const EVENTS: &str = "select event_no, kind, turn_id, seq, request_id, state, at \
     from session_events where session_id = $1 and event_no > $2 order by event_no limit $3";
const TURN: &str = concat!(
    turn_readback!(),
    " where t.session_id = $1 and t.turn_id = $2"
);
/// A page of turns after `$2` (and before `$3`, if given), oldest first,
/// `$4` of them.
const TURNS_FORWARD: &str = concat!(
    turn_readback!(),
    " where t.session_id = $1 and t.seq > $2 and (cast($3 as bigint) is null or t.seq < $3)
     order by t.seq limit $4"
);
/// A page of turns back from `$3`, newest first, `$4` of them (`$2` unused).
const TURNS_BACKWARD: &str = concat!(
    turn_readback!(),
    " where t.session_id = $1 and t.seq < $3 order by t.seq desc limit $4"
);

/// An id that can name no stored row: every stored id is a minted one or a
/// checked client id, neither of which holds U+0000 (which PostgreSQL text
/// refuses outright, so asking would be a store error instead of a 404).
pub fn unstorable(id: &str) -> bool {
    id.contains('\0')
}

/// [`Reader::held_sessions`]'s extra column.
#[derive(FromRow)]
pub struct HeldSince {
    holder_claimed_at: i64,
}

/// One column.
type Only<T> = (T,);

/// A session's latest report of its working tree as kept (its body and
/// when); 404 for an unknown session.
async fn kept_changes<R>(rows: &R, session_id: &str) -> Result<Option<(Vec<u8>, i64)>>
where
    R: Rows,
    for<'r> (Vec<u8>, i64): FromRow<'r, R::Row>,
{
    let session = Statement::new(SESSION).bind(session_id);
    let session = match unstorable(session_id) {
        true => None,
        false => rows.first(session, R::session_row).await?,
    };
    decide::existing(session)?;
    let select = Statement::new(super::KEPT_CHANGES).bind(session_id);
    rows.first(select, |row| <(Vec<u8>, i64)>::from_row(row))
        .await
}

/// The reads, for any store that gives [`Rows`].
#[async_trait]
impl<'a, R> Reader<'a> for R
where
    R: Rows,
    for<'r> Only<i64>: FromRow<'r, R::Row>,
    for<'r> Only<Option<i64>>: FromRow<'r, R::Row>,
    for<'r> Only<String>: FromRow<'r, R::Row>,
    for<'r> (i64, Option<i64>): FromRow<'r, R::Row>,
    for<'r> (String, String, i64): FromRow<'r, R::Row>,
    for<'r> EventRow: FromRow<'r, R::Row>,
    for<'r> AttachmentBytes: FromRow<'r, R::Row>,
    for<'r> HeldSince: FromRow<'r, R::Row>,
    for<'r> DeviceRow: FromRow<'r, R::Row>,
    for<'r> PushSubscriptionRow: FromRow<'r, R::Row>,
    for<'r> (Vec<u8>, i64): FromRow<'r, R::Row>,
    for<'r> (String, Vec<u8>): FromRow<'r, R::Row>,
{
    async fn all_push_subscriptions(&self) -> Result<Vec<PushSubscriptionRow>> {
        let select = Statement::new(ALL_PUSH_SUBSCRIPTIONS);
        self.rows(select, |row| PushSubscriptionRow::from_row(row))
            .await
    }

    async fn push_subscriptions(
        &self,
        device_id: Option<&'a str>,
    ) -> Result<Vec<PushSubscriptionRow>> {
        let select = Statement::new(PUSH_SUBSCRIPTIONS).bind(device_id);
        self.rows(select, |row| PushSubscriptionRow::from_row(row))
            .await
    }

    async fn devices(&self) -> Result<Vec<DeviceRow>> {
        let select = Statement::new(DEVICES);
        self.rows(select, |row| DeviceRow::from_row(row)).await
    }

    async fn device_by_token(&self, token_hash: &'a str) -> Result<Option<DeviceRow>> {
        let select = Statement::new(DEVICE_BY_TOKEN).bind(token_hash);
        self.first(select, |row| DeviceRow::from_row(row)).await
    }

    async fn session(&self, session_id: &'a str) -> Result<Option<SessionRow>> {
        if unstorable(session_id) {
            return Ok(None);
        }
        let select = Statement::new(SESSION).bind(session_id);
        self.first(select, R::session_row).await
    }

    async fn sessions(&self, filter: ListSessions, limit: u32) -> Result<Vec<SessionRow>> {
        let select = Statement::new(SESSIONS)
            .bind(filter.state)
            .bind(filter.goal_id.as_deref())
            .bind(filter.agent_id.as_deref())
            .bind(filter.cursor.as_deref())
            .bind(i64::from(limit));
        self.rows(select, R::session_row).await
    }

    async fn silent_sessions(&self, away_before: i64, stalled_before: i64) -> Result<Vec<String>> {
        let select = Statement::new(SILENT_SESSIONS)
            .bind(away_before)
            .bind(crate::decide::presence::AWAY_AFTER_MS)
            .bind(stalled_before);
        let ids = self
            .rows(select, |row| Only::<String>::from_row(row))
            .await?;
        Ok(ids.into_iter().map(|(id,)| id).collect())
    }

    async fn exited_sessions(&self, left_before: i64) -> Result<Vec<String>> {
        let select = Statement::new(EXITED_SESSIONS).bind(left_before);
        let ids = self
            .rows(select, |row| Only::<String>::from_row(row))
            .await?;
        Ok(ids.into_iter().map(|(id,)| id).collect())
    }

    async fn held_sessions(&self) -> Result<Vec<(SessionRow, i64)>> {
        let select = Statement::new(super::HELD_SESSIONS);
        self.rows(select, |row| {
            Ok((
                R::session_row(row)?,
                HeldSince::from_row(row)?.holder_claimed_at,
            ))
        })
        .await
    }

    async fn asking_sessions(&self, first: &'a str, last: &'a str) -> Result<Vec<String>> {
        if unstorable(first) || unstorable(last) {
            return Ok(Vec::new());
        }
        let select = Statement::new(ASKING).bind(first).bind(last);
        let ids = self
            .rows(select, |row| Only::<String>::from_row(row))
            .await?;
        Ok(ids.into_iter().map(|(id,)| id).collect())
    }

    async fn permission(&self, session_id: &'a str, request_id: &'a str) -> Result<PermissionRow> {
        let session = self.session(session_id).await?;
        let request = if unstorable(request_id) {
            None
        } else {
            let select = Statement::new(PERMISSION).bind(session_id).bind(request_id);
            self.first(select, R::permission_row).await?
        };
        decide::item(session, request, "permission request")
    }

    async fn permissions(
        &self,
        session_id: &'a str,
        state: Option<PermissionState>,
    ) -> Result<Vec<PermissionRow>> {
        decide::existing(self.session(session_id).await?)?;
        let select = Statement::new(PERMISSIONS)
            .bind(session_id)
            .bind(state)
            .bind(i64::from(permission::LIST_LIMIT));
        self.rows(select, R::permission_row).await
    }

    async fn lark_link_status(&self, session_id: &'a str) -> Result<LarkLink> {
        decide::existing(self.session(session_id).await?)?;
        let select = Statement::new(super::LINK_STATUS).bind(session_id);
        let link = self
            .first(select, |row| <(String, String, i64)>::from_row(row))
            .await?;
        Ok(LarkLink::stored(session_id, link))
    }

    async fn due_replies(&self, now_ms: i64, limit: u32) -> Result<Vec<ReplyJob>> {
        self.replies_due(now_ms, limit).await
    }

    async fn next_reply_due(&self) -> Result<Option<i64>> {
        let select = Statement::new(super::NEXT_OUTBOX_DUE);
        let due = self.first(select, |row| Only::<Option<i64>>::from_row(row));
        Ok(due.await?.and_then(|(at,)| at))
    }

    async fn due_card_updates(&self, now_ms: i64, limit: u32) -> Result<Vec<CardUpdateJob>> {
        self.card_updates_due(now_ms, limit).await
    }

    async fn queue_stats(&self) -> Result<(i64, Option<i64>)> {
        let select = Statement::new(QUEUE_STATS);
        let stats = self.first(select, |row| <(i64, Option<i64>)>::from_row(row));
        Ok(stats.await?.unwrap_or((0, None)))
    }

    async fn last_event_no(&self, session_id: &'a str) -> Result<i64> {
        if unstorable(session_id) {
            return decide::last_event_no(None);
        }
        let select = Statement::new(NEXT_EVENT_NO).bind(session_id);
        let next = self.first(select, |row| Only::<i64>::from_row(row));
        decide::last_event_no(next.await?.map(|(next,)| next))
    }

    async fn events(&self, session_id: &'a str, after: i64, limit: u32) -> Result<Vec<EventRow>> {
        if unstorable(session_id) {
            return Ok(Vec::new());
        }
        let select = Statement::new(EVENTS)
            .bind(session_id)
            .bind(after)
            .bind(i64::from(limit));
        self.rows(select, |row| EventRow::from_row(row)).await
    }

    async fn turn(&self, session_id: &'a str, turn_id: &'a str) -> Result<TurnRow> {
        let session = self.session(session_id).await?;
        let turn = if unstorable(turn_id) {
            None
        } else {
            let select = Statement::new(TURN).bind(session_id).bind(turn_id);
            self.first(select, R::turn_row).await?
        };
        decide::item(session, turn, "turn")
    }

    async fn turns(
        &self,
        session_id: &'a str,
        page: ListTurns,
        limit: u32,
    ) -> Result<(Vec<TurnRow>, bool)> {
        decide::existing(self.session(session_id).await?)?;
        let paging = TurnPage::new(&page, limit);
        let sql = if paging.backwards {
            TURNS_BACKWARD
        } else {
            TURNS_FORWARD
        };
        let select = Statement::new(sql)
            .bind(session_id)
            .bind(page.after_seq.unwrap_or(0))
            .bind(page.before_seq)
            .bind(i64::from(paging.read_limit()));
        Ok(paging.finish(self.rows(select, R::turn_row).await?))
    }

    async fn session_attachment_bytes(&self, session_id: &'a str) -> Result<u64> {
        if unstorable(session_id) {
            return Ok(0);
        }
        let select = Statement::new(super::SESSION_ATTACHMENT_BYTES).bind(session_id);
        let held = self.first(select, |row| Only::<i64>::from_row(row));
        Ok(held.await?.map_or(0, |(bytes,)| bytes.max(0) as u64))
    }

    async fn changes(&self, session_id: &'a str) -> Result<crate::model::Changes> {
        let kept = kept_changes(self, session_id).await?;
        let select = Statement::new(TURN_CHANGES)
            .bind(session_id)
            .bind(i64::from(decide::changes::TURNS_SHOWN));
        let turns = self.rows(select, |row| <(String, Vec<u8>)>::from_row(row));
        decide::changes::shown(session_id, kept, turns.await?)
    }

    async fn file_changes(
        &self,
        session_id: &'a str,
        path: &'a str,
    ) -> Result<crate::model::FileChanges> {
        decide::changes::file_shown(kept_changes(self, session_id).await?, path)
    }

    async fn attachment(
        &self,
        session_id: &'a str,
        turn_id: &'a str,
        position: u32,
    ) -> Result<Option<AttachmentBytes>> {
        if unstorable(session_id) || unstorable(turn_id) {
            return Ok(None);
        }
        let select = Statement::new(super::ATTACHMENT_DOWNLOAD)
            .bind(session_id)
            .bind(turn_id)
            .bind(i64::from(position));
        self.first(select, |row| AttachmentBytes::from_row(row))
            .await
    }

    async fn due_fetches(&self, now_ms: i64, limit: u32) -> Result<Vec<FetchJob>> {
        self.fetches_due(now_ms, limit).await
    }

    async fn next_fetch_due(&self) -> Result<Option<i64>> {
        let select = Statement::new(super::NEXT_FETCH_DUE);
        let due = self.first(select, |row| Only::<Option<i64>>::from_row(row));
        Ok(due.await?.and_then(|(at,)| at))
    }

    async fn has_client_message_id(
        &self,
        session_id: &'a str,
        client_message_id: &'a str,
    ) -> Result<bool> {
        if unstorable(session_id) || unstorable(client_message_id) {
            return Ok(false);
        }
        let select = Statement::new(super::CLIENT_MESSAGE_ID_USED)
            .bind(session_id)
            .bind(client_message_id);
        let used = self.first(select, |row| Only::<i64>::from_row(row));
        Ok(used.await?.is_some_and(|(count,)| count > 0))
    }
}
