//! A replica's state digest: the SHA-256 of `ClusterState`'s canonical encoding, so replicas
//! can be compared (the chaos harness's "digests equal after heal" check).
//!
//! The canonical encoding is the state's JSON as the snapshot writes it. It is deterministic:
//! every map in the state is a `BTreeMap` (ordered by key), lists keep their applied order, no
//! field is skipped, and the state holds no floats (whose text form could differ after a
//! round-trip). A replica restored from a snapshot therefore digests like one that applied
//! every entry.

use sha2::{Digest, Sha256};

use crate::model::state::ClusterState;

/// The canonical bytes of `state` (what `digest` hashes).
pub fn canonical_bytes(state: &ClusterState) -> Vec<u8> {
    // Serialising plain data with string keys into memory cannot fail.
    serde_json::to_vec(state).unwrap_or_default()
}

/// Hex SHA-256 of `bytes` (from `canonical_bytes`).
pub fn digest_bytes(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Hex SHA-256 of `state`'s canonical encoding.
pub fn state_digest(state: &ClusterState) -> String {
    digest_bytes(&canonical_bytes(state))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::command::{Command, LogEntry};
    use crate::model::job::JobSpec;
    use crate::model::node::Inventory;

    fn entry(at: u64, cmd: Command) -> LogEntry {
        LogEntry {
            proposed_at_ms: at,
            meta: None,
            cmd,
            request: None,
        }
    }

    fn applied(entries: &[LogEntry]) -> ClusterState {
        let mut s = ClusterState::new();
        for e in entries {
            s.apply(e);
        }
        s
    }

    fn history() -> Vec<LogEntry> {
        let spec = |n: &str| -> JobSpec {
            serde_json::from_value(serde_json::json!({"name": n, "command": ["true"]}))
                .expect("spec")
        };
        vec![
            entry(
                1,
                Command::RegisterNode {
                    node: 2,
                    addr: "10.0.0.2:7000".into(),
                    labels: Default::default(),
                    inventory: Inventory::default(),
                    edge: None,
                    protocol: 1,
                },
            ),
            entry(
                2,
                Command::SubmitJob {
                    spec: Box::new(spec("b")),
                    idempotency_key: Some("k2".into()),
                    hold: false,
                    owner: None,
                },
            ),
            entry(
                3,
                Command::SubmitJob {
                    spec: Box::new(spec("a")),
                    idempotency_key: Some("k1".into()),
                    hold: false,
                    owner: None,
                },
            ),
        ]
    }

    #[test]
    fn equal_histories_digest_equally_and_a_snapshot_round_trip_keeps_it() {
        let a = applied(&history());
        let b = applied(&history());
        assert_eq!(state_digest(&a), state_digest(&b));
        let restored: ClusterState = serde_json::from_slice(&canonical_bytes(&a)).expect("decode");
        assert_eq!(state_digest(&restored), state_digest(&a));
        assert_eq!(state_digest(&a).len(), 64);
    }

    #[test]
    fn any_difference_changes_the_digest() {
        let full = applied(&history());
        let shorter = applied(&history()[..2]);
        assert_ne!(state_digest(&full), state_digest(&shorter));
        let mut later = history();
        later[2].proposed_at_ms = 4;
        assert_ne!(state_digest(&applied(&later)), state_digest(&full));
        assert_ne!(
            state_digest(&ClusterState::new()),
            state_digest(&ClusterState::default()),
            "next_job_id differs"
        );
    }
}
