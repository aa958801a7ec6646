//! The replicated domain state and its pure, deterministic `apply`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::command::{ApplyResult, Command, LogEntry, Rejection};
use crate::{NodeId, validate};

/// Everything the cluster agrees on (besides Raft membership, which openraft tracks).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterState {
    #[serde(default)]
    pub nodes: BTreeMap<NodeId, NodeRecord>,
}

/// A registered agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub id: NodeId,
    pub addr: String,
    /// Labels from the agent's own configuration, replaced at every registration.
    #[serde(default)]
    pub agent_labels: BTreeMap<String, String>,
    /// Labels set by operators through the API; they survive agent restarts and win over
    /// agent labels with the same key.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub registered_at_ms: u64,
    pub updated_at_ms: u64,
}

impl NodeRecord {
    /// What placement sees: agent labels overlaid by operator labels.
    pub fn effective_labels(&self) -> BTreeMap<String, String> {
        let mut all = self.agent_labels.clone();
        all.extend(self.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        all
    }
}

impl ClusterState {
    /// Apply one entry. Pure: the result depends only on `self` and `entry`. A rejected command
    /// leaves the state untouched.
    pub fn apply(&mut self, entry: &LogEntry) -> ApplyResult {
        match self.try_apply(entry) {
            Ok(()) => ApplyResult::Ok,
            Err(reason) => ApplyResult::Rejected { reason },
        }
    }

    fn try_apply(&mut self, entry: &LogEntry) -> Result<(), Rejection> {
        let now = entry.proposed_at_ms;
        match &entry.cmd {
            Command::RegisterNode { node, addr, labels } => {
                validate::addr(addr).map_err(invalid)?;
                validate::labels(labels).map_err(invalid)?;
                let record = self.nodes.entry(*node).or_insert_with(|| NodeRecord {
                    id: *node,
                    addr: String::new(),
                    agent_labels: BTreeMap::new(),
                    labels: BTreeMap::new(),
                    registered_at_ms: now,
                    updated_at_ms: now,
                });
                record.addr.clone_from(addr);
                record.agent_labels.clone_from(labels);
                record.updated_at_ms = now;
                Ok(())
            }
            Command::SetNodeLabels { node, set, remove } => {
                let record = self
                    .nodes
                    .get(node)
                    .ok_or(Rejection::UnknownNode { node: *node })?;
                let mut labels = record.labels.clone();
                for key in remove {
                    labels.remove(key);
                }
                labels.extend(set.iter().map(|(k, v)| (k.clone(), v.clone())));
                validate::labels(&labels).map_err(invalid)?;
                let record = self
                    .nodes
                    .get_mut(node)
                    .ok_or(Rejection::UnknownNode { node: *node })?;
                record.labels = labels;
                record.updated_at_ms = now;
                Ok(())
            }
        }
    }
}

fn invalid(message: String) -> Rejection {
    Rejection::Invalid { message }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn at(ms: u64, cmd: Command) -> LogEntry {
        LogEntry {
            proposed_at_ms: ms,
            cmd,
        }
    }

    fn register(node: NodeId) -> Command {
        Command::RegisterNode {
            node,
            addr: format!("127.0.0.1:{}", 7000 + node),
            labels: BTreeMap::new(),
        }
    }

    #[test]
    fn register_is_an_upsert_keeping_first_registration_time() {
        let mut s = ClusterState::default();
        assert_eq!(s.apply(&at(10, register(1))), ApplyResult::Ok);
        assert_eq!(s.apply(&at(20, register(1))), ApplyResult::Ok);
        let n = &s.nodes[&1];
        assert_eq!((n.registered_at_ms, n.updated_at_ms), (10, 20));
    }

    #[test]
    fn labels_on_unknown_node_are_rejected_without_change() {
        let mut s = ClusterState::default();
        let before = s.clone();
        let cmd = Command::SetNodeLabels {
            node: 9,
            set: BTreeMap::from([("a".into(), "b".into())]),
            remove: BTreeSet::new(),
        };
        assert_eq!(
            s.apply(&at(1, cmd)),
            ApplyResult::Rejected {
                reason: Rejection::UnknownNode { node: 9 }
            }
        );
        assert_eq!(s, before);
    }

    #[test]
    fn invalid_labels_are_rejected_atomically() {
        let mut s = ClusterState::default();
        s.apply(&at(1, register(1)));
        let before = s.clone();
        let cmd = Command::SetNodeLabels {
            node: 1,
            set: BTreeMap::from([("ok".into(), "v".into()), ("../evil".into(), "v".into())]),
            remove: BTreeSet::new(),
        };
        assert!(matches!(s.apply(&at(2, cmd)), ApplyResult::Rejected { .. }));
        assert_eq!(s, before, "a rejected command must not half-apply");
    }

    #[test]
    fn re_registration_keeps_operator_labels() {
        let mut s = ClusterState::default();
        let with_rack = |rack: &str| Command::RegisterNode {
            node: 1,
            addr: "h:1".into(),
            labels: BTreeMap::from([("rack".into(), rack.into())]),
        };
        s.apply(&at(1, with_rack("r1")));
        let zone = Command::SetNodeLabels {
            node: 1,
            set: BTreeMap::from([
                ("zone".into(), "b".into()),
                ("rack".into(), "override".into()),
            ]),
            remove: BTreeSet::new(),
        };
        s.apply(&at(2, zone));
        s.apply(&at(3, with_rack("r2")));
        let n = &s.nodes[&1];
        assert_eq!(n.agent_labels["rack"], "r2");
        assert_eq!(
            n.effective_labels(),
            BTreeMap::from([
                ("rack".into(), "override".into()),
                ("zone".into(), "b".into())
            ])
        );
    }

    #[test]
    fn set_and_remove_labels() {
        let mut s = ClusterState::default();
        s.apply(&at(1, register(1)));
        let set = |k: &str, v: &str| Command::SetNodeLabels {
            node: 1,
            set: BTreeMap::from([(k.into(), v.into())]),
            remove: BTreeSet::new(),
        };
        s.apply(&at(2, set("zone", "a")));
        s.apply(&at(3, set("rack", "r7")));
        s.apply(&at(
            4,
            Command::SetNodeLabels {
                node: 1,
                set: BTreeMap::new(),
                remove: BTreeSet::from(["zone".into()]),
            },
        ));
        assert_eq!(
            s.nodes[&1].labels,
            BTreeMap::from([("rack".into(), "r7".into())])
        );
        assert_eq!(s.nodes[&1].updated_at_ms, 4);
    }
}
