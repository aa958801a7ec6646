//! Self-fencing from the jobs' own records: two runs (generations) of one job never overlap in
//! time (`concurrent-runs`). A job is placed again only after its old node was declared down,
//! and a cut-off node stops its runs before that — if it did not, both runs show here.
//! A run that never recorded its end counts as still running.

use std::collections::BTreeMap;

use super::overlap::{end, overlapping};
use crate::model::{RunRecord, Violation};

const NAME: &str = "fencing";

/// Pairs of runs of one job that overlap in time.
pub fn check(runs: &[RunRecord]) -> Vec<Violation> {
    let mut by_job: BTreeMap<u64, Vec<&RunRecord>> = BTreeMap::new();
    for r in runs {
        by_job.entry(r.job_id).or_default().push(r);
    }
    let mut out = Vec::new();
    for (job, rs) in by_job {
        for (prev, r) in overlapping(rs) {
            out.push(Violation::new(
                NAME,
                "concurrent-runs",
                format!(
                    "j-{job}: g{} on n{} [{}, {}) still ran when g{} started on n{} at {} \
                     ({} ms overlap)",
                    prev.generation,
                    prev.node,
                    prev.start_ns,
                    prev.end_ns.map_or("running".into(), |e| e.to_string()),
                    r.generation,
                    r.node,
                    r.start_ns,
                    (end(prev).min(end(r)) - r.start_ns) / 1_000_000
                ),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(
        job_id: u64,
        generation: u64,
        node: u64,
        start_ns: u128,
        end_ns: Option<u128>,
    ) -> RunRecord {
        RunRecord {
            job_id,
            generation,
            node,
            gpus: vec![format!("GPU-n{node}")],
            start_ns,
            end_ns,
        }
    }

    #[test]
    fn a_fenced_run_then_its_replacement_passes() {
        let runs = [
            run(1, 1, 2, 0, Some(2_000)),
            run(1, 2, 3, 4_000, Some(9_000)),
            // Other jobs may overlap freely.
            run(2, 1, 2, 500, Some(8_000)),
        ];
        assert_eq!(check(&runs), vec![]);
    }

    #[test]
    fn finds_a_run_that_outlived_its_replacement_start() {
        let runs = [
            run(1, 1, 2, 0, Some(4_500_000)),
            run(1, 2, 3, 4_000_000, None),
        ];
        let v = check(&runs);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].kind, "concurrent-runs");
        assert!(v[0].detail.contains("j-1: g1 on n2"), "{}", v[0].detail);
    }

    #[test]
    fn a_run_that_never_ended_overlaps_every_later_run() {
        let runs = [
            run(1, 1, 2, 0, None),
            run(1, 2, 3, 10, Some(20)),
            run(1, 3, 1, 30, Some(40)),
        ];
        assert_eq!(check(&runs).len(), 2);
    }
}
