//! The whole Raft log vocabulary: every replicated change is one `Command` in a `LogEntry`.
//!
//! Encodings are frozen: fields added later carry `#[serde(default)]`, and the tests pin the
//! bytes of old entries so a new binary still reads an old log.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::NodeId;

/// One replicated log record. `proposed_at_ms` is stamped by the proposer (the leader); apply
/// uses it as "now" and never reads a clock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    pub proposed_at_ms: u64,
    pub cmd: Command,
}

/// A state change proposed through Raft.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Command {
    /// An agent announces itself (on start and whenever its inventory changes). Upsert.
    RegisterNode {
        node: NodeId,
        addr: String,
        #[serde(default)]
        labels: BTreeMap<String, String>,
    },
    /// Set and remove user labels on a registered node.
    SetNodeLabels {
        node: NodeId,
        #[serde(default)]
        set: BTreeMap<String, String>,
        #[serde(default)]
        remove: BTreeSet<String>,
    },
}

/// What applying one entry produced. A rejection is a normal, replicated outcome: every replica
/// rejects the same entry the same way.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum ApplyResult {
    Ok,
    Rejected { reason: Rejection },
}

/// Why `apply` refused a command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Rejection {
    #[error("node {node} is not registered")]
    UnknownNode { node: NodeId },
    #[error("invalid argument: {message}")]
    Invalid { message: String },
}

impl fmt::Display for LogEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} @{}ms", self.cmd, self.proposed_at_ms)
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Command::RegisterNode { node, addr, labels } => {
                write!(f, "register n{node} {addr} ({} labels)", labels.len())
            }
            Command::SetNodeLabels { node, set, remove } => {
                write!(f, "label n{node} +{} -{}", set.len(), remove.len())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    fn entry(cmd: Command) -> LogEntry {
        LogEntry {
            proposed_at_ms: 1_700_000_000_000,
            cmd,
        }
    }

    /// Frozen encodings: if one of these changes, old logs on disk no longer decode.
    #[test]
    fn encodings_are_frozen() {
        let register = entry(Command::RegisterNode {
            node: 3,
            addr: "10.0.0.3:7070".into(),
            labels: BTreeMap::from([("rack".into(), "r1".into())]),
        });
        expect![[r#"{"proposed_at_ms":1700000000000,"cmd":{"type":"register_node","node":3,"addr":"10.0.0.3:7070","labels":{"rack":"r1"}}}"#]]
            .assert_eq(&serde_json::to_string(&register).unwrap_or_default());

        let label = entry(Command::SetNodeLabels {
            node: 3,
            set: BTreeMap::from([("zone".into(), "b".into())]),
            remove: BTreeSet::from(["rack".into()]),
        });
        expect![[r#"{"proposed_at_ms":1700000000000,"cmd":{"type":"set_node_labels","node":3,"set":{"zone":"b"},"remove":["rack"]}}"#]]
            .assert_eq(&serde_json::to_string(&label).unwrap_or_default());
    }

    #[test]
    fn old_entries_without_optional_fields_decode() {
        let old = r#"{"proposed_at_ms":5,"cmd":{"type":"register_node","node":1,"addr":"a:1"}}"#;
        let decoded: LogEntry = serde_json::from_str(old).expect("old entry decodes");
        assert_eq!(
            decoded.cmd,
            Command::RegisterNode {
                node: 1,
                addr: "a:1".into(),
                labels: BTreeMap::new()
            }
        );
    }

    #[test]
    fn display_is_compact() {
        let e = entry(Command::SetNodeLabels {
            node: 2,
            set: BTreeMap::from([("a".into(), "b".into())]),
            remove: BTreeSet::new(),
        });
        assert_eq!(e.to_string(), "label n2 +1 -0 @1700000000000ms");
    }
}
