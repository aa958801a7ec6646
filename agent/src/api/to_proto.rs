//! Domain → wire conversions for the public API, the only place they happen (the other way is
//! `from_proto.rs`). Generated types
//! are always written `pb::…`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use gpu_proto::v1 as pb;
use gpu_raft_store::{
    Account, ClusterState, Job, JobKind, JobSpec, JobState, NodeRecord, NodeStatus, Outcome, Role,
    Run, SliceRequest, TokenRecord, job_name,
};

use crate::raft::RaftView;
use crate::raft::contact::ContactBook;

pub(crate) fn node(n: &NodeRecord) -> pb::Node {
    pb::Node {
        id: n.id,
        addr: n.addr.clone(),
        labels: n.effective_labels().into_owned().into_iter().collect(),
        registered_at_ms: n.registered_at_ms,
        updated_at_ms: n.updated_at_ms,
        status: match n.status {
            NodeStatus::Ready => pb::NodeStatus::Ready,
            NodeStatus::Down => pb::NodeStatus::Down,
        } as i32,
        cordoned: n.cordoned,
        edge: n.edge.as_ref().map(|e| pb::EdgeSite {
            site: e.site.clone(),
            lease_ms: e.lease_ms,
            down_after_ms: e.down_after_ms,
        }),
        gpus: n
            .inventory
            .gpus
            .iter()
            .map(|g| pb::Gpu {
                index: g.index,
                uuid: g.uuid.clone(),
                model: g.model.clone(),
                gpu_type: g.gpu_type.clone(),
                memory_mib: g.memory_mib,
                numa_node: g.numa_node,
                nvlink_peers: g.nvlink_peers.clone(),
                healthy: g.healthy,
                job_id: n.allocations.get(&g.index).copied(),
                quarantined_by: n.quarantined.get(&g.index).cloned().unwrap_or_default(),
                ..gpu_partition(n, g)
            })
            .collect(),
        cpu_cores: n.inventory.cpu_cores,
        memory_mib: n.inventory.memory_mib,
        images: n.images.iter().cloned().collect(),
    }
}

/// A GPU's partitioning fields (mode, layout, pending change, slices held).
fn gpu_partition(n: &NodeRecord, g: &gpu_raft_store::GpuRecord) -> pb::Gpu {
    let entry = n.partitions.get(&g.index);
    let current = n.partition(g.index);
    let (used_mem, used_share) = n.shared_used(g.index);
    pb::Gpu {
        mode: current.mode.name().to_owned(),
        mig_layout: current.mig.iter().map(ToString::to_string).collect(),
        pending_partition: entry
            .and_then(|p| p.pending.as_ref())
            .map(ToString::to_string)
            .unwrap_or_default(),
        slices: n
            .slices
            .get(&g.index)
            .map(|h| {
                h.iter()
                    .map(|(job, slice)| format!("{} {slice}", job_name(*job)))
                    .collect()
            })
            .unwrap_or_default(),
        shared_memory_used_mib: used_mem,
        shared_share_used: used_share,
        mig_profiles: gpu_raft_store::mig::model(&g.model)
            .map(|m| m.names().into_iter().map(str::to_owned).collect())
            .unwrap_or_default(),
        ..Default::default()
    }
}

pub(crate) fn role(r: Role) -> pb::Role {
    match r {
        Role::Admin => pb::Role::Admin,
        Role::Operator => pb::Role::Operator,
        Role::TenantAdmin => pb::Role::TenantAdmin,
        Role::User => pb::Role::User,
        Role::Viewer => pb::Role::Viewer,
        Role::Node => pb::Role::Node,
    }
}

pub(crate) fn account(a: &Account) -> pb::Account {
    pb::Account {
        user: a.user.clone(),
        group: a.group.clone().unwrap_or_default(),
        groups: a.groups.clone(),
    }
}

pub(crate) fn token(t: &TokenRecord) -> pb::Token {
    pb::Token {
        account: t.account.as_ref().map(account),
        id: t.id.clone(),
        role: role(t.role) as i32,
        tenant: t.tenant.clone().unwrap_or_default(),
        description: t.description.clone(),
        created_at_ms: t.created_at_ms,
        created_by: t.created_by.clone(),
        revoked: t.revoked,
        expires_at_ms: t.limits.expires_at_ms,
        uses_left: t.limits.uses_left,
        node_id_first: t.limits.node_ids.map_or(0, |(first, _)| first),
        node_id_last: t.limits.node_ids.map_or(0, |(_, last)| last),
        seat: t
            .limits
            .seat
            .map(|s| s.as_str().to_owned())
            .unwrap_or_default(),
    }
}

