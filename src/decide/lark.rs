//! The Lark link's rules: a chat is linked to at most one open session, and a
//! session to at most one chat.

use super::{existing, open};
use crate::error::{Error, ErrorCode, Result};
use crate::store::SessionRow;

/// A link of a chat to the session, given the session the chat is linked to
/// now (`holder`), in this order: unknown session 404; closed 409
/// `session_closed`; the chat linked to another session 409 `chat_linked`.
/// Linking the session's own chat again, or another chat (which replaces
/// the session's link), is fine.
pub fn link(session: Option<SessionRow>, holder: Option<&str>) -> Result<SessionRow> {
    let session = existing(session)?;
    open(&session)?;
    if holder.is_some_and(|holder| holder != session.session_id) {
        return Err(Error::new(
            ErrorCode::ChatLinked,
            "This Lark chat is linked to another open session; unlink it there first.",
        ));
    }
    Ok(session)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::tests::session;
    use crate::model::SessionState;

    #[test]
    fn a_chat_links_to_one_open_session() {
        let open = || Some(session(SessionState::Open));
        assert!(link(open(), None).is_ok());
        assert!(link(open(), Some("ses_1")).is_ok());
        let taken = link(open(), Some("ses_2")).expect_err("a refusal");
        assert_eq!(taken.code, ErrorCode::ChatLinked);
        let closed = link(Some(session(SessionState::Closed)), Some("ses_2"));
        assert_eq!(
            closed.expect_err("a refusal").code,
            ErrorCode::SessionClosed
        );
        let unknown = link(None, None).expect_err("a refusal");
        assert_eq!(unknown.code, ErrorCode::NotFound);
    }
}
