//! Signatures with the cluster CA key over things that are not certificates: the audit chain's
//! signed heads. A signature names its key by the SHA-256 of the public key (`key_id`), so a
//! verifier looks the key up among the CA certificates it trusts (`TrustedSigners`): the
//! cluster's own, and those of earlier clusters an operator vouches for after a restore.

use std::collections::BTreeMap;

use gpu_raft_store::SignedHead;
use gpu_raft_store::audit::head_message;
use rcgen::{KeyPair, PublicKeyData, SigningKey};
use sha2::{Digest, Sha256};

use super::pki::{KeyedCert, PkiError};

/// The hex SHA-256 of a certificate's public key: what a signature names its key by.
pub fn key_id(cert_pem: &str) -> Result<String, PkiError> {
    Ok(hex::encode(Sha256::digest(public_key(cert_pem)?)))
}

/// A head for entry `seq` of hash `hash`, signed with the CA key.
pub fn sign_head(ca: &KeyedCert, seq: u64, hash: &str) -> Result<SignedHead, PkiError> {
    let key = KeyPair::from_pem(&ca.key_pem)?;
    let signature = key.sign(&head_message(seq, hash))?;
    let key_id = hex::encode(Sha256::digest(key.der_bytes()));
    if key_id != self::key_id(&ca.cert_pem)? {
        return Err(PkiError::Invalid(
            "the CA key does not belong to the CA certificate".into(),
        ));
    }
    Ok(SignedHead {
        seq,
        hash: hash.to_owned(),
        time_ms: 0,
        key_id,
        signature: hex::encode(signature),
    })
}

/// The CA certificates whose signatures a verifier accepts, by key id.
#[derive(Debug, Default)]
pub struct TrustedSigners {
    keys: BTreeMap<String, Vec<u8>>,
}

impl TrustedSigners {
    /// Trust the CA of each certificate (a PEM text may hold several, a trust bundle); one
    /// that does not parse is refused with why.
    pub fn of<'a>(cert_pems: impl IntoIterator<Item = &'a str>) -> Result<Self, PkiError> {
        let mut keys = BTreeMap::new();
        for pem in cert_pems {
            let certs = super::pki::certs_in(pem);
            if certs.is_empty() {
                public_key(pem)?;
            }
            for cert in certs {
                let key = public_key(&cert)?;
                keys.insert(hex::encode(Sha256::digest(&key)), key);
            }
        }
        Ok(Self { keys })
    }

    /// Whether a trusted key made `head`'s signature over its entry and hash.
    pub fn check(&self, head: &SignedHead) -> Result<(), String> {
        let key = self.keys.get(&head.key_id).ok_or_else(|| {
            format!(
                "it is signed by key {}, which is not a CA this cluster trusts (an earlier \
                 cluster's CA can be trusted with --trust CA_FILE)",
                short(&head.key_id)
            )
        })?;
        let signature = hex::decode(&head.signature).map_err(|_| "its signature is not hex")?;
        ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_ASN1, key)
            .verify(&head_message(head.seq, &head.hash), &signature)
            .map_err(|_| "its signature does not verify: the head was forged or altered".into())
    }
}

fn short(id: &str) -> &str {
    id.get(..16).unwrap_or(id)
}

/// The raw public key (the SubjectPublicKeyInfo's bit string) of a PEM certificate.
fn public_key(cert_pem: &str) -> Result<Vec<u8>, PkiError> {
    use x509_parser::prelude::*;
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
        .map_err(|e| PkiError::Parse(e.to_string()))?;
    let (_, cert) =
        X509Certificate::from_der(&pem.contents).map_err(|e| PkiError::Parse(e.to_string()))?;
    Ok(cert.public_key().subject_public_key.data.to_vec())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::tls::pki;

    fn ca() -> KeyedCert {
        pki::new_ca(SystemTime::now(), Duration::from_secs(3600)).expect("ca")
    }

    #[test]
    fn a_head_verifies_under_its_ca_only() {
        let (ours, theirs) = (ca(), ca());
        let head = sign_head(&ours, 7, &"ab".repeat(32)).expect("sign");
        assert_eq!(head.key_id, key_id(&ours.cert_pem).expect("id"));
        let trusted = TrustedSigners::of([ours.cert_pem.as_str()]).expect("trust");
        assert_eq!(trusted.check(&head), Ok(()));

        let altered = SignedHead {
            hash: "cd".repeat(32),
            ..head.clone()
        };
        let problem = trusted.check(&altered).expect_err("altered");
        assert!(problem.contains("does not verify"), "{problem}");

        let forged = sign_head(&theirs, 7, &"ab".repeat(32)).expect("sign");
        let problem = trusted.check(&forged).expect_err("foreign key");
        assert!(
            problem.contains("not a CA this cluster trusts"),
            "{problem}"
        );
        let both = TrustedSigners::of([ours.cert_pem.as_str(), theirs.cert_pem.as_str()]);
        assert_eq!(both.expect("trust").check(&forged), Ok(()));
    }

    #[test]
    fn a_key_of_another_ca_is_refused() {
        let (ours, theirs) = (ca(), ca());
        let mixed = KeyedCert {
            cert_pem: ours.cert_pem,
            key_pem: theirs.key_pem,
        };
        assert!(sign_head(&mixed, 1, "ab").is_err());
    }
}
