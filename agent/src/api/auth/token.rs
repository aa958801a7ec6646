//! Bearer tokens: `<id>.<secret>`. The cluster stores only the SHA-256 of the secret and
//! compares digests in constant time.

use gpu_raft_store::TokenRecord;
use sha2::{Digest, Sha256};

use super::rbac::Identity;

/// A freshly minted credential: the public id, the secret (shown once), and what is stored.
pub struct Minted {
    pub id: String,
    pub bearer: String,
    pub secret_sha256: String,
}

pub fn mint() -> Minted {
    let id = format!("t{}", hex::encode(rand::random::<[u8; 6]>()));
    let secret = hex::encode(rand::random::<[u8; 32]>());
    Minted {
        bearer: format!("{id}.{secret}"),
        secret_sha256: digest(&secret),
        id,
    }
}

pub fn digest(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Split `Bearer <id>.<secret>` (the `authorization` header value) into id and secret.
pub fn parse_header(value: &str) -> Option<(&str, &str)> {
    let token = value.strip_prefix("Bearer ")?.trim();
    let (id, secret) = token.split_once('.')?;
    let plausible =
        |s: &str| !s.is_empty() && s.len() <= 128 && s.chars().all(|c| c.is_ascii_alphanumeric());
    (plausible(id) && plausible(secret)).then_some((id, secret))
}

/// Who a token's holder is at `now_ms`, from its replicated record (`None`: unknown here) and
/// the secret they presented; else why not (unknown, wrong secret, revoked, expired, used up).
pub fn identify(
    record: Option<&TokenRecord>,
    secret: &str,
    now_ms: u64,
) -> Result<Identity, String> {
    let t = record
        .filter(|t| matches(secret, &t.secret_sha256))
        .ok_or("invalid token (unknown token or wrong secret)")?;
    t.usable_at(now_ms)?;
    Ok(Identity {
        token_id: t.id.clone(),
        role: t.role,
        tenant: t.tenant.clone(),
    })
}

/// Whether `secret` hashes to `stored` (hex SHA-256), in time independent of where they differ.
pub fn matches(secret: &str, stored: &str) -> bool {
    let computed = digest(secret);
    let (a, b) = (computed.as_bytes(), stored.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_tokens_verify_and_others_do_not() {
        let m = mint();
        let header = format!("Bearer {}", m.bearer);
        let (id, secret) = parse_header(&header).expect("parses");
        assert_eq!(id, m.id);
        assert!(matches(secret, &m.secret_sha256));
        assert!(!matches("0", &m.secret_sha256));
        assert!(!matches(secret, "short"));
        assert_ne!(mint().bearer, m.bearer);
    }

    #[test]
    fn malformed_headers_are_refused() {
        for bad in [
            "",
            "Bearer",
            "Bearer ",
            "Bearer x",
            "Bearer .s",
            "Bearer i.",
            "Basic i.s",
            "Bearer i.s\u{0}",
            "Bearer a.b.c",
        ] {
            assert_eq!(parse_header(bad), None, "{bad:?}");
        }
        let long = format!("Bearer a.{}", "s".repeat(1000));
        assert_eq!(parse_header(&long), None);
    }
}
