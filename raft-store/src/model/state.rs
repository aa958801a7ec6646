//! The replicated domain state, `ClusterState`, and its pure, deterministic `apply`: the
//! dispatch of each command to its domain's rules (`apply/`), and the audit step.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::model::alert::{Alert, AlertRule};
use crate::model::audit::{self, AuditEntry, ChainBase, RequestMeta, SignedHead};
use crate::model::auth::{Seat, TokenRecord};
use crate::model::ca::CaSet;
use crate::model::cert::CertRecord;
use crate::model::command::{Command, LogEntry, Submission};
use crate::model::energy::EnergyBook;
use crate::model::job::Job;
use crate::model::job_log::JobLog;
use crate::model::node::NodeRecord;
use crate::model::outcome::{ApplyResult, Rejection, invalid};
use crate::model::registry::SealedCredential;
use crate::model::requests::RequestLedger;
use crate::model::retention::{ArchiveOutbox, ArchivedKey};
use crate::model::scheduler::SchedulerSettings;
use crate::model::shared_map::SharedMap;
use crate::model::tenant::TenantRecord;
use crate::{JobId, NodeId};

/// Everything the cluster agrees on (besides Raft membership, which openraft tracks).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterState {
    #[serde(default)]
    pub nodes: BTreeMap<NodeId, NodeRecord>,
    #[serde(default)]
    pub jobs: SharedMap<JobId, Job>,
    /// The id the next submitted job gets.
    #[serde(default = "first_job_id")]
    pub next_job_id: JobId,
    /// `tenant/key` → the job that key created.
    #[serde(default)]
    pub idempotency: BTreeMap<String, JobId>,
    /// API tokens by id (secrets are never stored, only their SHA-256).
    #[serde(default)]
    pub tokens: BTreeMap<String, TokenRecord>,
    /// The hash-chained audit log: its newest entries (the older ones are archived), each
    /// shared with a snapshot's copy of the state rather than copied (they never change).
    #[serde(default)]
    pub audit: Vec<Arc<AuditEntry>>,
    /// The last entry archived: where `audit` continues the chain from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_base: Option<ChainBase>,
    /// The leader's signatures over the audit chain's head, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audit_heads: Vec<SignedHead>,
    /// Certificates (PEM) of earlier cluster CAs whose signed heads this cluster trusts: set
    /// by `gpu-agent restore --trust-audit-ca` once the backup's heads verified against them,
    /// never by a command.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audit_signers: Vec<String>,
    /// Certificates by serial: those the CA issued, and every revoked one.
    #[serde(default)]
    pub certificates: BTreeMap<String, CertRecord>,
    /// The cluster CAs, once a rotation has begun (`ca.rs`); before, the CA each agent holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<CaSet>,
    /// The policy the leader schedules with.
    #[serde(default)]
    pub scheduler: SchedulerSettings,
    /// Tenant → registry → its login there, the password sealed (`registry.rs`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub registry_credentials: BTreeMap<String, BTreeMap<String, SealedCredential>>,
    /// Operators' alert rules by name (overriding built-in and configured ones).
    #[serde(default)]
    pub alert_rules: BTreeMap<String, AlertRule>,
    /// Open alerts, and the most recent resolved ones (`alert::KEEP_RESOLVED`), by id.
    #[serde(default)]
    pub alerts: BTreeMap<u64, Alert>,
    #[serde(default)]
    pub next_alert_id: u64,
    /// GPU energy per job and per node.
    #[serde(default)]
    pub energy: EnergyBook,
    /// Nodes a join token enrolled as learners only (`Seat::Learner`, `Seat::Edge`): never
    /// voters. The latest enrolment of a node decides.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub seats: BTreeMap<NodeId, Seat>,
    /// Tenant records by name (quotas, weight, default priority). A tenant without one is
    /// unlimited.
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantRecord>,
    /// Idempotency keys whose job was archived, until they expire (`retention.rs`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub archived_keys: BTreeMap<String, ArchivedKey>,
    /// GPU-milliseconds of archived jobs' runs, per tenant and hour the run ended (for
    /// fair-share usage, which decays over days: `apply/archive.rs`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub archived_usage: BTreeMap<String, BTreeMap<u64, u64>>,
    /// The answers of recent API requests, for exactly-once writes (`requests.rs`).
    #[serde(default, skip_serializing_if = "RequestLedger::is_empty")]
    pub requests: RequestLedger,
    /// Job → the pending jobs whose dependencies on it are not settled yet
    /// (`apply/dependencies.rs`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub dependents: BTreeMap<JobId, BTreeSet<JobId>>,
    /// Array → its tasks that hold GPUs now, for arrays with a `%limit` (`apply/arrays.rs`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub array_live: BTreeMap<JobId, BTreeSet<JobId>>,
    /// Which jobs changed state lately (local, never serialized).
    #[serde(skip)]
    pub job_log: JobLog,
    /// What the last entries moved out, for the archive store (local, never serialized).
    #[serde(skip)]
    pub archive_outbox: ArchiveOutbox,
}

