//! The discrete-event replay: jobs arrive at their trace times, the scheduler's own `plan`
//! places them in virtual time on a real `ClusterState`, and each placed job finishes after its
//! trace duration. Nothing here reads a clock except to time the replay itself.
//!
//! Jobs on part of a GPU (a share of a GPU in shared mode, a MIG instance) are placed by the
//! same pass (its slice binds) and count by the part they hold (`partition::normalized`) in
//! GPU time and in the busy timeline, whose unit is a thousandth of a GPU.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::time::{Duration, Instant};

use gpu_raft_store::partition::normalized;
use gpu_raft_store::scheduler::Preemption;
use gpu_raft_store::{
    Binding, ClusterState, GpuMode, Job, JobId, JobSpec, JobState, NodeId, SliceRequest,
};

use super::trace::{TraceJob, TraceSlice};
use crate::scheduler::{PendingIndex, PlanEnv, Policy, plan_pending, preemptions};

/// Where SJF and backfill get runtime estimates from in a replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Estimates {
    /// Every job's estimate is its real duration (perfect user estimates, an upper bound).
    Exact,
    /// The trace's `estimate` column when it has one, else predictions from the history of
    /// jobs finished so far.
    Predicted,
}

/// One finished job of a replay.
#[derive(Clone, Debug)]
pub(crate) struct JobRecord {
    /// Index into the replayed trace's jobs.
    pub job: usize,
    pub submit_ms: u64,
    pub start_ms: u64,
    pub end_ms: u64,
    /// GPU-milliseconds its runs held (more than `gpus × (end − start)` less the time it
    /// waited after a preemption; a slice's part of a GPU for a job on a slice).
    pub gpu_ms: u64,
    /// Index into `Replay::tenants`.
    pub tenant: usize,
    /// What the history predicted when the job started, if it had anything to go on.
    pub predicted_ms: Option<u64>,
    /// A gang: a job larger than a node, run evenly over several.
    pub gang: bool,
}

/// What a replay produced.
#[derive(Debug)]
pub(crate) struct Replay {
    pub records: Vec<JobRecord>,
    pub tenants: Vec<String>,
    /// Jobs still pending at the end (they can never fit this cluster).
    pub never_placed: usize,
    /// Idle GPU-milliseconds while a waiting job needed no more GPUs than were idle, but no
    /// node had enough of them together.
    pub fragmented_gpu_ms: f64,
    /// Busy thousandths of a GPU from each time on (change points).
    pub timeline: Vec<(u64, u64)>,
    pub total_gpus: u64,
    pub passes: u64,
    /// Runs stopped by the preemption pass (each resumed later from its checkpoint).
    pub preemptions: u64,
    pub wall: Duration,
}

/// A plan that broke the rules: a bug, never a property of the trace.
#[derive(Debug, thiserror::Error)]
#[error("at t={at_ms} ms the plan bound GPU n{node}/{gpu} for j-{job}, which is not free")]
pub(crate) struct DoubleBooked {
    pub at_ms: u64,
    pub node: NodeId,
    pub gpu: u32,
    pub job: JobId,
}

