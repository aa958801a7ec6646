//! Nodes in the replicated state: a registered agent, its GPU inventory, its schedulability
//! and which job holds each of its GPUs.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::model::job::JobSpec;
use crate::model::partition::{GpuMode, GpuPartition, Holds, PartitionSpec, Slice};
use crate::{JobId, NodeId};

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

/// The label naming a node's site; placement selects on it like on any label.
pub const SITE_LABEL: &str = "site";

/// The label an agent sets to the container runtime it runs container jobs with (`podman`,
/// `apptainer`, `enroot`). Container jobs are placed only on nodes that carry it.
pub const CONTAINER_RUNTIME_LABEL: &str = "gpumesh.io/container-runtime";

/// The terms an edge-site node runs under, from its agent's `[edge]` configuration, recorded
/// by `apply` at registration so that every leader judges the node by the same grace. Every
/// node of one site must bring the same terms (a mismatch is refused, so sites cannot drift).
///
/// The safety rule is the one of `jobs.lease` / `jobs.down_after`, per site: the node fences
/// its jobs `lease_ms` after it last heard from the cluster, and the leader declares it down
/// (re-placing its jobs) only `down_after_ms` ≥ 1.5 × `lease_ms` after it last heard from it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeTerms {
    /// The node's `site` label when it registered.
    pub site: String,
    pub lease_ms: u64,
    pub down_after_ms: u64,
}

/// The shortest edge lease: an edge node tolerates at least this long a disconnection.
pub const MIN_EDGE_LEASE_MS: u64 = 1_000;

impl EdgeTerms {
    /// Why the terms are unusable, if they are.
    pub fn validate(&self) -> Result<(), String> {
        crate::model::validate::label_value(&self.site)?;
        if self.site.is_empty() {
            return Err("an edge site needs a name (the node's `site` label)".into());
        }
        if self.lease_ms < MIN_EDGE_LEASE_MS {
            return Err(format!(
                "edge lease must be at least {MIN_EDGE_LEASE_MS} ms, got {}",
                self.lease_ms
            ));
        }
        if self.down_after_ms < self.lease_ms.saturating_add(self.lease_ms / 2) {
            return Err(format!(
                "edge down_after ({} ms) must be at least 1.5 x its lease ({} ms), so a cut-off \
                 node fences its jobs before they are re-placed",
                self.down_after_ms, self.lease_ms
            ));
        }
        Ok(())
    }
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
    /// GPU index → its partitioning (absent: a whole GPU). Kept across registrations; set
    /// by `SetGpuPartition`. Maintained only by `apply`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub partitions: BTreeMap<u32, GpuPartition>,
    /// GPU index → the slices (MIG instances, shares) live jobs hold on it. Maintained only
    /// by `apply`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub slices: BTreeMap<u32, Holds>,
    /// Set when the node is at an edge site: a learner only, judged down after its site's
    /// grace rather than `jobs.down_after`. Maintained only by registration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edge: Option<EdgeTerms>,
    /// The internal protocol version its agent announced at its last registration.
    #[serde(default = "first_protocol", skip_serializing_if = "is_first_protocol")]
    pub protocol: u32,
    /// The container images its runtime holds, by canonical name (`container::canonical_image`),
    /// as its agent last reported them (`Command::ReportImages`; at most
    /// `container::MAX_NODE_IMAGES`). Placement prefers nodes that hold a job's image.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub images: BTreeSet<String>,
    pub registered_at_ms: u64,
    pub updated_at_ms: u64,
}

