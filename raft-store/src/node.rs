//! Nodes in the replicated state: a registered agent, its GPU inventory, its schedulability
//! and which job holds each of its GPUs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::NodeId;
use crate::job::JobId;

/// One physical GPU as the cluster schedules it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuRecord {
    pub index: u32,
    pub uuid: String,
    pub model: String,
    /// The `gpu_type` label, e.g. `A100`.
    pub gpu_type: String,
    pub memory_mib: u64,
    #[serde(default)]
    pub numa_node: Option<u32>,
    #[serde(default)]
    pub nvlink_peers: Vec<u32>,
    #[serde(default = "healthy")]
    pub healthy: bool,
}

fn healthy() -> bool {
    true
}

/// What an agent reports about its host when it registers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    #[serde(default)]
    pub gpus: Vec<GpuRecord>,
    #[serde(default)]
    pub cpu_cores: u32,
    #[serde(default)]
    pub memory_mib: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeStatus {
    #[default]
    Ready,
    /// The leader has not heard from it for longer than the down grace.
    Down,
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
    #[serde(default)]
    pub inventory: Inventory,
    #[serde(default)]
    pub status: NodeStatus,
    /// No new work is placed on a cordoned node.
    #[serde(default)]
    pub cordoned: bool,
    /// GPU index → the live job holding it. Maintained only by `apply`.
    #[serde(default)]
    pub allocations: BTreeMap<u32, JobId>,
    /// GPU index → the alert rule that took it out of service (no new work until it resolves).
    /// Maintained only by `apply`.
    #[serde(default)]
    pub quarantined: BTreeMap<u32, String>,
    pub registered_at_ms: u64,
    pub updated_at_ms: u64,
}

impl NodeRecord {
    /// What placement sees: agent labels overlaid by operator labels, plus `gpu_type` for each
    /// GPU type present.
    pub fn effective_labels(&self) -> BTreeMap<String, String> {
        let mut all = self.agent_labels.clone();
        all.extend(self.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        all
    }

    pub fn gpu(&self, index: u32) -> Option<&GpuRecord> {
        self.inventory.gpus.iter().find(|g| g.index == index)
    }

    /// Healthy GPUs that are not quarantined and that no live job holds.
    pub fn free_gpus(&self) -> impl Iterator<Item = &GpuRecord> {
        self.inventory.gpus.iter().filter(|g| {
            g.healthy
                && !self.quarantined.contains_key(&g.index)
                && !self.allocations.contains_key(&g.index)
        })
    }

    /// Ready and not cordoned.
    pub fn accepts_work(&self) -> bool {
        self.status == NodeStatus::Ready && !self.cordoned
    }
}
