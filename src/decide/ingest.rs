//! What became of a Lark event: the one outcome every Lark rule answers,
//! the event's own ([`super::lark::event`]), a chat command's
//! ([`super::chat`]) and a pairing's ([`super::pairing`]).

use super::notice::Note;
use super::permission::Decision;
use super::rows::TurnRow;

/// What became of a Lark event.
#[derive(Debug)]
pub enum LarkIngest {
    /// Seen before (same event id, or same message id): nothing enqueued.
    Duplicate,
    /// Enqueued into the linked session.
    Enqueued {
        session_id: String,
        turn: Box<TurnRow>,
    },
    /// No open session is linked to the chat: acknowledged, not enqueued.
    Unlinked,
    /// Not a text message: acknowledged, not enqueued.
    Unsupported,
    /// `yes <id>` / `no <id>` from an approver of the link: the request's
    /// answer (written, or a replay); not enqueued.
    Answered {
        session_id: String,
        decision: Decision,
    },
    /// An answer that nobody may give there or that changes nothing
    /// ([`crate::decide::lark::event`]): acknowledged, not enqueued.
    Ignored,
    /// A command, answered by the broker in the chat; not enqueued.
    Command(Note),
}
