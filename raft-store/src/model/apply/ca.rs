//! Applying a CA rotation's steps (`model/ca.rs`): introduce, switch, retire, and the agents'
//! reports of what they trust.

use std::collections::{BTreeMap, BTreeSet};

use crate::NodeId;
use crate::model::ca::{self, CaCert, CaSet, MAX_TRUSTED_CAS, NextCa, ResealedCredential};
use crate::model::outcome::{ApplyResult, Rejection, invalid};
use crate::model::state::ClusterState;

fn not_now(message: String) -> Rejection {
    Rejection::NotNow { message }
}

impl ClusterState {
    /// Trust `next` beside the signing CA `current`. The first rotation names the cluster's
    /// first CA here, and the certificates recorded without an issuer get its key id.
    pub(crate) fn introduce_ca(
        &mut self,
        current: &CaCert,
        next: &CaCert,
        sealed_key: &str,
        now: u64,
    ) -> Result<ApplyResult, Rejection> {
        ca::check_ca(current).map_err(invalid)?;
        ca::check_ca(next).map_err(invalid)?;
        ca::check_sealed_key(sealed_key).map_err(invalid)?;
        if current.key_id == next.key_id {
            return Err(invalid("the new CA is the signing one".into()));
        }
        if let Some(set) = &self.ca {
            if let Some(pending) = &set.next {
                return Err(not_now(format!(
                    "CA {} was introduced already: switch to it, or retire it to call the \
                     rotation off",
                    pending.key_id
                )));
            }
            if set.signing != current.key_id {
                return Err(not_now(format!(
                    "the signing CA is {}, not {}",
                    set.signing, current.key_id
                )));
            }
            if set.trusted.len() >= MAX_TRUSTED_CAS {
                return Err(not_now(format!(
                    "{MAX_TRUSTED_CAS} CAs are trusted already: retire the old one first"
                )));
            }
        }
        let set = self.ca.get_or_insert_with(|| CaSet {
            trusted: BTreeMap::from([(current.key_id.clone(), current.clone())]),
            signing: current.key_id.clone(),
            ..CaSet::default()
        });
        set.trusted.insert(next.key_id.clone(), next.clone());
        set.next = Some(NextCa {
            key_id: next.key_id.clone(),
            sealed_key: sealed_key.to_owned(),
        });
        set.changed_at_ms = now;
        for cert in self.certificates.values_mut() {
            if cert.issuer.is_empty() {
                cert.issuer = current.key_id.clone();
            }
        }
        Ok(ApplyResult::Ok)
    }

    /// Sign with the introduced CA from now on; the registry logins sealed under the old CA's
    /// key are replaced by `resealed`, all of them or none.
    pub(crate) fn switch_ca(
        &mut self,
        key_id: &str,
        resealed: &[ResealedCredential],
        now: u64,
    ) -> Result<ApplyResult, Rejection> {
        let set = self.ca.as_ref().ok_or_else(no_rotation)?;
        match &set.next {
            Some(next) if next.key_id == key_id => {}
            Some(next) => {
                return Err(not_now(format!(
                    "the CA introduced is {}, not {key_id}",
                    next.key_id
                )));
            }
            None => return Err(not_now("no CA is introduced: introduce one first".into())),
        }
        let old = set.signing.clone();
        let mut logins = self.registry_credentials.clone();
        for r in resealed {
            let login = logins
                .get_mut(&r.tenant)
                .and_then(|by_registry| by_registry.get_mut(&r.registry))
                .filter(|l| l.key_id == old && l.username == r.credential.username)
                .ok_or_else(|| {
                    not_now(format!(
                        "registry login {}@{} changed during the switch: switch again",
                        r.tenant, r.registry
                    ))
                })?;
            if r.credential.key_id != key_id {
                return Err(invalid(format!(
                    "registry login {}@{} was not sealed under the new CA",
                    r.tenant, r.registry
                )));
            }
            login.sealed = r.credential.sealed.clone();
            login.key_id = key_id.to_owned();
        }
        if let Some((tenant, registry)) = logins.iter().find_map(|(tenant, by_registry)| {
            by_registry
                .iter()
                .find(|(_, l)| l.key_id == old)
                .map(|(registry, _)| (tenant, registry))
        }) {
            return Err(not_now(format!(
                "registry login {tenant}@{registry} is still sealed under the old CA (set during \
                 the switch): switch again"
            )));
        }
        self.registry_credentials = logins;
        let set = self.ca.as_mut().ok_or_else(no_rotation)?;
        set.signing = key_id.to_owned();
        set.next = None;
        set.changed_at_ms = now;
        Ok(ApplyResult::Ok)
    }