/// Replay `jobs` (sorted by submission) on `cluster` under `policy`. With preemption on in
/// the cluster's scheduler settings, a pass that places nothing is followed by the leader's
/// own preemption pass; a preempted run resumes later from its checkpoint, paying
/// `checkpoint_ms` of its work again.
pub(crate) fn replay(
    jobs: &[TraceJob],
    cluster: &ClusterState,
    total_gpus: u64,
    policy: &Policy,
    estimates: Estimates,
    checkpoint_ms: u64,
) -> Result<Replay, DoubleBooked> {
    let began = Instant::now();
    let policy = Policy {
        multi_node_gangs: true,
        gang_wait_limit_ms: cluster.scheduler.gang_wait_limit_ms(),
        explain: false,
        max_binds_per_pass: usize::MAX,
        ..policy.clone()
    };
    let mut env = PlanEnv::new(0, &policy);
    let mut state = cluster.clone();
    let (tenants, job_tenant) = tenant_indices(jobs);

    let mut records = Vec::with_capacity(jobs.len());
    let mut predicted: HashMap<JobId, Option<u64>> = HashMap::new();
    // (end, job, generation): a preempted run's end is stale once the job moved on.
    let mut ends: BinaryHeap<Reverse<(u64, JobId, u64)>> = BinaryHeap::new();
    let mut stopped = Stopped::default();
    let preempting = !cluster.scheduler.preemption.is_off();
    let mut placements: HashMap<JobId, Vec<(NodeId, Vec<u32>)>> = HashMap::new();
    let mut pending = PendingIndex::new(policy.ordering);
    let mut pending_by_gpus: BTreeMap<u32, usize> = BTreeMap::new();
    // GPUs per node, largest first (where a gang can be split evenly).
    let mut node_sizes: Vec<u32> = cluster
        .nodes
        .values()
        .map(|n| n.inventory.gpus.len() as u32)
        .collect();
    node_sizes.sort_unstable_by(|a, b| b.cmp(a));
    let node_size = cluster
        .nodes
        .values()
        .map(|n| n.inventory.gpus.len() as u32)
        .max()
        .unwrap_or(0);
    let (whole_gpus, shared_memory_mib) = partitioned(cluster);
    // Whole-mode GPUs held: what `could_place` and the fragmentation measure weigh.
    let mut busy: u64 = 0;
    // Thousandths of a GPU held, slices included: the timeline's unit.
    let mut busy_milli: u64 = 0;
    let mut timeline = vec![(0, 0)];
    let mut fragmented_gpu_ms = 0.0;
    let mut fragmented = false;
    let mut passes = 0;
    let mut next_arrival = 0;
    let mut last_t = 0;

    loop {
        let arrival = jobs.get(next_arrival).map(|j| j.submit_ms);
        let completion = ends.peek().map(|Reverse((t, ..))| *t);
        let t = match (arrival, completion) {
            (None, None) => break,
            (Some(a), Some(c)) => a.min(c),
            (Some(a), None) => a,
            (None, Some(c)) => c,
        };
        if fragmented {
            fragmented_gpu_ms += (whole_gpus - busy) as f64 * (t - last_t) as f64;
        }
        last_t = t;

        while let Some(&Reverse((end, id, generation))) = ends.peek() {
            if end != t {
                break;
            }
            ends.pop();
            let current = |j: &Job| j.generation == generation && j.state == JobState::Running;
            if !state.jobs.get(&id).is_some_and(current) {
                continue;
            }
            let Some(job) = state.jobs.remove(&id) else {
                continue;
            };
            let milli = milli_gpus(&state, &job);
            release(&mut state, &job, placements.remove(&id));
            busy -= whole(&job.spec);
            busy_milli -= milli;
            let start = job.started_at_ms.unwrap_or(t);
            env.usage.record(&job.spec.tenant, job.spec.gpus, start, t);
            env.history.record(&job.spec, t - start);
            let (first_start, gpu_ms) = stopped.finish(&job, milli, start, t);
            records.push(JobRecord {
                job: (id - 1) as usize,
                submit_ms: job.submitted_at_ms,
                start_ms: first_start,
                gpu_ms,
                end_ms: t,
                tenant: job_tenant[(id - 1) as usize],
                predicted_ms: predicted.remove(&id).flatten(),
                gang: job.spec.nodes > 1,
            });
        }
        while let Some(j) = jobs.get(next_arrival) {
            if j.submit_ms != t {
                break;
            }
            let id = next_arrival as JobId + 1;
            let job = pending_job(id, j, estimates, &node_sizes, shared_memory_mib);
            // The starvation guard acts on its own time: a pass then, whatever else happens.
            if let Some(limit) = policy.gang_wait_limit_ms.filter(|_| job.spec.nodes > 1) {
                ends.push(Reverse((t + limit, WAKE_UP, 0)));
            }
            pending.insert(&job);
            *pending_by_gpus.entry(whole(&job.spec) as u32).or_default() += 1;
            state.jobs.insert(id, job);
            next_arrival += 1;
        }

        // A pass; when it placed nothing and preemption is on, the leader's preemption pass,
        // then another pass for the job the stopped runs made room for.
        let mut rounds = 0;
        loop {
            env.now_ms = t;
            let plan = if could_place(&state, &pending_by_gpus, whole_gpus - busy, node_size) {
                passes += 1;
                plan_pending(&state, &policy, &env, &pending)
            } else {
                Default::default()
            };
            let placed = !plan.binds.is_empty() || !plan.slice_binds.is_empty();
            // Whole GPUs (a gang: one bind per node), then slices; each job starts once.
            let binds = (plan.binds.into_iter())
                .map(|b| (b.job, b.node, b.gpus, None))
                .chain(
                    (plan.slice_binds.into_iter())
                        .map(|b| (b.job, b.node, vec![b.gpu], Some(b.slice))),
                );
            for (id, node_id, gpus, slice) in binds {
                let node = state
                    .nodes
                    .get_mut(&node_id)
                    .expect("plan binds known nodes");
                for &g in &gpus {
                    let taken = match &slice {
                        None => node.allocations.insert(g, id).is_some(),
                        Some(s) => {
                            (node.slices.entry(g).or_default())
                                .insert(id, s.clone())
                                .is_some()
                                || node.allocations.contains_key(&g)
                        }
                    };
                    if taken {
                        return Err(DoubleBooked {
                            at_ms: t,
                            node: node_id,
                            gpu: g,
                            job: id,
                        });
                    }
                }
                let parts = placements.entry(id).or_default();
                let first = parts.is_empty();
                parts.push((node_id, gpus.clone()));
                if !first {
                    continue;
                }
                let job = state.jobs.get_mut(&id).expect("plan binds known jobs");
                pending.remove(job.id);
                job.state = JobState::Running;
                job.generation += 1;
                job.attempts += 1;
                job.bound_at_ms = Some(t);
                job.started_at_ms = Some(t);
                // As `apply` does: a preempted job placed again waits for no one.
                job.preempted_for = None;
                job.binding = Some(Binding {
                    node: node_id,
                    gpus,
                    generation: job.generation,
                    slice,
                });
                let (generation, needs) = (job.generation, whole(&job.spec));
                predicted.insert(id, env.history.predict_ms(&job.spec));
                let job = &state.jobs[&id];
                busy += needs;
                busy_milli += milli_gpus(&state, job);
                let trace = &jobs[(id - 1) as usize];
                let run = stopped.work_left_ms(id).unwrap_or(trace.duration_ms);
                ends.push(Reverse((t + run, id, generation)));
                let key = needs as u32;
                if let Some(n) = pending_by_gpus.get_mut(&key) {
                    *n -= 1;
                    if *n == 0 {
                        pending_by_gpus.remove(&key);
                    }
                }
                stopped.waiting.remove(&id);
            }
            if placed {
                if stopped.waiting.is_empty() {
                    break;
                }
                continue;
            }
            if !preempting || rounds == MAX_PREEMPTION_ROUNDS || !may_preempt(&state, &pending, t) {
                break;
            }
            rounds += 1;
            let stop = preemptions(&state, &policy, &env, &pending);
            if stop.is_empty() {
                break;
            }
            for p in stop {
                let Some(job) = state.jobs.get(&p.job).cloned() else {
                    continue;
                };
                let milli = milli_gpus(&state, &job);
                release(&mut state, &job, placements.remove(&p.job));
                let job = state.jobs.get_mut(&p.job).expect("still there");
                busy -= whole(&job.spec);
                busy_milli -= milli;
                let full = jobs[(p.job - 1) as usize].duration_ms;
                stopped.stop(job, milli, full, t, checkpoint_ms);
                job.state = JobState::Pending;
                job.binding = None;
                job.started_at_ms = None;
                job.bound_at_ms = None;
                job.preempted_for = Some(p.for_job);
                pending.insert(job);
                *pending_by_gpus.entry(whole(&job.spec) as u32).or_default() += 1;
                predicted.remove(&p.job);
            }
        }
        fragmented = is_fragmented(&state, &pending_by_gpus, whole_gpus - busy, node_size);
        if timeline.last().is_some_and(|&(_, b)| b != busy_milli) {
            timeline.push((t, busy_milli));
        }
    }
    Ok(Replay {
        records,
        tenants,
        never_placed: state
            .jobs
            .values()
            .filter(|j| j.state == JobState::Pending)
            .count(),
        fragmented_gpu_ms,
        timeline,
        total_gpus,
        passes,
        preemptions: stopped.count,
        wall: began.elapsed(),
    })
}

