//! The embedded SQLite store (WAL). Every write goes through one writer
//! thread that owns the only writing connection (`writer`: group commit,
//! the waiting writes in one transaction, one sync per batch); a
//! decision ([`crate::store::dispatch`]) has its rows loaded and its
//! writes journaled there (`tx`, `journal`). Reads use a small pool of
//! their own. This file opens the database and answers the [`Store`] calls.

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::Connection;
use sqlx::FromRow;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow,
};

mod apply;
mod cards;
mod crash;
mod journal;
mod tx;
mod writer;

use super::retention::{self, PruneStep};
use super::sync_sql as sql;
use tx::command as command_on;
use writer::{Writer, nested};

use super::reads::Rows;
use super::statement::{Arg, Statement};
use super::{CardUpdateJob, FetchJob, SESSION_COLUMNS};
use super::{Change, ChangeFeed, Command, Done, Found, Read, ReplyJob, Store};
use crate::decide::{SessionRow, TurnRow};
use crate::error::{Error, Result};
use crate::ids::Minter;
use crate::permission::PermissionRow;

/// How much a power loss may take: `Full` nothing acknowledged (every commit
/// is synced to disk before it is answered), `Relaxed` the last commits
/// (SQLite `synchronous=NORMAL`, answered at the commit and synced right
/// behind it by the writer's flusher; crash-safe).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Durability {
    #[default]
    Full,
    Relaxed,
}

pub struct SqliteStore {
    writer: Writer,
    reads: SqlitePool,
    minter: std::sync::Arc<Minter>,
    feed: ChangeFeed,
}

impl SqliteStore {
    /// Opens (creating and migrating) the database file and starts the writer.
    pub async fn open(path: &Path, durability: Durability) -> Result<Self> {
        create_private_file(path).map_err(|e| Error::store("creating the database file", e))?;
        let options = SqliteConnectOptions::new()
            .filename(path)
            .journal_mode(SqliteJournalMode::Wal)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(5));
        super::migrate::<SqliteConnection>(
            &options,
            sqlx::migrate!("./migrations/sqlite"),
            "opening the database",
        )
        .await?;
        let writer = Writer::start(path, durability)?;
        let reads = SqlitePoolOptions::new()
            .max_connections(4)
            .min_connections(1)
            .connect_with(options.read_only(true))
            .await
            .map_err(|e| Error::store("opening the read pool", e))?;
        Ok(Self {
            writer,
            reads,
            minter: Default::default(),
            feed: Default::default(),
        })
    }

    /// Runs `op` on the writer ([`Writer::write`]: the journal folded
    /// first) and, once it is answered, publishes what its decisions changed
    /// (of its last run: an earlier run's changes were rolled back).
    async fn write<T, F>(&self, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&Connection) -> Result<T> + Send + 'static,
    {
        self.run(false, op).await
    }

    /// As [`SqliteStore::write`], for a decision of a turn's cycle, which
    /// reads its rows through the journal ([`Writer::write_cycle`]).
    async fn write_cycle<T, F>(&self, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&Connection) -> Result<T> + Send + 'static,
    {
        self.run(true, op).await
    }

    async fn run<T, F>(&self, cycle: bool, mut op: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&Connection) -> Result<T> + Send + 'static,
    {
        let op = move |conn: &Connection| {
            journal::take_changed();
            let answer = op(conn)?;
            Ok((answer, journal::take_changed()))
        };
        let (answer, changed) = if cycle {
            self.writer.write_cycle(op).await?
        } else {
            self.writer.write(op).await?
        };
        changed
            .into_iter()
            .for_each(|c| self.feed.publish(&Change::Session(c)));
        Ok(answer)
    }

    /// The read pool, once the tables hold everything acknowledged
    /// ([`Writer::caught_up`]).
    async fn reads(&self) -> Result<&SqlitePool> {
        self.writer.caught_up().await?;
        Ok(&self.reads)
    }
}

