//! Devices signed in with a one-time link (WEB.md "Signing in a phone"):
//! the rules apart from the store. The owner mints a link whose code is good
//! once for [`LINK_TTL_MS`]; a phone trades the code for a device credential
//! of its own, which works on every `/v1` route but the devices' own and
//! the links'. The owner token never leaves the machine. Only the SHA-256 of
//! a code or a credential is stored or looked up ([`hash`]).
//!
//! A wrong, used or expired code gets the one same refusal; after
//! [`MAX_WRONG_CODES`] of them within [`WRONG_CODES_WINDOW_MS`], every
//! sign-in is refused until the window ends ([`Throttle`]), good code or
//! not: codes are 130 random bits, and this keeps guessing hopeless even so.
//! It knows nothing of HTTP or SQL.

use std::sync::Mutex;

use sha2::{Digest, Sha256};

use crate::error::{Error, ErrorCode, Result};

/// How long a sign-in link is good.
pub const LINK_TTL_MS: i64 = 10 * 60 * 1000;
/// Sign-in links not yet used nor expired at once; more is 429.
pub const MAX_OPEN_LINKS: i64 = 20;
/// Devices signed in at once; one more is 409 `too_many_devices`.
pub const MAX_DEVICES: i64 = 50;
/// Wrong codes (for all callers together) within [`WRONG_CODES_WINDOW_MS`].
pub const MAX_WRONG_CODES: u32 = 10;
/// The window wrong codes are counted in, from the first of them.
pub const WRONG_CODES_WINDOW_MS: i64 = 10 * 60 * 1000;
/// A device's name, in characters.
pub const MAX_NAME_CHARS: usize = 64;
/// A device's last sighting is written at most this often.
pub const SEEN_EVERY_MS: i64 = 60 * 1000;

/// What every device credential starts with: the owner token never does
/// (it is hex), so a request's bearer says which check it takes.
pub const TOKEN_PREFIX: &str = "lxd_";
/// Characters of a code: 26 of Crockford's base 32, 130 random bits, in
/// the QR code's compact alphanumeric set.
pub const CODE_LEN: usize = 26;

const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// A new sign-in code.
pub fn new_code() -> Result<String> {
    random_text::<CODE_LEN>()
}

/// A new device credential.
pub fn new_token() -> Result<String> {
    Ok(format!("{TOKEN_PREFIX}{}", random_text::<52>()?))
}

fn random_text<const N: usize>() -> Result<String> {
    let mut random = [0u8; N];
    getrandom::fill(&mut random)
        .map_err(|_| Error::store("minting a device credential", "no randomness"))?;
    Ok(random
        .iter()
        .map(|b| ALPHABET[usize::from(b & 31)] as char)
        .collect())
}

/// What the store keeps of a code or a credential, and looks it up by.
pub fn hash(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// A device's name as given: trimmed, 1 to [`MAX_NAME_CHARS`] characters,
/// no control character; else 400.
pub fn checked_name(name: &str) -> Result<String> {
    let name = name.trim();
    let chars = name.chars().count();
    if chars == 0 || chars > MAX_NAME_CHARS || name.chars().any(char::is_control) {
        return Err(Error::new(
            ErrorCode::InvalidRequest,
            format!("`name` must be 1 to {MAX_NAME_CHARS} characters with no control character."),
        ));
    }
    Ok(name.to_owned())
}

/// The one refusal of a code that signs nothing in.
pub fn bad_code() -> Error {
    Error::new(
        ErrorCode::Unauthorized,
        "This sign-in link is not valid: it was used, it expired, or it was never made. \
         Ask for a new one with `loopx web link`.",
    )
}

/// 403 for a device on the routes only the owner may use.
pub fn owner_only() -> Error {
    Error::new(
        ErrorCode::OwnerOnly,
        "Only the owner token may make sign-in links and manage devices.",
    )
}

/// A device as stored (never its credential).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct DeviceRow {
    pub device_id: String,
    pub name: String,
    pub created_at: i64,
    pub last_seen_at: Option<i64>,
}

/// A device about to be signed in: its name and its credential's hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDevice {
    pub name: String,
    pub token_hash: String,
}

/// Who a `/v1` request comes from: the owner, or one of the owner's devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    Owner,
    Device(String),
}

/// Counts wrong codes for all callers together: a window opens at the
/// first, and while it holds [`MAX_WRONG_CODES`], sign-ins are refused.
#[derive(Debug, Default)]
pub struct Throttle(Mutex<Option<(i64, u32)>>);

impl Throttle {
    /// 429 while the window is full, with the seconds until it ends.
    pub fn check(&self, now: i64) -> Result<()> {
        let window = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match *window {
            Some((since, wrong))
                if wrong >= MAX_WRONG_CODES && now < since + WRONG_CODES_WINDOW_MS =>
            {
                let seconds = (since + WRONG_CODES_WINDOW_MS - now + 999) / 1000;
                let mut error = Error::new(
                    ErrorCode::TooManyAttempts,
                    "Too many wrong sign-in codes: sign-in is paused for a while.",
                );
                error.retry_after_seconds = Some(u32::try_from(seconds).unwrap_or(u32::MAX));
                Err(error)
            }
            _ => Ok(()),
        }
    }

    /// Counts a wrong code.
    pub fn wrong(&self, now: i64) {
        let mut window = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *window = match *window {
            Some((since, wrong)) if now < since + WRONG_CODES_WINDOW_MS => Some((since, wrong + 1)),
            _ => Some((now, 1)),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_credentials_are_fresh_and_look_apart() {
        let (a, b) = (new_code().unwrap(), new_code().unwrap());
        assert_eq!(a.len(), CODE_LEN);
        assert_ne!(a, b);
        assert!(a.bytes().all(|c| ALPHABET.contains(&c)));
        let token = new_token().unwrap();
        assert!(token.starts_with(TOKEN_PREFIX) && token.len() == 56);
        assert_eq!(hash(&token).len(), 64);
        assert_ne!(hash(&token), hash(&new_token().unwrap()));
    }

    #[test]
    fn names_are_checked() {
        assert_eq!(
            checked_name("  Chrome on Android ").unwrap(),
            "Chrome on Android"
        );
        assert_eq!(
            checked_name(&"é".repeat(MAX_NAME_CHARS))
                .unwrap()
                .chars()
                .count(),
            64
        );
        for bad in [
            "",
            "   ",
            "a\u{0}b",
            "tab\there",
            &"x".repeat(MAX_NAME_CHARS + 1),
        ] {
            assert_eq!(
                checked_name(bad).unwrap_err().code,
                ErrorCode::InvalidRequest,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_throttle_shuts_after_ten_wrong_codes_until_the_window_ends() {
        let throttle = Throttle::default();
        let start = 1_000_000;
        for n in 0..MAX_WRONG_CODES {
            assert!(throttle.check(start + i64::from(n)).is_ok());
            throttle.wrong(start + i64::from(n));
        }
        let refused = throttle.check(start + 20).unwrap_err();
        assert_eq!(refused.code, ErrorCode::TooManyAttempts);
        assert_eq!(refused.retry_after_seconds, Some(600));
        assert!(throttle.check(start + WRONG_CODES_WINDOW_MS).is_ok());
        throttle.wrong(start + WRONG_CODES_WINDOW_MS);
        assert!(
            throttle.check(start + WRONG_CODES_WINDOW_MS + 1).is_ok(),
            "a new window"
        );
    }
}
