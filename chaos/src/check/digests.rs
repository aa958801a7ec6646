//! Replicas agree after the heal: once the cluster has settled, every agent reports the same
//! applied index (`not-converged` otherwise, or `unreported` for an agent that did not answer)
//! and, at that index, the same state digest (`digests-differ`): Raft's state machine safety,
//! checked on the replicas themselves.

use crate::model::{ReplicaDigest, Violation};

const NAME: &str = "replica-digests";

/// Judge the agents' final reports (one per agent).
pub fn check(replicas: &[ReplicaDigest]) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut reported = Vec::new();
    for r in replicas {
        match (&r.applied_index, &r.sha256) {
            (Some(index), Some(sha)) => reported.push((r.node, *index, sha.as_str())),
            _ => out.push(Violation::new(
                NAME,
                "unreported",
                format!(
                    "n{} gave no digest: {}",
                    r.node,
                    r.error.as_deref().unwrap_or("no answer")
                ),
            )),
        }
    }
    let Some(&(_, first_index, first_sha)) = reported.first() else {
        return out;
    };
    let describe = || {
        reported
            .iter()
            .map(|(n, i, sha)| format!("n{n}@{i}={}", &sha[..sha.len().min(12)]))
            .collect::<Vec<_>>()
            .join(" ")
    };
    if reported.iter().any(|(_, i, _)| *i != first_index) {
        out.push(Violation::new(
            NAME,
            "not-converged",
            format!(
                "the replicas never reached one applied index: {}",
                describe()
            ),
        ));
    } else if reported.iter().any(|(_, _, sha)| *sha != first_sha) {
        out.push(Violation::new(
            NAME,
            "digests-differ",
            format!(
                "replicas at applied index {first_index} hold different states: {}",
                describe()
            ),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::fixtures::replica;

    #[test]
    fn equal_replicas_pass() {
        let r = [
            replica(1, 40, "aa"),
            replica(2, 40, "aa"),
            replica(3, 40, "aa"),
        ];
        assert_eq!(check(&r), vec![]);
        assert_eq!(check(&[]), vec![]);
    }

    #[test]
    fn finds_a_replica_that_diverged() {
        let r = [
            replica(1, 40, "aa"),
            replica(2, 40, "bb"),
            replica(3, 40, "aa"),
        ];
        let v = check(&r);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].kind, "digests-differ");
        assert!(v[0].detail.contains("n2@40=bb"), "{}", v[0].detail);
    }

    #[test]
    fn finds_replicas_that_never_converged_or_did_not_answer() {
        let behind = [
            replica(1, 40, "aa"),
            replica(2, 38, "cc"),
            replica(3, 40, "aa"),
        ];
        let v = check(&behind);
        assert_eq!(
            v.iter().map(|v| v.kind).collect::<Vec<_>>(),
            ["not-converged"]
        );
        let silent = ReplicaDigest {
            error: Some("Unavailable: connection refused".into()),
            ..ReplicaDigest::default()
        };
        let v = check(&[replica(1, 40, "aa"), ReplicaDigest { node: 2, ..silent }]);
        assert_eq!(v.iter().map(|v| v.kind).collect::<Vec<_>>(), ["unreported"]);
        assert!(v[0].detail.contains("connection refused"));
    }
}
