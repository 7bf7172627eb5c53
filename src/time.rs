//! Wall-clock time as the broker stores it (milliseconds since the Unix epoch)
//! and shows it (RFC 3339 UTC with milliseconds).

use chrono::{DateTime, SecondsFormat};

/// Now, in milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// `2026-11-30T10:00:00.000Z`.
pub fn rfc3339(ms: i64) -> String {
    DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(SecondsFormat::Millis, true)
}
