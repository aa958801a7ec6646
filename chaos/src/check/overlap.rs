//! The sweep `fencing` and `gpu-overlap` share: within one group of runs (a job's, a GPU's),
//! every run that starts while an earlier one is still going. A run that never recorded its
//! end counts as still running.

use crate::model::RunRecord;

/// `(earlier, later)` for each run of `runs` that starts before the run ending last among
/// those started before it has ended; in order of start.
pub(super) fn overlapping(mut runs: Vec<&RunRecord>) -> Vec<(&RunRecord, &RunRecord)> {
    runs.sort_by_key(|r| r.start_ns);
    let mut out = Vec::new();
    // The run that ends last among those started so far.
    let mut open: Option<&RunRecord> = None;
    for r in runs {
        if let Some(prev) = open {
            if r.start_ns < end(prev) {
                out.push((prev, r));
            }
            if end(r) <= end(prev) {
                continue;
            }
        }
        open = Some(r);
    }
    out
}

/// When the run ended; `u128::MAX` while it has not.
pub(super) fn end(r: &RunRecord) -> u128 {
    r.end_ns.unwrap_or(u128::MAX)
}
