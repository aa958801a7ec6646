//! The discrete-event replay: jobs arrive at their trace times, the scheduler's own `plan`
//! places them in virtual time on a real `ClusterState`, and each placed job finishes after its
//! trace duration. Nothing here reads a clock except to time the replay itself.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::time::{Duration, Instant};

use gpu_raft_store::{Binding, ClusterState, Job, JobId, JobSpec, JobState, NodeId};

use super::trace::TraceJob;
use crate::scheduler::{PendingIndex, PlanEnv, Policy, plan_pending};

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
    pub submit_ms: u64,
    pub start_ms: u64,
    pub end_ms: u64,
    pub gpus: u32,
    /// Index into `Replay::tenants`.
    pub tenant: usize,
    /// What the history predicted when the job started, if it had anything to go on.
    pub predicted_ms: Option<u64>,
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
    /// Busy GPUs from each time on (change points).
    pub timeline: Vec<(u64, u64)>,
    pub total_gpus: u64,
    pub passes: u64,
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

/// Replay `jobs` (sorted by submission) on `cluster` under `policy`.
pub(crate) fn replay(
    jobs: &[TraceJob],
    cluster: &ClusterState,
    total_gpus: u64,
    policy: &Policy,
    estimates: Estimates,
) -> Result<Replay, DoubleBooked> {
    let began = Instant::now();
    let policy = Policy {
        multi_node_gangs: true,
        explain: false,
        max_binds_per_pass: usize::MAX,
        ..policy.clone()
    };
    let mut env = PlanEnv::new(0, &policy);
    let mut state = cluster.clone();
    let mut tenants: Vec<String> = Vec::new();
    let mut tenant_index: HashMap<&str, usize> = HashMap::new();
    let mut job_tenant: Vec<usize> = Vec::with_capacity(jobs.len());
    for j in jobs {
        let next = tenant_index.len();
        let i = *tenant_index.entry(j.tenant.as_str()).or_insert(next);
        if i == next {
            tenants.push(j.tenant.clone());
        }
        job_tenant.push(i);
    }

    let mut records = Vec::with_capacity(jobs.len());
    let mut predicted: HashMap<JobId, Option<u64>> = HashMap::new();
    let mut ends: BinaryHeap<Reverse<(u64, JobId)>> = BinaryHeap::new();
    let mut placements: HashMap<JobId, Vec<(NodeId, Vec<u32>)>> = HashMap::new();
    let mut pending = PendingIndex::new(policy.ordering);
    let mut pending_by_gpus: BTreeMap<u32, usize> = BTreeMap::new();
    let node_size = cluster
        .nodes
        .values()
        .map(|n| n.inventory.gpus.len() as u32)
        .max()
        .unwrap_or(0);
    let mut busy: u64 = 0;
    let mut timeline = vec![(0, 0)];
    let mut fragmented_gpu_ms = 0.0;
    let mut fragmented = false;
    let mut passes = 0;
    let mut next_arrival = 0;
    let mut last_t = 0;

    loop {
        let arrival = jobs.get(next_arrival).map(|j| j.submit_ms);
        let completion = ends.peek().map(|Reverse((t, _))| *t);
        let t = match (arrival, completion) {
            (None, None) => break,
            (Some(a), Some(c)) => a.min(c),
            (Some(a), None) => a,
            (None, Some(c)) => c,
        };
        if fragmented {
            fragmented_gpu_ms += (total_gpus - busy) as f64 * (t - last_t) as f64;
        }
        last_t = t;

        while let Some(&Reverse((end, id))) = ends.peek() {
            if end != t {
                break;
            }
            ends.pop();
            let Some(job) = state.jobs.remove(&id) else {
                continue;
            };
            for (node, gpus) in placements.remove(&id).unwrap_or_default() {
                if let Some(n) = state.nodes.get_mut(&node) {
                    for g in gpus {
                        n.allocations.remove(&g);
                    }
                }
            }
            busy -= u64::from(job.spec.gpus);
            let start = job.started_at_ms.unwrap_or(t);
            env.usage.record(&job.spec.tenant, job.spec.gpus, start, t);
            env.history.record(&job.spec, t - start);
            records.push(JobRecord {
                submit_ms: job.submitted_at_ms,
                start_ms: start,
                end_ms: t,
                gpus: job.spec.gpus,
                tenant: job_tenant[(id - 1) as usize],
                predicted_ms: predicted.remove(&id).flatten(),
            });
        }
        while let Some(j) = jobs.get(next_arrival) {
            if j.submit_ms != t {
                break;
            }
            let id = next_arrival as JobId + 1;
            let job = pending_job(id, j, estimates);
            pending.insert(&job);
            state.jobs.insert(id, job);
            *pending_by_gpus.entry(j.gpus).or_default() += 1;
            next_arrival += 1;
        }

        if could_place(&state, &pending_by_gpus, total_gpus - busy, node_size) {
            env.now_ms = t;
            let pass = plan_pending(&state, &policy, &env, &pending);
            passes += 1;
            for b in pass.binds {
                let node = state
                    .nodes
                    .get_mut(&b.node)
                    .expect("plan binds known nodes");
                for &g in &b.gpus {
                    if node.allocations.insert(g, b.job).is_some() {
                        return Err(DoubleBooked {
                            at_ms: t,
                            node: b.node,
                            gpu: g,
                            job: b.job,
                        });
                    }
                }
                let parts = placements.entry(b.job).or_default();
                let first = parts.is_empty();
                parts.push((b.node, b.gpus.clone()));
                if !first {
                    continue;
                }
                let job = state.jobs.get_mut(&b.job).expect("plan binds known jobs");
                pending.remove(job.id);
                job.state = JobState::Running;
                job.generation += 1;
                job.attempts += 1;
                job.bound_at_ms = Some(t);
                job.started_at_ms = Some(t);
                job.binding = Some(Binding {
                    node: b.node,
                    gpus: b.gpus,
                    generation: job.generation,
                    slice: None,
                });
                busy += u64::from(job.spec.gpus);
                predicted.insert(b.job, env.history.predict_ms(&job.spec));
                let trace = &jobs[(b.job - 1) as usize];
                ends.push(Reverse((t + trace.duration_ms, b.job)));
                if let Some(n) = pending_by_gpus.get_mut(&trace.gpus) {
                    *n -= 1;
                    if *n == 0 {
                        pending_by_gpus.remove(&trace.gpus);
                    }
                }
            }
        }
        fragmented = is_fragmented(&state, &pending_by_gpus, total_gpus - busy, node_size);
        if timeline.last().is_some_and(|&(_, b)| b != busy) {
            timeline.push((t, busy));
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
        wall: began.elapsed(),
    })
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

fn pending_job(id: JobId, t: &TraceJob, estimates: Estimates) -> Job {
    let estimate_s = match estimates {
        Estimates::Exact => Some(t.duration_ms.div_ceil(1000)),
        Estimates::Predicted => t.estimate_s,
    };
    let spec = JobSpec {
        name: t.name.clone(),
        tenant: t.tenant.clone(),
        gpus: t.gpus,
        priority: t.priority,
        runtime_estimate_s: estimate_s,
        ..JobSpec::default()
    };
    Job::pending(id, spec, None, t.submit_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::simulate::{cluster, trace};

    /// A (2 GPUs, 100 s) at 0, B (all 4 GPUs, 100 s) at 1, C (1 GPU, 10 s) at 2, on one node.
    const TRACE: &str = "submit,duration,gpus\n0,100,2\n1,100,4\n2,10,1\n";

    fn starts(policy: &str, estimates: Estimates) -> Vec<(u64, u64)> {
        let t = trace::parse(TRACE, false).expect("trace");
        let (state, gpus) = cluster::build("1x4xV100-32GB").expect("cluster");
        let policy: Policy = policy.parse().expect("policy");
        let r = replay(&t.jobs, &state, gpus, &policy, estimates).expect("replay");
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
    fn jobs_larger_than_a_node_run_as_gangs_and_impossible_ones_are_counted() {
        let t = trace::parse("submit,duration,gpus\n0,10,8\n0,10,9\n", false).expect("trace");
        let (state, gpus) = cluster::build("2x4xV100-32GB").expect("cluster");
        let r = replay(
            &t.jobs,
            &state,
            gpus,
            &"fcfs".parse().expect("p"),
            Estimates::Exact,
        )
        .expect("replay");
        assert_eq!(r.records.len(), 1);
        assert_eq!(r.never_placed, 1);
    }
}
