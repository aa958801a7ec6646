//! Preemption, decided purely: when a pass places nothing, find the first pending job (in the
//! policy's order) that running jobs could make room for — on one node, or on K nodes for a
//! gang asked for — and the fewest, least important runs to stop for it. Which runs may be
//! stopped is `ClusterState::check_preemption`, the rule `apply` enforces as well: quota
//! reclaim from borrowers, single-node runs of no higher priority for a starving gang, and
//! with `priority` mode strictly lower-priority jobs, never for a job that would borrow.

use std::borrow::Cow;
use std::collections::BTreeMap;

use gpu_raft_store::{
    ClusterState, Job, JobSpec, JobState, NodeId, NodeRecord, Preempt, gpu_fits, tenant,
};

use super::env::PlanEnv;
use super::order;
use super::pending::PendingIndex;
use super::placement::{gang_domains, selector_matches};
use super::policy::Policy;
use super::quota::{Admission, QuotaBook, restrict};

/// Most pending jobs looked at as beneficiaries in one pass.
const CANDIDATES: usize = 64;

/// The preemptions to propose now (for one beneficiary), or none.
pub fn preemptions(
    state: &ClusterState,
    policy: &Policy,
    env: &PlanEnv,
    pending: &PendingIndex,
) -> Vec<Preempt> {
    if state.scheduler.preemption.is_off() {
        return Vec::new();
    }
    // One round at a time: while preempted runs are still stopping, their GPUs are already
    // promised.
    let stopping = state
        .jobs
        .values()
        .any(|j| j.state.is_live() && j.evict_requested && j.preempted_for.is_some());
    if stopping {
        return Vec::new();
    }
    let held = tenant::held_by_type(&state.jobs, &state.nodes);
    let quotas = QuotaBook::new(state);
    let mut by_node: BTreeMap<NodeId, Vec<&Job>> = BTreeMap::new();
    for j in state.jobs.values().filter(|j| j.state.is_live()) {
        if let Some(b) = &j.binding {
            by_node.entry(b.node).or_default().push(j);
        }
    }
    for job in order::queue(state, policy, env, pending).take(CANDIDATES) {
        if job.spec.gpus == 0
            || waits_for_beneficiary(state, job)
            || job.waits_for_retry(env.now_ms)
            || state.gate(job).is_some()
        {
            continue;
        }
        // `check_preemption` refuses every run for a job that would borrow: skip the nodes.
        if quotas.borrows_whatever_it_gets(&job.spec) {
            continue;
        }
        let spec = match quotas.admit(&job.spec) {
            Admission::Unlimited => job.spec.clone(),
            Admission::Only(types) => restrict(&job.spec, types),
            Admission::OverQuota(_) => continue,
        };
        let victims = Victims {
            state,
            held: &held,
            by_node: &by_node,
            now_ms: env.now_ms,
        };
        let chosen = if spec.nodes > 1 {
            victims.for_gang(job, &spec)
        } else {
            victims.for_one_node(job, &spec)
        };
        if let Some(chosen) = chosen {
            return chosen;
        }
    }
    Vec::new()
}

/// Where to find the runs to stop for one beneficiary.
struct Victims<'s> {
    state: &'s ClusterState,
    held: &'s BTreeMap<(String, String), u32>,
    by_node: &'s BTreeMap<NodeId, Vec<&'s Job>>,
    now_ms: u64,
}

/// The runs to stop on one node.
struct Stops {
    runs: Vec<Preempt>,
    /// What stopping them costs, least first: runs, GPUs, the highest priority among them.
    cost: (usize, usize, i32),
}

