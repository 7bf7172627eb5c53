//! Pairing a Lark chat with a session by a one-time code: the owner asks
//! for a code for an open session (valid [`CODE_TTL_MS`], once), and a
//! person sends `/link <code>` to the bot in a chat. A good code links the
//! chat, makes the sender one of the link's approvers and is spent; a wrong,
//! used or expired code changes nothing but the chat's count of wrong codes,
//! and the answer does not say which it was. A chat that sent
//! [`MAX_WRONG_CODES`] wrong codes within [`WRONG_CODES_WINDOW_MS`] is not
//! heard on `/link` until the window ends, good code or not: codes are 50
//! random bits, and this keeps guessing hopeless. Only a code's hash is
//! stored or looked up ([`code_hash`]).

use sha2::{Digest, Sha256};

use super::ingest::LarkIngest;
use super::link::{LinkRow, LinkRows, link};
pub use super::notice::{Note, SessionName};
pub use super::{ChatRow, NewNote, PairCodeWrite};
use super::{Decided, SessionRow, Writes, existing, open};
use crate::error::Result;
use crate::permission::{MAX_APPROVERS, approvers_from_stored};

/// How long a code is valid.
pub const CODE_TTL_MS: i64 = 10 * 60 * 1000;
/// Wrong codes a chat may send within [`WRONG_CODES_WINDOW_MS`].
pub const MAX_WRONG_CODES: i64 = 10;
/// The window wrong codes are counted in, from the first of them.
pub const WRONG_CODES_WINDOW_MS: i64 = 10 * 60 * 1000;

/// The alphabet codes are written in (Crockford's base 32: no I, L, O, U).
const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
/// Characters in a code: 50 random bits.
pub const CODE_LEN: usize = 10;

/// A new code from 10 random bytes (one character each, 5 bits of each byte).
pub fn code_from(random: [u8; CODE_LEN]) -> String {
    random
        .iter()
        .map(|b| ALPHABET[usize::from(b & 31)] as char)
        .collect()
}

/// A code as typed, in its canonical form: upper case, separators dropped,
/// the letters Crockford reads as digits (O as 0, I and L as 1) read so.
pub fn normalize(typed: &str) -> String {
    typed
        .chars()
        .filter(|c| !matches!(c, '-' | ' ' | '_'))
        .map(|c| match c.to_ascii_uppercase() {
            'O' => '0',
            'I' | 'L' => '1',
            c => c,
        })
        .collect()
}

/// What the store keeps of a code, and looks it up by.
pub fn code_hash(code: &str) -> String {
    hex::encode(Sha256::digest(normalize(code).as_bytes()))
}

/// A code, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairCodeRow {
    pub code_hash: String,
    pub session_id: String,
    pub expires_at: i64,
    pub used_at: Option<i64>,
}

/// A new code for the session (`code_hash` of a code just minted): unknown
/// session 404; closed 409 `session_closed`. Answers when it expires.
pub fn new_code(session: Option<SessionRow>, code_hash: String, now: i64) -> Result<Decided<i64>> {
    let session = existing(session)?;
    open(&session)?;
    let expires_at = now + CODE_TTL_MS;
    Ok(Decided {
        writes: Writes {
            pair_code: Some(PairCodeWrite::New {
                code_hash,
                session_id: session.session_id,
                at: now,
                expires_at,
            }),
            ..Writes::default()
        },
        answer: expires_at,
    })
}

/// What a `/link <code>` reads: the code (by its hash), the session it is
/// for (locked), that session's link (if any), and the chat.
#[derive(Debug, Default)]
pub struct PairRows {
    pub code: Option<PairCodeRow>,
    pub session: Option<SessionRow>,
    pub link: Option<LinkRow>,
    pub chat: Option<ChatRow>,
}

/// Where a `/link <code>` came from and whom from.
#[derive(Debug, Clone)]
pub struct PairAt {
    pub chat_id: String,
    pub message_id: String,
    pub sender: Option<String>,
}

/// A `/link <code>`, in this order: a throttled chat is told so, nothing
/// else written; a code that is unknown, spent, expired, or for a closed
/// session is a wrong code (counted, said without telling which); else the
/// session joins the chat's sessions as its current one ([`link`]), the
/// sender added to the link's approvers (kept when the session's link was
/// this chat's), the code spent and the chat's count cleared. Every outcome
/// is answered with a note in the chat.
pub fn pair(rows: PairRows, at: PairAt, now: i64) -> Decided<LarkIngest> {
    let chat = ChatRow::or_new(rows.chat.clone(), &at.chat_id);
    // A chat with no wrong codes has no window open: the next one opens it.
    let in_window = chat.failed_codes > 0 && now < chat.failed_since + WRONG_CODES_WINDOW_MS;
    if in_window && chat.failed_codes >= MAX_WRONG_CODES {
        return noted(Writes::default(), &at, Note::Throttled, now);
    }
    let valid = |code: &&PairCodeRow| code.used_at.is_none() && now < code.expires_at;
    let (Some(code), Some(session)) = (rows.code.as_ref().filter(valid), rows.session) else {
        return wrong_code(chat, in_window, &at, now);
    };
    let mut approvers = rows
        .link
        .as_ref()
        .filter(|link| link.chat_id == at.chat_id)
        .map(|link| approvers_from_stored(&link.approvers))
        .unwrap_or_default();
    if let Some(sender) = &at.sender
        && !approvers.contains(sender)
        && approvers.len() < MAX_APPROVERS
    {
        approvers.push(sender.clone());
    }
    let name = SessionName::of(&session);
    let rows = LinkRows {
        session: Some(session),
        link: rows.link,
        chat: Some(ChatRow {
            failed_codes: 0,
            failed_since: 0,
            ..chat.clone()
        }),
    };
    let options = super::link::LinkOptions {
        approvers,
        terminal_turns: None,
    };
    match link(rows, at.chat_id.clone(), options, now) {
        Ok(linked) => {
            let writes = Writes {
                pair_code: Some(PairCodeWrite::Used {
                    code_hash: code.code_hash.clone(),
                    at: now,
                }),
                ..linked.writes
            };
            noted(writes, &at, Note::Linked(name), now)
        }
        Err(_) => wrong_code(chat, in_window, &at, now),
    }
}