fn first_job_id() -> JobId {
    1
}

impl ClusterState {
    pub fn new() -> Self {
        Self {
            next_job_id: first_job_id(),
            ..Self::default()
        }
    }

    /// Apply one entry. Pure: the result depends only on `self` and `entry`. A rejected command
    /// leaves the state untouched, except that an API request (one with `meta`) always gets
    /// exactly one audit entry, whatever its outcome. A request applied before (`entry.request`,
    /// still remembered) changes nothing and gets its first answer.
    pub fn apply(&mut self, entry: &LogEntry) -> ApplyResult {
        let now = entry.proposed_at_ms;
        if let Some(first) = (entry.request.as_ref()).and_then(|r| self.requests.answer(r, now)) {
            return first.clone();
        }
        let changes = self.job_log.cursor();
        let result = self
            .apply_command(entry)
            .unwrap_or_else(|reason| ApplyResult::Rejected { reason });
        self.track_array_tasks(changes);
        self.settle_dependents(changes, now);
        if let Some(meta) = &entry.meta {
            self.record_audit(entry, meta, &result);
        }
        if let Some(request) = &entry.request {
            self.requests
                .remember(request, entry.proposed_at_ms, &result);
        }
        result
    }

    /// The command's effect, by the rules of its domain (`apply/`), or why it has none.
    fn apply_command(&mut self, entry: &LogEntry) -> Result<ApplyResult, Rejection> {
        let now = entry.proposed_at_ms;
        let meta = entry.meta.as_ref();
        match &entry.cmd {
            Command::Batch { entries } => Ok(self.apply_batch(entries)),
            Command::RegisterNode {
                node,
                addr,
                labels,
                inventory,
                edge,
                protocol,
            } => self.register(
                *node,
                addr,
                labels,
                inventory,
                edge.as_ref(),
                *protocol,
                now,
            ),
            Command::ReportImages { node, images } => self.set_images(*node, images),
            Command::SetNodeLabels { node, set, remove } => {
                self.set_labels(*node, set, remove, now)
            }
            Command::SetNodeStatus {
                node,
                status,
                requeue_evicting,
            } => self.set_status(*node, *status, *requeue_evicting, now),
            Command::CordonNode { node, cordoned } => self.cordon(*node, *cordoned, now),
            Command::DrainNode { node, evict } => self.drain(*node, *evict, now),
            Command::SubmitJob {
                spec,
                idempotency_key,
                hold,
                owner,
            } => {
                let how = Submission {
                    key: idempotency_key.as_deref(),
                    hold: *hold,
                    owner: owner.as_deref(),
                };
                self.submit(spec, how, now, meta)
            }
            Command::CancelJob { job } => self.cancel(*job, now),
            Command::HoldJob { job, hold } => self.hold(*job, *hold),
            Command::CancelArray { array } => self.cancel_array(*array, now),
            Command::UpdateJob { job, array, update } => self.update_job(*job, *array, update),
            Command::RequeueJob { job, array } => self.requeue(*job, *array),
            Command::HoldArray { array, hold } => self.hold_array(*array, *hold),
            Command::BindJobs { binds } => Ok(self.bind_all(binds, now)),
            Command::JobStarted { job, generation } => self.started(*job, *generation, now),
            Command::ReportRunPhase {
                job,
                generation,
                phase,
            } => self.run_phase(*job, *generation, phase.as_deref(), now),
            Command::JobFinished {
                job,
                generation,
                outcome,
            } => self.finished(*job, *generation, outcome, now),
            Command::GangMemberFinished {
                job,
                generation,
                node,
            } => self.member_finished(*job, *generation, *node, now),
            Command::NoteUnschedulable { reasons } => Ok(self.note_unschedulable(reasons)),
            Command::PreemptJobs { preemptions } => Ok(self.preempt_all(preemptions, now)),
            Command::CreateToken { token } => self.create_token(token, meta, now),
            Command::RevokeToken { id } => self.revoke_token(id, meta),
            Command::SetTokenAccount { id, account } => {
                self.set_token_account(id, account.as_ref(), meta)
            }
            Command::AuditDenied { .. } | Command::RecordAction { .. } => Ok(ApplyResult::Ok),
            Command::RecordCertificate {
                cert,
                enrolled_with,
            } => self.record_certificate(cert, enrolled_with.as_deref(), now),
            Command::RevokeCertificate { serial, reason } => {
                self.revoke_certificate(serial, reason)
            }
            Command::CreateTenant { tenant } => self.put_tenant(tenant, false, now, meta),
            Command::UpdateTenant { tenant } => self.put_tenant(tenant, true, now, meta),
            Command::SetRegistryCredential {
                tenant,
                registry,
                credential,
            } => self.set_registry_credential(tenant, registry, credential.as_ref(), now, meta),
            Command::SetSchedulerPolicy { settings } => self.set_scheduler_policy(settings),
            Command::SetAlertRule { rule } => self.set_alert_rule(rule),
            Command::DeleteAlertRule { name } => self.delete_alert_rule(name),
            Command::RaiseAlert {
                node,
                gpu,
                rule,
                severity,
                remediation,
                message,
            } => self.raise_alert(*node, *gpu, rule, *severity, *remediation, message, now),
            Command::ResolveAlert { node, gpu, rule } => self.resolve_alert(*node, *gpu, rule, now),
            Command::SetGpuPartition {
                node,
                gpu,
                partition,
                if_idle,
            } => self.set_partition(*node, *gpu, partition, *if_idle),
            Command::BindSlices { binds } => Ok(self.bind_slices(binds, now)),
            Command::RecordEnergy { report } => self.record_energy(report),
            Command::SignAuditHead { head } => self.sign_audit_head(head, now),
            Command::ForgetExpired => Ok(self.forget_expired(now)),
            Command::Archive { retention } => Ok(self.archive(retention, now)),
            Command::IntroduceCa {
                current,
                next,
                sealed_key,
            } => self.introduce_ca(current, next, sealed_key, now),
            Command::SwitchCa { key_id, resealed } => self.switch_ca(key_id, resealed, now),
            Command::RetireCa { key_id } => self.retire_ca(key_id, now),
            Command::ReportTrust { node, key_ids } => self.report_trust(*node, key_ids),
        }
    }