pub(crate) fn job_state(s: JobState) -> pb::JobState {
    match s {
        JobState::Pending => pb::JobState::Pending,
        JobState::Bound => pb::JobState::Bound,
        JobState::Running => pb::JobState::Running,
        JobState::Succeeded => pb::JobState::Succeeded,
        JobState::Failed => pb::JobState::Failed,
        JobState::Cancelled => pb::JobState::Cancelled,
    }
}

fn spec(s: &JobSpec) -> pb::JobSpec {
    pb::JobSpec {
        name: s.name.clone(),
        tenant: s.tenant.clone(),
        command: s.command.clone(),
        env: s.env.clone().into_iter().collect(),
        workdir: s.workdir.clone().unwrap_or_default(),
        gpus: s.gpus,
        gpu_types: s.gpu_types.clone(),
        min_gpu_memory_mib: s.min_gpu_memory_mib,
        node_selector: s.node_selector.clone().into_iter().collect(),
        priority: Some(s.priority),
        runtime_estimate_s: s.runtime_estimate_s,
        wall_time_limit_s: s.wall_time_limit_s,
        max_attempts: s.max_attempts,
        cpu_millis: s.cpu_millis,
        memory_mib: s.memory_mib,
        nodes: s.nodes,
        topology: s.topology.clone().unwrap_or_default(),
        mig_profile: match &s.slice {
            Some(SliceRequest::Mig { profile }) => profile.clone(),
            _ => String::new(),
        },
        shared_memory_mib: match s.slice {
            Some(SliceRequest::Shared { memory_mib, .. }) => memory_mib,
            _ => 0,
        },
        gpu_share: match s.slice {
            Some(SliceRequest::Shared { share, .. }) => share,
            _ => 0,
        },
        kind: match s.kind {
            JobKind::Process => String::new(),
            JobKind::Vm => "vm".to_owned(),
        },
        retry_backoff_s: s.retry_backoff_s,
        after: s.after.iter().map(ToString::to_string).collect(),
        singleton: s.singleton,
        labels: s.labels.clone().into_iter().collect(),
        notify_url: s.notify.as_ref().map(|n| n.url.clone()).unwrap_or_default(),
        notify_events: (s.notify.iter())
            .flat_map(|n| n.events.iter().map(ToString::to_string))
            .collect(),
        array: s
            .array
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        container: s.container.as_ref().map(|c| pb::ContainerSpec {
            image: c.image.clone(),
            mounts: c
                .mounts
                .iter()
                .map(|m| pb::ContainerMount {
                    source: m.source.clone(),
                    target: m.target.clone(),
                    read_only: m.read_only,
                })
                .collect(),
        }),
    }
}

fn webhook(w: &gpu_raft_store::webhook::Webhook) -> pb::Webhook {
    pb::Webhook {
        url: w.url.clone(),
        events: w.events.iter().map(ToString::to_string).collect(),
    }
}

