//! Lark's event crypto, on RustCrypto crates: AES-256-CBC decryption of
//! `{"encrypt": …}` bodies and the request signature, compared in constant time.

use aes::cipher::{BlockDecryptMut, KeyIvInit, block_padding::Pkcs7};
use base64::Engine;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

type Aes256CbcDec = cbc::Decryptor<aes::Aes256>;

/// Decrypts an `encrypt` field: key = SHA-256(encrypt_key), IV = the first 16
/// bytes, PKCS#7 padding. `None` when it does not decrypt.
pub fn decrypt(encrypt_key: &str, encrypted: &str) -> Option<Vec<u8>> {
    let data = base64::engine::general_purpose::STANDARD
        .decode(encrypted.trim())
        .ok()?;
    if data.len() < 32 || data.len() % 16 != 0 {
        return None;
    }
    let key = Sha256::digest(encrypt_key.as_bytes());
    let (iv, ciphertext) = data.split_at(16);
    Aes256CbcDec::new_from_slices(&key, iv)
        .ok()?
        .decrypt_padded_vec_mut::<Pkcs7>(ciphertext)
        .ok()
}

/// `lowercase_hex(SHA-256(timestamp + nonce + encrypt_key ++ body))`.
pub fn signature(timestamp: &str, nonce: &str, encrypt_key: &str, body: &[u8]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(timestamp.as_bytes());
    hasher.update(nonce.as_bytes());
    hasher.update(encrypt_key.as_bytes());
    hasher.update(body);
    hex::encode(hasher.finalize())
}

/// Whether `presented` is the signature of `body`, in constant time.
pub fn signature_matches(
    timestamp: &str,
    nonce: &str,
    encrypt_key: &str,
    body: &[u8],
    presented: &str,
) -> bool {
    let expected = signature(timestamp, nonce, encrypt_key, body);
    expected
        .as_bytes()
        .ct_eq(presented.trim().to_ascii_lowercase().as_bytes())
        .into()
}

/// Constant-time equality of two secrets.
pub fn secret_eq(a: &str, b: &str) -> bool {
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decrypts_larks_test_vector() {
        let plain = decrypt("test key", "P37w+VZImNgPEO1RBhJ6RtKl7n6zymIbEG1pReEzghk=").unwrap();
        assert_eq!(plain, b"hello world");
    }

    #[test]
    fn refuses_what_does_not_decrypt() {
        assert!(
            decrypt(
                "another key",
                "P37w+VZImNgPEO1RBhJ6RtKl7n6zymIbEG1pReEzghk="
            )
            .is_none()
        );
        assert!(decrypt("test key", "not base64!").is_none());
        assert!(decrypt("test key", "AAAA").is_none());
    }

    #[test]
    fn signs_larks_test_vector() {
        let body = br#"{"encrypt":"P37w+VZImNgPEO1RBhJ6RtKl7n6zymIbEG1pReEzghk="}"#;
        let expected = "44cd1c114dbce2df6d5c0a5e849db7d1c34e597708c36e3112157c8c322e0d1e";
        assert_eq!(
            signature("1752346850", "950646929", "test key", body),
            expected
        );
        assert!(signature_matches(
            "1752346850",
            "950646929",
            "test key",
            body,
            expected
        ));
        assert!(!signature_matches(
            "1752346851",
            "950646929",
            "test key",
            body,
            expected
        ));
        let mut tampered = body.to_vec();
        tampered.push(b' ');
        assert!(!signature_matches(
            "1752346850",
            "950646929",
            "test key",
            &tampered,
            expected
        ));
    }
}
