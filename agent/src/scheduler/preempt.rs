//! Preemption, decided purely: when a pass places nothing, find the first pending job (in the
//! policy's order) that running jobs could make room for on one node, and the fewest, least
//! important runs to stop for it. Which runs may be stopped is `ClusterState::check_preemption`,
//! the rule `apply` enforces as well: quota reclaim from borrowers, and with `priority` mode
//! strictly lower-priority jobs, never for a job that would borrow.

use std::collections::BTreeMap;

use gpu_raft_store::{ClusterState, Job, JobState, NodeId, Preempt, gpu_fits, tenant};

use super::env::PlanEnv;
use super::order;
use super::pending::PendingIndex;
use super::placement::selector_matches;
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
            || job.spec.nodes > 1
            || waits_for_beneficiary(state, job)
            || job.waits_for_retry(env.now_ms)
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
        let want = spec.gpus as usize;
        // The best node: fewest runs stopped, then fewest GPUs stopped, then lowest id.
        let mut best: Option<(usize, usize, Vec<Preempt>)> = None;
        for node in state.nodes.values().filter(|n| n.accepts_work()) {
            if !selector_matches(&spec, &node.effective_labels()) {
                continue;
            }
            let free = node.free_gpus().filter(|g| gpu_fits(g, &spec)).count();
            let Some(live) = by_node.get(&node.id) else {
                continue;
            };
            let mut victims: Vec<(&Job, usize)> = live
                .iter()
                .filter_map(|&v| {
                    let b = v.binding.as_ref()?;
                    let fitting = b
                        .gpus
                        .iter()
                        .filter(|i| node.gpu(**i).is_some_and(|g| gpu_fits(g, &spec)))
                        .count();
                    let p = preempt(v, job);
                    // Never the run the job was itself preempted for: both would wait for
                    // each other to start, forever.
                    let mutual = job.preempted_for == Some(v.id);
                    (fitting > 0 && !mutual && state.check_preemption(&held, &p).is_ok())
                        .then_some((v, fitting))
                })
                .collect();
            // Least important first: lowest priority, then the most recently started (the
            // least work lost).
            victims.sort_by_key(|(v, _)| {
                (
                    v.spec.priority,
                    std::cmp::Reverse(v.started_at_ms.or(v.bound_at_ms)),
                    v.id,
                )
            });
            let mut freed = free;
            let mut chosen = Vec::new();
            let mut gpus = 0;
            for (v, fitting) in victims {
                if freed >= want {
                    break;
                }
                freed += fitting;
                gpus += v.spec.gpus as usize;
                chosen.push(preempt(v, job));
            }
            if freed < want || chosen.is_empty() {
                continue;
            }
            if best
                .as_ref()
                .is_none_or(|(n, g, _)| (chosen.len(), gpus) < (*n, *g))
            {
                best = Some((chosen.len(), gpus, chosen));
            }
        }
        if let Some((.., chosen)) = best {
            return chosen;
        }
    }
    Vec::new()
}

fn preempt(victim: &Job, for_job: &Job) -> Preempt {
    Preempt {
        job: victim.id,
        generation: victim.generation,
        for_job: for_job.id,
    }
}

/// A job preempted for another that has not started yet waits for it.
pub(crate) fn waits_for_beneficiary(state: &ClusterState, job: &Job) -> bool {
    job.preempted_for
        .and_then(|b| state.jobs.get(&b))
        .is_some_and(|b| b.state == JobState::Pending)
}
