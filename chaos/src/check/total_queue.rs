//! Jepsen's total-queue check for submissions: every acknowledged job exists at the end
//! (`lost`), every job at the end was submitted by the workload (`unexpected`), no key made two
//! jobs (`duplicated`), and no job exists for a key whose every submission certainly failed
//! (`failed-but-present`). Jobs from `info` submissions are "recovered": allowed.

use std::collections::{BTreeMap, BTreeSet};

use crate::history::{Event, OpKind, Phase};
use crate::model::{FinalJob, Violation};

const NAME: &str = "total-queue";

pub fn check(history: &[Event], jobs: &[FinalJob]) -> Vec<Violation> {
    let mut out = Vec::new();
    let submits = history.iter().filter(|e| e.op == OpKind::Submit);
    let mut phases: BTreeMap<&str, BTreeSet<Phase>> = BTreeMap::new();
    let mut acked: BTreeSet<u64> = BTreeSet::new();
    for e in submits {
        let Some(key) = e.key.as_deref() else {
            continue;
        };
        phases.entry(key).or_default().insert(e.phase);
        if e.phase == Phase::Ok
            && let Some(id) = e.job_id
        {
            acked.insert(id);
        }
    }
    let present: BTreeSet<u64> = jobs.iter().map(|j| j.id).collect();
    for id in acked.difference(&present) {
        out.push(Violation::new(
            NAME,
            "lost",
            format!("acknowledged job j-{id} is not in the final job list"),
        ));
    }
    let mut by_key: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for j in jobs {
        by_key.entry(j.key.as_str()).or_default().push(j.id);
        match phases.get(j.key.as_str()) {
            None => out.push(Violation::new(
                NAME,
                "unexpected",
                format!("j-{} (key {:?}) was never submitted", j.id, j.key),
            )),
            Some(p) if !p.contains(&Phase::Ok) && !p.contains(&Phase::Info) => {
                out.push(Violation::new(
                    NAME,
                    "failed-but-present",
                    format!(
                        "j-{} exists though every submit of {:?} failed",
                        j.id, j.key
                    ),
                ))
            }
            Some(_) => {}
        }
    }
    for (key, ids) in by_key {
        if ids.len() > 1 {
            out.push(Violation::new(
                NAME,
                "duplicated",
                format!("key {key:?} made jobs {ids:?}"),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::fixtures::{acked, job, kinds, submit};

    #[test]
    fn clean_history_passes_and_recovered_jobs_are_allowed() {
        let mut h = acked("w0", "a", 1);
        h.push(submit("w1", Phase::Invoke, "b", None));
        h.push(submit("w1", Phase::Info, "b", None));
        h.push(submit("w1", Phase::Invoke, "c", None));
        h.push(submit("w1", Phase::Info, "c", None));
        assert_eq!(check(&h, &[job(1, "a"), job(2, "b")]), vec![]);
    }

    #[test]
    fn finds_a_lost_job() {
        let h = [acked("w0", "a", 1), acked("w0", "b", 2)].concat();
        assert_eq!(kinds(&check(&h, &[job(2, "b")])), ["lost"]);
    }

    #[test]
    fn finds_an_unexpected_job() {
        let h = acked("w0", "a", 1);
        assert_eq!(
            kinds(&check(&h, &[job(1, "a"), job(9, "x")])),
            ["unexpected"]
        );
    }

    #[test]
    fn finds_a_duplicate() {
        let h = [acked("w0", "a", 1), acked("w1", "a", 1)].concat();
        assert_eq!(
            kinds(&check(&h, &[job(1, "a"), job(2, "a")])),
            ["duplicated"]
        );
    }

    #[test]
    fn finds_a_job_whose_submits_all_failed() {
        let h = vec![
            submit("w0", Phase::Invoke, "a", None),
            submit("w0", Phase::Fail, "a", None),
        ];
        assert_eq!(kinds(&check(&h, &[job(1, "a")])), ["failed-but-present"]);
    }
}