/// `uuids` maps (node, GPU index) to the GPU's UUID, for the bound GPUs.
pub(crate) fn job(j: &Job, uuids: &BTreeMap<u32, String>) -> pb::Job {
    let binding = j.binding.as_ref();
    let (exit_code, signal) = exit_of(j.outcome.as_ref());
    pb::Job {
        id: j.id,
        spec: Some(spec(&j.spec)),
        state: job_state(j.state) as i32,
        idempotency_key: j.idempotency_key.clone().unwrap_or_default(),
        submitted_at_ms: j.submitted_at_ms,
        attempts: j.attempts,
        generation: j.generation,
        node_id: binding.map(|b| b.node),
        gang_nodes: j.gang.iter().map(|b| b.node).collect(),
        gpus: binding.map(|b| b.gpus.clone()).unwrap_or_default(),
        gpu_uuids: binding
            .map(|b| {
                b.gpus
                    .iter()
                    .filter_map(|g| uuids.get(g).cloned())
                    .collect()
            })
            .unwrap_or_default(),
        slice: binding
            .and_then(|b| b.slice.as_ref())
            .map(ToString::to_string)
            .unwrap_or_default(),
        reason: j.reason.clone().unwrap_or_default(),
        outcome: j
            .outcome
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        exit_code,
        signal,
        bound_at_ms: j.bound_at_ms,
        started_at_ms: j.started_at_ms,
        finished_at_ms: j.finished_at_ms,
        cancel_requested: j.cancel_requested,
        // Filled in by `api::job::job_view`, which has the state's energy book.
        energy_mj: 0,
        runs: j.runs.iter().map(run).collect(),
        not_before_ms: j.not_before_ms,
        account: j.spec.account.as_ref().map(account),
        phase: j.live_phase().map(|p| p.text.clone()).unwrap_or_default(),
        phase_since_ms: j.live_phase().map(|p| p.since_ms),
        waiting_for: j.waiting_for.iter().copied().collect(),
        held: j.held,
        array_id: j.array_task.map(|t| t.array),
        array_index: j.array_task.map(|t| t.index),
        // Filled in by a folded list.
        array_task_states: Default::default(),
        submitted_by: j.submitted_by.clone().unwrap_or_default(),
    }
}

fn run(r: &Run) -> pb::JobRun {
    let (exit_code, signal) = exit_of(r.outcome.as_ref());
    pb::JobRun {
        attempt: r.attempt,
        generation: r.generation,
        nodes: r.nodes.clone(),
        bound_at_ms: r.bound_at_ms,
        started_at_ms: r.started_at_ms,
        finished_at_ms: r.finished_at_ms,
        outcome: r
            .outcome
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        exit_code,
        signal,
    }
}

/// The exit code or signal of an outcome that has one.
fn exit_of(outcome: Option<&Outcome>) -> (Option<i32>, Option<i32>) {
    match outcome {
        Some(Outcome::Exited { code }) => (Some(*code), None),
        Some(Outcome::Signaled { signal }) => (None, Some(*signal)),
        _ => (None, None),
    }
}

/// Liveness as the leader sees it; `None` when this view is not the leader's.
pub(crate) struct Liveness<'a> {
    pub contacts: &'a ContactBook,
    pub reachable_within: std::time::Duration,
}

/// The Raft view as `ClusterStatus`; `protocols` is the protocol each member's node registered
/// with (from the replica).
pub(crate) fn cluster_status(
    view: &RaftView,
    protocols: &BTreeMap<u64, u32>,
    voter_target: usize,
    liveness: Option<Liveness<'_>>,
) -> pb::ClusterStatus {
    let now = Instant::now();
    let members = view
        .members
        .iter()
        .map(|(&id, addr)| {
            let is_self = id == view.node_id;
            let ago = liveness.as_ref().and_then(|l| {
                if is_self {
                    Some(0)
                } else {
                    l.contacts.last_heard(id).map(|t| millis(now - t))
                }
            });
            let reachable = liveness
                .as_ref()
                .map(|l| ago.is_some_and(|ms| u128::from(ms) <= l.reachable_within.as_millis()));
            pb::Member {
                node_id: id,
                addr: addr.clone(),
                role: if view.voters.contains(&id) {
                    pb::MemberRole::Voter
                } else {
                    pb::MemberRole::Learner
                } as i32,
                is_leader: view.leader == Some(id),
                reachable,
                last_contact_ms_ago: ago,
                matched_index: view.matched.get(&id).copied(),
                build: if is_self {
                    Some(crate::build_info::BUILD.to_owned())
                } else {
                    liveness.as_ref().and_then(|l| l.contacts.build_of(id))
                },
                protocol: protocols.get(&id).copied(),
            }
        })
        .collect();
    pb::ClusterStatus {
        node_id: view.node_id,
        leader_id: view.leader,
        leader_addr: view
            .leader
            .and_then(|l| view.members.get(&l).cloned())
            .unwrap_or_default(),
        term: view.term,
        commit_index: view.commit_index,
        applied_index: view.applied_index,
        last_log_index: view.last_log_index,
        members,
        voter_target: u32::try_from(voter_target).unwrap_or(u32::MAX),
    }
}

/// A replica's applied index and state digest (`StateReader::applied_digest`).
pub(crate) fn state_digest(node_id: u64, applied_index: u64, sha256: String) -> pb::StateDigest {
    pb::StateDigest {
        node_id,
        applied_index,
        sha256,
    }
}

