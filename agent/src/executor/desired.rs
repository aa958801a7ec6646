//! The desired state: the runs the replicated state wants on this node, from a set of this
//! node's jobs kept between passes.

use std::collections::{BTreeSet, HashMap};

use gpu_raft_store::KeptIndex;
use gpu_raft_store::{ClusterState, Job, JobId, NodeId};

use super::reconcile::{Desired, Observed};

/// The ids of the live jobs placed (in whole or in part) on this node, kept between passes:
/// a pass runs on every applied entry, and scanning every job each time (tens of thousands in a
/// long-lived state, on every agent) made each entry cost O(all jobs) on every agent.
pub(super) type Mine = KeptIndex<BTreeSet<JobId>>;

fn placed_here(job: &Job, me: NodeId) -> bool {
    job.state.is_live() && job.on_node(me)
}

/// This node's live placements, plus the jobs they and the runs `observed` here belong to.
/// Only those jobs are copied.
pub(super) fn desired_runs(
    state: &ClusterState,
    me: NodeId,
    observed: &[Observed],
    mine: &mut Mine,
) -> (Vec<Desired>, HashMap<JobId, Job>) {
    let mine = jobs_placed_here(state, me, mine);
    let desired = mine
        .iter()
        .filter_map(|id| state.jobs.get(id))
        .map(|j| Desired {
            job: j.id,
            generation: j.generation,
            state: j.state,
            cancel: j.cancel_requested,
            evict: j.evict_requested,
        })
        .collect();
    // The jobs of stale runs too (a requeued job's old run here), so they can be named; not of
    // runs whose end was reported, which need nothing more.
    let jobs = mine
        .iter()
        .copied()
        .chain(observed.iter().filter(|o| !o.reported).map(|o| o.job))
        .filter_map(|id| state.jobs.get(&id).map(|j| (id, j.clone())))
        .collect();
    (desired, jobs)
}

/// The ids of this node's live jobs: the kept set brought up to date with the jobs that changed
/// since the last pass, or a scan of every job when it cannot be.
fn jobs_placed_here<'a>(
    state: &ClusterState,
    me: NodeId,
    mine: &'a mut Mine,
) -> &'a BTreeSet<JobId> {
    mine.get(
        state,
        |_| true,
        |s| {
            s.jobs
                .values()
                .filter(|j| placed_here(j, me))
                .map(|j| j.id)
                .collect()
        },
        |ids, s, job| {
            if s.jobs.get(&job).is_some_and(|j| placed_here(j, me)) {
                ids.insert(job);
            } else {
                ids.remove(&job);
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::scheduler::random_history::{job_step, step_command};
    use crate::scheduler::testkit::{apply, gpu, node};

    proptest! {
        /// Whatever entries are applied, the runs a pass wants from the kept set of this
        /// node's jobs are those a scan of every job finds.
        #[test]
        fn kept_placements_equal_a_scan_of_every_job(
            steps in proptest::collection::vec(job_step(), 1..60),
        ) {
            let mut state = ClusterState::new();
            for id in [1, 2] {
                node(&mut state, id, (0..2).map(|i| gpu(i, "A100", 0)).collect());
            }
            let mut kept = [Mine::default(), Mine::default()];
            for step in &steps {
                if let Some(cmd) = step_command(&state, step) {
                    apply(&mut state, cmd);
                }
                for (me, mine) in [1, 2].into_iter().zip(&mut kept) {
                    let (want, _) = desired_runs(&state, me, &[], mine);
                    let (scanned, _) = desired_runs(&state, me, &[], &mut Mine::default());
                    prop_assert_eq!(want, scanned);
                }
            }
        }
    }
}
