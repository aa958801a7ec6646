//! Applying certificates: recording what the cluster CA issued, and the revocation list.

use crate::NodeId;
use crate::model::auth::Seat;
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
            match token.limits.seat {
                Some(Seat::Voter) => {
                    self.seats.remove(&node);
                }
                Some(seat) => {
                    self.seats.insert(node, seat);
                }
                None => {}
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
                issuer: String::new(),
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::model::auth::{Role, Seat, TokenLimits, TokenRecord};
    use crate::model::cert::CertRecord;
    use crate::model::command::{Command, LogEntry};
    use crate::model::node::{EdgeTerms, SITE_LABEL};
    use crate::model::outcome::ApplyResult;
    use crate::model::state::ClusterState;

    fn apply(s: &mut ClusterState, cmd: Command) -> ApplyResult {
        s.apply(&LogEntry {
            proposed_at_ms: 10,
            cmd,
            meta: None,
            request: None,
        })
    }

    fn join_token(id: &str, seat: Option<Seat>, node_ids: Option<(u64, u64)>) -> Command {
        Command::CreateToken {
            token: TokenRecord {
                id: id.into(),
                secret_sha256: "ab".repeat(32),
                role: Role::Node,
                tenant: None,
                description: String::new(),
                created_at_ms: 1,
                created_by: "system:bootstrap".into(),
                revoked: false,
                account: None,
                limits: TokenLimits {
                    uses_left: Some(5),
                    node_ids,
                    seat,
                    ..TokenLimits::default()
                },
            },
        }
    }

    fn enrol(s: &mut ClusterState, node: u64, serial: &str, token: &str) -> ApplyResult {
        let cert = CertRecord {
            serial: serial.into(),
            subject: format!("node {node}"),
            not_after_ms: 1_000_000,
            issued_at_ms: 10,
            revoked: false,
            revoked_reason: String::new(),
            issuer: String::new(),
        };
        apply(
            s,
            Command::RecordCertificate {
                cert,
                enrolled_with: Some(token.into()),
            },
        )
    }

    fn register(node: u64, edge: bool) -> Command {
        let site = edge.then(|| EdgeTerms {
            site: "edge-1".into(),
            lease_ms: 60_000,
            down_after_ms: 90_000,
        });
        let labels = site
            .as_ref()
            .map(|t| BTreeMap::from([(SITE_LABEL.to_owned(), t.site.clone())]))
            .unwrap_or_default();
        Command::RegisterNode {
            node,
            addr: format!("h:{node}"),
            labels,
            inventory: Default::default(),
            edge: site,
            protocol: 6,
        }
    }

    #[test]
    fn a_join_tokens_seat_binds_the_nodes_it_enrols() {
        let mut s = ClusterState::new();
        apply(&mut s, join_token("any", None, None));
        apply(&mut s, join_token("learners", Some(Seat::Learner), None));
        apply(&mut s, join_token("edges", Some(Seat::Edge), None));
        apply(
            &mut s,
            join_token("n4-voter", Some(Seat::Voter), Some((4, 4))),
        );

        assert_eq!(enrol(&mut s, 3, "03", "any"), ApplyResult::Ok);
        assert_eq!(
            s.learner_only(3),
            None,
            "an unbound token enrols a possible voter"
        );

        assert_eq!(enrol(&mut s, 4, "04", "learners"), ApplyResult::Ok);
        let why = s.learner_only(4).expect("learner only");
        assert!(why.contains("join token for a learner seat"), "{why}");
        // Enrolled again with a voter token bound to exactly its id, it may vote again.
        assert_eq!(enrol(&mut s, 4, "14", "n4-voter"), ApplyResult::Ok);
        assert_eq!(s.learner_only(4), None);

        assert_eq!(enrol(&mut s, 5, "05", "edges"), ApplyResult::Ok);
        let before = s.clone();
        let refused = apply(&mut s, register(5, false));
        assert!(
            matches!(&refused, ApplyResult::Rejected { reason } if reason.to_string().contains("edge join token")),
            "{refused:?}"
        );
        assert_eq!(s, before, "a refused registration changes nothing");
        assert_eq!(apply(&mut s, register(5, true)), ApplyResult::Ok);
        let why = s.learner_only(5).expect("edge");
        assert!(why.contains("edge site \"edge-1\""), "{why}");
    }
}