/// A backup file (`gpu_raft_store::backup`) read at `index`, as the API returns it.
pub(crate) fn cluster_backup(index: u64, data: Vec<u8>, cluster_id: String) -> pb::ClusterBackup {
    pb::ClusterBackup {
        data,
        index,
        cluster_id,
    }
}

/// A backup file cut into pieces of at most `max` bytes, in order, each naming the index and
/// the cluster.
pub(crate) fn backup_pieces(
    index: u64,
    data: &[u8],
    cluster_id: &str,
    max: usize,
) -> Vec<pb::ClusterBackup> {
    data.chunks(max.max(1))
        .map(|piece| cluster_backup(index, piece.to_vec(), cluster_id.to_owned()))
        .collect()
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The scheduler's settings and queue as `SchedulerStatus`.
pub(crate) fn runtime_accuracy(a: &crate::scheduler::Accuracy) -> pb::RuntimeAccuracy {
    let errors = |e: &crate::scheduler::Errors| pb::GuessErrors {
        count: e.count as u64,
        median_relative_error: e.median_relative_error,
        within_2x: e.within_2x,
    };
    pb::RuntimeAccuracy {
        jobs: a.jobs as u64,
        estimates: Some(errors(&a.estimates)),
        predictions: Some(errors(&a.predictions)),
    }
}

pub(crate) fn scheduler_status(s: &ClusterState) -> pb::SchedulerStatus {
    let settings = &s.scheduler;
    let pending = s
        .jobs
        .values()
        .filter(|j| j.state == JobState::Pending)
        .count();
    let running = s.jobs.values().filter(|j| j.state.is_live()).count();
    let schedulable = s.nodes.values().filter(|n| n.accepts_work());
    let (total, free) = schedulable.fold((0, 0), |(t, f), n| {
        (t + n.inventory.gpus.len(), f + n.free_gpus().count())
    });
    pb::SchedulerStatus {
        policy: Some(pb::SchedulerPolicy {
            spec: settings.spec(),
            ordering: settings.ordering.to_string(),
            backfill: settings.backfill.to_string(),
            aging_per_hour: settings.aging_per_hour,
            fairshare_weight: settings.fairshare_weight,
            usage_half_life_s: settings.usage_half_life_s,
            preemption: settings.preemption.to_string(),
            gang_wait_limit_s: settings.gang_wait_limit_s,
            preempt_exempt_s: settings.preempt_exempt_s,
        }),
        pending_jobs: pending as u64,
        running_jobs: running as u64,
        gpus_total: total as u64,
        gpus_free: free as u64,
        accuracy: Some(runtime_accuracy(&crate::scheduler::accuracy(s))),
    }
}

/// One GPU sample; `job_of` names the job a process runs for.
pub(crate) fn gpu_telemetry(
    s: crate::gpu::GpuSample,
    job_of: impl Fn(u32) -> Option<gpu_raft_store::JobId>,
) -> pb::GpuTelemetry {
    pb::GpuTelemetry {
        utilization_pct: s.utilization_pct,
        memory_used_mib: s.memory_used_mib,
        temperature_c: s.temperature_c,
        power_w: s.power_w,
        power_limit_w: s.power_limit_w,
        sm_clock_mhz: s.sm_clock_mhz,
        healthy: s.healthy,
        error: s.error.unwrap_or_default(),
        memory_total_mib: s.memory_total_mib,
        memory_utilization_pct: s.memory_utilization_pct,
        memory_temperature_c: s.memory_temperature_c,
        energy_mj: s.energy_mj,
        memory_clock_mhz: s.memory_clock_mhz,
        throttle_reasons: s.throttle_reasons,
        throttle_reason_names: crate::gpu::throttle::names(s.throttle_reasons)
            .into_iter()
            .map(str::to_owned)
            .collect(),
        pcie_tx_kib_s: s.pcie_tx_kib_s,
        pcie_rx_kib_s: s.pcie_rx_kib_s,
        pcie_replays: s.pcie_replays,
        nvlink_tx_kib: s.nvlink_tx_kib,
        nvlink_rx_kib: s.nvlink_rx_kib,
        nvlink_errors: s.nvlink_errors,
        xid_events: s.xid_events,
        ecc_single_bit: s.ecc_single_bit,
        ecc_double_bit: s.ecc_double_bit,
        retired_pages: s.retired_pages,
        processes: s
            .processes
            .into_iter()
            .map(|p| pb::GpuProcess {
                pid: p.pid,
                used_mib: p.used_mib,
                job_id: job_of(p.pid),
            })
            .collect(),
    }
}

pub(crate) fn alert(a: &gpu_raft_store::Alert) -> pb::Alert {
    pb::Alert {
        id: a.id,
        rule: a.rule.clone(),
        node_id: a.node,
        gpu_index: a.gpu,
        severity: a.severity.name().into(),
        action: crate::monitor::rules::action_name(a.remediation),
        message: a.message.clone(),
        raised_at_ms: a.raised_at_ms,
        resolved_at_ms: a.resolved_at_ms,
        migrated_job_id: a.migrated_job,
    }
}

/// A rule for listing; `source` says where it comes from.
pub(crate) fn alert_rule(r: &gpu_raft_store::AlertRule, source: &str) -> pb::AlertRule {
    let flat = crate::monitor::rules::FlatRule::from_rule(r);
    let ms = |d: Option<std::time::Duration>| d.map_or(0, |d| d.as_millis() as u64);
    pb::AlertRule {
        name: flat.name,
        metric: flat.metric.unwrap_or_default(),
        above: flat.above,
        rate_per_minute: flat.rate_per_minute,
        predict_limit: flat.predict_limit,
        health: flat.fatal_xids.is_some(),
        fatal_xids: flat.fatal_xids.unwrap_or_default(),
        for_ms: ms(flat.for_),
        window_ms: ms(flat.window),
        within_ms: ms(flat.within),
        clear_after_ms: ms(flat.clear_after),
        severity: r.severity.name().into(),
        action: flat.action.unwrap_or_default(),
        enabled: r.enabled,
        source: source.into(),
    }
}

/// Energy per node and per tenant (tenants summed over their jobs).
pub(crate) fn energy(s: &ClusterState) -> pb::EnergyReport {
    let mut tenants: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for (id, mj) in &s.energy.by_job {
        if let Some(job) = s.jobs.get(id) {
            let t = tenants.entry(job.spec.tenant.as_str()).or_default();
            t.0 += mj;
            t.1 += 1;
        }
    }
    pb::EnergyReport {
        nodes: s
            .energy
            .by_node
            .iter()
            .map(|(id, e)| pb::NodeEnergy {
                node_id: *id,
                gpu_mj: e.gpu_mj,
                green_capped_ms: e.green_capped_ms,
            })
            .collect(),
        tenants: tenants
            .into_iter()
            .map(|(tenant, (gpu_mj, jobs))| pb::TenantEnergy {
                tenant: tenant.to_owned(),
                gpu_mj,
                jobs,
            })
            .collect(),
    }
}

/// Most jobs listed in a `GetTenant` answer.
const TENANT_JOBS_SHOWN: usize = 1000;

/// Every tenant with a record or a job, by name.
pub(crate) fn tenant_names(s: &ClusterState) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = s.tenants.keys().cloned().collect();
    names.extend(s.jobs.values().map(|j| j.spec.tenant.clone()));
    names
}

