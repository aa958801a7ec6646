//! The queue order of pending jobs under each `Ordering`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::BuildHasherDefault;

use gpu_raft_store::{ClusterState, Job, JobId, JobState};

use super::env::PlanEnv;
use super::history::Fnv;
use super::policy::{Ordering, Policy};

const HOUR_MS: f64 = 3_600_000.0;

/// Per-tenant figures for one pass, looked up once per pending job: FNV keeps that cheap.
type TenantMap<'a> = HashMap<&'a str, f64, BuildHasherDefault<Fnv>>;

/// Pending jobs in the order the policy considers them, produced lazily where the order allows
/// it (FCFS walks the job map, so a strict queue stops at its head without looking further).
pub(crate) fn queue<'a>(
    state: &'a ClusterState,
    policy: &Policy,
    env: &PlanEnv,
) -> Box<dyn Iterator<Item = &'a Job> + 'a> {
    ordered(state, policy, env).jobs
}

/// A pass's queue, and what building it learnt on the way.
pub(crate) struct Queue<'a> {
    pub jobs: Box<dyn Iterator<Item = &'a Job> + 'a>,
    /// Whether any pending job asks for no GPUs, when the ordering had to look at every
    /// pending job anyway (`None` for FCFS, which does not).
    pub cpu_only_pending: Option<bool>,
}

/// `queue`, plus `Queue::cpu_only_pending`, so that `plan` need not scan the job map for it.
pub(crate) fn ordered<'a>(state: &'a ClusterState, policy: &Policy, env: &PlanEnv) -> Queue<'a> {
    let pending = state.jobs.values().filter(|j| j.state == JobState::Pending);
    let mut cpu_only = false;
    // FCFS: arrival order is the order the Raft log accepted the jobs, job id order.
    // (Submission timestamps come from whichever leader proposed them and need not be
    // monotonic.)
    let jobs: Box<dyn Iterator<Item = &'a Job> + 'a> = match policy.ordering {
        Ordering::Fcfs => {
            return Queue {
                jobs: Box::new(pending),
                cpu_only_pending: None,
            };
        }
        // Keys are computed for every job, but the order is drawn from a heap lazily: a pass
        // that stops early (a strict queue, a full cluster) does not pay for a full sort.
        Ordering::Sjf => {
            let heap: BinaryHeap<SjfEntry<'a>> = pending
                .map(|j| {
                    cpu_only |= j.spec.gpus == 0;
                    let est = env.estimate_ms(&j.spec, policy).unwrap_or(u64::MAX);
                    Reverse((est, j.submitted_at_ms, j.id, Keyed(j)))
                })
                .collect();
            Box::new(drain(heap).map(|Reverse((.., Keyed(j)))| j))
        }
        Ordering::Priority => {
            let usage = usage_shares(state, env);
            let shares: TenantMap<'_> = usage.iter().map(|(t, v)| (t.as_str(), *v)).collect();
            let heap: BinaryHeap<PriorityEntry<'a>> = pending
                .map(|j| {
                    cpu_only |= j.spec.gpus == 0;
                    let score = dynamic_priority(j, policy, env, &shares);
                    (Load(score), Reverse((j.submitted_at_ms, j.id)), Keyed(j))
                })
                .collect();
            Box::new(drain(heap).map(|(.., Keyed(j))| j))
        }
        Ordering::FairShare => {
            let pending: Vec<&Job> = pending.collect();
            cpu_only = pending.iter().any(|j| j.spec.gpus == 0);
            Box::new(fair_share(state, env, pending).into_iter())
        }
    };
    Queue {
        jobs,
        cpu_only_pending: Some(cpu_only),
    }
}

/// Shortest estimate first, then submission time and id.
type SjfEntry<'a> = Reverse<(u64, u64, JobId, Keyed<'a>)>;
/// Highest score first, then earliest submission and lowest id.
type PriorityEntry<'a> = (Load, Reverse<(u64, JobId)>, Keyed<'a>);

