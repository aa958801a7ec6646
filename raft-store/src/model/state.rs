//! The replicated domain state and its pure, deterministic `apply`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::NodeId;
use crate::model::alert::{Alert, AlertRule};
use crate::model::audit::{self, AuditEntry, RequestMeta};
use crate::model::auth::{self, Grant, TokenRecord};
use crate::model::cert::{self, CertRecord};
use crate::model::command::{ApplyResult, Bind, Command, LogEntry, Preempt, Rejection};
use crate::model::energy::EnergyBook;
use crate::model::job::{Binding, Job, JobId, JobState, Outcome};
use crate::model::job_log::JobLog;
use crate::model::node::{EdgeTerms, NodeRecord, NodeStatus, SITE_LABEL};
use crate::model::scheduler::SchedulerSettings;
use crate::model::tenant::{self, TenantRecord};
use crate::model::validate;

/// Everything the cluster agrees on (besides Raft membership, which openraft tracks).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterState {
    #[serde(default)]
    pub nodes: BTreeMap<NodeId, NodeRecord>,
    #[serde(default)]
    pub jobs: BTreeMap<JobId, Job>,
    /// The id the next submitted job gets.
    #[serde(default = "first_job_id")]
    pub next_job_id: JobId,
    /// `tenant/key` → the job that key created.
    #[serde(default)]
    pub idempotency: BTreeMap<String, JobId>,
    /// API tokens by id (secrets are never stored, only their SHA-256).
    #[serde(default)]
    pub tokens: BTreeMap<String, TokenRecord>,
    /// The hash-chained audit log.
    #[serde(default)]
    pub audit: Vec<AuditEntry>,
    /// Certificates by serial: those the CA issued, and every revoked one.
    #[serde(default)]
    pub certificates: BTreeMap<String, CertRecord>,
    /// The policy the leader schedules with.
    #[serde(default)]
    pub scheduler: SchedulerSettings,
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
    /// Tenant records by name (quotas, weight, default priority). A tenant without one is
    /// unlimited.
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantRecord>,
    /// Which jobs changed state lately (local, never serialized).
    #[serde(skip)]
    pub job_log: JobLog,
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
    /// exactly one audit entry, whatever its outcome.
    pub fn apply(&mut self, entry: &LogEntry) -> ApplyResult {
        let now = entry.proposed_at_ms;
        let result = match &entry.cmd {
            Command::Batch { entries } => Ok(ApplyResult::Batch {
                results: entries
                    .iter()
                    .map(|e| match e.cmd {
                        Command::Batch { .. } => ApplyResult::Rejected {
                            reason: invalid("a batch cannot hold a batch".into()),
                        },
                        _ => self.apply(e),
                    })
                    .collect(),
            }),
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
            Command::SetNodeLabels { node, set, remove } => self.node_mut(*node).and_then(|n| {
                let mut labels = n.labels.clone();
                for key in remove {
                    labels.remove(key);
                }
                labels.extend(set.iter().map(|(k, v)| (k.clone(), v.clone())));
                validate::labels(&labels).map_err(invalid)?;
                n.labels = labels;
                n.updated_at_ms = now;
                Ok(ApplyResult::Ok)
            }),
            Command::SetNodeStatus { node, status } => self.set_status(*node, *status, now),
            Command::CordonNode { node, cordoned } => self.node_mut(*node).map(|n| {
                n.cordoned = *cordoned;
                n.updated_at_ms = now;
                ApplyResult::Ok
            }),
            Command::DrainNode { node, evict } => self.drain(*node, *evict, now),
            Command::SubmitJob {
                spec,
                idempotency_key,
            } => self.submit(spec, idempotency_key.as_deref(), now),
            Command::CancelJob { job } => self.cancel(*job, now),
            Command::BindJobs { binds } => Ok(self.bind_all(binds, now)),
            Command::JobStarted { job, generation } => self.started(*job, *generation, now),
            Command::JobFinished {
                job,
                generation,
                outcome,
            } => self.finished(*job, *generation, outcome, now),
            Command::NoteUnschedulable { reasons } => {
                for (id, reason) in reasons {
                    if let Some(job) = self
                        .jobs
                        .get_mut(id)
                        .filter(|j| j.state == JobState::Pending)
                    {
                        job.reason = Some(reason.clone());
                    }
                }
                Ok(ApplyResult::Ok)
            }
            Command::CreateToken { token } => self.create_token(token, entry.meta.as_ref()),
            Command::RevokeToken { id } => self.revoke_token(id, entry.meta.as_ref()),
            Command::AuditDenied { .. } | Command::RecordAction { .. } => Ok(ApplyResult::Ok),
            Command::RecordCertificate { cert } => self.record_certificate(cert),
            Command::RevokeCertificate { serial, reason } => {
                self.revoke_certificate(serial, reason)
            }
            Command::PreemptJobs { preemptions } => Ok(self.preempt_all(preemptions)),
            Command::GangMemberFinished {
                job,
                generation,
                node,
            } => self.member_finished(*job, *generation, *node, now),
            Command::CreateTenant { tenant } => self.put_tenant(tenant, false, now),
            Command::UpdateTenant { tenant } => self.put_tenant(tenant, true, now),
            Command::SetSchedulerPolicy { settings } => {
                settings.validate().map_err(invalid).map(|()| {
                    self.scheduler = settings.clone();
                    ApplyResult::Ok
                })
            }
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
            Command::RecordEnergy { report } => {
                if self.nodes.contains_key(&report.node) {
                    self.energy.record(report);
                    Ok(ApplyResult::Ok)
                } else {
                    Err(Rejection::UnknownNode { node: report.node })
                }
            }
        };
        let result = result.unwrap_or_else(|reason| ApplyResult::Rejected { reason });
        if let Some(meta) = &entry.meta {
            let outcome = match (&entry.cmd, &result) {
                (Command::AuditDenied { reason }, _) => format!("denied: {reason}"),
                (Command::RecordAction { outcome }, _) => outcome.clone(),
                (_, ApplyResult::Rejected { reason }) => format!("rejected: {reason}"),
                _ => "ok".to_owned(),
            };
            let prev = self
                .audit
                .last()
                .map_or(audit::GENESIS, |e| e.hash.as_str())
                .to_owned();
            let seq = self.audit.len() as u64 + 1;
            self.audit
                .push(AuditEntry::new(seq, now, meta, outcome, &prev));
        }
        result
    }

    /// The rights of the actor behind `meta`: `None` for the system (agents themselves).
    fn actor_grant(&self, meta: Option<&RequestMeta>) -> Result<Option<Grant>, Rejection> {
        let Some(meta) = meta else { return Ok(None) };
        if meta.actor.starts_with("system:") {
            return Ok(None);
        }
        match self.tokens.get(&meta.actor) {
            Some(t) if !t.revoked => Ok(Some(Grant {
                role: t.role,
                tenant: t.tenant.clone(),
            })),
            _ => Err(Rejection::PermissionDenied {
                message: format!("token {} is not valid", meta.actor),
            }),
        }
    }

    fn create_token(
        &mut self,
        token: &TokenRecord,
        meta: Option<&RequestMeta>,
    ) -> Result<ApplyResult, Rejection> {
        let wanted = Grant {
            role: token.role,
            tenant: token.tenant.clone(),
        };
        auth::check_grant_shape(&wanted).map_err(invalid)?;
        if let Some(holder) = self.actor_grant(meta)?
            && !auth::can_grant(&holder, &wanted)
        {
            return Err(Rejection::PermissionDenied {
                message: format!("a {} token cannot grant {}", holder.role, token.role),
            });
        }
        let well_formed = token.secret_sha256.len() == 64
            && token.secret_sha256.chars().all(|c| c.is_ascii_hexdigit());
        if !well_formed {
            return Err(invalid("token secret hash must be 64 hex digits".into()));
        }
        validate::name("token id", &token.id).map_err(invalid)?;
        if self.tokens.contains_key(&token.id) {
            return Err(invalid(format!("token {} already exists", token.id)));
        }
        self.tokens.insert(token.id.clone(), token.clone());
        Ok(ApplyResult::Ok)
    }

    /// Create (`exists` false) or replace (`exists` true) a tenant record, re-validated here.
    fn put_tenant(
        &mut self,
        t: &TenantRecord,
        exists: bool,
        now: u64,
    ) -> Result<ApplyResult, Rejection> {
        tenant::validate(t).map_err(invalid)?;
        let created_at_ms = match (self.tenants.get(&t.name), exists) {
            (Some(_), false) => {
                return Err(invalid(format!("tenant {} already exists", t.name)));
            }
            (None, true) => {
                return Err(Rejection::UnknownTenant {
                    name: t.name.clone(),
                });
            }
            (Some(old), true) => old.created_at_ms,
            (None, false) => now,
        };
        let record = TenantRecord {
            created_at_ms,
            updated_at_ms: now,
            ..t.clone()
        };
        self.tenants.insert(t.name.clone(), record);
        Ok(ApplyResult::Ok)
    }

    fn record_certificate(&mut self, cert: &CertRecord) -> Result<ApplyResult, Rejection> {
        cert::check_serial(&cert.serial).map_err(invalid)?;
        if self.certificates.contains_key(&cert.serial) {
            return Err(invalid(format!(
                "certificate {} is already recorded",
                cert.serial
            )));
        }
        let mut cert = cert.clone();
        cert.revoked = false;
        cert.revoked_reason.clear();
        self.certificates.insert(cert.serial.clone(), cert);
        Ok(ApplyResult::Ok)
    }

    fn revoke_certificate(&mut self, serial: &str, reason: &str) -> Result<ApplyResult, Rejection> {
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

    /// Whether a presented certificate serial is on the revocation list.
    pub fn is_revoked(&self, serial: &str) -> bool {
        self.certificates.get(serial).is_some_and(|c| c.revoked)
    }

    fn revoke_token(
        &mut self,
        id: &str,
        meta: Option<&RequestMeta>,
    ) -> Result<ApplyResult, Rejection> {
        let holder = self.actor_grant(meta)?;
        let token = self
            .tokens
            .get_mut(id)
            .ok_or_else(|| Rejection::UnknownToken { id: id.to_owned() })?;
        if let Some(holder) = holder {
            let target = Grant {
                role: token.role,
                tenant: token.tenant.clone(),
            };
            if !auth::can_grant(&holder, &target) {
                return Err(Rejection::PermissionDenied {
                    message: format!(
                        "a {} token cannot revoke a {} token",
                        holder.role, token.role
                    ),
                });
            }
        }
        token.revoked = true;
        Ok(ApplyResult::Ok)
    }

    fn node_mut(&mut self, node: NodeId) -> Result<&mut NodeRecord, Rejection> {
        self.nodes
            .get_mut(&node)
            .ok_or(Rejection::UnknownNode { node })
    }

    fn job_mut(&mut self, job: JobId) -> Result<&mut Job, Rejection> {
        self.jobs.get_mut(&job).ok_or(Rejection::UnknownJob { job })
    }

    #[allow(clippy::too_many_arguments)] // The fields of `Command::RegisterNode`, one to one.
    fn register(
        &mut self,
        node: NodeId,
        addr: &str,
        labels: &BTreeMap<String, String>,
        inventory: &crate::model::node::Inventory,
        edge: Option<&EdgeTerms>,
        protocol: u32,
        now: u64,
    ) -> Result<ApplyResult, Rejection> {
        validate::addr(addr).map_err(invalid)?;
        validate::labels(labels).map_err(invalid)?;
        let mut seen = std::collections::BTreeSet::new();
        if !inventory.gpus.iter().all(|g| seen.insert(g.index)) {
            return Err(invalid("duplicate GPU index in inventory".into()));
        }
        self.check_edge_terms(node, labels, edge).map_err(invalid)?;
        let record = self.nodes.entry(node).or_insert_with(|| NodeRecord {
            id: node,
            addr: String::new(),
            agent_labels: BTreeMap::new(),
            labels: BTreeMap::new(),
            inventory: Default::default(),
            status: NodeStatus::Ready,
            cordoned: false,
            allocations: BTreeMap::new(),
            quarantined: BTreeMap::new(),
            partitions: BTreeMap::new(),
            slices: BTreeMap::new(),
            edge: None,
            protocol,
            registered_at_ms: now,
            updated_at_ms: now,
        });
        record.addr = addr.to_owned();
        record.edge = edge.cloned();
        record.protocol = protocol;
        record.agent_labels.clone_from(labels);
        record.inventory.clone_from(inventory);
        record.status = NodeStatus::Ready;
        record.updated_at_ms = now;
        Ok(ApplyResult::Ok)
    }

    /// Why a registration's edge terms cannot be accepted, if they cannot: they must be valid
    /// and name the node's own `site` label; every node of a site must be edge with the same
    /// terms, or none of them edge (so one site has one grace, whoever leads); and a node's
    /// terms do not change while it holds jobs (their supervisors fence by the old lease).
    pub fn check_edge_terms(
        &self,
        node: NodeId,
        labels: &BTreeMap<String, String>,
        edge: Option<&EdgeTerms>,
    ) -> Result<(), String> {
        let site = labels.get(SITE_LABEL);
        if let Some(terms) = edge {
            terms.validate()?;
            if site != Some(&terms.site) {
                return Err(format!(
                    "edge site {:?} must be the node's `site` label (it is {site:?})",
                    terms.site
                ));
            }
        }
        if let Some(site) = site {
            let peer = self.nodes.values().find(|n| {
                n.id != node
                    && (n.edge.as_ref().is_some_and(|e| &e.site == site)
                        || n.agent_labels.get(SITE_LABEL) == Some(site))
            });
            if let Some(peer) = peer {
                let describe = |t: Option<&EdgeTerms>| match t {
                    Some(t) => format!(
                        "an edge site (lease {} ms, down_after {} ms)",
                        t.lease_ms, t.down_after_ms
                    ),
                    None => "not an edge site".to_owned(),
                };
                if peer.edge.as_ref() != edge {
                    return Err(format!(
                        "site {site:?} is {} for n{}, but n{node} registers it as {}: every \
                         agent of a site needs the same [edge] settings",
                        describe(peer.edge.as_ref()),
                        peer.id,
                        describe(edge)
                    ));
                }
            }
        }
        if let Some(record) = self.nodes.get(&node)
            && record.edge.as_ref() != edge
            && !record.allocations.is_empty()
        {
            return Err(format!(
                "n{node} holds jobs started under its earlier edge settings; drain it before \
                 changing them"
            ));
        }
        Ok(())
    }

    fn set_status(
        &mut self,
        node: NodeId,
        status: NodeStatus,
        now: u64,
    ) -> Result<ApplyResult, Rejection> {
        let record = self.node_mut(node)?;
        record.status = status;
        record.updated_at_ms = now;
        if status == NodeStatus::Down {
            let live: Vec<(JobId, u64)> = self
                .jobs
                .values()
                .filter(|j| j.state.is_live() && j.on_node(node))
                .map(|j| (j.id, j.generation))
                .collect();
            for (job, generation) in live {
                let outcome = Outcome::Lost {
                    message: format!("node n{node} went down"),
                };
                self.finished(job, generation, &outcome, now)?;
            }
        }
        Ok(ApplyResult::Ok)
    }

    fn drain(&mut self, node: NodeId, evict: bool, now: u64) -> Result<ApplyResult, Rejection> {
        let record = self.node_mut(node)?;
        record.cordoned = true;
        record.updated_at_ms = now;
        if evict {
            for job in self.jobs.values_mut() {
                if job.state.is_live() && job.on_node(node) {
                    job.evict_requested = true;
                }
            }
        }
        Ok(ApplyResult::Ok)
    }

    fn submit(
        &mut self,
        spec: &crate::model::job::JobSpec,
        key: Option<&str>,
        now: u64,
    ) -> Result<ApplyResult, Rejection> {
        validate::job_spec(spec).map_err(invalid)?;
        let scoped = match key {
            Some(k) => {
                validate::idempotency_key(k).map_err(invalid)?;
                let scoped = format!("{}/{k}", spec.tenant);
                if let Some(&existing) = self.idempotency.get(&scoped) {
                    let same = self.jobs.get(&existing).is_some_and(|j| j.spec == *spec);
                    return if same {
                        Ok(ApplyResult::JobSubmitted {
                            job: existing,
                            existing: true,
                        })
                    } else {
                        Err(Rejection::IdempotencyConflict {
                            key: k.to_owned(),
                            job: existing,
                        })
                    };
                }
                Some(scoped)
            }
            None => None,
        };
        let id = self.next_job_id.max(1);
        self.next_job_id = id + 1;
        if let Some(scoped) = scoped {
            self.idempotency.insert(scoped, id);
        }
        self.job_log.record(id);
        self.jobs.insert(
            id,
            Job {
                id,
                spec: spec.clone(),
                idempotency_key: key.map(str::to_owned),
                state: JobState::Pending,
                submitted_at_ms: now,
                attempts: 0,
                generation: 0,
                binding: None,
                reason: None,
                outcome: None,
                cancel_requested: false,
                evict_requested: false,
                bound_at_ms: None,
                started_at_ms: None,
                finished_at_ms: None,
                gpu_ms: Default::default(),
                preempted_for: None,
                gang: Vec::new(),
                gang_done: Default::default(),
            },
        );
        Ok(ApplyResult::JobSubmitted {
            job: id,
            existing: false,
        })
    }

    fn cancel(&mut self, job: JobId, now: u64) -> Result<ApplyResult, Rejection> {
        let j = self.job_mut(job)?;
        match j.state {
            JobState::Pending => {
                j.state = JobState::Cancelled;
                j.outcome = Some(Outcome::Cancelled);
                j.finished_at_ms = Some(now);
                j.reason = None;
                self.job_log.record(job);
            }
            JobState::Bound | JobState::Running => j.cancel_requested = true,
            state => return Err(Rejection::JobFinished { job, state }),
        }
        Ok(ApplyResult::Ok)
    }

    fn bind_all(&mut self, binds: &[Bind], now: u64) -> ApplyResult {
        let mut bound = Vec::new();
        let mut rejected = Vec::new();
        let mut gangs_seen = std::collections::BTreeSet::new();
        for b in binds {
            let gang = self.jobs.get(&b.job).is_some_and(|j| j.spec.nodes > 1);
            if gang {
                // All of a gang's binds, in rank order, at its first: all or nothing.
                if !gangs_seen.insert(b.job) {
                    continue;
                }
                let members: Vec<&Bind> = binds.iter().filter(|m| m.job == b.job).collect();
                match self.check_gang(&members) {
                    Ok(()) => {
                        self.bind_gang(&members, now);
                        bound.push(b.job);
                    }
                    Err(reason) => rejected.push((b.job, reason)),
                }
                continue;
            }
            match self.check_bind(b) {
                Ok(()) => {
                    self.bind(b, now);
                    bound.push(b.job);
                }
                Err(reason) => rejected.push((b.job, reason)),
            }
        }
        ApplyResult::Bound { bound, rejected }
    }

    /// A gang's binds: one per member node, distinct nodes, each passing `check_bind`.
    fn check_gang(&self, members: &[&Bind]) -> Result<(), String> {
        let Some(first) = members.first() else {
            return Err("an empty gang".into());
        };
        let job = self
            .jobs
            .get(&first.job)
            .ok_or_else(|| format!("job j-{} does not exist", first.job))?;
        let want = job.spec.node_count() as usize;
        if members.len() != want {
            return Err(format!(
                "gang j-{} needs {want} nodes, the binds name {}",
                first.job,
                members.len()
            ));
        }
        let mut nodes = std::collections::BTreeSet::new();
        for m in members {
            if !nodes.insert(m.node) {
                return Err(format!("gang j-{} names node n{} twice", m.job, m.node));
            }
            self.check_bind(m)?;
        }
        Ok(())
    }

    fn bind_gang(&mut self, members: &[&Bind], now: u64) {
        let Some(first) = members.first() else {
            return;
        };
        self.bind(first, now);
        for m in &members[1..] {
            if let Some(node) = self.nodes.get_mut(&m.node) {
                for &index in &m.gpus {
                    node.allocations.insert(index, m.job);
                }
            }
        }
        if let Some(job) = self.jobs.get_mut(&first.job) {
            let generation = job.generation;
            job.gang = members
                .iter()
                .map(|m| Binding {
                    node: m.node,
                    gpus: m.gpus.clone(),
                    generation,
                    slice: None,
                })
                .collect();
        }
    }

    fn member_finished(
        &mut self,
        job: JobId,
        generation: u64,
        node: NodeId,
        now: u64,
    ) -> Result<ApplyResult, Rejection> {
        let j = self.jobs.get(&job).ok_or(Rejection::UnknownJob { job })?;
        if !j.state.is_live() || j.generation != generation {
            return Err(Rejection::Stale {
                job,
                generation,
                current: j.generation,
                state: j.state,
            });
        }
        if j.gang.is_empty() || !j.on_node(node) {
            return Err(invalid(format!(
                "job j-{job} has no gang member on node n{node}"
            )));
        }
        let members = j.gang.len();
        let j = self.job_mut(job)?;
        j.gang_done.insert(node);
        if j.gang_done.len() == members {
            return self.finished(job, generation, &Outcome::Exited { code: 0 }, now);
        }
        Ok(ApplyResult::Ok)
    }

    /// Whether `b` may be applied now: the P4 check. Every condition is re-checked here no
    /// matter what the scheduler believed.
    pub fn check_bind(&self, b: &Bind) -> Result<(), String> {
        let job = self
            .jobs
            .get(&b.job)
            .ok_or_else(|| format!("job j-{} does not exist", b.job))?;
        if job.state != JobState::Pending {
            return Err(format!("job j-{} is {}, not Pending", b.job, job.state));
        }
        let node = self
            .nodes
            .get(&b.node)
            .ok_or_else(|| format!("node n{} is not registered", b.node))?;
        if !node.accepts_work() {
            return Err(format!("node n{} does not accept work", b.node));
        }
        let labels = node.effective_labels();
        if let Some((k, v)) = job
            .spec
            .node_selector
            .iter()
            .find(|(k, v)| labels.get(*k) != Some(*v))
        {
            return Err(format!("node n{} does not have label {k}={v}", b.node));
        }
        if job.spec.slice.is_some() {
            return Err(format!(
                "job j-{} asks for a GPU slice: it is bound with BindSlices",
                b.job
            ));
        }
        let wanted_mode = match job.spec.kind {
            crate::model::job::JobKind::Process => crate::model::partition::GpuMode::Whole,
            crate::model::job::JobKind::Vm => crate::model::partition::GpuMode::Passthrough,
        };
        let per_node = job.spec.gpus_per_node() as usize;
        if b.gpus.len() != per_node {
            return Err(format!(
                "job j-{} needs {per_node} GPUs on each node, bind gives {}",
                b.job,
                b.gpus.len()
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for &index in &b.gpus {
            if !seen.insert(index) {
                return Err(format!("GPU {index} appears twice"));
            }
            let gpu = node
                .gpu(index)
                .ok_or_else(|| format!("node n{} has no GPU {index}", b.node))?;
            if !gpu.healthy {
                return Err(format!("GPU n{}/{index} is unhealthy", b.node));
            }
            if let Some(rule) = node.quarantined.get(&index) {
                return Err(format!("GPU n{}/{index} is quarantined ({rule})", b.node));
            }
            if let Some(holder) = node.allocations.get(&index) {
                return Err(format!("GPU n{}/{index} is held by j-{holder}", b.node));
            }
            if node.gpu_busy(index) {
                return Err(format!("GPU n{}/{index} has slices in use", b.node));
            }
            if node.draining(index) {
                return Err(format!(
                    "GPU n{}/{index} is draining for a partition change",
                    b.node
                ));
            }
            let mode = node.mode(index);
            if mode != wanted_mode {
                return Err(format!(
                    "GPU n{}/{index} is in {} mode; j-{} needs a {} GPU",
                    b.node,
                    mode.name(),
                    b.job,
                    wanted_mode.name()
                ));
            }
            if !gpu_fits(gpu, &job.spec) {
                return Err(format!(
                    "GPU n{}/{index} ({}) does not match the job's selector",
                    b.node, gpu.model
                ));
            }
        }
        Ok(())
    }

    fn preempt_all(&mut self, preemptions: &[Preempt]) -> ApplyResult {
        let held = tenant::held_by_type(&self.jobs, &self.nodes);
        let mut preempted = Vec::new();
        let mut rejected = Vec::new();
        for p in preemptions {
            match self.check_preemption(&held, p) {
                Ok(_) => {
                    if let Some(j) = self.jobs.get_mut(&p.job) {
                        j.evict_requested = true;
                        j.preempted_for = Some(p.for_job);
                    }
                    preempted.push(p.job);
                }
                Err(reason) => rejected.push((p.job, reason)),
            }
        }
        ApplyResult::Preempted {
            preempted,
            rejected,
        }
    }

    /// Whether preemption `p` is allowed now, and of which kind (`reclaim` or `priority`):
    /// the rule the leader plans with and `apply` enforces. Only a live run not already
    /// stopping may be preempted, only for a pending job, never so that a tenant can borrow
    /// (hold more than its guarantee of a type the run's GPUs are), and only to take GPUs back
    /// from a tenant borrowing them (reclaim) or, with `priority` preemption on, from a job of
    /// strictly lower priority.
    pub fn check_preemption(
        &self,
        held: &BTreeMap<(String, String), u32>,
        p: &Preempt,
    ) -> Result<&'static str, String> {
        let mode = self.scheduler.preemption;
        if mode == crate::model::scheduler::Preemption::Off {
            return Err("preemption is off".into());
        }
        let victim = self
            .jobs
            .get(&p.job)
            .ok_or_else(|| format!("job j-{} does not exist", p.job))?;
        if !victim.state.is_live() || victim.generation != p.generation {
            return Err(format!(
                "run g{} of j-{} is not live (now {} g{})",
                p.generation, p.job, victim.state, victim.generation
            ));
        }
        if victim.evict_requested || victim.cancel_requested {
            return Err(format!("j-{} is already stopping", p.job));
        }
        let ben = self
            .jobs
            .get(&p.for_job)
            .ok_or_else(|| format!("job j-{} does not exist", p.for_job))?;
        if ben.state != JobState::Pending || ben.spec.gpus == 0 {
            return Err(format!(
                "j-{} is not a pending GPU job, nothing to preempt for",
                p.for_job
            ));
        }
        let held_of = |tenant: &str, t: &str| {
            held.get(&(tenant.to_owned(), t.to_owned()))
                .copied()
                .unwrap_or(0)
        };
        let mut types: Vec<&str> = tenant::bound_types(victim, &self.nodes).collect();
        types.sort_unstable();
        types.dedup();
        let ben_record = self.tenants.get(&ben.spec.tenant);
        let victim_record = self.tenants.get(&victim.spec.tenant);
        for t in &types {
            if let Some(q) = ben_record.and_then(|r| r.quota(t))
                && held_of(&ben.spec.tenant, t).saturating_add(ben.spec.gpus) > q.guaranteed
            {
                return Err(format!(
                    "j-{} would borrow {t} GPUs beyond tenant {}'s guarantee of {}: no job is preempted for a borrower",
                    p.for_job, ben.spec.tenant, q.guaranteed
                ));
            }
        }
        let reclaim = victim.spec.tenant != ben.spec.tenant
            && !types.is_empty()
            && types.iter().all(|t| {
                ben_record.and_then(|r| r.quota(t)).is_some()
                    && victim_record
                        .and_then(|r| r.quota(t))
                        .is_some_and(|q| held_of(&victim.spec.tenant, t) > q.guaranteed)
            });
        if reclaim {
            return Ok("reclaim");
        }
        if mode == crate::model::scheduler::Preemption::Priority
            && victim.spec.priority < ben.spec.priority
        {
            return Ok("priority");
        }
        Err(format!(
            "j-{} (priority {}) is not of lower priority than j-{} (priority {}) and its tenant is not borrowing what j-{} is guaranteed",
            p.job, victim.spec.priority, p.for_job, ben.spec.priority, p.for_job
        ))
    }

    fn bind(&mut self, b: &Bind, now: u64) {
        // A deliberate bug for chaos tests (never on outside a failpoints build).
        let forget = crate::failpoint::on("apply-bind-forgets-gpus");
        if let Some(node) = self.nodes.get_mut(&b.node)
            && !forget
        {
            for &index in &b.gpus {
                node.allocations.insert(index, b.job);
            }
        }
        self.mark_bound(b.job, b.node, b.gpus.clone(), None, now);
    }

    /// The job side of a bind: a new generation, Bound, its binding.
    pub(crate) fn mark_bound(
        &mut self,
        job: JobId,
        node: NodeId,
        gpus: Vec<u32>,
        slice: Option<crate::model::partition::Slice>,
        now: u64,
    ) {
        if let Some(job) = self.jobs.get_mut(&job) {
            self.job_log.record(job.id);
            job.generation += 1;
            job.attempts += 1;
            job.state = JobState::Bound;
            job.binding = Some(Binding {
                node,
                gpus,
                generation: job.generation,
                slice,
            });
            job.bound_at_ms = Some(now);
            job.reason = None;
            job.preempted_for = None;
            job.gang.clear();
            job.gang_done.clear();
        }
    }

    fn started(&mut self, job: JobId, generation: u64, now: u64) -> Result<ApplyResult, Rejection> {
        let j = self.job_mut(job)?;
        match j.state {
            JobState::Bound if j.generation == generation => {
                j.state = JobState::Running;
                j.started_at_ms = Some(now);
                self.job_log.record(job);
                Ok(ApplyResult::Ok)
            }
            JobState::Running if j.generation == generation => Ok(ApplyResult::Ok),
            state => Err(Rejection::Stale {
                job,
                generation,
                current: j.generation,
                state,
            }),
        }
    }

    fn finished(
        &mut self,
        job: JobId,
        generation: u64,
        outcome: &Outcome,
        now: u64,
    ) -> Result<ApplyResult, Rejection> {
        let j = self.jobs.get(&job).ok_or(Rejection::UnknownJob { job })?;
        if !j.state.is_live() || j.generation != generation {
            return Err(Rejection::Stale {
                job,
                generation,
                current: j.generation,
                state: j.state,
            });
        }
        // GPU time of this run, bind to end, by GPU type, in whole-GPU units (a slice counts
        // its fraction: MIG compute slices / 7, a share / 100).
        let held_ms = now.saturating_sub(j.bound_at_ms.unwrap_or(now));
        let slice = j.binding.as_ref().and_then(|b| b.slice.as_ref());
        let types: Vec<(String, (u64, u64))> = j
            .members()
            .flat_map(|b| {
                let node = self.nodes.get(&b.node);
                b.gpus.iter().map(move |&i| {
                    node.and_then(|n| n.gpu(i)).map_or_else(
                        || ("unknown".to_owned(), (1, 1)),
                        |g| {
                            let fraction = crate::model::partition::normalized(slice, &g.model);
                            (g.gpu_type.clone(), fraction)
                        },
                    )
                })
            })
            .collect();
        let nodes: Vec<NodeId> = j.members().map(|b| b.node).collect();
        for n in nodes {
            if let Some(node) = self.nodes.get_mut(&n) {
                node.allocations.retain(|_, holder| *holder != job);
            }
            self.release_slices(n, job);
        }
        // The binding stays as the record of where the job last ran (for logs and history).
        let j = self.job_mut(job)?;
        for (t, (num, den)) in types {
            *j.gpu_ms.entry(t).or_insert(0) += held_ms.saturating_mul(num) / den.max(1);
        }
        j.outcome = Some(outcome.clone());
        j.cancel_requested = false;
        j.evict_requested = false;
        let requeue = match outcome {
            Outcome::Exited { code: 0 } => Some(JobState::Succeeded),
            Outcome::Cancelled => Some(JobState::Cancelled),
            Outcome::Evicted => {
                j.attempts = j.attempts.saturating_sub(1);
                None
            }
            Outcome::Lost { .. } | Outcome::Fenced if j.attempts < j.spec.max_attempts => None,
            _ => Some(JobState::Failed),
        };
        match requeue {
            Some(terminal) => {
                j.state = terminal;
                j.finished_at_ms = Some(now);
                j.reason = (terminal == JobState::Failed).then(|| outcome.to_string());
            }
            None => {
                j.state = JobState::Pending;
                j.reason = Some(match (outcome, j.preempted_for) {
                    (Outcome::Evicted, Some(by)) => format!("requeued: preempted for j-{by}"),
                    _ => format!("requeued: {outcome}"),
                });
            }
        }
        self.job_log.record(job);
        Ok(ApplyResult::Ok)
    }
}

/// Whether one GPU satisfies a job's GPU selector (type and memory).
pub fn gpu_fits(gpu: &crate::model::node::GpuRecord, spec: &crate::model::job::JobSpec) -> bool {
    (spec.gpu_types.is_empty() || spec.gpu_types.contains(&gpu.gpu_type))
        && gpu.memory_mib >= spec.min_gpu_memory_mib
}

fn invalid(message: String) -> Rejection {
    Rejection::Invalid { message }
}