/// A tenant as `Tenant`: its record (or the defaults), GPU use by type as of `now_ms`, and
/// with `with_jobs` the GPU time of its most recent jobs. `None` when the cluster has neither
/// a record nor a job of that name.
pub(crate) fn tenant(
    s: &ClusterState,
    name: &str,
    now_ms: u64,
    with_jobs: bool,
) -> Option<pb::Tenant> {
    let record = s.tenants.get(name);
    let jobs: Vec<&gpu_raft_store::Job> =
        s.jobs.values().filter(|j| j.spec.tenant == name).collect();
    if record.is_none() && jobs.is_empty() {
        return None;
    }
    let mut cluster: BTreeMap<&str, u32> = BTreeMap::new();
    for g in s.nodes.values().flat_map(|n| &n.inventory.gpus) {
        *cluster.entry(g.gpu_type.as_str()).or_insert(0) += 1;
    }
    let mut usage: BTreeMap<String, (u32, u64)> = BTreeMap::new();
    if let Some(r) = record {
        for t in r.quotas.keys() {
            usage.entry(t.clone()).or_default();
        }
    }
    let mut per_job = Vec::new();
    for j in &jobs {
        if j.state.is_live() {
            for t in gpu_raft_store::tenant::bound_types(j, &s.nodes) {
                usage.entry(t.to_owned()).or_default().0 += 1;
            }
        }
        for (t, ms) in gpu_raft_store::tenant::job_gpu_time(j, &s.nodes, now_ms) {
            usage.entry(t.clone()).or_default().1 += ms;
            per_job.push(pb::JobGpuTime {
                job_id: j.id,
                gpu_type: t,
                gpu_ms: ms,
            });
        }
    }
    if !with_jobs {
        per_job.clear();
    }
    // The most recent jobs (highest ids) when there are too many.
    let skip = per_job.len().saturating_sub(TENANT_JOBS_SHOWN);
    let per_job = per_job.split_off(skip);
    let mut warnings = Vec::new();
    let quotas = record.map(|r| r.quotas.clone()).unwrap_or_default();
    for (t, q) in &quotas {
        let have = cluster.get(t.as_str()).copied().unwrap_or(0);
        if have == 0 {
            warnings.push(format!("no registered node has a {t} GPU"));
        } else if q.guaranteed > have {
            warnings.push(format!(
                "guaranteed {} {t} GPUs, the cluster has {have}",
                q.guaranteed
            ));
        }
    }
    Some(pb::Tenant {
        name: name.to_owned(),
        has_record: record.is_some(),
        quotas: quotas
            .iter()
            .map(|(t, q)| pb::GpuQuota {
                gpu_type: t.clone(),
                guaranteed: q.guaranteed,
                borrow: q.borrow,
            })
            .collect(),
        weight: record.map_or(1, |r| r.weight),
        default_priority: record.map_or(0, |r| r.default_priority),
        max_priority: record.map_or(0, |r| r.max_priority.unwrap_or(r.default_priority)),
        max_pending_jobs: record.and_then(|r| r.max_pending_jobs),
        created_at_ms: record.map_or(0, |r| r.created_at_ms),
        updated_at_ms: record.map_or(0, |r| r.updated_at_ms),
        usage: usage
            .into_iter()
            .map(|(t, (held, ms))| pb::GpuTypeUsage {
                cluster_gpus: cluster.get(t.as_str()).copied().unwrap_or(0),
                gpu_type: t,
                gpus_held: held,
                gpu_ms: ms,
            })
            .collect(),
        jobs: per_job,
        warnings,
        pending_jobs: jobs.iter().filter(|j| j.state == JobState::Pending).count() as u64,
        live_jobs: jobs.iter().filter(|j| j.state.is_live()).count() as u64,
        account: record.and_then(|r| r.account.as_ref()).map(account),
        allowed_mounts: record.map(|r| r.allowed_mounts.clone()).unwrap_or_default(),
        webhook: record.and_then(|r| r.webhook.as_ref()).map(webhook),
        registry_logins: s
            .registry_credentials
            .get(name)
            .into_iter()
            .flatten()
            .map(|(registry, c)| pb::RegistryLogin {
                registry: registry.clone(),
                username: c.username.clone(),
                set_at_ms: c.set_at_ms,
            })
            .collect(),
    })
}

/// `explain`'s answer as `JobExplanation`.
pub(crate) fn job_explanation(
    id: gpu_raft_store::JobId,
    e: &crate::scheduler::Explanation,
    policy: String,
) -> pb::JobExplanation {
    pb::JobExplanation {
        job_id: id,
        state: job_state(e.state) as i32,
        reason: e.reason.clone().unwrap_or_default(),
        queue_position: e.position as u64,
        pending_jobs: e.pending as u64,
        estimated_start_ms: e.start_ms,
        estimate_note: e.note.clone(),
        policy,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backup_pieces_concatenate_to_the_file_and_each_names_the_index() {
        let data: Vec<u8> = (0..10u8).collect();
        let pieces = backup_pieces(7, &data, "ca", 4);
        let sizes: Vec<usize> = pieces.iter().map(|p| p.data.len()).collect();
        assert_eq!(sizes, [4, 4, 2]);
        assert!(pieces.iter().all(|p| p.index == 7 && p.cluster_id == "ca"));
        let joined: Vec<u8> = pieces.iter().flat_map(|p| p.data.clone()).collect();
        assert_eq!(joined, data);
    }
}