/// What the preemption pass stopped: each stopped job's work left, first start and GPU time
/// held so far, and which of them wait to be placed again.
#[derive(Default)]
struct Stopped {
    work_left_ms: HashMap<JobId, u64>,
    first_start_ms: HashMap<JobId, u64>,
    gpu_ms: HashMap<JobId, u64>,
    /// Stopped jobs not placed again yet: each waits for its beneficiary to start, so a pass
    /// that placed something is followed by another at the same instant.
    waiting: HashSet<JobId>,
    count: u64,
}

impl Stopped {
    /// `job`'s run (of a job whose whole work is `full_ms`) stops at `t`; it will resume from
    /// its checkpoint, doing `checkpoint_ms` of its work again.
    fn stop(&mut self, job: &Job, milli: u64, full_ms: u64, t: u64, checkpoint_ms: u64) {
        let start = job.started_at_ms.unwrap_or(t);
        self.first_start_ms.entry(job.id).or_insert(start);
        *self.gpu_ms.entry(job.id).or_default() += milli * (t - start) / 1000;
        let left = self.work_left_ms(job.id).unwrap_or(full_ms);
        self.work_left_ms
            .insert(job.id, left.saturating_sub(t - start) + checkpoint_ms);
        self.waiting.insert(job.id);
        self.count += 1;
    }

