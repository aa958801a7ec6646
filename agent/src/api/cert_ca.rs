//! `CertService`'s CA rotation: the status of the cluster's CAs, and each step, checked here
//! against what the cluster is ready for before it is proposed (apply checks again).

use gpu_proto::v1 as pb;
use gpu_raft_store::ClusterState;
use gpu_raft_store::ca::CaSet;
use tonic::Status;

use super::cert::CertApi;
use crate::api::auth::Caller;
use crate::tls::rotation::{self, RotationError};
use crate::tls::{TlsIdentity, pki};

impl CertApi {
    fn identity(&self) -> Result<&TlsIdentity, Status> {
        self.tls
            .as_ref()
            .ok_or_else(|| Status::failed_precondition("this agent runs without TLS"))
    }

    /// The status as this agent's replica sees it.
    pub(crate) fn ca_status(&self) -> Result<pb::CaStatus, Status> {
        let own = self
            .identity()?
            .current()
            .ok_or_else(|| Status::unavailable("this agent has no TLS material yet"))?;
        let members = self.cluster.view().members;
        let now = crate::clock::now_ms();
        self.cluster.state.read(|s| {
            let Some(set) = &s.ca else {
                // No rotation yet: the CA this agent holds is the cluster's.
                let cas = pki::certs_in(&own.ca_cert_pem)
                    .iter()
                    .map(|pem| info(pem, "signing"))
                    .collect::<Result<_, _>>()?;
                return Ok(pb::CaStatus {
                    cas,
                    bundle_pem: own.ca_cert_pem.clone(),
                    ..pb::CaStatus::default()
                });
            };
            let cas = set
                .trusted
                .values()
                .map(|c| info(&c.cert_pem, role(set, &c.key_id)))
                .collect::<Result<_, _>>()?;
            Ok(pb::CaStatus {
                cas,
                bundle_pem: set.bundle_pem(),
                not_installed: members
                    .keys()
                    .copied()
                    .filter(|id| !set.installed_by(*id))
                    .collect(),
                old_certificates: old_certificates(s, set, members.keys().copied(), now),
            })
        })
    }

    pub(crate) async fn rotate(
        &self,
        req: &pb::RotateCaRequest,
        caller: &Caller,
    ) -> Result<pb::CaStatus, Status> {
        let (step, key_id) = (req.step(), req.key_id.as_str());
        self.cluster.linearizable_read().await?;
        let tls = self
            .identity()?
            .current()
            .ok_or_else(|| Status::unavailable("this agent has no TLS material yet"))?;
        let (set, logins) = self
            .cluster
            .state
            .read(|s| (s.ca.clone(), s.registry_credentials.clone()));
        let cmd = match step {
            pb::CaStep::Introduce => rotation::introduce(&tls, set.as_ref()).map_err(refused)?,
            pb::CaStep::Switch => {
                let set = set.ok_or_else(|| {
                    Status::failed_precondition("no CA is introduced: introduce one first")
                })?;
                self.all_installed(&set, req.skip_down)?;
                rotation::switch(&tls, &set, &logins).map_err(refused)?
            }
            pb::CaStep::Retire => {
                let key_id = retiring(set.as_ref(), key_id)?;
                if set.as_ref().is_some_and(|s| role(s, &key_id) == "old") {
                    self.all_renewed(req.skip_down)?;
                }
                gpu_raft_store::Command::RetireCa { key_id }
            }
            pb::CaStep::Unspecified => {
                return Err(Status::invalid_argument(
                    "name a step: introduce, switch or retire",
                ));
            }
        };
        self.cluster.write_as(cmd, caller.on_behalf()).await?;
        self.ca_status()
    }

    /// A switch waits until every member trusts every CA: a member that does not would refuse
    /// the certificates of the new CA, and be cut off.
    fn all_installed(&self, set: &CaSet, skip_down: bool) -> Result<(), Status> {
        let missing: Vec<String> = self
            .members(skip_down)
            .into_iter()
            .filter(|id| !set.installed_by(*id))
            .map(|id| format!("n{id}"))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(Status::failed_precondition(format!(
            "{} {} not installed the introduced CA yet: running agents do within seconds; bring \
             a stopped one up (or, once the cluster declares it Down, pass --skip-down and \
             join it anew after the rotation)",
            missing.join(", "),
            if missing.len() == 1 { "has" } else { "have" }
        )))
    }
}