    /// A batch's entries, each applied exactly as an entry of its own (its own time, caller and
    /// result). Batches are never nested.
    fn apply_batch(&mut self, entries: &[LogEntry]) -> ApplyResult {
        let results = entries
            .iter()
            .map(|e| match e.cmd {
                Command::Batch { .. } => ApplyResult::Rejected {
                    reason: invalid("a batch cannot hold a batch".into()),
                },
                _ => self.apply(e),
            })
            .collect();
        ApplyResult::Batch { results }
    }

    /// The one audit entry of an API request, whatever its outcome, chained to the one before.
    fn record_audit(&mut self, entry: &LogEntry, meta: &RequestMeta, result: &ApplyResult) {
        let outcome = match (&entry.cmd, result) {
            (Command::AuditDenied { reason }, _) => format!("denied: {reason}"),
            (Command::RecordAction { outcome }, _) => outcome.clone(),
            (_, ApplyResult::Rejected { reason }) => format!("rejected: {reason}"),
            _ => "ok".to_owned(),
        };
        self.append_audit(entry.proposed_at_ms, meta, outcome);
    }

    /// Append one entry to the audit log, chained to the one before.
    pub fn append_audit(&mut self, time_ms: u64, meta: &RequestMeta, outcome: String) {
        let base = self.audit_base.as_ref();
        let prev = match self.audit.last() {
            Some(e) => &e.hash,
            None => base.map_or(audit::GENESIS, |b| b.hash.as_str()),
        }
        .to_owned();
        let seq = base.map_or(0, |b| b.seq) + self.audit.len() as u64 + 1;
        self.audit.push(Arc::new(AuditEntry::new(
            seq, time_ms, meta, outcome, &prev,
        )));
    }

    /// The oldest internal protocol any of `members` registered with; one that has not
    /// registered yet counts as speaking none (0), and so does an empty set.
    pub fn lowest_protocol(&self, members: impl IntoIterator<Item = NodeId>) -> u32 {
        (members.into_iter())
            .map(|id| self.nodes.get(&id).map_or(0, |n| n.protocol))
            .min()
            .unwrap_or(0)
    }

    /// The audit entry `seq`, unless it was archived (or does not exist yet).
    pub fn audit_entry(&self, seq: u64) -> Option<&AuditEntry> {
        let first = self.audit_base.as_ref().map_or(0, |b| b.seq) + 1;
        let i = usize::try_from(seq.checked_sub(first)?).ok()?;
        self.audit.get(i).map(Arc::as_ref)
    }

    /// Why `node` may never be a voter, if it may not: it registered at an edge site, or the
    /// join token that enrolled it made it a learner.
    pub fn learner_only(&self, node: NodeId) -> Option<String> {
        let site = self.nodes.get(&node).and_then(|n| n.edge.as_ref());
        match (site, self.seats.get(&node)) {
            (Some(terms), _) => Some(format!("is at edge site {:?}", terms.site)),
            (None, Some(seat)) => Some(format!(
                "was enrolled with a join token for a {} seat",
                seat.as_str()
            )),
            (None, None) => None,
        }
    }

    pub(crate) fn node_mut(&mut self, node: NodeId) -> Result<&mut NodeRecord, Rejection> {
        self.nodes
            .get_mut(&node)
            .ok_or(Rejection::UnknownNode { node })
    }

    pub(crate) fn job_mut(&mut self, job: JobId) -> Result<&mut Job, Rejection> {
        self.jobs.get_mut(&job).ok_or(Rejection::UnknownJob { job })
    }
}
