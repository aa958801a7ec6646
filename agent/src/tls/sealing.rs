//! Sealing secrets for the replicated state: tenants' registry passwords. AES-256-GCM under a
//! key derived (HKDF-SHA256) from the cluster CA's private key, which only voters hold, with the
//! tenant, registry and username as associated data (a sealed password moved to another tenant
//! or registry does not open). The state keeps the sealed bytes and the key's id
//! (`signature::key_id` of the CA certificate); only an agent holding the CA key seals or opens.
//! A CA rotation seals the new CA's key the same way for the other signers, and seals every
//! login again under the new key at the switch (`reseal`).

use gpu_raft_store::registry::SealedCredential;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::hkdf::{HKDF_SHA256, Salt};
use ring::rand::{SecureRandom, SystemRandom};

use super::files::NodeTls;
use super::pki::KeyedCert;
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

/// Seal `password` for tenant `tenant`'s login `username` at `registry`, under the signing
/// CA's key.
pub fn seal(
    tls: &NodeTls,
    tenant: &str,
    registry: &str,
    username: &str,
    password: &str,
) -> Result<SealedCredential, SealError> {
    seal_under(
        &tls.signing_ca().ok_or(SealError::NoKey)?,
        tenant,
        registry,
        username,
        password,
    )
}

/// Open tenant `tenant`'s sealed login at `registry`: its password.
pub fn open(
    tls: &NodeTls,
    tenant: &str,
    registry: &str,
    c: &SealedCredential,
) -> Result<String, SealError> {
    let ca = tls.signing_ca().ok_or(SealError::NoKey)?;
    let plain = open_under(
        &ca,
        &c.key_id,
        &aad(tenant, registry, &c.username),
        &c.sealed,
    )?;
    String::from_utf8(plain).map_err(|_| SealError::DoesNotOpen)
}

/// A login sealed under the signing CA's key, sealed again under the introduced CA's (the
/// switch of a CA rotation).
pub fn reseal(
    tls: &NodeTls,
    tenant: &str,
    registry: &str,
    c: &SealedCredential,
) -> Result<SealedCredential, SealError> {
    let next = tls.next_ca().ok_or(SealError::NoKey)?;
    let password = open(tls, tenant, registry, c)?;
    Ok(SealedCredential {
        set_at_ms: c.set_at_ms,
        ..seal_under(&next, tenant, registry, &c.username, &password)?
    })
}

/// The private key of CA `next`, sealed under the signing CA's key for the other signers.
pub fn seal_ca_key(tls: &NodeTls, next: &KeyedCert) -> Result<String, SealError> {
    let ca = tls.signing_ca().ok_or(SealError::NoKey)?;
    let aad = ca_key_aad(&key_id_of(&next.cert_pem)?);
    Ok(hex::encode(seal_bytes(
        &ca.key_pem,
        &aad,
        next.key_pem.as_bytes(),
    )?))
}

/// The private key of CA `next_key_id`, sealed under `signing_key_id` (`seal_ca_key`).
pub fn open_ca_key(
    tls: &NodeTls,
    signing_key_id: &str,
    next_key_id: &str,
    sealed: &str,
) -> Result<String, SealError> {
    let ca = tls.signing_ca().ok_or(SealError::NoKey)?;
    let plain = open_under(&ca, signing_key_id, &ca_key_aad(next_key_id), sealed)?;
    String::from_utf8(plain).map_err(|_| SealError::DoesNotOpen)
}

fn seal_under(
    ca: &KeyedCert,
    tenant: &str,
    registry: &str,
    username: &str,
    password: &str,
) -> Result<SealedCredential, SealError> {
    let sealed = seal_bytes(
        &ca.key_pem,
        &aad(tenant, registry, username),
        password.as_bytes(),
    )?;
    Ok(SealedCredential {
        username: username.to_owned(),
        sealed: hex::encode(sealed),
        key_id: key_id_of(&ca.cert_pem)?,
        set_at_ms: 0,
    })
}