impl Victims<'_> {
    /// The cheapest node for a single-node job (lowest id on equal costs). `None` when no
    /// node qualifies or one has room already.
    fn for_one_node(&self, job: &Job, spec: &JobSpec) -> Option<Vec<Preempt>> {
        let want = spec.gpus as usize;
        self.nodes(spec)
            .filter_map(|(node, _)| self.on_node(node, job, spec, want))
            .filter(|stops| !stops.runs.is_empty())
            .min_by_key(|stops| stops.cost)
            .map(|stops| stops.runs)
    }

    /// A gang asked for: its K nodes, each freed to its per-node share, the cheapest first
    /// (nodes with room already cost nothing), inside one domain of the topology level it
    /// requires, if any (the cheapest domain). `None` when no K nodes qualify or nothing needs
    /// stopping.
    fn for_gang(&self, job: &Job, spec: &JobSpec) -> Option<Vec<Preempt>> {
        let per = spec.gpus_per_node() as usize;
        let k = spec.node_count() as usize;
        let costs: Vec<(Cow<'_, BTreeMap<String, String>>, Stops)> = self
            .nodes(spec)
            .filter_map(|(node, labels)| Some((labels, self.on_node(node, job, spec, per)?)))
            .collect();
        let labelled: Vec<(&BTreeMap<String, String>, &Stops)> = costs
            .iter()
            .map(|(labels, stops)| (&**labels, stops))
            .collect();
        let groups = gang_domains(spec.topology.as_deref(), &labelled);
        let cheapest = groups
            .into_iter()
            .filter(|group| group.len() >= k)
            .map(|mut group| {
                // Stable: equal costs keep node id order.
                group.sort_by_key(|stops| stops.cost);
                group.truncate(k);
                let total = group.iter().fold((0, 0, i32::MIN), |(r, g, p), s| {
                    (r + s.cost.0, g + s.cost.1, p.max(s.cost.2))
                });
                (total, group)
            })
            .min_by_key(|(total, _)| *total)?;
        let chosen: Vec<Preempt> = cheapest
            .1
            .into_iter()
            .flat_map(|stops| stops.runs.iter().cloned())
            .collect();
        (!chosen.is_empty()).then_some(chosen)
    }

    /// Schedulable nodes that match the job's selector, with their labels.
    fn nodes<'n>(
        &'n self,
        spec: &'n JobSpec,
    ) -> impl Iterator<Item = (&'n NodeRecord, Cow<'n, BTreeMap<String, String>>)> + 'n {
        self.state
            .nodes
            .values()
            .filter(|n| n.accepts_work())
            .map(|n| (n, n.effective_labels()))
            .filter(|(_, labels)| selector_matches(spec, labels))
    }

    /// The least important runs on `node` whose stopping leaves `want` GPUs fitting `spec`
    /// free (none when enough are free already); `None` when stopping every run it may stop
    /// is not enough.
    fn on_node(&self, node: &NodeRecord, job: &Job, spec: &JobSpec, want: usize) -> Option<Stops> {
        let free = node.free_gpus().filter(|g| gpu_fits(g, spec)).count();
        if free >= want {
            return Some(Stops {
                runs: Vec::new(),
                cost: (0, 0, i32::MIN),
            });
        }
        let live = self.by_node.get(&node.id)?;
        let mut victims: Vec<(&Job, usize)> = live
            .iter()
            .filter_map(|&v| {
                let b = v.binding.as_ref()?;
                let fitting = b
                    .gpus
                    .iter()
                    .filter(|i| node.gpu(**i).is_some_and(|g| gpu_fits(g, spec)))
                    .count();
                let p = preempt(v, job);
                // Never the run the job was itself preempted for: both would wait for each
                // other to start, forever.
                let mutual = job.preempted_for == Some(v.id);
                let allowed = self
                    .state
                    .check_preemption(self.held, &p, self.now_ms)
                    .is_ok();
                (fitting > 0 && !mutual && allowed).then_some((v, fitting))
            })
            .collect();
        // Least important first: lowest priority, then the most recently started (the least
        // work lost).
        victims.sort_by_key(|(v, _)| {
            (
                v.spec.priority,
                std::cmp::Reverse(v.started_at_ms.or(v.bound_at_ms)),
                v.id,
            )
        });
        let mut freed = free;
        let mut runs = Vec::new();
        let (mut gpus, mut highest) = (0, i32::MIN);
        for (v, fitting) in victims {
            if freed >= want {
                break;
            }
            freed += fitting;
            gpus += v.spec.gpus as usize;
            highest = highest.max(v.spec.priority);
            runs.push(preempt(v, job));
        }
        let cost = (runs.len(), gpus, highest);
        (freed >= want).then_some(Stops { runs, cost })
    }
}

fn preempt(victim: &Job, for_job: &Job) -> Preempt {
    Preempt {
        job: victim.id,
        generation: victim.generation,
        for_job: for_job.id,
    }
}

/// A job preempted for another waits for it while it is pending and free to start (not held,
/// nor waiting for a dependency, a singleton namesake or its array's limit: it may never
/// start, and its victims would wait forever).
pub(crate) fn waits_for_beneficiary(state: &ClusterState, job: &Job) -> bool {
    job.preempted_for
        .and_then(|b| state.jobs.get(&b))
        .is_some_and(|b| b.state == JobState::Pending && state.gate(b).is_none())
}
