//! The cluster's certificate authorities while one is rotated. Before the first rotation the
//! state names none: the CA is the one each agent holds on disk since bootstrap. A rotation
//! moves in three steps, each a command an admin sends:
//! 1. `IntroduceCa`: a new CA is trusted beside the signing one (agents install both); its key
//!    travels sealed under the signing CA's key, which only the signers (voters) can open;
//! 2. `SwitchCa`: the new CA signs from now on, and every agent renews its certificate;
//! 3. `RetireCa`: the old CA is trusted no more, once nothing in use chains to it.
//!
//! Agents report which CAs they have installed (`ReportTrust`), so the switch waits until
//! every member would accept a certificate of the new CA.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::NodeId;
use crate::model::registry::SealedCredential;

/// The longest CA certificate (PEM) the state keeps: a P-256 CA is under 1 KiB.
pub const MAX_CA_PEM: usize = 8 * 1024;
/// The longest sealed key (hex of nonce, a PEM key, tag).
const MAX_SEALED_KEY: usize = 8 * 1024;
/// The most CAs trusted at once (the signing one, the next, and a retiring one).
pub const MAX_TRUSTED_CAS: usize = 3;

/// One CA certificate, named by its key id (the hex SHA-256 of its public key, as signed audit
/// heads and sealed secrets name it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaCert {
    pub key_id: String,
    pub cert_pem: String,
}

/// The CA introduced to replace the signing one, until the switch.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NextCa {
    pub key_id: String,
    /// Its private key, sealed under the signing CA's key (hex): voters open it.
    pub sealed_key: String,
}

impl std::fmt::Debug for NextCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NextCa")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

/// The CAs the cluster trusts and which one signs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaSet {
    /// Every CA agents and tools trust, by key id.
    pub trusted: BTreeMap<String, CaCert>,
    /// The key id of the CA that signs certificates.
    pub signing: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<NextCa>,
    /// The key ids each agent reported it has installed.
    #[serde(default)]
    pub installed: BTreeMap<NodeId, BTreeSet<String>>,
    /// When the set last changed (the log entry's time).
    #[serde(default)]
    pub changed_at_ms: u64,
}

impl CaSet {
    /// The trust bundle: every trusted CA's certificate, the signing one first.
    pub fn bundle_pem(&self) -> String {
        let signing = self.trusted.get(&self.signing);
        let others = self.trusted.values().filter(|c| c.key_id != self.signing);
        signing
            .into_iter()
            .chain(others)
            .map(|c| c.cert_pem.trim_end().to_owned() + "\n")
            .collect()
    }

    /// The signing CA's certificate.
    pub fn signing_cert_pem(&self) -> Option<String> {
        self.trusted.get(&self.signing).map(|c| c.cert_pem.clone())
    }

    /// Whether `node` reported it trusts every CA of the set.
    pub fn installed_by(&self, node: NodeId) -> bool {
        self.installed
            .get(&node)
            .is_some_and(|ids| self.trusted.keys().all(|id| ids.contains(id)))
    }
}

/// A registry login sealed again under the new CA's key at the switch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResealedCredential {
    pub tenant: String,
    pub registry: String,
    pub credential: SealedCredential,
}

/// A key id: the hex SHA-256 of a public key.
pub fn check_key_id(id: &str) -> Result<(), String> {
    if id.len() == 64
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(())
    } else {
        Err(format!(
            "a CA key id is 64 lower-case hex digits, got {id:?}"
        ))
    }
}

/// A CA certificate as a command carries it: a key id and one PEM certificate of bounded size.
pub fn check_ca(ca: &CaCert) -> Result<(), String> {
    check_key_id(&ca.key_id)?;
    let pem = ca.cert_pem.trim();
    let one = pem.starts_with("-----BEGIN CERTIFICATE-----")
        && pem.ends_with("-----END CERTIFICATE-----")
        && pem.matches("BEGIN").count() == 1;
    if !one || ca.cert_pem.len() > MAX_CA_PEM {
        return Err(format!(
            "CA {} must be one PEM certificate of at most {MAX_CA_PEM} bytes",
            ca.key_id
        ));
    }
    Ok(())
}

/// A sealed key: hex of bounded length.
pub fn check_sealed_key(sealed: &str) -> Result<(), String> {
    let ok = !sealed.is_empty()
        && sealed.len() <= MAX_SEALED_KEY
        && sealed.bytes().all(|b| b.is_ascii_hexdigit());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "the sealed CA key must be hex of at most {MAX_SEALED_KEY} characters"
        ))
    }
}
