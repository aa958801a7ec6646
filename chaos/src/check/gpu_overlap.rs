//! GPU exclusivity from the jobs' own records: no GPU UUID is in two runs whose intervals
//! overlap (`gpu-overlap`). A run that never recorded its end counts as still running.

use std::collections::BTreeMap;

use super::overlap::overlapping;
use crate::model::{RunRecord, Violation};

const NAME: &str = "gpu-overlap";

pub fn check(runs: &[RunRecord]) -> Vec<Violation> {
    let mut by_gpu: BTreeMap<&str, Vec<&RunRecord>> = BTreeMap::new();
    for r in runs {
        for g in &r.gpus {
            by_gpu.entry(g.as_str()).or_default().push(r);
        }
    }
    let mut out = Vec::new();
    for (gpu, rs) in by_gpu {
        for (prev, r) in overlapping(rs) {
            out.push(Violation::new(
                NAME,
                "gpu-overlap",
                format!(
                    "GPU {gpu}: j-{}-g{} [{}, {}) overlaps j-{}-g{} starting {}",
                    prev.job_id,
                    prev.generation,
                    prev.start_ns,
                    prev.end_ns.map_or("running".into(), |e| e.to_string()),
                    r.job_id,
                    r.generation,
                    r.start_ns
                ),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(job_id: u64, gpus: &[&str], start_ns: u128, end_ns: Option<u128>) -> RunRecord {
        RunRecord {
            job_id,
            generation: 1,
            node: 1,
            gpus: gpus.iter().map(|g| (*g).to_owned()).collect(),
            start_ns,
            end_ns,
        }
    }

    #[test]
    fn back_to_back_and_disjoint_runs_pass() {
        let runs = [
            run(1, &["A", "B"], 0, Some(10)),
            run(2, &["A"], 10, Some(20)),
            run(3, &["B"], 15, None),
            run(4, &["C"], 5, Some(30)),
        ];
        assert_eq!(check(&runs), vec![]);
    }

    #[test]
    fn finds_an_overlap() {
        let runs = [
            run(1, &["A", "B"], 0, Some(10)),
            run(2, &["B"], 9, Some(20)),
        ];
        let v = check(&runs);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].detail.contains("GPU B") && v[0].kind == "gpu-overlap");
    }

    #[test]
    fn a_run_that_never_ended_overlaps_everything_after_it() {
        let runs = [
            run(1, &["A"], 0, None),
            run(2, &["A"], 50, Some(60)),
            run(3, &["A"], 70, Some(80)),
        ];
        assert_eq!(check(&runs).len(), 2);
    }

    #[test]
    fn a_long_run_is_not_forgotten_behind_a_short_one() {
        let runs = [
            run(1, &["A"], 0, Some(100)),
            run(2, &["A"], 10, Some(20)),
            run(3, &["A"], 50, Some(60)),
        ];
        assert_eq!(check(&runs).len(), 2);
    }
}
