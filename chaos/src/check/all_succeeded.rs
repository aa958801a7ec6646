//! After the cluster has healed and drained, every acknowledged job finished `Succeeded`
//! (`not-succeeded`). Jobs missing from the list are `total-queue`'s business.

use std::collections::BTreeMap;

use crate::history::{Event, OpKind, Phase};
use crate::model::{FinalJob, SUCCEEDED, Violation};

const NAME: &str = "all-succeeded";

pub fn check(history: &[Event], jobs: &[FinalJob]) -> Vec<Violation> {
    let by_id: BTreeMap<u64, &FinalJob> = jobs.iter().map(|j| (j.id, j)).collect();
    let mut acked: Vec<u64> = history
        .iter()
        .filter(|e| e.op == OpKind::Submit && e.phase == Phase::Ok)
        .filter_map(|e| e.job_id)
        .collect();
    acked.sort_unstable();
    acked.dedup();
    acked
        .into_iter()
        .filter_map(|id| by_id.get(&id))
        .filter(|j| j.state != SUCCEEDED)
        .map(|j| {
            Violation::new(
                NAME,
                "not-succeeded",
                format!(
                    "j-{} (key {:?}) ended {} (generation {}): {}",
                    j.id, j.key, j.state, j.generation, j.reason
                ),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::fixtures::{acked, job};

    #[test]
    fn succeeded_jobs_pass_and_unacked_ones_are_ignored() {
        let h = acked("w0", "a", 1);
        let other = FinalJob {
            state: "JOB_STATE_FAILED".into(),
            ..job(2, "b")
        };
        assert_eq!(check(&h, &[job(1, "a"), other]), vec![]);
    }

    #[test]
    fn finds_an_acked_job_that_did_not_succeed() {
        let h = [acked("w0", "a", 1), acked("w0", "b", 2)].concat();
        let failed = FinalJob {
            state: "JOB_STATE_FAILED".into(),
            ..job(2, "b")
        };
        let v = check(&h, &[job(1, "a"), failed]);
        assert_eq!(v.len(), 1);
        assert_eq!(
            (v[0].kind, v[0].detail.contains("j-2")),
            ("not-succeeded", true)
        );
    }
}