/// The internal protocol version of agents that announce none.
pub fn first_protocol() -> u32 {
    1
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's `skip_serializing_if` signature.
pub fn is_first_protocol(v: &u32) -> bool {
    *v == first_protocol()
}

impl NodeRecord {
    /// What placement sees: agent labels overlaid by operator labels, plus `gpu_type` for each
    /// GPU type present.
    pub fn effective_labels(&self) -> Cow<'_, BTreeMap<String, String>> {
        if self.labels.is_empty() {
            return Cow::Borrowed(&self.agent_labels);
        }
        if self.agent_labels.is_empty() {
            return Cow::Borrowed(&self.labels);
        }
        let mut all = self.agent_labels.clone();
        all.extend(self.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        Cow::Owned(all)
    }

    /// The operator's labels after `SetNodeLabels { set, remove }`: `remove` taken out, then
    /// `set` written over them.
    pub fn labels_after(
        &self,
        set: &BTreeMap<String, String>,
        remove: &BTreeSet<String>,
    ) -> BTreeMap<String, String> {
        let mut labels = self.labels.clone();
        for key in remove {
            labels.remove(key);
        }
        labels.extend(set.iter().map(|(k, v)| (k.clone(), v.clone())));
        labels
    }

    pub fn gpu(&self, index: u32) -> Option<&GpuRecord> {
        self.inventory.gpus.iter().find(|g| g.index == index)
    }

    /// Whole GPUs (not partitioned, not draining for a change) that are healthy, not
    /// quarantined and that no live job holds: what whole-GPU jobs may take.
    pub fn free_gpus(&self) -> impl Iterator<Item = &GpuRecord> {
        // Every pass asks this of every node. On a node without partitions, quarantines or
        // slices, a healthy GPU is free unless a job holds it: one look at the allocations
        // (those below 64 as bits) instead of five map lookups per GPU.
        let plain =
            self.partitions.is_empty() && self.quarantined.is_empty() && self.slices.is_empty();
        let held = plain.then(|| AllocatedSet::of(&self.allocations));
        self.inventory.gpus.iter().filter(move |g| match &held {
            Some(held) => g.healthy && !held.contains(g.index, &self.allocations),
            None => self.is_free_in(g, GpuMode::Whole),
        })
    }

    /// Usable GPUs in `mode` that no live job holds (or a slice of).
    pub fn free_in_mode(&self, mode: GpuMode) -> impl Iterator<Item = &GpuRecord> {
        self.inventory
            .gpus
            .iter()
            .filter(move |g| self.is_free_in(g, mode))
    }

    fn is_free_in(&self, g: &GpuRecord, mode: GpuMode) -> bool {
        self.gpu_usable(g) && self.mode(g.index) == mode && !self.gpu_busy(g.index)
    }

    /// Ready and not cordoned.
    pub fn accepts_work(&self) -> bool {
        self.status == NodeStatus::Ready && !self.cordoned
    }
}

/// Partitioning: modes, layouts and slices of the node's GPUs.
impl NodeRecord {
    /// The partitioning in force on GPU `index` (whole when none is recorded).
    pub fn partition(&self, index: u32) -> PartitionSpec {
        self.partitions
            .get(&index)
            .map(|p| p.current.clone())
            .unwrap_or_default()
    }

    pub fn mode(&self, index: u32) -> GpuMode {
        self.partitions
            .get(&index)
            .map_or(GpuMode::Whole, |p| p.current.mode)
    }

    /// A change is waiting for this GPU to drain: nothing new goes on it.
    pub fn draining(&self, index: u32) -> bool {
        self.partitions
            .get(&index)
            .is_some_and(|p| p.pending.is_some())
    }

    /// Whether any live job holds the GPU or a slice of it.
    pub fn gpu_busy(&self, index: u32) -> bool {
        self.allocations.contains_key(&index)
            || self.slices.get(&index).is_some_and(|s| !s.is_empty())
    }

    /// Whether new work of any kind may go on this GPU (healthy, not quarantined, not
    /// draining for a partition change).
    pub fn gpu_usable(&self, g: &GpuRecord) -> bool {
        g.healthy && !self.quarantined.contains_key(&g.index) && !self.draining(g.index)
    }

    /// Memory and compute share already held on a shared GPU.
    pub fn shared_used(&self, index: u32) -> (u64, u32) {
        self.slices.get(&index).map_or((0, 0), |holds| {
            holds.values().fold((0, 0), |(m, s), slice| match slice {
                Slice::Shared { memory_mib, share } => (m + memory_mib, s + share),
                Slice::Mig { .. } => (m, s),
            })
        })
    }

    /// Start slices of the MIG instances live jobs hold on this GPU.
    pub fn mig_held(&self, index: u32) -> Vec<u8> {
        self.slices.get(&index).map_or_else(Vec::new, |holds| {
            holds
                .values()
                .filter_map(|s| match s {
                    Slice::Mig { start, .. } => Some(*start),
                    Slice::Shared { .. } => None,
                })
                .collect()
        })
    }
}

/// Whether one GPU satisfies a job's GPU selector (type and memory).
pub fn gpu_fits(gpu: &GpuRecord, spec: &JobSpec) -> bool {
    (spec.gpu_types.is_empty() || spec.gpu_types.contains(&gpu.gpu_type))
        && gpu.memory_mib >= spec.min_gpu_memory_mib
}

/// A node's allocated GPU indexes: those below 64 as bits, the rest looked up in the map.
struct AllocatedSet(u64);

impl AllocatedSet {
    fn of(allocations: &BTreeMap<u32, JobId>) -> Self {
        let bits = allocations
            .keys()
            .filter(|&&i| i < 64)
            .fold(0, |bits, &i| bits | 1 << i);
        Self(bits)
    }

    fn contains(&self, index: u32, allocations: &BTreeMap<u32, JobId>) -> bool {
        if index < 64 {
            self.0 & 1 << index != 0
        } else {
            allocations.contains_key(&index)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_agents_own_labels_are_under_their_prefix() {
        use crate::model::validate::{AGENT_LABEL_PREFIX, user_label_key};
        assert!(super::CONTAINER_RUNTIME_LABEL.starts_with(AGENT_LABEL_PREFIX));
        assert!(user_label_key(super::CONTAINER_RUNTIME_LABEL).is_err());
    }
}
