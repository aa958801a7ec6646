//! After the drain, wait until the replicas settle: every agent reports the same applied
//! index (bounded by `SETTLE`), then keep that round's digests for `check::digests`.

use std::time::{Duration, Instant};

use gpu_tests::Cluster;

use crate::model::ReplicaDigest;

/// How long the healed, drained cluster gets for every replica to apply the same log.
const SETTLE: Duration = Duration::from_secs(20);
/// Deadline of one agent's answer.
const ASK: Duration = Duration::from_secs(3);

/// Ask every agent for its applied index and state digest until one round has every agent at
/// one index, or `SETTLE` has passed; return the last round (sorted by node).
pub async fn replica_digests(c: &Cluster) -> Vec<ReplicaDigest> {
    let start = Instant::now();
    loop {
        let round = ask_all(c).await;
        if common_index(&round).is_some() || start.elapsed() >= SETTLE {
            return round;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The applied index every replica reported, when they all reported the same one.
pub fn common_index(replicas: &[ReplicaDigest]) -> Option<u64> {
    let first = replicas.first()?.applied_index?;
    replicas
        .iter()
        .all(|r| r.applied_index == Some(first))
        .then_some(first)
}

async fn ask_all(c: &Cluster) -> Vec<ReplicaDigest> {
    let mut out = Vec::new();
    for &node in c.agents.keys() {
        let answer = tokio::time::timeout(ASK, c.state_digest(node)).await;
        out.push(match answer {
            Ok(Ok(d)) => ReplicaDigest {
                node,
                applied_index: Some(d.applied_index),
                sha256: Some(d.sha256),
                error: None,
            },
            Ok(Err(s)) => ReplicaDigest {
                node,
                error: Some(format!("{:?}: {}", s.code(), s.message())),
                ..ReplicaDigest::default()
            },
            Err(_) => ReplicaDigest {
                node,
                error: Some(format!("no answer within {ASK:?}")),
                ..ReplicaDigest::default()
            },
        });
    }
    out
}
