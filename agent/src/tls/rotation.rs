//! The commands of a CA rotation's steps that need the CA keys (`gpu_raft_store::ca`): made
//! on a voter, which holds them. Introduce makes a new CA and seals its key under the signing
//! CA's; switch seals every registry login again under the new CA's key.

use std::collections::BTreeMap;
use std::time::SystemTime;

use gpu_raft_store::Command;
use gpu_raft_store::ca::{CaCert, CaSet, ResealedCredential};
use gpu_raft_store::registry::SealedCredential;

use super::enroll::CA_VALIDITY;
use super::files::NodeTls;
use super::pki::{self, KeyedCert};
use super::{sealing, signature};

/// Why this agent cannot make a rotation step's command.
#[derive(Debug, thiserror::Error)]
pub enum RotationError {
    #[error("this agent holds no CA key (it is not a voter): send this to a voter")]
    NotASigner,
    #[error("this agent has not caught up with the cluster's CAs yet: ask again in a few seconds")]
    NotCaughtUp,
    #[error("{0}")]
    Crypto(String),
}

fn crypto(e: impl std::fmt::Display) -> RotationError {
    RotationError::Crypto(e.to_string())
}

fn ca_cert(ca: &KeyedCert) -> Result<CaCert, RotationError> {
    Ok(CaCert {
        key_id: signature::key_id(&ca.cert_pem).map_err(crypto)?,
        cert_pem: ca.cert_pem.clone(),
    })
}

/// `IntroduceCa` for a new CA made here, beside this agent's signing CA (which must be the
/// cluster's, `set`).
pub fn introduce(tls: &NodeTls, set: Option<&CaSet>) -> Result<Command, RotationError> {
    let signing = tls.signing_ca().ok_or(RotationError::NotASigner)?;
    let current = ca_cert(&signing)?;
    if set.is_some_and(|s| s.signing != current.key_id) {
        return Err(RotationError::NotCaughtUp);
    }
    let next = pki::new_ca(SystemTime::now(), CA_VALIDITY).map_err(crypto)?;
    let sealed_key = sealing::seal_ca_key(tls, &next).map_err(crypto)?;
    Ok(Command::IntroduceCa {
        current,
        next: ca_cert(&next)?,
        sealed_key,
    })
}

/// `SwitchCa` to the CA `set` introduced, with every registry login sealed under the signing
/// CA's key sealed again under the new one's.
pub fn switch(
    tls: &NodeTls,
    set: &CaSet,
    logins: &BTreeMap<String, BTreeMap<String, SealedCredential>>,
) -> Result<Command, RotationError> {
    let next = set.next.as_ref().ok_or(RotationError::NotCaughtUp)?;
    if tls.ca_key_pem.is_none() {
        return Err(RotationError::NotASigner);
    }
    if tls.signing_key_id().map_err(crypto)?.as_ref() != Some(&set.signing)
        || tls.next_key_id().map_err(crypto)?.as_ref() != Some(&next.key_id)
    {
        return Err(RotationError::NotCaughtUp);
    }
    let mut resealed = Vec::new();
    for (tenant, by_registry) in logins {
        for (registry, login) in by_registry {
            if login.key_id != set.signing {
                continue;
            }
            let credential = sealing::reseal(tls, tenant, registry, login).map_err(crypto)?;
            resealed.push(ResealedCredential {
                tenant: tenant.clone(),
                registry: registry.clone(),
                credential,
            });
        }
    }
    Ok(Command::SwitchCa {
        key_id: next.key_id.clone(),
        resealed,
    })
}
