//! Node liveness (leader only): a registered node the leader has not heard from for
//! `down_after` is marked Down — which requeues its jobs — and marked Ready again once it is
//! heard from. `down_after` exceeds the node lease, so a silent node has fenced its own jobs
//! before they are placed elsewhere. Verdicts are proposed by this leader only, never forwarded.

use std::time::{Duration, Instant};

use gpu_raft_store::{Command, NodeStatus};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::cluster::{Attempt, Cluster, Proposal};

pub struct Liveness {
    pub cluster: Cluster,
    pub down_after: Duration,
    pub reachable_within: Duration,
    pub interval: Duration,
}

impl Liveness {
    pub async fn run(self, cancel: CancellationToken) {
        let mut leader_since: Option<Instant> = None;
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(self.interval) => {}
            }
            if !self.cluster.view().is_leader {
                leader_since = None;
                continue;
            }
            let since = *leader_since.get_or_insert_with(Instant::now);
            let nodes: Vec<(u64, NodeStatus)> = self
                .cluster
                .state
                .read(|s| s.nodes.values().map(|n| (n.id, n.status)).collect());
            for (node, status) in nodes {
                let silent = if node == self.cluster.id {
                    Duration::ZERO
                } else {
                    self.cluster.contacts.silent_for(node, since)
                };
                let verdict = match status {
                    NodeStatus::Ready if silent > self.down_after => NodeStatus::Down,
                    NodeStatus::Down if silent <= self.reachable_within => NodeStatus::Ready,
                    _ => continue,
                };
                info!(
                    node_id = node,
                    ?verdict,
                    silent_ms = silent.as_millis() as u64,
                    "node liveness changed"
                );
                // Proposed only as this leader, never retried or forwarded: a verdict made by a
                // leader that lost its quorum (and so heard nobody) must not reach its successor.
                let proposal = Proposal {
                    cmd: Command::SetNodeStatus {
                        node,
                        status: verdict,
                    },
                    meta: None,
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