/// The database file is created owner-only before SQLite opens it; SQLite
/// gives its WAL and shared-memory files the same mode.
fn create_private_file(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

/// One writer job of retention: a chunk of the oldest prunable session's
/// rows, or the session itself once they are gone, or old Lark guards.
fn prune_step(conn: &Connection, cutoff_ms: i64) -> Result<PruneStep> {
    use rusqlite::OptionalExtension;
    let oldest: Option<String> = conn
        .prepare_cached(retention::OLDEST_PRUNABLE)?
        .query_row([cutoff_ms], |row| row.get(0))
        .optional()?;
    let Some(session_id) = oldest else {
        for statement in retention::DELETE_OLD {
            let rows = conn.prepare_cached(statement)?.execute([cutoff_ms])?;
            if rows > 0 {
                return Ok(PruneStep::Rows(rows as u64));
            }
        }
        return Ok(PruneStep::Done);
    };
    for statement in retention::DELETE_CHILDREN {
        let rows = conn.prepare_cached(statement)?.execute([&session_id])?;
        if rows > 0 {
            return Ok(PruneStep::Rows(rows as u64));
        }
    }
    conn.prepare_cached(retention::DELETE_SESSION)?
        .execute([&session_id])?;
    Ok(PruneStep::Session)
}

/// One turn with its reply, by session and turn id.
const SELECT_TURN: &str = concat!(
    turn_readback!(),
    " where t.session_id = ? and t.turn_id = ?"
);

/// One session by id.
const SELECT_SESSION: &str = concat!(
    "select ",
    session_columns!(),
    " from sessions where session_id = ?"
);

/// A session on the writer's connection, as last written (journaled or
/// stored: [`journal::session`]).
fn load_session(db: &Connection, session_id: &str) -> Result<Option<SessionRow>> {
    journal::session(db, session_id)
}

/// A session's turn on the writer's connection, as last written.
fn load_turn(db: &Connection, session_id: &str, turn_id: &str) -> Result<Option<TurnRow>> {
    journal::turn(db, session_id, turn_id)
}

/// A session as the table holds it.
fn stored_session(db: &Connection, session_id: &str) -> Result<Option<SessionRow>> {
    sql::query_as(SELECT_SESSION)
        .bind(session_id)
        .fetch_optional(db)
}

/// A turn as the table holds it.
fn stored_turn(db: &Connection, session_id: &str, turn_id: &str) -> Result<Option<TurnRow>> {
    sql::query_as(SELECT_TURN)
        .bind(session_id)
        .bind(turn_id)
        .fetch_optional(db)
}

const SELECT_PERMISSION: &str = concat!(
    "select ",
    permission_columns!(),
    " from permission_requests where session_id = ? and request_id = ?"
);

fn load_permission(
    conn: &Connection,
    session_id: &str,
    request_id: &str,
) -> Result<Option<PermissionRow>> {
    sql::query_as(SELECT_PERMISSION)
        .bind(session_id)
        .bind(request_id)
        .fetch_optional(conn)
}

#[async_trait]
impl Store for SqliteStore {
    fn feed(&self) -> &ChangeFeed {
        &self.feed
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("select 1").execute(&self.reads).await?;
        // A read alone does not prove the writer is alive.
        self.write(|_| Ok(())).await
    }

    fn shared(&self) -> bool {
        false
    }

    async fn decide(&self, command: Command) -> Result<Done> {
        let minter = self.minter.clone();
        // A turn's cycle reads its rows through the journal.
        let cycle = matches!(
            command,
            Command::Enqueue { .. }
                | Command::Claim { .. }
                | Command::Complete { .. }
                | Command::Release { .. }
                | Command::ReportAgent { .. }
                | Command::LapseAgent { .. }
                | Command::Notify { .. }
        );
        self.run(cycle, move |conn| {
            command_on(conn, command.clone(), &minter)
        })
        .await
    }

    async fn together(&self, first: Command, then: Command) -> Result<(Done, Result<Done>)> {
        let minter = self.minter.clone();
        self.write_cycle(move |conn| {
            let first = command_on(conn, first.clone(), &minter)?;
            // A refused second command keeps the first's writes.
            let then = nested(conn, |conn| command_on(conn, then.clone(), &minter))?;
            Ok((first, then))
        })
        .await
    }

    async fn read(&self, read: Read<'_>) -> Result<Found> {
        read.answer(self).await
    }
}

/// The plain reads ([`super::reads`]) on the read pool, once the tables
/// hold everything acknowledged.
#[async_trait]
impl Rows for SqliteStore {
    type Row = SqliteRow;

    async fn rows<T: Send + 'static>(
        &self,
        statement: Statement,
        decode: for<'r> fn(&'r SqliteRow) -> sqlx::Result<T>,
    ) -> Result<Vec<T>> {
        let mut query = sqlx::query(statement.sql);
        for arg in &statement.args {
            query = match arg {
                Arg::Int(v) => query.bind(*v),
                Arg::Text(v) | Arg::Body(v) => query.bind(v.as_deref()),
                Arg::Bytes(b) => query.bind(b.as_ref()),
            };
        }
        let rows = query.fetch_all(self.reads().await?).await?;
        Ok(rows.iter().map(decode).collect::<sqlx::Result<_>>()?)
    }

    fn session_row(row: &SqliteRow) -> sqlx::Result<SessionRow> {
        SessionRow::from_row(row)
    }

    fn turn_row(row: &SqliteRow) -> sqlx::Result<TurnRow> {
        TurnRow::from_row(row)
    }

    fn permission_row(row: &SqliteRow) -> sqlx::Result<PermissionRow> {
        PermissionRow::from_row(row)
    }

    async fn replies_due(&self, now_ms: i64, limit: u32) -> Result<Vec<ReplyJob>> {
        let select = Statement::new(super::DUE_OUTBOX)
            .bind(now_ms)
            .bind(i64::from(limit));
        self.rows(select, |row| {
            super::OutboxRow::from_row(row).map(super::OutboxRow::job)
        })
        .await
    }

    async fn card_updates_due(&self, now_ms: i64, limit: u32) -> Result<Vec<CardUpdateJob>> {
        let select = Statement::new(cards::DUE_CARD_UPDATES)
            .bind(now_ms)
            .bind(i64::from(limit));
        self.rows(select, |row| CardUpdateJob::from_row(row)).await
    }

    async fn fetches_due(&self, now_ms: i64, limit: u32) -> Result<Vec<FetchJob>> {
        let select = Statement::new(super::DUE_FETCHES)
            .bind(now_ms)
            .bind(i64::from(limit));
        self.rows(select, |row| FetchJob::from_row(row)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::turn::ClaimOutcome;
    use crate::model::HostIdentity;
    use crate::store::reads::QUEUE_STATS;
    use sqlx::Connection as _;

    /// A database written before migration 0013 (claims with a rowid and
    /// the `claims_session` index) keeps every claim through the rebuild:
    /// its claim_id still answers the same turn again, and a new claim
    /// finds the claimed turn's claim active.
    #[tokio::test]
    async fn claims_written_before_the_rebuild_survive_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.db");
        create_private_file(&path).unwrap();
        let options = SqliteConnectOptions::new().filename(&path);
        let mut conn = SqliteConnection::connect_with(&options).await.unwrap();
        let mut before = sqlx::migrate!("./migrations/sqlite");
        before.migrations = before
            .migrations
            .iter()
            .filter(|m| m.version < 13)
            .cloned()
            .collect::<Vec<_>>()
            .into();
        before.run(&mut conn).await.unwrap();
        for statement in [
            "insert into agent_threads values ('g', 'a', 'codex-cli', 'h', 1)",
            "insert into sessions (session_id, goal_id, agent_id, host_surface, host_session_id,
                 executor_endpoint_id, state, created_at, next_seq, queued_count,
                 active_claim_id, next_event_no)
             values ('ses_1', 'g', 'a', 'codex-cli', 'h', 'e', 'open', 1, 3, 0, 'c2', 1)",
            "insert into turns (turn_id, session_id, seq, origin, text, state, enqueued_at,
                 claim_count, current_claim_id, completion_id, response, completed_at)
             values ('trn_1', 'ses_1', 1, 'web', 'one', 'completed', 1, 1, 'c1', 'done-1',
                 '{}', 2)",
            "insert into turns (turn_id, session_id, seq, origin, text, state, enqueued_at,
                 claim_count, current_claim_id, claimed_at)
             values ('trn_2', 'ses_1', 2, 'web', 'two', 'claimed', 1, 1, 'c2', 3)",
            "insert into claims values ('c1', 'ses_1', 'trn_1', 1, 'completed', 2, null)",
            "insert into claims values ('c2', 'ses_1', 'trn_2', 1, 'active', 3, null)",
        ] {
            sqlx::query(statement).execute(&mut conn).await.unwrap();
        }
        conn.close().await.unwrap();

        let store = SqliteStore::open(&path, Durability::Relaxed).await.unwrap();
        let host = HostIdentity {
            host_surface: "codex-cli".into(),
            host_session_id: "h".into(),
        };
        let decide: &dyn Store = &store;
        let again = decide
            .claim("ses_1".into(), host.clone(), "c2".into())
            .await
            .unwrap();
        assert!(
            matches!(&again, ClaimOutcome::Claimed { turn, replayed: true, .. } if turn.turn_id == "trn_2"),
            "{again:?}"
        );
        let refused = decide
            .claim("ses_1".into(), host, "c3".into())
            .await
            .unwrap_err();
        assert_eq!(refused.code, crate::error::ErrorCode::ClaimActive);
        let claims: i64 = sqlx::query_scalar("select count(*) from claims")
            .fetch_one(&store.reads)
            .await
            .unwrap();
        assert_eq!(claims, 2);
        let table: String =
            sqlx::query_scalar("select sql from sqlite_master where name = 'claims'")
                .fetch_one(&store.reads)
                .await
                .unwrap();
        assert!(table.contains("without rowid"), "{table}");
    }

    /// A turn's cycle writes its rows without building a b-tree per row:
    /// no CHECK lists its values as `in (…)` (SQLite evaluates a list of
    /// more than two through an ephemeral index, migration 0042), and each
    /// check still refuses what it refused.
    #[tokio::test]
    async fn a_cycles_writes_check_their_rows_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.db");
        let _store = SqliteStore::open(&path, Durability::Relaxed).await.unwrap();
        let conn = Connection::open(&path).unwrap();
        for statement in [
            "insert into turns (turn_id, session_id, seq, origin, text, state, enqueued_at) \
             values (?, ?, ?, ?, ?, ?, ?)",
            "update turns set state = ?, claimed_at = ? where turn_id = ?",
            "update sessions set agent_state = ?, queued_count = ? where session_id = ?",
            "insert into session_events (session_id, event_no, kind, turn_id, seq, request_id, \
             state, at) values (?, ?, ?, ?, ?, ?, ?, ?)",
            "insert into claims (claim_id, session_id, turn_id, attempt, state, claimed_at) \
             values (?, ?, ?, ?, ?, ?)",
            "update claims set state = ?, released_at = ? where claim_id = ?",
            "update lark_replies set state = ? where turn_id = ?",
            "update permission_requests set state = ? where request_id = ?",
        ] {
            let mut program = conn.prepare(&format!("explain {statement}")).unwrap();
            let params = vec![rusqlite::types::Null; program.parameter_count()];
            let ops: Vec<String> = program
                .query_map(rusqlite::params_from_iter(params), |row| row.get(1))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            assert!(
                !ops.iter().any(|op| op == "OpenEphemeral"),
                "{statement} builds an ephemeral table"
            );
        }
        let bogus = conn.execute(
            "insert into claims (claim_id, session_id, turn_id, attempt, state, claimed_at) \
             values ('c', 's', 't', 1, 'bogus', 1)",
            [],
        );
        assert!(
            format!("{bogus:?}").contains("CHECK constraint failed"),
            "{bogus:?}"
        );
    }

    /// `/metrics` and every retention statement go through indexes: none
    /// scans a whole table, however large the history.
    #[tokio::test]
    async fn scrapes_and_pruning_scan_no_whole_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.db");
        let _store = SqliteStore::open(&path, Durability::Relaxed).await.unwrap();
        let conn = Connection::open(&path).unwrap();
        let mut statements = vec![
            QUEUE_STATS,
            retention::OLDEST_PRUNABLE,
            retention::DELETE_SESSION,
        ];
        statements.extend(retention::DELETE_OLD);
        statements.extend(retention::DELETE_CHILDREN);
        for statement in statements {
            let mut plan = conn
                .prepare(&format!("explain query plan {statement}"))
                .unwrap();
            let params = vec![1; plan.parameter_count()];
            let steps: Vec<String> = plan
                .query_map(rusqlite::params_from_iter(params), |row| {
                    row.get::<_, String>(3)
                })
                .unwrap()
                .map(Result::unwrap)
                .collect();
            let whole_table = steps
                .iter()
                .find(|step| step.starts_with("SCAN ") && !step.contains(" USING "));
            assert!(whole_table.is_none(), "{statement}\n{steps:#?}");
        }
    }
}