/// Open `sealed` (hex), which says it was sealed under key `sealed_by`, with `ca`.
fn open_under(
    ca: &KeyedCert,
    sealed_by: &str,
    aad: &[u8],
    sealed: &str,
) -> Result<Vec<u8>, SealError> {
    let ours = key_id_of(&ca.cert_pem)?;
    if ours != sealed_by {
        return Err(SealError::OtherKey {
            sealed_by: sealed_by.to_owned(),
            ours,
        });
    }
    let bytes = hex::decode(sealed).map_err(|_| SealError::DoesNotOpen)?;
    if bytes.len() < NONCE_LEN {
        return Err(SealError::DoesNotOpen);
    }
    let (nonce, rest) = bytes.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| SealError::DoesNotOpen)?;
    let mut buf = rest.to_vec();
    let plain = key(&ca.key_pem)?
        .open_in_place(nonce, Aad::from(aad), &mut buf)
        .map_err(|_| SealError::DoesNotOpen)?;
    Ok(plain.to_vec())
}

/// Nonce, then ciphertext and tag.
fn seal_bytes(ca_key_pem: &str, aad: &[u8], plain: &[u8]) -> Result<Vec<u8>, SealError> {
    let mut nonce = [0u8; NONCE_LEN];
    SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| SealError::Crypto("no randomness".into()))?;
    let mut buf = plain.to_vec();
    key(ca_key_pem)?
        .seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad),
            &mut buf,
        )
        .map_err(|_| SealError::Crypto("sealing".into()))?;
    let mut sealed = nonce.to_vec();
    sealed.extend_from_slice(&buf);
    Ok(sealed)
}

fn key_id_of(cert_pem: &str) -> Result<String, SealError> {
    signature::key_id(cert_pem).map_err(|e| SealError::Crypto(e.to_string()))
}

fn ca_key_aad(next_key_id: &str) -> Vec<u8> {
    format!("ca key\0{next_key_id}").into_bytes()
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
            ca_key_pem: Some(ca.key_pem.clone()),
            // Not used by sealing.
            ..NodeTls::keyless(ca.cert_pem.clone(), ca)
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
        let learner = NodeTls::keyless(tls.ca_cert_pem.clone(), tls.node.clone());
        assert!(matches!(
            seal(&learner, "vision", "nvcr.io", "robot", "x"),
            Err(SealError::NoKey)
        ));
    }

    #[test]
    fn a_rotation_carries_the_next_key_and_the_logins_across() {
        let tls = voter();
        let next = pki::new_ca(
            std::time::SystemTime::now(),
            std::time::Duration::from_secs(3600),
        )
        .expect("next ca");
        let (signing_id, next_id) = (
            key_id_of(&tls.ca_cert_pem).expect("id"),
            key_id_of(&next.cert_pem).expect("id"),
        );
        let sealed_key = seal_ca_key(&tls, &next).expect("sealed");
        assert!(!sealed_key.contains(&hex::encode(&next.key_pem[40..60])));
        let opened = open_ca_key(&tls, &signing_id, &next_id, &sealed_key).expect("opens");
        assert_eq!(opened, next.key_pem);
        // Named for another CA, or opened by another cluster: nothing.
        assert!(open_ca_key(&tls, &signing_id, &signing_id, &sealed_key).is_err());
        assert!(open_ca_key(&voter(), &signing_id, &next_id, &sealed_key).is_err());

        let login = seal(&tls, "vision", "nvcr.io", "robot", "pw").expect("sealed");
        let both = NodeTls {
            ca_cert_pem: format!("{}{}", tls.ca_cert_pem, next.cert_pem),
            next_ca_key_pem: Some(opened),
            ..tls.clone()
        };
        let resealed = reseal(&both, "vision", "nvcr.io", &login).expect("resealed");
        assert_eq!(resealed.key_id, next_id);
        let switched = NodeTls {
            ca_key_pem: both.next_ca_key_pem.clone(),
            next_ca_key_pem: None,
            ..both
        };
        assert_eq!(
            open(&switched, "vision", "nvcr.io", &resealed).expect("opens"),
            "pw"
        );
        assert!(matches!(
            open(&switched, "vision", "nvcr.io", &login),
            Err(SealError::OtherKey { .. })
        ));
    }
}
