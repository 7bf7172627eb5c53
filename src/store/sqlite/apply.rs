//! Writing what a decision returns: each [`Writes`] applied in its order,
//! in the decision's transaction on the writer's connection, or journaled
//! there and applied by a later fold ([`super::journal`]). Every table a
//! decision changes is written here and nowhere else.

use rusqlite::Connection;

use super::sql;
use crate::decide::{Change, ClaimRow, NewEvent, NewReply, SessionRow, TurnRow, Writes};
use crate::error::Result;
use crate::model::{SessionState, TurnState};
use crate::store::statement::{self, Statement};

/// Applies a decision's writes, in their order, to the tables.
pub(super) fn apply(conn: &Connection, mut writes: Writes) -> Result<()> {
    if let Some(before) = writes.before.take() {
        apply(conn, *before)?;
    }
    execute_all(conn, statement::side_writes(&writes))?;
    if let Some(turn) = writes.turn {
        write_turn(conn, &turn)?;
    }
    if let Some(fetch) = writes.fetch {
        execute_all(conn, statement::fetch_writes(&fetch))?;
    }
    if let Some(claim) = writes.claim {
        write_claim(conn, &claim)?;
    }
    if let Some(s) = writes.session {
        write_session(conn, &s)?;
    }
    if let Some(e) = writes.event {
        insert_event(conn, &e)?;
    }
    if let Some(reply) = writes.reply {
        insert_reply(conn, &reply)?;
    }
    Ok(())
}

/// Applies a fold's records (each only a turn cycle's writes,
/// [`Writes::journaled`]) with each row written once, in its final state:
/// a session's row as the last record left it, a turn or claim inserted as
/// its last record left it (and then updated, for the columns an insert does
/// not name), or updated once; then every event and reply, in their order.
/// The tables end as applying the records one by one leaves them: a later
/// write of a row sets every column an earlier one of the same kind set
/// (a turn's completion or cancellation is final, and its statement names
/// the claim's columns too), and no record reads what another wrote.
pub(super) fn apply_final(conn: &Connection, records: Vec<Writes>) -> Result<()> {
    let mut turns = Final::default();
    let mut claims = Final::default();
    let mut sessions = Final::default();
    let (mut events, mut replies) = (Vec::new(), Vec::new());
    for writes in records {
        debug_assert!(
            writes.journaled(),
            "only a turn cycle's writes are journaled"
        );
        if let Some(turn) = writes.turn {
            turns.add(turn, |t| &t.turn_id);
        }
        if let Some(claim) = writes.claim {
            claims.add(claim, |c| &c.claim_id);
        }
        if let Some(session) = writes.session {
            sessions.add(Change::Update(session), |s| &s.session_id);
        }
        events.extend(writes.event);
        replies.extend(writes.reply);
    }
    turns.write(conn, write_turn)?;
    // A crash here leaves the fold's transaction half written: none of it
    // is committed, and the records are folded again at the next start.
    super::crash::at(super::crash::Point::Folding);
    claims.write(conn, write_claim)?;
    sessions.write(conn, |conn, session| match session {
        Change::Insert(s) | Change::Update(s) => write_session(conn, s),
    })?;
    for event in &events {
        insert_event(conn, event)?;
    }
    for reply in &replies {
        insert_reply(conn, reply)?;
    }
    Ok(())
}

/// Rows by key in the order first written, each as its last write left it,
/// with whether it was inserted and whether it was updated after that.
struct Final<T> {
    at: std::collections::HashMap<String, usize>,
    rows: Vec<(bool, bool, T)>,
}

impl<T> Default for Final<T> {
    fn default() -> Self {
        Self {
            at: Default::default(),
            rows: Vec::new(),
        }
    }
}

impl<T> Final<T> {
    fn add(&mut self, change: Change<T>, key: impl Fn(&T) -> &String) {
        let (insert, row) = match change {
            Change::Insert(row) => (true, row),
            Change::Update(row) => (false, row),
        };
        match self.at.get(key(&row)) {
            Some(&i) => {
                let (_, updated, last) = &mut self.rows[i];
                *updated = true;
                *last = row;
            }
            None => {
                self.at.insert(key(&row).clone(), self.rows.len());
                self.rows.push((insert, !insert, row));
            }
        }
    }

    /// Writes each row once through `write`, in the order first written; a
    /// row inserted and then updated is written again as an update, for the
    /// columns an insert does not name.
    fn write(
        self,
        conn: &Connection,
        write: impl Fn(&Connection, &Change<T>) -> Result<()>,
    ) -> Result<()> {
        for (inserted, updated, row) in self.rows {
            let change = match inserted {
                true => Change::Insert(row),
                false => Change::Update(row),
            };
            write(conn, &change)?;
            if let (Change::Insert(row), true) = (change, inserted && updated) {
                write(conn, &Change::Update(row))?;
            }
        }
        Ok(())
    }
}

