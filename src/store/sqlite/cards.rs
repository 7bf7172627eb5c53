//! The SQLite statement of the permission cards' outbox: which final forms
//! are due.

/// Cards whose request was settled after they were sent, and not updated yet.
pub(super) const DUE_CARD_UPDATES: &str = "select m.session_id, m.request_id, m.chat_id, \
         m.message_id, m.answered_by, m.update_attempts, m.update_failures \
     from lark_permission_messages m join permission_requests p \
         on p.session_id = m.session_id and p.request_id = m.request_id \
     where m.update_state = 'pending' and m.message_id is not null \
         and m.update_next_at <= ?1 and p.state <> 'pending' \
     order by m.update_next_at limit ?2";
