//! Node liveness (leader only): a registered node the leader has not heard from for its down
//! grace is marked Down — which requeues its jobs — and marked Ready again once it is heard
//! from. The grace is `jobs.down_after`, or for a node at an edge site the `down_after` its
//! registration recorded in the replicated state (so every leader judges it alike). The grace
//! exceeds the node's lease, so a silent node has fenced its own jobs before they are placed
//! elsewhere. Verdicts are proposed by this leader only, never forwarded.

use std::time::Duration;

use gpu_raft_store::{Command, NodeRecord, NodeStatus};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::ticks::LeaderTicks;
use crate::raft::{Attempt, Cluster, Proposal};

pub(crate) struct Liveness {
    pub cluster: Cluster,
    /// The grace of nodes that are not at an edge site.
    pub down_after: Duration,
    pub reachable_within: Duration,
    pub interval: Duration,
}

impl Liveness {
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let mut ticks = LeaderTicks::new(self.cluster.clone(), self.interval);
        while let Some((_, since)) = ticks.next(&cancel).await {
            let nodes: Vec<(u64, NodeStatus, Duration)> = self.cluster.state.read(|s| {
                s.nodes
                    .values()
                    .map(|n| (n.id, n.status, down_grace(n, self.down_after)))
                    .collect()
            });
            for (node, status, down_after) in nodes {
                let silent = if node == self.cluster.id {
                    Duration::ZERO
                } else {
                    self.cluster.contacts.silent_for(node, since)
                };
                let verdict = match status {
                    NodeStatus::Ready if silent > down_after => NodeStatus::Down,
                    NodeStatus::Down if silent <= self.reachable_within => NodeStatus::Ready,
                    _ => continue,
                };
                info!(
                    node_id = node,
                    ?verdict,
                    silent_ms = silent.as_millis() as u64,
                    grace_ms = down_after.as_millis() as u64,
                    "node liveness changed"
                );
                // Proposed only as this leader, never retried or forwarded: a verdict made by a
                // leader that lost its quorum (and so heard nobody) must not reach its successor.
                let proposal = Proposal {
                    cmd: Command::SetNodeStatus {
                        node,
                        status: verdict,
                        // Jobs asked to stop are requeued without spending an attempt, once
                        // every member applies the verdict that way.
                        requeue_evicting: self.cluster.lowest_protocol()
                            >= gpu_raft_store::PROTOCOL_6,
                    },
                    meta: None,
                    credential: None,
                };
                if let Err(Attempt::Retry(e) | Attempt::Fail(e)) =
                    self.cluster.write_as_leader(proposal).await
                {
                    warn!(node_id = node, error = %e, "could not record node liveness");
                }
            }
        }
    }
}

/// How long the leader waits before declaring `node` down: its edge site's grace, as recorded
/// when it registered, or `default` (`jobs.down_after`).
pub(crate) fn down_grace(node: &NodeRecord, default: Duration) -> Duration {
    node.edge
        .as_ref()
        .map_or(default, |e| Duration::from_millis(e.down_after_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edge_node_is_judged_by_its_site_grace() {
        let mut record = gpu_raft_store::NodeRecord {
            id: 4,
            addr: "h:1".into(),
            agent_labels: Default::default(),
            labels: Default::default(),
            inventory: Default::default(),
            status: NodeStatus::Ready,
            cordoned: false,
            allocations: Default::default(),
            quarantined: Default::default(),
            partitions: Default::default(),
            slices: Default::default(),
            edge: None,
            protocol: 1,
            images: Default::default(),
            registered_at_ms: 0,
            updated_at_ms: 0,
        };
        let default = Duration::from_secs(20);
        assert_eq!(down_grace(&record, default), default);
        record.edge = Some(gpu_raft_store::EdgeTerms {
            site: "edge-1".into(),
            lease_ms: 120_000,
            down_after_ms: 180_000,
        });
        assert_eq!(down_grace(&record, default), Duration::from_secs(180));
    }
}
