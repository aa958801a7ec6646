//! Exactly once per idempotency key: every acknowledgement for a key names the same job
//! (`divergent-acks`), at most one job carries the key (`duplicate-key`), and the job that
//! carries it is the one acknowledged (`ack-mismatch`).

use std::collections::{BTreeMap, BTreeSet};

use crate::history::{Event, OpKind, Phase};
use crate::model::{FinalJob, Violation};

const NAME: &str = "exactly-once";

pub fn check(history: &[Event], jobs: &[FinalJob]) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut acks: BTreeMap<&str, BTreeSet<u64>> = BTreeMap::new();
    for e in history {
        if e.op == OpKind::Submit
            && e.phase == Phase::Ok
            && let (Some(key), Some(id)) = (e.key.as_deref(), e.job_id)
        {
            acks.entry(key).or_default().insert(id);
        }
    }
    let mut holders: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for j in jobs {
        holders.entry(j.key.as_str()).or_default().push(j.id);
    }
    for (key, ids) in &acks {
        if ids.len() > 1 {
            out.push(Violation::new(
                NAME,
                "divergent-acks",
                format!("key {key:?} acknowledged as jobs {ids:?}"),
            ));
        }
        match holders.get(key).map(Vec::as_slice) {
            Some([one]) if !ids.contains(one) => out.push(Violation::new(
                NAME,
                "ack-mismatch",
                format!("key {key:?} acknowledged as {ids:?} but held by j-{one}"),
            )),
            Some(many) if many.len() > 1 => out.push(Violation::new(
                NAME,
                "duplicate-key",
                format!("key {key:?} is held by jobs {many:?}"),
            )),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::fixtures::{acked, job, kinds};

    #[test]
    fn concurrent_acks_of_one_job_pass() {
        let h = [
            acked("s0", "k", 4),
            acked("s1", "k", 4),
            acked("s2", "k", 4),
        ]
        .concat();
        assert_eq!(check(&h, &[job(4, "k")]), vec![]);
    }

    #[test]
    fn finds_divergent_acks() {
        let h = [acked("s0", "k", 4), acked("s1", "k", 5)].concat();
        assert_eq!(kinds(&check(&h, &[job(4, "k")])), ["divergent-acks"]);
    }

    #[test]
    fn finds_two_jobs_for_one_key() {
        let h = acked("s0", "k", 4);
        assert_eq!(
            kinds(&check(&h, &[job(4, "k"), job(5, "k")])),
            ["duplicate-key"]
        );
    }

    #[test]
    fn finds_an_ack_for_another_job() {
        let h = acked("s0", "k", 4);
        assert_eq!(kinds(&check(&h, &[job(6, "k")])), ["ack-mismatch"]);
    }
}