    /// Trust CA `key_id` no more: refused while a certificate in use (the newest valid one of
    /// its subject) chains to it. Its certificate stays trusted for the audit heads it signed.
    /// A CA introduced but not switched to is simply dropped.
    pub(crate) fn retire_ca(&mut self, key_id: &str, now: u64) -> Result<ApplyResult, Rejection> {
        let set = self.ca.as_ref().ok_or_else(no_rotation)?;
        let cert = set
            .trusted
            .get(key_id)
            .ok_or_else(|| invalid(format!("CA {key_id} is not trusted")))?
            .clone();
        if set.signing == key_id {
            return Err(not_now(format!(
                "CA {key_id} signs: introduce another and switch to it first"
            )));
        }
        let calling_off = set.next.as_ref().is_some_and(|n| n.key_id == key_id);
        if !calling_off {
            let in_use = self.certificates_in_use_from(key_id, now);
            if !in_use.is_empty() {
                return Err(not_now(format!(
                    "these certificates in use still chain to CA {key_id}: {} (agents renew \
                     theirs after the switch; clients get a new one with `gpuctl cert request`, \
                     or revoke it)",
                    in_use.join(", ")
                )));
            }
        }
        let set = self.ca.as_mut().ok_or_else(no_rotation)?;
        set.trusted.remove(key_id);
        set.changed_at_ms = now;
        if calling_off {
            set.next = None;
        } else if !self.audit_signers.contains(&cert.cert_pem) {
            self.audit_signers.push(cert.cert_pem);
        }
        Ok(ApplyResult::Ok)
    }

    /// `node` has installed these CAs.
    pub(crate) fn report_trust(
        &mut self,
        node: NodeId,
        key_ids: &BTreeSet<String>,
    ) -> Result<ApplyResult, Rejection> {
        if key_ids.is_empty() || key_ids.len() > 2 * MAX_TRUSTED_CAS {
            return Err(invalid(format!(
                "an agent trusts 1 to {} CAs",
                2 * MAX_TRUSTED_CAS
            )));
        }
        for id in key_ids {
            ca::check_key_id(id).map_err(invalid)?;
        }
        let set = self.ca.as_mut().ok_or_else(no_rotation)?;
        set.installed.insert(node, key_ids.clone());
        Ok(ApplyResult::Ok)
    }

    /// The `members` whose newest valid certificate on record (at `now`) is not from the
    /// signing CA, or who have none on record (the bootstrap agent's first certificate is
    /// not): retiring the old CA would cut them off.
    pub fn members_not_renewed(
        &self,
        members: impl IntoIterator<Item = NodeId>,
        now: u64,
    ) -> Vec<String> {
        let Some(set) = &self.ca else {
            return Vec::new();
        };
        members
            .into_iter()
            .filter(|id| {
                let subject = format!("node {id}");
                let newest = self
                    .certificates
                    .values()
                    .filter(|c| c.subject == subject && !c.revoked && c.not_after_ms > now)
                    .max_by_key(|c| c.issued_at_ms);
                newest.is_none_or(|c| c.issuer != set.signing)
            })
            .map(|id| format!("n{id}"))
            .collect()
    }

    /// The certificates still in use that CA `key_id` issued (or may have): per subject, its
    /// newest valid (unrevoked, unexpired at `now`) certificate, named `subject (serial)`.
    pub fn certificates_in_use_from(&self, key_id: &str, now: u64) -> Vec<String> {
        let mut newest: BTreeMap<&str, &crate::CertRecord> = BTreeMap::new();
        let valid = self
            .certificates
            .values()
            .filter(|c| !c.revoked && c.not_after_ms > now && !c.subject.is_empty());
        for cert in valid {
            let slot = newest.entry(cert.subject.as_str()).or_insert(cert);
            if cert.issued_at_ms > slot.issued_at_ms {
                *slot = cert;
            }
        }
        // A certificate recorded without its issuer after the first rotation (by an older
        // agent) might be from any CA: it counts as in use.
        newest
            .values()
            .filter(|c| c.issuer == key_id || c.issuer.is_empty())
            .map(|c| format!("{} ({})", c.subject, c.serial))
            .collect()
    }
}

fn no_rotation() -> Rejection {
    not_now("no CA rotation has begun: introduce a CA first".into())
}
