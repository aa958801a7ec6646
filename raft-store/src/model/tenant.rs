//! Tenants as replicated records: per-GPU-type quotas (a guaranteed share and how much more may
//! be borrowed from idle capacity), a fair-share weight and a default priority; and the GPU-time
//! accounting read from the jobs' own records.
//!
//! A tenant with no record (every tenant before tenants existed) is unlimited, weighs 1 and
//! has default priority 0: its jobs run exactly as they did. A record limits only the GPU types
//! it names; other types stay unlimited for it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::container;
use crate::model::job::Job;
use crate::model::node::NodeRecord;
use crate::model::shared_map::SharedMap;
use crate::model::validate;

/// Most GPUs one quota figure may name (a bound against typos like 10^12, far above any
/// cluster; a quota above the cluster's size is allowed and reported).
pub const MAX_QUOTA_GPUS: u32 = 1_000_000;
/// Most GPU types one tenant may have quotas for.
pub const MAX_QUOTA_TYPES: usize = 32;
/// Fair-share weights accepted.
pub const WEIGHT_RANGE: std::ops::RangeInclusive<u32> = 1..=10_000;
/// Default priorities accepted.
pub const PRIORITY_RANGE: std::ops::RangeInclusive<i32> = -10_000..=10_000;

/// What a tenant may hold of one GPU type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quota {
    /// GPUs of this type the tenant is entitled to.
    pub guaranteed: u32,
    /// GPUs beyond the guarantee it may borrow while they are idle.
    #[serde(default)]
    pub borrow: u32,
}

impl Quota {
    /// The most GPUs of the type the tenant may hold at once.
    pub fn limit(&self) -> u32 {
        self.guaranteed.saturating_add(self.borrow)
    }
}

/// A tenant's record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantRecord {
    pub name: String,
    /// GPU type (as nodes report it, e.g. `A100`) → quota.
    #[serde(default)]
    pub quotas: BTreeMap<String, Quota>,
    /// Share of the cluster in the fair-share ordering, relative to other tenants (1 = the
    /// weight of a tenant without a record).
    #[serde(default = "one")]
    pub weight: u32,
    /// The priority a job of this tenant gets when it is submitted without one.
    #[serde(default)]
    pub default_priority: i32,
    #[serde(default)]
    pub created_at_ms: u64,
    #[serde(default)]
    pub updated_at_ms: u64,
    /// The Unix account the tenant's jobs run as when the submitting token maps to none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<crate::model::account::Account>,
    /// The highest priority its users and tenant admins may give a job; none: its default
    /// priority (they may lower a job's priority, not raise it above the tenant's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_priority: Option<i32>,
    /// Host directories (and what lies below them) the tenant's container jobs may bind;
    /// empty: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_mounts: Vec<String>,
    /// The most jobs it may have pending at once: a submission beyond it is refused; none: no
    /// cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pending_jobs: Option<u32>,
    /// Where the leader posts the state changes of every job of the tenant; its origin is
    /// also where the tenant's jobs may have webhooks of their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<crate::model::webhook::Webhook>,
}

fn one() -> u32 {
    1
}

impl TenantRecord {
    /// A record named `name` that limits nothing: weight 1, default priority 0, no quotas.
    pub fn named(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            quotas: BTreeMap::new(),
            weight: 1,
            default_priority: 0,
            created_at_ms: 0,
            updated_at_ms: 0,
            account: None,
            max_priority: None,
            allowed_mounts: Vec::new(),
            max_pending_jobs: None,
            webhook: None,
        }
    }

    /// The quota of `gpu_type`, if the record limits it.
    pub fn quota(&self, gpu_type: &str) -> Option<Quota> {
        self.quotas.get(gpu_type).copied()
    }
}

