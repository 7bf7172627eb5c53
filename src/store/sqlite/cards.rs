//! The SQLite statements of the permission cards' outbox: which final
//! forms are due, and what became of an update.

/// Cards whose request was settled after they were sent, and not updated yet.
pub(super) const DUE_CARD_UPDATES: &str = "select m.session_id, m.request_id, m.chat_id, \
         m.message_id, m.answered_by, m.update_attempts, m.update_failures \
     from lark_permission_messages m join permission_requests p \
         on p.session_id = m.session_id and p.request_id = m.request_id \
     where m.update_state = 'pending' and m.message_id is not null \
         and m.update_next_at <= ?1 and p.state <> 'pending' \
     order by m.update_next_at limit ?2";

/// Records an update attempt: `?1`..`?5` state, attempts, failures, error,
/// next attempt; the keys after.
pub(super) const RECORD_CARD_UPDATE: &str = "update lark_permission_messages \
     set update_state = ?1, update_attempts = ?2, update_failures = ?3, update_error = ?4, \
         update_next_at = ?5 \
     where session_id = ?6 and request_id = ?7";
