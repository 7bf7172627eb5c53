//! Identifiers: the rule every client-chosen id obeys, and the ids the broker mints.

use crate::error::{Error, Result};

/// The longest client-chosen identifier, in bytes.
pub const MAX_ID_BYTES: usize = 256;

/// A client-chosen identifier is 1 to 256 bytes of UTF-8 with no control
/// character (Unicode category Cc); `field` names it in the error.
pub fn check(field: &'static str, value: &str) -> Result<()> {
    if value.is_empty() || value.len() > MAX_ID_BYTES || value.chars().any(char::is_control) {
        return Err(Error::invalid(format!(
            "`{field}` must be 1 to {MAX_ID_BYTES} bytes of UTF-8 without control characters."
        )));
    }
    Ok(())
}

/// Mints `<prefix>_<ULID>` ids that sort in creation order, also within one
/// millisecond (the generator is monotonic).
#[derive(Default)]
pub struct Minter(std::sync::Mutex<ulid::Generator>);

impl Minter {
    pub fn mint(&self, prefix: &str) -> String {
        let mut generator = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // The generator only fails when 2^80 ids are minted in one millisecond.
        let id = generator.generate().unwrap_or_else(|_| ulid::Ulid::new());
        format!("{prefix}_{id}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_obey_the_contract() {
        assert!(check("goal_id", "g-1").is_ok());
        assert!(check("goal_id", &"x".repeat(256)).is_ok());
        assert!(check("goal_id", "é").is_ok());
        assert!(check("goal_id", "").is_err());
        assert!(check("goal_id", &"x".repeat(257)).is_err());
        assert!(check("goal_id", "a\nb").is_err());
        assert!(check("goal_id", "a\u{7f}b").is_err());
        assert!(check("goal_id", "a\u{85}b").is_err());
    }

    #[test]
    fn minted_ids_sort_in_creation_order() {
        let minter = Minter::default();
        let ids: Vec<String> = (0..1000).map(|_| minter.mint("turn")).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted);
        assert!(ids[0].starts_with("turn_") && ids[0].len() == 5 + 26);
    }
}
