//! Checkers: pure functions over the history, the final job list, the jobs' own records and
//! the replicas' final digests, each returning named violations. `all` runs every one.

pub mod all_succeeded;
pub mod digests;
pub mod exactly_once;
pub mod fencing;
pub mod gpu_overlap;
pub mod job_order;
pub mod leaders;
pub mod minority;
mod overlap;
pub mod recovery;
pub mod total_queue;

#[cfg(test)]
pub(crate) mod fixtures;

use crate::history::Event;
use crate::model::{FinalJob, ReplicaDigest, RunRecord, Violation};

/// Every checker's violations, in checker order.
pub fn all(
    history: &[Event],
    jobs: &[FinalJob],
    runs: &[RunRecord],
    replicas: &[ReplicaDigest],
) -> Vec<Violation> {
    let mut out = total_queue::check(history, jobs);
    out.extend(exactly_once::check(history, jobs));
    out.extend(gpu_overlap::check(runs));
    out.extend(fencing::check(runs));
    out.extend(all_succeeded::check(history, jobs));
    out.extend(leaders::check(history));
    out.extend(minority::check(history));
    out.extend(job_order::check(history));
    out.extend(recovery::check(history));
    out.extend(digests::check(replicas));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::fixtures::{acked, job, replica};
    use crate::model::FinalJob;

    #[test]
    fn all_runs_every_checker() {
        let h = [
            acked("w0", "a", 1),
            acked("w1", "a", 2),
            acked("w0", "b", 3),
        ]
        .concat();
        let failed = FinalJob {
            state: "JOB_STATE_FAILED".into(),
            ..job(1, "a")
        };
        let run = |job_id, start_ns| RunRecord {
            job_id,
            generation: 1,
            node: 1,
            gpus: vec!["G".into()],
            start_ns,
            end_ns: Some(start_ns + 10),
        };
        let diverged = [replica(1, 9, "aa"), replica(2, 9, "bb")];
        let v = all(&h, &[failed], &[run(1, 0), run(2, 5)], &diverged);
        let mut checkers: Vec<&str> = v.iter().map(|v| v.checker).collect();
        checkers.dedup();
        assert_eq!(
            checkers,
            [
                "total-queue",
                "exactly-once",
                "gpu-overlap",
                "all-succeeded",
                "replica-digests"
            ],
            "{v:?}"
        );
        assert_eq!(
            all(
                &acked("w0", "b", 3),
                &[job(3, "b")],
                &[run(3, 0)],
                &[replica(1, 9, "aa"), replica(2, 9, "aa")]
            ),
            vec![]
        );
    }
}
