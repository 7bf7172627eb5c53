//! Web Push (WEB.md "Installable, and it tells you"), apart from the store
//! and the sending: the broker's VAPID key (RFC 8292; made on first start,
//! kept in the data dir, 0600), and the rules of a subscription as
//! `PushManager.subscribe` gives it: an `https` endpoint (plain `http` on
//! loopback only, for tests), the browser's P-256 key and auth secret. It
//! knows nothing of HTTP routes or SQL.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use web_push_native::jwt_simple::algorithms::{ECDSAP256PublicKeyLike, ES256KeyPair};

use crate::error::{Error, Result};
use crate::model::NewPushSubscription;

/// Subscriptions one caller (the owner, or one device) may hold.
pub const MAX_SUBSCRIPTIONS: i64 = 10;
/// The longest endpoint URL, in bytes.
pub const MAX_ENDPOINT_BYTES: usize = 2048;

/// The broker's VAPID key pair; `Debug` never shows it.
pub struct Vapid(ES256KeyPair);

impl std::fmt::Debug for Vapid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Vapid(<redacted>)")
    }
}

impl Vapid {
    /// A new key pair, kept nowhere (tests; a broker without a data dir).
    pub fn generate() -> Self {
        Self(ES256KeyPair::generate())
    }

    /// The key in `path` (its 32-byte private scalar, base64url), made and
    /// written (0600) the first time.
    pub fn load_or_create(path: &Path) -> std::result::Result<Self, String> {
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let bytes = URL_SAFE_NO_PAD
                    .decode(text.trim())
                    .map_err(|e| format!("{}: not base64url: {e}", path.display()))?;
                ES256KeyPair::from_bytes(&bytes)
                    .map(Self)
                    .map_err(|e| format!("{}: not a P-256 key: {e}", path.display()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = Self::generate();
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(path)
                    .and_then(|mut file| {
                        writeln!(file, "{}", URL_SAFE_NO_PAD.encode(key.0.to_bytes()))?;
                        file.sync_all()
                    })
                    .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                Ok(key)
            }
            Err(e) => Err(format!("cannot read {}: {e}", path.display())),
        }
    }

    /// The public key as browsers take it (`applicationServerKey`): the
    /// uncompressed P-256 point, base64url.
    pub fn public_key(&self) -> String {
        let point = self.0.public_key().public_key().to_bytes_uncompressed();
        URL_SAFE_NO_PAD.encode(point)
    }

    pub fn key_pair(&self) -> &ES256KeyPair {
        &self.0
    }
}

/// A push subscription as stored.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct PushSubscriptionRow {
    pub subscription_id: String,
    /// The device it belongs to; `None`: the owner's.
    pub device_id: Option<String>,
    pub endpoint: String,
    pub p256dh: String,
    pub auth: String,
    pub created_at: i64,
}

/// A subscription's parts, checked: 400 for an endpoint that is not
/// `https` (or `http` on loopback), too long or not a URL, a `p256dh` that
/// is not a P-256 point, an `auth` that is not 16 bytes.
pub fn check(subscription: &NewPushSubscription) -> Result<()> {
    let endpoint = &subscription.endpoint;
    if endpoint.len() > MAX_ENDPOINT_BYTES {
        return Err(Error::invalid(format!(
            "`endpoint` is over {MAX_ENDPOINT_BYTES} bytes."
        )));
    }
    // The URL parser would encode a control character away; the endpoint
    // is stored as given (PostgreSQL's text refuses U+0000).
    if endpoint.chars().any(char::is_control) {
        return Err(Error::invalid("`endpoint` holds a control character."));
    }
    let url = url::Url::parse(endpoint)
        .map_err(|e| Error::invalid(format!("`endpoint` is not a URL: {e}.")))?;
    let loopback = match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(name)) => name == "localhost",
        None => false,
    };
    match url.scheme() {
        "https" if url.host().is_some() => {}
        "http" if loopback => {}
        _ => {
            return Err(Error::invalid(
                "`endpoint` must be an https URL (plain http only on loopback).",
            ));
        }
    }
    let p256dh = decode("keys.p256dh", &subscription.keys.p256dh)?;
    if web_push_native::p256::PublicKey::from_sec1_bytes(&p256dh).is_err() {
        return Err(Error::invalid("`keys.p256dh` is not a P-256 public key."));
    }
    if decode("keys.auth", &subscription.keys.auth)?.len() != 16 {
        return Err(Error::invalid("`keys.auth` must be 16 bytes."));
    }
    Ok(())
}

fn decode(field: &str, value: &str) -> Result<Vec<u8>> {
    URL_SAFE_NO_PAD
        .decode(value.trim_end_matches('='))
        .map_err(|_| Error::invalid(format!("`{field}` is not base64url.")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::PushKeys;

    fn subscription(endpoint: &str) -> NewPushSubscription {
        let browser = ES256KeyPair::generate();
        NewPushSubscription {
            endpoint: endpoint.into(),
            keys: PushKeys {
                p256dh: URL_SAFE_NO_PAD
                    .encode(browser.public_key().public_key().to_bytes_uncompressed()),
                auth: URL_SAFE_NO_PAD.encode([7u8; 16]),
            },
        }
    }

    #[test]
    fn the_key_is_made_once_kept_private_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vapid.key");
        let made = Vapid::load_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = Vapid::load_or_create(&path).unwrap();
        assert_eq!(made.public_key(), again.public_key());
        let point = URL_SAFE_NO_PAD.decode(made.public_key()).unwrap();
        assert_eq!((point.len(), point[0]), (65, 4), "an uncompressed point");
        std::fs::write(&path, "not a key").unwrap();
        assert!(Vapid::load_or_create(&path).is_err());
    }

    #[test]
    fn endpoints_are_https_or_loopback_and_keys_are_checked() {
        for good in [
            "https://push.example.net/send/abc",
            "http://127.0.0.1:9/x",
            "http://[::1]/x",
            "http://localhost:8/x",
        ] {
            assert!(check(&subscription(good)).is_ok(), "{good}");
        }
        let long = format!(
            "https://push.example.net/{}",
            "a".repeat(MAX_ENDPOINT_BYTES)
        );
        for bad in [
            "http://push.example.net/x",
            "ftp://127.0.0.1/x",
            "not a url",
            "https://",
            "https://push.example.net/a\u{0}b",
            "https://push.example.net/a\tb",
            long.as_str(),
        ] {
            assert!(check(&subscription(bad)).is_err(), "{bad}");
        }
        let mut bad_key = subscription("https://push.example.net/x");
        bad_key.keys.p256dh = URL_SAFE_NO_PAD.encode([4u8; 65]);
        assert!(check(&bad_key).is_err());
        let mut bad_auth = subscription("https://push.example.net/x");
        bad_auth.keys.auth = URL_SAFE_NO_PAD.encode([1u8; 15]);
        assert!(check(&bad_auth).is_err());
        bad_auth.keys.auth = "***".into();
        assert!(check(&bad_auth).is_err());
    }
}