    /// The work left of a job that was stopped before.
    fn work_left_ms(&self, job: JobId) -> Option<u64> {
        self.work_left_ms.get(&job).copied()
    }

    /// `job`, whose last run (holding `milli` thousandths of a GPU) started at `start`, ends
    /// at `t`: its first start and the GPU time of all its runs.
    fn finish(&mut self, job: &Job, milli: u64, start: u64, t: u64) -> (u64, u64) {
        self.work_left_ms.remove(&job.id);
        let first = self.first_start_ms.remove(&job.id).unwrap_or(start);
        let before = self.gpu_ms.remove(&job.id).unwrap_or(0);
        (first, before + milli * (t - start) / 1000)
    }
}

/// Free what `job`'s run holds on its placements: whole GPUs, or its slice.
fn release(state: &mut ClusterState, job: &Job, placements: Option<Vec<(NodeId, Vec<u32>)>>) {
    let sliced = job.binding.as_ref().is_some_and(|b| b.slice.is_some());
    for (node, gpus) in placements.unwrap_or_default() {
        let Some(n) = state.nodes.get_mut(&node) else {
            continue;
        };
        for g in gpus {
            if !sliced {
                n.allocations.remove(&g);
            } else if let Some(holds) = n.slices.get_mut(&g) {
                holds.remove(&job.id);
                if holds.is_empty() {
                    n.slices.remove(&g);
                }
            }
        }
    }
}

/// The whole GPUs a job needs (0 for a job on a slice, which no whole-GPU count tells about).
fn whole(spec: &JobSpec) -> u64 {
    if spec.slice.is_some() {
        0
    } else {
        u64::from(spec.gpus)
    }
}

/// The thousandths of a GPU `job`'s run holds: its whole GPUs, or its slice's part of one.
fn milli_gpus(state: &ClusterState, job: &Job) -> u64 {
    let Some(binding) = &job.binding else {
        return 0;
    };
    let Some(slice) = &binding.slice else {
        return 1000 * u64::from(job.spec.gpus);
    };
    let model = (state.nodes.get(&binding.node))
        .and_then(|n| {
            binding
                .gpus
                .first()
                .and_then(|&g| n.inventory.gpus.get(g as usize))
        })
        .map_or("", |g| g.model.as_str());
    let (part, of) = normalized(Some(slice), model);
    1000 * part / of
}

/// The cluster's GPUs in whole mode, and the least memory of a GPU in shared mode (0: none),
/// which a trace's GPU fraction is a share of.
fn partitioned(cluster: &ClusterState) -> (u64, u64) {
    let mut whole = 0;
    let mut shared_memory = u64::MAX;
    for node in cluster.nodes.values() {
        for gpu in &node.inventory.gpus {
            match node.mode(gpu.index) {
                GpuMode::Whole => whole += 1,
                GpuMode::Shared => shared_memory = shared_memory.min(gpu.memory_mib),
                _ => {}
            }
        }
    }
    (
        whole,
        if shared_memory == u64::MAX {
            0
        } else {
            shared_memory
        },
    )
}

/// Most preemption rounds at one instant (each round stops runs for one beneficiary).
const MAX_PREEMPTION_ROUNDS: usize = 16;

