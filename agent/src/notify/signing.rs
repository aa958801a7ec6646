//! The signature on webhook posts: HMAC-SHA256 over `TIMESTAMP.BODY` (the timestamp also sent,
//! so a receiver can refuse an old post replayed), keyed per tenant with a key derived
//! (HKDF-SHA256) from the cluster CA's private key. Only voters hold that key, so only they
//! sign or show the secret; nothing secret is kept in the replicated state. A CA rotation
//! changes every tenant's secret (the `X-Gpumesh-Key-Id` header names the CA).

use ring::hkdf::{HKDF_SHA256, KeyType, Salt};
use ring::hmac;

const SALT: &[u8] = b"gpumesh webhooks v1";

/// 32 bytes of HKDF output.
struct Len32;

impl KeyType for Len32 {
    fn len(&self) -> usize {
        32
    }
}

/// Tenant `tenant`'s webhook secret under the CA whose private key is `ca_key_pem`.
pub(crate) fn secret(ca_key_pem: &str, tenant: &str) -> [u8; 32] {
    let prk = Salt::new(HKDF_SHA256, SALT).extract(ca_key_pem.as_bytes());
    let mut out = [0u8; 32];
    let info = [tenant.as_bytes()];
    // 32 bytes is far below HKDF-SHA256's limit: neither step can fail.
    if let Ok(okm) = prk.expand(&info, Len32) {
        let _ = okm.fill(&mut out);
    }
    out
}

/// `sha256=HEX`: the signature of `body` sent at `timestamp_s` under `secret`.
pub(crate) fn signature(secret: &[u8], timestamp_s: u64, body: &[u8]) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    let mut ctx = hmac::Context::with_key(&key);
    ctx.update(timestamp_s.to_string().as_bytes());
    ctx.update(b".");
    ctx.update(body);
    format!("sha256={}", hex::encode(ctx.sign().as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_rfc_4231_hmac_sha256_of_timestamp_dot_body() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        let sig = signature(b"Jefe", 0, b"what do ya want for nothing?");
        assert_ne!(sig, "", "shape");
        let key = hmac::Key::new(hmac::HMAC_SHA256, b"Jefe");
        let data = b"what do ya want for nothing?";
        assert_eq!(
            hex::encode(hmac::sign(&key, data).as_ref()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        let manual = hmac::sign(&key, b"0.what do ya want for nothing?");
        assert_eq!(sig, format!("sha256={}", hex::encode(manual.as_ref())));
    }

    #[test]
    fn each_tenant_and_each_ca_has_its_own_secret() {
        let a = secret("ca key one", "vision");
        assert_eq!(a, secret("ca key one", "vision"), "stable");
        assert_ne!(a, secret("ca key one", "nlp"));
        assert_ne!(a, secret("ca key two", "vision"));
        assert_ne!(a, [0u8; 32]);
    }
}
