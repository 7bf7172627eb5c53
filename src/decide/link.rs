//! Linking a chat to a session, and unlinking it: a session is linked to at
//! most one chat (linking it elsewhere moves it) and becomes the chat's
//! current one. Pairing by code ([`super::pairing`]) links through here.

use super::{ChatRow, Decided, LinkChange, NewLink, SessionRow, Writes, existing, open};
use crate::error::Result;
use crate::model::LarkLink;
use crate::permission::approvers_to_stored;

/// A session's link, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkRow {
    pub chat_id: String,
    pub approvers: String,
    pub linked_at: i64,
    pub terminal_turns: bool,
}

/// What a link asks for besides its chat: its approvers (checked already,
/// [`crate::permission::approvers`]), and whether the chat gets the turns
/// typed at the agent's terminal (None: as the session's link to the same
/// chat had it, else not).
#[derive(Debug, Clone, Default)]
pub struct LinkOptions {
    pub approvers: Vec<String>,
    pub terminal_turns: Option<bool>,
}

/// What a link reads: the session (locked), its link now, and the chat it
/// is to be linked to.
#[derive(Debug, Default)]
pub struct LinkRows {
    pub session: Option<SessionRow>,
    pub link: Option<LinkRow>,
    pub chat: Option<ChatRow>,
}

/// A link of a chat to the session, in this order: unknown session 404;
/// closed 409 `session_closed`; else the session joins the chat's sessions
/// (it keeps its place when it was this chat's already; linked to another
/// chat, it moves) and becomes the chat's current one.
pub fn link(
    rows: LinkRows,
    chat_id: String,
    options: LinkOptions,
    now: i64,
) -> Result<Decided<LarkLink>> {
    let session = existing(rows.session)?;
    open(&session)?;
    let same = rows.link.filter(|link| link.chat_id == chat_id);
    let linked_at = same.as_ref().map_or(now, |link| link.linked_at);
    let terminal_turns = options
        .terminal_turns
        .unwrap_or_else(|| same.is_some_and(|link| link.terminal_turns));
    let approvers = options.approvers;
    let chat = ChatRow {
        current_session_id: Some(session.session_id.clone()),
        ..ChatRow::or_new(rows.chat, &chat_id)
    };
    Ok(Decided {
        writes: Writes {
            link: Some(LinkChange {
                session_id: session.session_id.clone(),
                link: Some(NewLink {
                    chat_id: chat_id.clone(),
                    approvers: approvers_to_stored(&approvers),
                    at: linked_at,
                    terminal_turns,
                }),
            }),
            chat: Some(chat),
            ..Writes::default()
        },
        answer: LarkLink {
            session_id: session.session_id,
            chat_id: Some(chat_id),
            approvers,
            terminal_turns,
        },
    })
}

/// An unlink: unknown session 404; else the session's link (if any) goes,
/// closed session or not.
pub fn unlink(session: Option<SessionRow>) -> Result<Decided<LarkLink>> {
    let session = existing(session)?;
    Ok(Decided {
        writes: Writes {
            link: Some(LinkChange {
                session_id: session.session_id.clone(),
                link: None,
            }),
            ..Writes::default()
        },
        answer: LarkLink::none(session.session_id),
    })
}