/// Whether the preemption pass could find anything: some tenant borrows (holds more than its
/// guarantee of a GPU type) while a pending job would stay within its own tenant's guarantee
/// (quota reclaim), or, in `priority` mode, some pending job outranks a running one, or a gang
/// starves (at `now_ms`). A cheap test that spares the replay most preemption passes.
fn may_preempt(state: &ClusterState, pending: &PendingIndex, now_ms: u64) -> bool {
    let starving = |&(_, id): &(u64, JobId)| {
        state
            .jobs
            .get(&id)
            .is_some_and(|j| state.is_starving_gang(j, now_ms))
    };
    let gangs = pending.classes().filter(|(_, c)| c.spec.nodes > 1);
    if state.scheduler.gang_wait_limit_ms().is_some()
        && gangs
            .into_iter()
            .any(|(_, c)| c.members.first().is_some_and(starving))
    {
        return true;
    }
    let held = gpu_raft_store::tenant::held_by_type(&state.jobs, &state.nodes);
    let held_of = |tenant: &str, gpu_type: &str| {
        held.get(&(tenant.to_owned(), gpu_type.to_owned()))
            .copied()
            .unwrap_or(0)
    };
    if state.scheduler.preemption == Preemption::Priority {
        let lowest_running = state
            .jobs
            .values()
            .filter(|j| j.state == JobState::Running)
            .map(|j| j.spec.priority)
            .min();
        let outranked =
            lowest_running.is_some_and(|low| pending.classes().any(|(_, c)| c.spec.priority > low));
        if outranked {
            return true;
        }
    }
    let borrowing = state.tenants.values().any(|t| {
        t.quotas
            .iter()
            .any(|(gpu_type, q)| held_of(&t.name, gpu_type) > q.guaranteed)
    });
    borrowing
        && pending.classes().any(|(_, class)| {
            let spec = &class.spec;
            state.tenants.get(&spec.tenant).is_some_and(|t| {
                t.quotas
                    .iter()
                    .any(|(gpu_type, q)| held_of(&t.name, gpu_type) + spec.gpus <= q.guaranteed)
            })
        })
}

/// The trace's tenants in order of first appearance, and each job's index among them.
pub(crate) fn tenant_indices(jobs: &[TraceJob]) -> (Vec<String>, Vec<usize>) {
    let mut tenants: Vec<String> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    let job_tenant = jobs
        .iter()
        .map(|j| {
            let next = index.len();
            let i = *index.entry(j.tenant.as_str()).or_insert(next);
            if i == next {
                tenants.push(j.tenant.clone());
            }
            i
        })
        .collect();
    (tenants, job_tenant)
}

/// Whether a pass could place anything: some waiting job fits the largest free hole of one
/// node, or is a multi-node gang no larger than the idle GPUs. Passes that cannot place
/// anything are skipped; they would return no binds whatever the policy.
fn could_place(
    state: &ClusterState,
    pending_by_gpus: &BTreeMap<u32, usize>,
    idle: u64,
    node_size: u32,
) -> bool {
    let Some((&smallest, _)) = pending_by_gpus.iter().next() else {
        return false;
    };
    if smallest == 0 {
        return true;
    }
    if idle == 0 {
        return false;
    }
    if u64::from(smallest) <= u64::from(node_size) && smallest <= max_free(state) {
        return true;
    }
    let idle = u32::try_from(idle).unwrap_or(u32::MAX);
    node_size < idle
        && pending_by_gpus
            .range(node_size.saturating_add(1)..=idle)
            .next()
            .is_some()
}

fn max_free(state: &ClusterState) -> u32 {
    state
        .nodes
        .values()
        .map(|n| n.inventory.gpus.len() - n.allocations.len())
        .max()
        .unwrap_or(0) as u32
}

/// Whether some waiting single-node job needs no more GPUs than are idle, yet more than any
/// one node has free.
fn is_fragmented(
    state: &ClusterState,
    pending_by_gpus: &BTreeMap<u32, usize>,
    idle: u64,
    node_size: u32,
) -> bool {
    let Some((&smallest, _)) = pending_by_gpus.range(1..).next() else {
        return false;
    };
    if u64::from(smallest) > idle {
        return false;
    }
    let max_free = max_free(state);
    let upper = u32::try_from(idle).unwrap_or(u32::MAX).min(node_size);
    if max_free >= upper {
        return false;
    }
    pending_by_gpus
        .range(max_free.saturating_add(1)..=upper)
        .next()
        .is_some()
}