/// The rules the API edge and `apply` both enforce. GPU types no node has (yet) are allowed:
/// quotas are often set before the hardware arrives.
pub fn validate(t: &TenantRecord) -> Result<(), String> {
    validate::name("tenant", &t.name)?;
    if let Some(hook) = &t.webhook {
        hook.validate()?;
    }
    if t.quotas.len() > MAX_QUOTA_TYPES {
        return Err(format!("at most {MAX_QUOTA_TYPES} GPU types per tenant"));
    }
    for (gpu_type, q) in &t.quotas {
        validate::name("GPU type", gpu_type)?;
        if q.guaranteed > MAX_QUOTA_GPUS || q.borrow > MAX_QUOTA_GPUS {
            return Err(format!(
                "quota for {gpu_type} must be at most {MAX_QUOTA_GPUS} GPUs guaranteed and {MAX_QUOTA_GPUS} borrowed"
            ));
        }
    }
    if !WEIGHT_RANGE.contains(&t.weight) {
        return Err(format!(
            "weight must be {}..={}, got {}",
            WEIGHT_RANGE.start(),
            WEIGHT_RANGE.end(),
            t.weight
        ));
    }
    if !PRIORITY_RANGE.contains(&t.default_priority) {
        return Err(format!(
            "default priority must be {}..={}, got {}",
            PRIORITY_RANGE.start(),
            PRIORITY_RANGE.end(),
            t.default_priority
        ));
    }
    if let Some(max) = t.max_priority
        && !(t.default_priority..=*PRIORITY_RANGE.end()).contains(&max)
    {
        return Err(format!(
            "max priority must be {}..={} (at least the default priority), got {max}",
            t.default_priority,
            PRIORITY_RANGE.end()
        ));
    }
    if t.max_pending_jobs == Some(0) {
        return Err("max pending jobs must be at least 1 (none: no cap)".into());
    }
    if let Some(a) = &t.account {
        validate::account(a).map_err(|e| format!("tenant {}: {e}", t.name))?;
    }
    if t.allowed_mounts.len() > container::MAX_ALLOWED_MOUNTS {
        return Err(format!(
            "at most {} allowed mounts per tenant",
            container::MAX_ALLOWED_MOUNTS
        ));
    }
    for dir in &t.allowed_mounts {
        container::allowed_entry(dir)?;
    }
    Ok(())
}

/// Whether a job of tenant `record` (`None`: a tenant without a record) may have `priority`
/// when submitted by a token of `role`: every job within `PRIORITY_RANGE`; a tenant-scoped
/// token's at most its tenant's ceiling (`max_priority`, else the default priority), so no
/// user queues a job above every other tenant's. Checked at the API edge and again by the
/// leader for a forwarded submission.
pub fn check_priority(
    priority: i32,
    record: Option<&TenantRecord>,
    role: crate::model::auth::Role,
) -> Result<(), String> {
    if !PRIORITY_RANGE.contains(&priority) {
        return Err(format!(
            "priority must be {}..={}, got {priority}",
            PRIORITY_RANGE.start(),
            PRIORITY_RANGE.end()
        ));
    }
    let ceiling = record.map_or(0, |t| t.max_priority.unwrap_or(t.default_priority));
    if role.is_tenant_scoped() && priority > ceiling {
        return Err(format!(
            "priority {priority} is above the tenant's ceiling {ceiling} (an admin raises it with \
             gpuctl tenant update --max-priority)"
        ));
    }
    Ok(())
}

/// GPU-milliseconds by GPU type.
pub type GpuTime = BTreeMap<String, u64>;

/// The GPU types of the GPUs a job's current (or last) binding names, as the node reports
/// them; GPUs the node no longer lists count as `unknown`.
pub fn bound_types<'a>(
    job: &'a Job,
    nodes: &'a BTreeMap<crate::NodeId, NodeRecord>,
) -> impl Iterator<Item = &'a str> + 'a {
    job.members().flat_map(move |b| {
        let node = nodes.get(&b.node);
        b.gpus.iter().map(move |&i| {
            node.and_then(|n| n.gpu(i))
                .map_or("unknown", |g| g.gpu_type.as_str())
        })
    })
}

/// GPUs held by live jobs, per (tenant, GPU type).
pub fn held_by_type(
    jobs: &SharedMap<crate::JobId, Job>,
    nodes: &BTreeMap<crate::NodeId, NodeRecord>,
) -> BTreeMap<(String, String), u32> {
    let mut held = BTreeMap::new();
    for j in jobs.values().filter(|j| j.state.is_live()) {
        for t in bound_types(j, nodes) {
            *held
                .entry((j.spec.tenant.clone(), t.to_owned()))
                .or_insert(0) += 1;
        }
    }
    held
}

/// The GPU time of a job: its finished runs (recorded by `apply` as each run ended) plus the
/// live run up to `now_ms`.
pub fn job_gpu_time(
    job: &Job,
    nodes: &BTreeMap<crate::NodeId, NodeRecord>,
    now_ms: u64,
) -> GpuTime {
    let mut out = job.gpu_ms.clone();
    if job.state.is_live()
        && let Some(since) = job.bound_at_ms
    {
        let held = now_ms.saturating_sub(since);
        for t in bound_types(job, nodes) {
            *out.entry(t.to_owned()).or_insert(0) += held;
        }
    }
    out
}
