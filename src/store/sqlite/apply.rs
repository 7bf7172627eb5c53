//! Writing what a decision returns: each [`Writes`] applied in its order,
//! in the decision's transaction on the writer's connection, or journaled
//! there and applied by a later fold ([`super::journal`]). Every table a
//! decision changes is written here and nowhere else.

use rusqlite::Connection;

use super::sql;
use crate::decide::lark::FetchWrite;
use crate::decide::pairing::PairCodeWrite;
use crate::decide::{Change, ClaimRow, NewEvent, NewReply, SessionRow, Sweep, TurnRow, Writes};
use crate::error::Result;
use crate::model::{SessionState, TurnState};
use crate::store::{DELETE_FETCH, FETCHED_TURN, INSERT_FETCH};
use crate::store::{INSERT_NOTE, INSERT_PAIR_CODE, INSERT_SENT, SPEND_PAIR_CODE, UPSERT_CHAT};

/// Applies a decision's writes, in their order, to the tables.
pub(super) fn apply(conn: &Connection, mut writes: Writes) -> Result<()> {
    if let Some(before) = writes.before.take() {
        apply(conn, *before)?;
    }
    lark_writes(conn, &writes)?;
    permission_writes(conn, &writes)?;
    card_writes(conn, &writes)?;
    if let Some(sweep) = &writes.sweep {
        sweep_session(conn, sweep)?;
    }
    if let Some(turn) = writes.turn {
        write_turn(conn, turn)?;
    }
    if let Some(fetch) = writes.fetch {
        write_fetch(conn, fetch)?;
    }
    if let Some(claim) = writes.claim {
        write_claim(conn, claim)?;
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

/// Writes back what a decision changes in a (locked) session row. A session
/// that is still open has only its counters and active claim changed (open
/// is never entered again once left), so that statement leaves `state` and
/// `closed_at` alone: assigning them, even unchanged, makes SQLite rewrite
/// the entries of every index whose columns or condition name them
/// (`sessions_open_tuple`, `sessions_closed`) on every write of a turn.
fn write_session(conn: &Connection, s: &SessionRow) -> Result<()> {
    let open = s.state == SessionState::Open;
    let mut update = sql::query(if open {
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
    })
    .bind(s.next_seq)
    .bind(s.next_event_no)
    .bind(s.queued_count)
    .bind(&s.active_claim_id)
    .bind(&s.session_id)
    .bind(s.agent_state)
    .bind(s.agent_since)
    .bind(s.agent_heard_at)
    .bind(s.holder_heard_at)
    .bind(s.waker_heard_at)
    .bind(&s.agent_tool)
    .bind(s.tool_since)
    .bind(&s.terminal_turn_id)
    .bind(s.stalled_at);
    if !open {
        update = update.bind(s.state).bind(s.closed_at);
    }
    update.execute(conn)?;
    Ok(())
}

fn insert_event(conn: &Connection, e: &NewEvent) -> Result<()> {
    sql::query(
        "insert into session_events
             (session_id, event_no, kind, turn_id, seq, request_id, state, at)
         values (?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&e.session_id)
    .bind(e.event_no)
    .bind(e.kind)
    .bind(&e.turn_id)
    .bind(e.seq)
    .bind(&e.request_id)
    .bind(e.state)
    .bind(e.at)
    .execute(conn)?;
    Ok(())
}

/// A close's sweep: the session's queued turns cancelled and its pending
/// permission requests expired, each with its numbered event.
fn sweep_session(conn: &Connection, sweep: &Sweep) -> Result<()> {
    sql::query(
        "insert into session_events (session_id, event_no, kind, turn_id, seq, state, at)
         select session_id, ?1 - 1 + row_number() over (order by seq), 'turn', turn_id, seq,
                ?2, ?3
         from turns where session_id = ?4 and (state = 'queued' or turn_id = ?5)",
    )
    .bind(sweep.cancelled_from)
    .bind(sweep.cancelled)
    .bind(sweep.at)
    .bind(&sweep.session_id)
    .bind(&sweep.terminal)
    .execute(conn)?;
    sql::query(
        "update turns set state = ?, cancel_reason = ?
         where session_id = ? and (state = 'queued' or turn_id = ?)",
    )
    .bind(sweep.cancelled)
    .bind(sweep.cancel_reason)
    .bind(&sweep.session_id)
    .bind(&sweep.terminal)
    .execute(conn)?;
    sql::query(
        "insert into session_events (session_id, event_no, kind, request_id, state, at)
         select session_id, ?1 - 1 + row_number() over (order by created_at, request_id),
                'permission', request_id, ?2, ?3
         from permission_requests where session_id = ?4 and state = 'pending'",
    )
    .bind(sweep.expired_from)
    .bind(sweep.expired)
    .bind(sweep.at)
    .bind(&sweep.session_id)
    .execute(conn)?;
    sql::query(
        "update permission_requests set state = ?, answered_at = ?
         where session_id = ? and state = 'pending'",
    )
    .bind(sweep.expired)
    .bind(sweep.at)
    .bind(&sweep.session_id)
    .execute(conn)?;
    Ok(())
}

/// A turn's files (its `attachments` list), one `turn_attachments` row each.
fn insert_attachments(conn: &Connection, t: &TurnRow) -> Result<()> {
    for a in crate::attachments::parse_list(t.attachments.as_deref()) {
        sql::query(crate::store::INSERT_TURN_ATTACHMENT)
            .bind(&t.turn_id)
            .bind(a.position)
            .bind(&t.session_id)
            .bind(a.name)
            .bind(a.declared_type)
            .bind(a.content_type)
            .bind(a.size as i64)
            .bind(a.sha256)
            .execute(conn)?;
    }
    Ok(())
}

/// A Lark turn's download job started, or finished (the turn taking its
/// files and text).
fn write_fetch(conn: &Connection, fetch: FetchWrite) -> Result<()> {
    match fetch {
        FetchWrite::Start {
            turn_id,
            session_id,
            message_id,
            resources,
            at,
        } => {
            sql::query(INSERT_FETCH)
                .bind(turn_id)
                .bind(session_id)
                .bind(message_id)
                .bind(resources)
                .bind(at)
                .execute(conn)?;
        }
        FetchWrite::Finish { turn_id, turn } => {
            if let Some(t) = turn {
                sql::query(FETCHED_TURN)
                    .bind(&t.text)
                    .bind(&t.attachments)
                    .bind(&t.turn_id)
                    .execute(conn)?;
                insert_attachments(conn, &t)?;
            }
            sql::query(DELETE_FETCH).bind(turn_id).execute(conn)?;
        }
    }
    Ok(())
}

fn write_turn(conn: &Connection, change: Change<TurnRow>) -> Result<()> {
    match change {
        Change::Insert(t) => {
            sql::query(
                "insert into turns (turn_id, session_id, seq, origin, text, client_message_id,
                     lark_chat_id, lark_message_id, state, enqueued_at, claimed_at, attachments)
                 values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&t.turn_id)
            .bind(&t.session_id)
            .bind(t.seq)
            .bind(t.origin)
            .bind(&t.text)
            .bind(&t.client_message_id)
            .bind(&t.lark_chat_id)
            .bind(&t.lark_message_id)
            .bind(t.state)
            .bind(t.enqueued_at)
            .bind(t.claimed_at)
            .bind(&t.attachments)
            .execute(conn)?;
            insert_attachments(conn, &t)?;
        }
        // A claim or a release leaves the completion's columns as they were
        // (unset: a completed turn is final), so its statement does not name
        // them: SQLite rewrites an index entry whenever a column it covers
        // is assigned, changed or not, and `completion_id` is indexed. A
        // terminal turn ends completed (with no completion id) or cancelled.
        Change::Update(t) => {
            let completes = t.state == TurnState::Completed;
            let mut update = sql::query(match t.state {
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
            })
            .bind(t.state)
            .bind(t.claimed_at)
            .bind(t.claim_count)
            .bind(&t.current_claim_id)
            .bind(&t.turn_id);
            if completes {
                update = update
                    .bind(t.completed_at)
                    .bind(&t.completion_id)
                    .bind(&t.response);
            } else if t.state == TurnState::Cancelled {
                update = update.bind(t.cancel_reason);
            }
            update.execute(conn)?;
        }
    }
    Ok(())
}

fn write_claim(conn: &Connection, change: Change<ClaimRow>) -> Result<()> {
    match change {
        Change::Insert(c) => {
            sql::query(
                "insert into claims (claim_id, session_id, turn_id, attempt, state, claimed_at)
                 values (?, ?, ?, ?, ?, ?)",
            )
            .bind(&c.claim_id)
            .bind(&c.session_id)
            .bind(&c.turn_id)
            .bind(c.attempt)
            .bind(c.state)
            .bind(c.claimed_at)
            .execute(conn)?;
        }
        Change::Update(c) => {
            sql::query("update claims set state = ?, released_at = ? where claim_id = ?")
                .bind(c.state)
                .bind(c.released_at)
                .bind(&c.claim_id)
                .execute(conn)?;
        }
    }
    Ok(())
}

fn insert_reply(conn: &Connection, r: &NewReply) -> Result<()> {
    sql::query(
        "insert into lark_replies (turn_id, session_id, chat_id, message_id, text, state,
             next_attempt_at, created_at, updated_at)
         values (?, ?, ?, ?, ?, 'pending', ?, ?, ?)",
    )
    .bind(&r.turn_id)
    .bind(&r.session_id)
    .bind(&r.chat_id)
    .bind(&r.message_id)
    .bind(&r.text)
    .bind(r.at)
    .bind(r.at)
    .bind(r.at)
    .execute(conn)?;
    Ok(())
}

/// Writes a decision's Lark event guard and link change, if any.
fn lark_writes(conn: &Connection, writes: &Writes) -> Result<()> {
    if let Some(e) = &writes.lark_event {
        sql::query(
            "insert into lark_events (app_id, event_id, message_id, received_at)
             values (?, ?, ?, ?)",
        )
        .bind(&e.app_id)
        .bind(&e.event_id)
        .bind(&e.message_id)
        .bind(e.at)
        .execute(conn)?;
    }
    pairing_writes(conn, writes)?;
    let Some(change) = &writes.link else {
        return Ok(());
    };
    sql::query("delete from lark_links where session_id = ?")
        .bind(&change.session_id)
        .execute(conn)?;
    if let Some(link) = &change.link {
        sql::query(
            "insert into lark_links (chat_id, session_id, linked_at, approvers, terminal_turns)
             values (?, ?, ?, ?, ?)",
        )
        .bind(&link.chat_id)
        .bind(&change.session_id)
        .bind(link.at)
        .bind(&link.approvers)
        .bind(i64::from(link.terminal_turns))
        .execute(conn)?;
    }
    Ok(())
}

/// Writes a decision's pairing code, chat and note, if any.
fn pairing_writes(conn: &Connection, writes: &Writes) -> Result<()> {
    match &writes.pair_code {
        Some(PairCodeWrite::New {
            code_hash,
            session_id,
            at,
            expires_at,
        }) => {
            sql::query(INSERT_PAIR_CODE)
                .bind(code_hash)
                .bind(session_id)
                .bind(*at)
                .bind(*expires_at)
                .execute(conn)?;
        }
        Some(PairCodeWrite::Used { code_hash, at }) => {
            sql::query(SPEND_PAIR_CODE)
                .bind(*at)
                .bind(code_hash)
                .execute(conn)?;
        }
        None => {}
    }
    if let Some(chat) = &writes.chat {
        sql::query(UPSERT_CHAT)
            .bind(&chat.chat_id)
            .bind(chat.failed_codes)
            .bind(chat.failed_since)
            .bind(&chat.current_session_id)
            .execute(conn)?;
    }
    if let Some(sent) = &writes.sent {
        sql::query(INSERT_SENT)
            .bind(&sent.message_id)
            .bind(&sent.session_id)
            .bind(&sent.chat_id)
            .bind(sent.at)
            .execute(conn)?;
    }
    if let Some(note) = &writes.note {
        sql::query(INSERT_NOTE)
            .bind(&note.message_id)
            .bind(&note.chat_id)
            .bind(&note.text)
            .bind(note.at)
            .bind(&note.session_id)
            .bind(i64::from(note.reply))
            .execute(conn)?;
    }
    Ok(())
}

/// Writes a decision's permission request and its chat message, if any.
fn permission_writes(conn: &Connection, writes: &Writes) -> Result<()> {
    match &writes.permission {
        Some(Change::Insert(row)) => {
            sql::query(
                "insert into permission_requests (session_id, request_id, tool_name, description,
                     input_preview, state, created_at, answered_at, answered_via)
                 values (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&row.session_id)
            .bind(&row.request_id)
            .bind(&row.tool_name)
            .bind(&row.description)
            .bind(&row.input_preview)
            .bind(row.state)
            .bind(row.created_at)
            .bind(row.answered_at)
            .bind(row.answered_via)
            .execute(conn)?;
        }
        Some(Change::Update(row)) => {
            sql::query(
                "update permission_requests set state = ?, answered_at = ?, answered_via = ?,
                     relayed_at = ?
                 where session_id = ? and request_id = ?",
            )
            .bind(row.state)
            .bind(row.answered_at)
            .bind(row.answered_via)
            .bind(row.relayed_at)
            .bind(&row.session_id)
            .bind(&row.request_id)
            .execute(conn)?;
        }
        None => {}
    }
    if let Some(m) = &writes.permission_message {
        sql::query(
            "insert into lark_permission_messages (session_id, request_id, chat_id, text, state,
                 next_attempt_at, created_at, updated_at)
             values (?, ?, ?, ?, 'pending', ?, ?, ?)",
        )
        .bind(&m.session_id)
        .bind(&m.request_id)
        .bind(&m.chat_id)
        .bind(&m.text)
        .bind(m.at)
        .bind(m.at)
        .bind(m.at)
        .execute(conn)?;
    }
    Ok(())
}

/// Writes what an answer given in Lark does to the request's card, if any.
fn card_writes(conn: &Connection, writes: &Writes) -> Result<()> {
    let Some(card) = &writes.card else {
        return Ok(());
    };
    sql::query(
        "update lark_permission_messages set answered_by = coalesce(?1, answered_by),
             update_state = case when ?2 = 1 and update_state = 'pending' then 'sent'
                                 else update_state end
         where session_id = ?3 and request_id = ?4",
    )
    .bind(&card.answered_by)
    .bind(i64::from(card.shown))
    .bind(&card.session_id)
    .bind(&card.request_id)
    .execute(conn)?;
    Ok(())
}