/// Writes back what a decision changes in a (locked) session row. A session
/// that is still open has only its counters and active claim changed (open
/// is never entered again once left), so that statement leaves `state` and
/// `closed_at` alone: assigning them, even unchanged, makes SQLite rewrite
/// the entries of every index whose columns or condition name them
/// (`sessions_open_tuple`, `sessions_closed`) on every write of a turn.
fn write_session(conn: &Connection, s: &SessionRow) -> Result<()> {
    let open = s.state == SessionState::Open;
    let update = sql::query(if open {
        "update sessions set next_seq = ?1, next_event_no = ?2, queued_count = ?3,
             active_claim_id = ?4, agent_state = ?6, agent_since = ?7, agent_heard_at = ?8,
             holder_heard_at = ?9, waker_heard_at = ?10, agent_tool = ?11, tool_since = ?12,
             terminal_turn_id = ?13, stalled_at = ?14
         where session_id = ?5"
    } else {
        "update sessions set next_seq = ?1, next_event_no = ?2, queued_count = ?3,
             active_claim_id = ?4, agent_state = ?6, agent_since = ?7, agent_heard_at = ?8,
             holder_heard_at = ?9, waker_heard_at = ?10, agent_tool = ?11, tool_since = ?12,
             terminal_turn_id = ?13, stalled_at = ?14, state = ?15, closed_at = ?16
         where session_id = ?5"
    });
    let mut update = statement::session_values(update, s);
    if !open {
        update = update.bind(s.state).bind(s.closed_at);
    }
    update.execute(conn)?;
    Ok(())
}

fn insert_event(conn: &Connection, e: &NewEvent) -> Result<()> {
    let insert = sql::query(
        "insert into session_events
             (session_id, event_no, kind, turn_id, seq, request_id, state, at)
         values (?, ?, ?, ?, ?, ?, ?, ?)",
    );
    statement::event_values(insert, e).execute(conn)?;
    Ok(())
}

/// Runs statements both stores share, in their order.
fn execute_all(conn: &Connection, statements: Vec<Statement>) -> Result<()> {
    for statement in &statements {
        sql::execute(statement, conn)?;
    }
    Ok(())
}

fn write_turn(conn: &Connection, change: &Change<TurnRow>) -> Result<()> {
    match change {
        Change::Insert(t) => {
            let insert = sql::query(
                "insert into turns (turn_id, session_id, seq, origin, text, client_message_id,
                     lark_chat_id, lark_message_id, state, enqueued_at, claimed_at, attachments)
                 values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            );
            statement::turn_values(insert, t).execute(conn)?;
            execute_all(conn, statement::attachment_rows(t))?;
        }
        // A claim or a release leaves the completion's columns as they were
        // (unset: a completed turn is final), so its statement does not name
        // them: SQLite rewrites an index entry whenever a column it covers
        // is assigned, changed or not, and `completion_id` is indexed. A
        // terminal turn ends completed (with no completion id) or cancelled.
        Change::Update(t) => {
            let update = sql::query(match t.state {
                TurnState::Completed => {
                    "update turns set state = ?1, claimed_at = ?2, claim_count = ?3,
                         current_claim_id = ?4, completed_at = ?6, completion_id = ?7,
                         response = ?8
                     where turn_id = ?5"
                }
                TurnState::Cancelled => {
                    "update turns set state = ?1, claimed_at = ?2, claim_count = ?3,
                         current_claim_id = ?4, cancel_reason = ?6
                     where turn_id = ?5"
                }
                TurnState::Queued | TurnState::Claimed => {
                    "update turns set state = ?1, claimed_at = ?2, claim_count = ?3,
                         current_claim_id = ?4
                     where turn_id = ?5"
                }
            });
            let update = statement::turn_update_values(update, t);
            match t.state {
                TurnState::Completed => update
                    .bind(t.completed_at)
                    .bind(&t.completion_id)
                    .bind(&t.response),
                TurnState::Cancelled => update.bind(t.cancel_reason),
                TurnState::Queued | TurnState::Claimed => update,
            }
            .execute(conn)?;
        }
    }
    Ok(())
}

fn write_claim(conn: &Connection, change: &Change<ClaimRow>) -> Result<()> {
    let write = sql::query(match change {
        Change::Insert(_) => {
            "insert into claims (claim_id, session_id, turn_id, attempt, state, claimed_at)
             values (?, ?, ?, ?, ?, ?)"
        }
        Change::Update(_) => "update claims set state = ?, released_at = ? where claim_id = ?",
    });
    statement::claim_values(write, change).execute(conn)?;
    Ok(())
}

fn insert_reply(conn: &Connection, r: &NewReply) -> Result<()> {
    let insert = sql::query(
        "insert into lark_replies (turn_id, session_id, chat_id, message_id, text, state,
             next_attempt_at, created_at, updated_at)
         values (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?6, ?6)",
    );
    statement::reply_values(insert, r).execute(conn)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(row: &(String, u32)) -> &String {
        &row.0
    }

    #[test]
    fn a_fold_keeps_each_row_once_in_its_last_state_in_first_written_order() {
        let mut rows = Final::default();
        rows.add(Change::Insert(("t1".into(), 1)), id);
        rows.add(Change::Update(("t0".into(), 1)), id);
        rows.add(Change::Update(("t1".into(), 2)), id);
        rows.add(Change::Insert(("t2".into(), 1)), id);
        rows.add(Change::Update(("t1".into(), 3)), id);
        rows.add(Change::Update(("t0".into(), 2)), id);
        assert_eq!(
            rows.rows,
            vec![
                // Inserted, then updated: inserted as it ended, then updated
                // for the columns the insert does not name.
                (true, true, ("t1".to_owned(), 3)),
                // Only updated: one update, the last.
                (false, true, ("t0".to_owned(), 2)),
                // Only inserted.
                (true, false, ("t2".to_owned(), 1)),
            ]
        );
    }
}