impl CertApi {
    /// The members a rotation step waits for: all, or with `skip_down` those not Down.
    fn members(&self, skip_down: bool) -> Vec<gpu_raft_store::NodeId> {
        let members = self.cluster.view().members;
        self.cluster.state.read(|s| {
            let down = |id: &gpu_raft_store::NodeId| {
                s.nodes
                    .get(id)
                    .is_some_and(|n| n.status == gpu_raft_store::NodeStatus::Down)
            };
            members
                .keys()
                .copied()
                .filter(|id| !(skip_down && down(id)))
                .collect()
        })
    }

    /// A retire waits until every member presents a certificate of the signing CA: one that
    /// does not would be refused by every other member once the old CA is gone.
    fn all_renewed(&self, skip_down: bool) -> Result<(), Status> {
        let members = self.members(skip_down);
        let now = crate::clock::now_ms();
        let behind = self
            .cluster
            .state
            .read(|s| s.members_not_renewed(members, now));
        if behind.is_empty() {
            return Ok(());
        }
        Err(Status::failed_precondition(format!(
            "{} {} no certificate of the signing CA on record yet: running agents renew within              seconds of the switch; bring a stopped one up (or, once the cluster declares it \
             Down, pass --skip-down and join it anew afterwards)",
            behind.join(", "),
            if behind.len() == 1 { "has" } else { "have" }
        )))
    }
}

fn refused(e: RotationError) -> Status {
    match e {
        RotationError::NotASigner => Status::failed_precondition(e.to_string()),
        RotationError::NotCaughtUp => Status::unavailable(e.to_string()),
        RotationError::Crypto(_) => Status::internal(e.to_string()),
    }
}

/// The CA to retire: `key_id`, or the one trusted CA that neither signs nor was introduced.
fn retiring(set: Option<&CaSet>, key_id: &str) -> Result<String, Status> {
    if !key_id.is_empty() {
        return Ok(key_id.to_owned());
    }
    let set = set.ok_or_else(|| Status::failed_precondition("no CA rotation has begun"))?;
    let old: Vec<&String> = set
        .trusted
        .keys()
        .filter(|id| role(set, id) == "old")
        .collect();
    match old.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(Status::failed_precondition(
            "no old CA to retire (to call off an introduced CA, name its key id)",
        )),
        _ => Err(Status::invalid_argument(
            "several old CAs are trusted: name the one to retire by its key id",
        )),
    }
}

fn role(set: &CaSet, key_id: &str) -> &'static str {
    if set.signing == key_id {
        "signing"
    } else if set.next.as_ref().is_some_and(|n| n.key_id == key_id) {
        "introduced"
    } else {
        "old"
    }
}

/// The certificates in use from CAs that no longer sign, and the `members` that have no
/// certificate of the signing CA on record (while an old CA is trusted).
fn old_certificates(
    s: &ClusterState,
    set: &CaSet,
    members: impl IntoIterator<Item = gpu_raft_store::NodeId>,
    now: u64,
) -> Vec<String> {
    let old: Vec<&String> = set
        .trusted
        .keys()
        .filter(|id| role(set, id) == "old")
        .collect();
    if old.is_empty() {
        return Vec::new();
    }
    let mut listed: Vec<String> = old
        .iter()
        .flat_map(|id| s.certificates_in_use_from(id, now))
        .collect();
    for member in s.members_not_renewed(members, now) {
        let subject = format!("node {} (", &member[1..]);
        if !listed.iter().any(|l| l.starts_with(&subject)) {
            listed.push(format!(
                "{member}: no certificate of the signing CA on record"
            ));
        }
    }
    listed
}

fn info(cert_pem: &str, role: &str) -> Result<pb::CaInfo, Status> {
    let (name, not_after) =
        pki::describe_ca(cert_pem).map_err(|e| Status::internal(e.to_string()))?;
    Ok(pb::CaInfo {
        key_id: crate::tls::signature::key_id(cert_pem)
            .map_err(|e| Status::internal(e.to_string()))?,
        name,
        not_after_ms: crate::tls::enroll::ms(not_after),
        role: role.to_owned(),
    })
}