/// The id of no job: an entry of the end events that only makes a pass happen then.
const WAKE_UP: JobId = 0;

/// The trace's job as submitted. A gang over the nodes the trace names; without, one larger
/// than every node is a gang over as few nodes as can hold it evenly (`node_sizes`: GPUs per
/// node, largest first), as a distributed training job is launched; one that no even split
/// fits is left for the planner to split however the free GPUs allow.
/// Trace job `t` as the pending job `id`; a GPU fraction is a share of `shared_memory_mib`
/// (the least memory of a shared GPU) and of compute alike.
fn pending_job(
    id: JobId,
    t: &TraceJob,
    estimates: Estimates,
    node_sizes: &[u32],
    shared_memory_mib: u64,
) -> Job {
    let estimate_s = match estimates {
        Estimates::Exact => Some(t.duration_ms.div_ceil(1000)),
        Estimates::Predicted => t.estimate_s,
    };
    let nodes = t.nodes.unwrap_or_else(|| even_split(t.gpus, node_sizes));
    let slice = t.slice.as_ref().map(|s| match s {
        TraceSlice::Share(share) => SliceRequest::Shared {
            memory_mib: shared_memory_mib * u64::from(*share) / 100,
            share: *share,
        },
        TraceSlice::Mig(profile) => SliceRequest::Mig {
            profile: profile.clone(),
        },
    });
    let spec = JobSpec {
        name: t.name.clone(),
        tenant: t.tenant.clone(),
        gpus: t.gpus,
        gpu_types: t.gpu_type.iter().cloned().collect(),
        nodes,
        priority: t.priority,
        runtime_estimate_s: estimate_s,
        slice,
        ..JobSpec::default()
    };
    Job::pending(id, spec, None, t.submit_ms)
}

