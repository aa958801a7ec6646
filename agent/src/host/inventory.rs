//! What this host reports about itself — its GPUs (with health from the backend), CPU cores
//! and memory — and the task that registers it at start and again whenever it changes.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use gpu_raft_store::{Command, GpuRecord, Inventory, NodeId};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::gpu::GpuBackend;
use crate::monitor::{Reading, Telemetry};
use crate::raft::Cluster;

/// Registers this node, then re-registers whenever its inventory changes (a GPU lost or back).
pub(crate) struct InventoryReporter {
    pub cluster: Cluster,
    pub gpus: Arc<dyn GpuBackend>,
    /// Health comes from the sampler's latest readings.
    pub telemetry: Telemetry,
    pub node_id: NodeId,
    pub addr: String,
    pub labels: BTreeMap<String, String>,
    /// The edge site terms this agent registers with, if it is at one.
    pub edge: Option<gpu_raft_store::EdgeTerms>,
    pub interval: Duration,
}

impl InventoryReporter {
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let mut registered: Option<Inventory> = None;
        loop {
            let inventory = collect(self.gpus.as_ref(), &self.telemetry.latest());
            if registered.as_ref() != Some(&inventory) {
                let cmd = Command::RegisterNode {
                    node: self.node_id,
                    addr: self.addr.clone(),
                    labels: self.labels.clone(),
                    inventory: inventory.clone(),
                    edge: self.edge.clone(),
                    protocol: crate::raft::protocol::PROTOCOL_VERSION,
                };
                match self.cluster.write(cmd).await {
                    Ok(_) => {
                        let unhealthy = inventory.gpus.iter().filter(|g| !g.healthy).count();
                        let first = registered.is_none();
                        info!(
                            node_id = self.node_id,
                            gpus = inventory.gpus.len(),
                            unhealthy,
                            first,
                            "registered"
                        );
                        registered = Some(inventory);
                    }
                    Err(e) => {
                        warn!(node_id = self.node_id, error = %e, "registration failed; retrying")
                    }
                }
            }
            let wait = if registered.is_some() {
                self.interval
            } else {
                Duration::from_secs(1)
            };
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}

/// This host as the cluster should see it now. A GPU whose latest sample could not read it is
/// unhealthy, so the scheduler stops placing work on it.
pub(crate) fn collect(gpus: &dyn GpuBackend, latest: &[Reading]) -> Inventory {
    let unhealthy: HashSet<u32> = latest
        .iter()
        .filter(|r| !r.sample.healthy)
        .map(|r| r.sample.index)
        .collect();
    Inventory {
        gpus: gpus
            .devices()
            .into_iter()
            .map(|d| GpuRecord {
                index: d.index,
                uuid: d.uuid,
                model: d.model,
                gpu_type: d.gpu_type,
                memory_mib: d.memory_mib,
                numa_node: d.numa_node,
                healthy: !unhealthy.contains(&d.index),
                nvlink_peers: d.nvlink_peers,
            })
            .collect(),
        cpu_cores: std::thread::available_parallelism()
            .map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX)),
        memory_mib: memory_mib().unwrap_or(0),
    }
}

/// `MemTotal` from /proc/meminfo, in MiB.
fn memory_mib() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}