/// A wrong code: counted in the chat's window (a new window once the last
/// one ended), and said.
fn wrong_code(chat: ChatRow, in_window: bool, at: &PairAt, now: i64) -> Decided<LarkIngest> {
    let chat = match in_window {
        true => ChatRow {
            failed_codes: chat.failed_codes + 1,
            ..chat
        },
        false => ChatRow {
            failed_codes: 1,
            failed_since: now,
            ..chat
        },
    };
    let writes = Writes {
        chat: Some(chat),
        ..Writes::default()
    };
    noted(writes, at, Note::BadCode, now)
}

/// The writes with the answer's note added.
pub(crate) fn noted(mut writes: Writes, at: &PairAt, note: Note, now: i64) -> Decided<LarkIngest> {
    writes.note = Some(NewNote {
        message_id: at.message_id.clone(),
        chat_id: at.chat_id.clone(),
        text: note.to_string(),
        session_id: note.session_id().map(str::to_owned),
        reply: true,
        at: now,
    });
    Decided {
        writes,
        answer: LarkIngest::Command(note),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::tests::session;
    use crate::model::SessionState;

    fn at() -> PairAt {
        PairAt {
            chat_id: "oc_1".into(),
            message_id: "om_1".into(),
            sender: Some("ou_a".into()),
        }
    }

    fn code(used_at: Option<i64>, expires_at: i64) -> PairCodeRow {
        PairCodeRow {
            code_hash: "h".into(),
            session_id: "ses_1".into(),
            expires_at,
            used_at,
        }
    }

    fn rows(code: Option<PairCodeRow>, chat: Option<ChatRow>) -> PairRows {
        PairRows {
            code,
            session: Some(session(SessionState::Open)),
            chat,
            ..PairRows::default()
        }
    }

    #[test]
    fn codes_are_canonical_and_hashed() {
        let code = code_from([0, 1, 2, 31, 32, 33, 200, 9, 10, 11]);
        assert_eq!(code.len(), CODE_LEN);
        assert_eq!(code, "012Z0189AB");
        assert_eq!(code_hash("o12z-0189ab"), code_hash(&code));
        assert_ne!(code_hash("012Z0189AC"), code_hash(&code));
    }

    #[test]
    fn a_good_code_links_the_chat_and_spends_the_code() {
        let decided = pair(rows(Some(code(None, 100)), None), at(), 50);
        assert!(matches!(
            decided.answer,
            LarkIngest::Command(Note::Linked(_))
        ));
        let link = decided.writes.link.and_then(|l| l.link).expect("linked");
        assert_eq!(
            (link.chat_id.as_str(), link.approvers.as_str()),
            ("oc_1", "[\"ou_a\"]")
        );
        assert!(matches!(
            decided.writes.pair_code,
            Some(PairCodeWrite::Used { at: 50, .. })
        ));
        assert_eq!(decided.writes.note.expect("noted").message_id, "om_1");
    }

    #[test]
    fn used_expired_and_unknown_codes_count_and_change_nothing() {
        for code in [Some(code(Some(1), 100)), Some(code(None, 50)), None] {
            let decided = pair(rows(code, None), at(), 50);
            assert!(matches!(decided.answer, LarkIngest::Command(Note::BadCode)));
            assert!(decided.writes.link.is_none() && decided.writes.pair_code.is_none());
            let chat = decided.writes.chat.expect("counted");
            assert_eq!((chat.failed_codes, chat.failed_since), (1, 50));
        }
    }

    #[test]
    fn too_many_wrong_codes_throttle_even_a_good_one_until_the_window_ends() {
        let full = ChatRow {
            chat_id: "oc_1".into(),
            failed_codes: MAX_WRONG_CODES,
            failed_since: 10,
            current_session_id: None,
        };
        let throttled = pair(rows(Some(code(None, 100)), Some(full.clone())), at(), 50);
        assert!(matches!(
            throttled.answer,
            LarkIngest::Command(Note::Throttled)
        ));
        assert!(throttled.writes.link.is_none() && throttled.writes.chat.is_none());
        let later = 10 + WRONG_CODES_WINDOW_MS;
        let good = code(None, later + 1);
        let after = pair(rows(Some(good), Some(full)), at(), later);
        assert!(matches!(after.answer, LarkIngest::Command(Note::Linked(_))));
    }

    #[test]
    fn a_chat_with_a_session_adds_the_next_and_makes_it_current() {
        let chat = ChatRow {
            chat_id: "oc_1".into(),
            current_session_id: Some("ses_0".into()),
            ..ChatRow::default()
        };
        let decided = pair(rows(Some(code(None, 100)), Some(chat)), at(), 50);
        assert!(matches!(
            decided.answer,
            LarkIngest::Command(Note::Linked(_))
        ));
        let chat = decided.writes.chat.expect("the chat");
        assert_eq!(chat.current_session_id.as_deref(), Some("ses_1"));
        assert!(decided.writes.pair_code.is_some());
        let note = decided.writes.note.expect("noted");
        assert_eq!(note.session_id.as_deref(), Some("ses_1"));
    }
}