/// The fewest nodes K > 1 over which `gpus` split evenly with K nodes large enough for a share
/// (`node_sizes` largest first); 0 for a job that fits one node, or that no even split fits.
fn even_split(gpus: u32, node_sizes: &[u32]) -> u32 {
    let largest = node_sizes.first().copied().unwrap_or(0).max(1);
    if gpus <= largest {
        return 0;
    }
    (gpus.div_ceil(largest)..=node_sizes.len() as u32)
        .find(|&k| gpus.is_multiple_of(k) && node_sizes[k as usize - 1] >= gpus / k)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::simulate::{cluster, trace};

    #[test]
    fn gangs_split_evenly_over_the_fewest_nodes_that_can_hold_them() {
        assert_eq!(even_split(8, &[8, 8]), 0, "fits one node");
        assert_eq!(even_split(16, &[8, 8, 8]), 2);
        assert_eq!(even_split(12, &[8, 8]), 2, "6 + 6");
        assert_eq!(even_split(24, &[8, 8]), 0, "3 × 8 needs 3 nodes");
        // 4 + 2 + 2 GPUs: no even split of 8 (2 × 4 needs two nodes of 4): split however.
        assert_eq!(even_split(8, &[4, 2, 2]), 0);
        assert_eq!(even_split(6, &[4, 2, 2]), 3, "3 × 2");
    }

    /// A (2 GPUs, 100 s) at 0, B (all 4 GPUs, 100 s) at 1, C (1 GPU, 10 s) at 2, on one node.
    const TRACE: &str = "submit,duration,gpus\n0,100,2\n1,100,4\n2,10,1\n";

    fn starts(policy: &str, estimates: Estimates) -> Vec<(u64, u64)> {
        let t = trace::parse(TRACE, false).expect("trace");
        let (state, gpus) = cluster::build("1x4xV100-32GB").expect("cluster");
        let policy: Policy = policy.parse().expect("policy");
        let r = replay(&t.jobs, &state, gpus, &policy, estimates, 0).expect("replay");
        let mut out: Vec<(u64, u64)> = r
            .records
            .iter()
            .map(|j| (j.submit_ms / 1000, j.start_ms / 1000))
            .collect();
        out.sort_unstable();
        out
    }

    #[test]
    fn policies_order_the_same_trace_differently() {
        // Strict FCFS: C waits behind B.
        assert_eq!(
            starts("fcfs", Estimates::Exact),
            vec![(0, 0), (1, 100), (2, 200)]
        );
        // EASY: C ends (12 s) before B's reservation (100 s), so it starts at once.
        assert_eq!(
            starts("fcfs+easy", Estimates::Exact),
            vec![(0, 0), (1, 100), (2, 2)]
        );
        // Without estimates nothing can be reserved: EASY falls back to a strict queue.
        assert_eq!(
            starts("fcfs+easy", Estimates::Predicted),
            vec![(0, 0), (1, 100), (2, 200)]
        );
        // SJF puts C ahead of B.
        assert_eq!(
            starts("sjf", Estimates::Exact),
            vec![(0, 0), (1, 100), (2, 2)]
        );
    }

    #[test]
    fn reclaim_preempts_a_borrower_which_resumes_from_its_checkpoint() {
        // a borrows the whole node (guarantee 0) for 1,000 s; b, guaranteed 4, wants 2 at 10 s.
        let t = trace::parse(
            "submit,duration,gpus,tenant\n0,1000,4,a\n10,10,2,b\n",
            false,
        )
        .expect("trace");
        let (mut state, gpus) = cluster::build("1x4xV100-32GB").expect("cluster");
        crate::tools::simulate::tenants::register(
            &mut state,
            "tenant,weight,quota\na,1,V100=0:4\nb,1,V100=4:0\n",
        )
        .expect("tenants");
        state.scheduler.preemption = Preemption::Reclaim;
        let policy: Policy = "fcfs".parse().expect("policy");
        let r = replay(&t.jobs, &state, gpus, &policy, Estimates::Exact, 5_000).expect("replay");
        assert_eq!(r.preemptions, 1);
        let mut got: Vec<(usize, u64, u64, u64)> = r
            .records
            .iter()
            .map(|j| (j.job, j.start_ms / 1000, j.end_ms / 1000, j.gpu_ms / 1000))
            .collect();
        got.sort_unstable();
        // b runs at once; a resumes when b ends, with 990 s left plus 5 s done again, and held
        // 4 GPUs for 10 s, then 995 s.
        assert_eq!(got, vec![(0, 0, 1015, 4 * 1005), (1, 10, 20, 20)]);
        // Off: b waits for a.
        state.scheduler.preemption = Preemption::Off;
        let r = replay(&t.jobs, &state, gpus, &policy, Estimates::Exact, 5_000).expect("replay");
        assert_eq!(r.preemptions, 0);
        assert!(
            r.records
                .iter()
                .any(|j| j.job == 1 && j.start_ms == 1_000_000)
        );
    }

    /// On 2 × 4 GPUs, an 8-GPU gang at 1 s behind a stream of 2-GPU jobs (one every 30 min,
    /// each running an hour): greedy keeps a node busy at every moment, so the gang waits
    /// until the stream ends. With the guard at an hour it goes first once it has waited an
    /// hour, reserves both nodes, and starts when the runs then holding them end.
    #[test]
    fn the_starvation_guard_bounds_a_gangs_wait() {
        let mut csv = String::from("submit,duration,gpus\n0,3600,2\n1,600,8\n");
        for k in 1..=24 {
            csv.push_str(&format!("{},3600,2\n", k * 1800));
        }
        let t = trace::parse(&csv, false).expect("trace");
        let (mut state, gpus) = cluster::build("2x4xV100-32GB").expect("cluster");
        let policy: Policy = "fcfs+greedy".parse().expect("policy");
        let gang_start = |state: &ClusterState| {
            let r = replay(&t.jobs, state, gpus, &policy, Estimates::Exact, 0).expect("replay");
            let gang = r.records.iter().find(|j| j.gang).expect("the gang ran");
            (gang.start_ms - gang.submit_ms) / 1000
        };
        assert!(
            gang_start(&state) > 24 * 1800,
            "without the guard it starves"
        );
        state.scheduler.gang_wait_limit_s = 3600;
        // Starving at 3601 s: the runs started at 1800 s and 3600 s end at 5400 s and 7200 s.
        assert_eq!(gang_start(&state), 7200 - 1);
    }

    #[test]
    fn a_gpu_type_column_keeps_jobs_on_their_type_and_a_nodes_column_makes_gangs() {
        let t = trace::parse(
            "submit,duration,gpus,gpu_type,nodes\n0,100,4,T4,\n0,100,4,T4,\n1,10,4,,2\n",
            false,
        )
        .expect("trace");
        let (state, gpus) = cluster::build("1x4xV100-32GB+2x4xT4-16GB").expect("cluster");
        let policy: Policy = "fcfs+greedy".parse().expect("policy");
        let r = replay(&t.jobs, &state, gpus, &policy, Estimates::Exact, 0).expect("replay");
        let mut got: Vec<(usize, u64, bool)> = r
            .records
            .iter()
            .map(|j| (j.job, j.start_ms / 1000, j.gang))
            .collect();
        got.sort_unstable();
        // Both T4 jobs start at once on the two T4 nodes; the 2 × 2 gang needs two nodes
        // with 2 GPUs free, and only the V100 node has any until 100 s.
        assert_eq!(got, vec![(0, 0, false), (1, 0, false), (2, 100, true)]);
    }

    #[test]
    fn jobs_larger_than_a_node_run_as_gangs_and_impossible_ones_are_counted() {
        let t = trace::parse("submit,duration,gpus\n0,10,8\n0,10,9\n", false).expect("trace");
        let (state, gpus) = cluster::build("2x4xV100-32GB").expect("cluster");
        let r = replay(
            &t.jobs,
            &state,
            gpus,
            &"fcfs".parse().expect("p"),
            Estimates::Exact,
            0,
        )
        .expect("replay");
        assert_eq!(r.records.len(), 1);
        assert_eq!(r.never_placed, 1);
    }

    /// The trace `csv` replayed on `cluster` under `policy`, with exact estimates.
    fn replay_exact(csv: &str, cluster: &str, policy: &str) -> Replay {
        let t = trace::parse(csv, false).expect("trace");
        let (state, gpus) = cluster::build(cluster).expect("cluster");
        let policy = policy.parse().expect("policy");
        replay(&t.jobs, &state, gpus, &policy, Estimates::Exact, 0).expect("replay")
    }

    /// Each finished job's first start, in seconds, earliest first.
    fn start_seconds(r: &Replay) -> Vec<u64> {
        let mut starts: Vec<u64> = r.records.iter().map(|j| j.start_ms / 1000).collect();
        starts.sort_unstable();
        starts
    }

    #[test]
    fn jobs_on_a_fraction_of_a_gpu_share_it_and_count_by_their_part() {
        // Two shared A100s: eight quarter-GPU jobs fit at once, the ninth waits; a whole-GPU
        // job finds no GPU in whole mode on that node and goes to the T4.
        let mut csv = String::from("submit,duration,gpus,gpu_fraction\n");
        for _ in 0..9 {
            csv.push_str("0,100,1,0.25\n");
        }
        csv.push_str("0,100,1,\n");
        let r = replay_exact(&csv, "1x2xA100-80GB:shared+1x1xT4-16GB", "fcfs");
        assert_eq!(start_seconds(&r), [0, 0, 0, 0, 0, 0, 0, 0, 0, 100]);
        let quarter: Vec<u64> = (r.records.iter())
            .filter(|j| j.job < 9)
            .map(|j| j.gpu_ms)
            .collect();
        assert_eq!(quarter, [25_000; 9], "a quarter of a GPU for 100 s each");
        let peak = r.timeline.iter().map(|&(_, b)| b).max();
        assert_eq!(
            peak,
            Some(3_000),
            "2 shared GPUs full and the T4, in thousandths"
        );
        assert_eq!(r.never_placed, 0);
    }

    #[test]
    fn jobs_on_mig_instances_take_the_layouts_instances() {
        // One A100 split in seven 1g.10gb instances: seven jobs at once, the eighth after them.
        let mut csv = String::from("submit,duration,gpus,mig\n");
        for _ in 0..8 {
            csv.push_str("0,60,1,1g.10gb\n");
        }
        csv.push_str("0,60,1,2g.20gb\n");
        let layout = ["1g.10gb"; 7].join(",");
        let r = replay_exact(&csv, &format!("1x1xA100-80GB:mig={layout}"), "fcfs+easy");
        assert_eq!(start_seconds(&r), [0, 0, 0, 0, 0, 0, 0, 60]);
        assert_eq!(r.never_placed, 1, "no 2g.20gb instance in the layout");
        // A seventh of the GPU, in whole thousandths: 142.
        assert!(
            r.records.iter().all(|j| j.gpu_ms == 142 * 60),
            "{:?}",
            r.records
        );
    }
}
