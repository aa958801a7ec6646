//! Applying certificates: recording what the cluster CA issued, and the revocation list.

use crate::NodeId;
use crate::model::cert::{self, CertRecord};
use crate::model::outcome::{ApplyResult, Rejection, invalid};
use crate::model::state::ClusterState;
use crate::model::validate;

impl ClusterState {
    /// Record an issued certificate; one that enrolled a node with a join token only while the
    /// token still works for that node, counting one of its uses. (Whether the node is already
    /// a member is the signer's check: membership is Raft's, not this state's.)
    pub(crate) fn record_certificate(
        &mut self,
        cert: &CertRecord,
        enrolled_with: Option<&str>,
        now: u64,
    ) -> Result<ApplyResult, Rejection> {
        cert::check_serial(&cert.serial).map_err(invalid)?;
        if self.certificates.contains_key(&cert.serial) {
            return Err(invalid(format!(
                "certificate {} is already recorded",
                cert.serial
            )));
        }
        if let Some(id) = enrolled_with {
            let node = cert
                .subject
                .strip_prefix("node ")
                .and_then(|n| n.parse::<NodeId>().ok())
                .ok_or_else(|| invalid(format!("{} is not a node's certificate", cert.subject)))?;
            let token = self
                .tokens
                .get_mut(id)
                .ok_or_else(|| Rejection::UnknownToken { id: id.to_owned() })?;
            let denied = |message| Rejection::PermissionDenied { message };
            token.usable_at(now).map_err(denied)?;
            token.may_enrol(node).map_err(denied)?;
            if let Some(left) = &mut token.limits.uses_left {
                *left -= 1;
            }
        }
        let mut cert = cert.clone();
        cert.revoked = false;
        cert.revoked_reason.clear();
        self.certificates.insert(cert.serial.clone(), cert);
        Ok(ApplyResult::Ok)
    }

    pub(crate) fn revoke_certificate(
        &mut self,
        serial: &str,
        reason: &str,
    ) -> Result<ApplyResult, Rejection> {
        cert::check_serial(serial).map_err(invalid)?;
        validate::free_text("revocation reason", reason).map_err(invalid)?;
        let record = self
            .certificates
            .entry(serial.to_owned())
            .or_insert_with(|| CertRecord {
                serial: serial.to_owned(),
                subject: String::new(),
                not_after_ms: 0,
                issued_at_ms: 0,
                revoked: false,
                revoked_reason: String::new(),
            });
        record.revoked = true;
        record.revoked_reason = reason.to_owned();
        Ok(ApplyResult::Ok)
    }

    /// Why revoking `serial` would lock a current voter out (`voters`, at `now_ms`): it is the
    /// newest valid certificate of a voter, with no later one to replace it, so the voter could
    /// no longer reach its peers (two such revocations in a cluster of three and the majority
    /// is gone). `None`: safe to revoke. Let the voter renew first, or remove it.
    pub fn revocation_locks_out(
        &self,
        serial: &str,
        voters: &std::collections::BTreeSet<NodeId>,
        now_ms: u64,
    ) -> Option<String> {
        let cert = self.certificates.get(serial).filter(|c| !c.revoked)?;
        let node: NodeId = cert.subject.strip_prefix("node ")?.parse().ok()?;
        if !voters.contains(&node) {
            return None;
        }
        let replaced = self.certificates.values().any(|c| {
            c.subject == cert.subject
                && c.serial != cert.serial
                && !c.revoked
                && c.not_after_ms > now_ms
                && c.issued_at_ms >= cert.issued_at_ms
        });
        (!replaced).then(|| {
            format!(
                "certificate {serial} is voter n{node}'s current one: revoking it would cut n{node} \
                 off from its peers. Let n{node} renew first (a newer certificate replaces it), or \
                 remove n{node} from the voters"
            )
        })
    }

    /// Whether a presented certificate serial is on the revocation list.
    pub fn is_revoked(&self, serial: &str) -> bool {
        self.certificates.get(serial).is_some_and(|c| c.revoked)
    }
}