fn drain<T: Ord>(mut heap: BinaryHeap<T>) -> impl Iterator<Item = T> {
    std::iter::from_fn(move || heap.pop())
}

/// A job riding along in a heap entry; entries are ordered by their keys alone (which end in
/// the unique job id, so this never decides).
struct Keyed<'a>(&'a Job);

impl PartialEq for Keyed<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.0.id == other.0.id
    }
}

impl Eq for Keyed<'_> {}

impl PartialOrd for Keyed<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Keyed<'_> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.id.cmp(&other.0.id)
    }
}

/// Base priority, plus `aging_per_hour` for each hour waited, minus `fairshare_weight` times
/// the tenant's share (0..=1) of all recent usage.
fn dynamic_priority(job: &Job, policy: &Policy, env: &PlanEnv, shares: &TenantMap<'_>) -> f64 {
    let waited_h = env.now_ms.saturating_sub(job.submitted_at_ms) as f64 / HOUR_MS;
    let share = if policy.fairshare_weight == 0.0 {
        0.0
    } else {
        shares.get(job.spec.tenant.as_str()).copied().unwrap_or(0.0)
    };
    f64::from(job.spec.priority) + policy.aging_per_hour * waited_h
        - policy.fairshare_weight * share
}

/// Each tenant's fraction of all recent (decayed) usage.
fn usage_shares(state: &ClusterState, env: &PlanEnv) -> HashMap<String, f64> {
    let mut usage = env.usage.at(state, env.now_ms);
    let total: f64 = usage.values().sum();
    if total > 0.0 {
        for v in usage.values_mut() {
            *v /= total;
        }
    }
    usage
}

/// Tenants take turns: the tenant with the least load (GPUs it holds, counting the jobs
/// already ahead of it in this queue, plus its decayed past usage in GPU-equivalents) goes
/// next, its load divided by its weight; inside a tenant, priority then submission order.
fn fair_share<'a>(state: &'a ClusterState, env: &PlanEnv, pending: Vec<&'a Job>) -> Vec<&'a Job> {
    let usage = env.usage.at(state, env.now_ms);
    let mut held: HashMap<&str, f64> = HashMap::new();
    for j in state.jobs.values().filter(|j| j.state.is_live()) {
        *held.entry(j.spec.tenant.as_str()).or_insert(0.0) += f64::from(j.spec.gpus);
    }
    let mut per_tenant: HashMap<&str, Vec<&Job>> = HashMap::new();
    for j in pending {
        per_tenant
            .entry(j.spec.tenant.as_str())
            .or_default()
            .push(j);
    }
    // A tenant's load counts per unit of its weight (1 without a record).
    let weight = |t: &str| f64::from(state.tenants.get(t).map_or(1, |r| r.weight.max(1)));
    let load = |t: &str| {
        (usage.get(t).copied().unwrap_or(0.0) + held.get(t).copied().unwrap_or(0.0)) / weight(t)
    };
    let total = per_tenant.values().map(Vec::len).sum();
    // Each tenant's queue reversed, so its next job is at the end.
    for q in per_tenant.values_mut() {
        q.sort_by_key(|j| Reverse((Reverse(j.spec.priority), j.submitted_at_ms, j.id)));
    }
    let mut turns: BinaryHeap<Reverse<(Load, &str)>> = per_tenant
        .keys()
        .map(|t| Reverse((Load(load(t)), *t)))
        .collect();
    let mut out = Vec::with_capacity(total);
    while let Some(Reverse((Load(l), tenant))) = turns.pop() {
        let Some(q) = per_tenant.get_mut(tenant) else {
            continue;
        };
        let Some(job) = q.pop() else { continue };
        out.push(job);
        if !q.is_empty() {
            let step = f64::from(job.spec.gpus.max(1)) / weight(tenant);
            turns.push(Reverse((Load(l + step), tenant)));
        }
    }
    out
}

/// A load value with a total order, for the heap.
#[derive(Clone, Copy, PartialEq)]
struct Load(f64);

impl Eq for Load {}

impl PartialOrd for Load {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Load {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}
