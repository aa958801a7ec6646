//! Sealing secrets for the replicated state: tenants' registry passwords. AES-256-GCM under a
//! key derived (HKDF-SHA256) from the cluster CA's private key, which only voters hold, with the
//! tenant, registry and username as associated data (a sealed password moved to another tenant
//! or registry does not open). The state keeps the sealed bytes and the key's id
//! (`signature::key_id` of the CA certificate); only an agent holding the CA key seals or opens.

use gpu_raft_store::registry::SealedCredential;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::hkdf::{HKDF_SHA256, Salt};
use ring::rand::{SecureRandom, SystemRandom};

use super::files::NodeTls;
use super::signature;

/// Why a secret could not be sealed or opened.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("this agent holds no CA key (only voters do): ask a voter")]
    NoKey,
    #[error(
        "the credential was sealed under another cluster CA (key {sealed_by}, this cluster's is \
         {ours}): set it again"
    )]
    OtherKey { sealed_by: String, ours: String },
    #[error(
        "the sealed credential does not open (corrupt, or moved to another tenant or registry)"
    )]
    DoesNotOpen,
    #[error("sealing: {0}")]
    Crypto(String),
}

const SALT: &[u8] = b"gpumesh registry credentials v1";

/// The sealing key of the CA whose private key is `ca_key_pem`.
fn key(ca_key_pem: &str) -> Result<LessSafeKey, SealError> {
    let prk = Salt::new(HKDF_SHA256, SALT).extract(ca_key_pem.as_bytes());
    let okm = prk
        .expand(&[b"aes-256-gcm"], &AES_256_GCM)
        .map_err(|_| SealError::Crypto("deriving the key".into()))?;
    let key = UnboundKey::from(okm);
    Ok(LessSafeKey::new(key))
}

fn aad(tenant: &str, registry: &str, username: &str) -> Vec<u8> {
    [tenant, registry, username].join("\0").into_bytes()
}

/// Seal `password` for tenant `tenant`'s login `username` at `registry`.
pub fn seal(
    tls: &NodeTls,
    tenant: &str,
    registry: &str,
    username: &str,
    password: &str,
) -> Result<SealedCredential, SealError> {
    let ca_key = tls.ca_key_pem.as_deref().ok_or(SealError::NoKey)?;
    let key_id =
        signature::key_id(&tls.ca_cert_pem).map_err(|e| SealError::Crypto(e.to_string()))?;
    let mut nonce = [0u8; NONCE_LEN];
    SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| SealError::Crypto("no randomness".into()))?;
    let mut buf = password.as_bytes().to_vec();
    key(ca_key)?
        .seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad(tenant, registry, username)),
            &mut buf,
        )
        .map_err(|_| SealError::Crypto("sealing".into()))?;
    let mut sealed = nonce.to_vec();
    sealed.extend_from_slice(&buf);
    Ok(SealedCredential {
        username: username.to_owned(),
        sealed: hex::encode(sealed),
        key_id,
        set_at_ms: 0,
    })
}

/// Open tenant `tenant`'s sealed login at `registry`: its password.
pub fn open(
    tls: &NodeTls,
    tenant: &str,
    registry: &str,
    c: &SealedCredential,
) -> Result<String, SealError> {
    let ca_key = tls.ca_key_pem.as_deref().ok_or(SealError::NoKey)?;
    let ours = signature::key_id(&tls.ca_cert_pem).map_err(|e| SealError::Crypto(e.to_string()))?;
    if ours != c.key_id {
        return Err(SealError::OtherKey {
            sealed_by: c.key_id.clone(),
            ours,
        });
    }
    let bytes = hex::decode(&c.sealed).map_err(|_| SealError::DoesNotOpen)?;
    if bytes.len() < NONCE_LEN {
        return Err(SealError::DoesNotOpen);
    }
    let (nonce, rest) = bytes.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| SealError::DoesNotOpen)?;
    let mut buf = rest.to_vec();
    let plain = key(ca_key)?
        .open_in_place(
            nonce,
            Aad::from(aad(tenant, registry, &c.username)),
            &mut buf,
        )
        .map_err(|_| SealError::DoesNotOpen)?;
    String::from_utf8(plain.to_vec()).map_err(|_| SealError::DoesNotOpen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::pki;

    fn voter() -> NodeTls {
        let ca = pki::new_ca(
            std::time::SystemTime::now(),
            std::time::Duration::from_secs(3600),
        )
        .expect("ca");
        NodeTls {
            ca_cert_pem: ca.cert_pem.clone(),
            ca_key_pem: Some(ca.key_pem.clone()),
            // Not used by sealing.
            node: ca,
        }
    }

    #[test]
    fn a_sealed_password_opens_only_for_its_tenant_registry_and_cluster() {
        let tls = voter();
        let c = seal(&tls, "vision", "nvcr.io", "robot", "s3cret-pass").expect("sealed");
        assert!(!c.sealed.contains(&hex::encode("s3cret-pass")));
        assert_eq!(
            open(&tls, "vision", "nvcr.io", &c).expect("opens"),
            "s3cret-pass"
        );
        for (tenant, registry) in [("audio", "nvcr.io"), ("vision", "quay.io")] {
            assert!(matches!(
                open(&tls, tenant, registry, &c),
                Err(SealError::DoesNotOpen)
            ));
        }
        let renamed = SealedCredential {
            username: "other".into(),
            ..c.clone()
        };
        assert!(open(&tls, "vision", "nvcr.io", &renamed).is_err());
        let other = voter();
        assert!(matches!(
            open(&other, "vision", "nvcr.io", &c),
            Err(SealError::OtherKey { .. })
        ));
        let learner = NodeTls {
            ca_key_pem: None,
            ..tls
        };
        assert!(matches!(
            seal(&learner, "vision", "nvcr.io", "robot", "x"),
            Err(SealError::NoKey)
        ));
    }
}
