//! The simulated cluster: `56x8xV100-32GB` (nodes × GPUs-per-node × model), several groups
//! joined with `+` (`40x8xV100-32GB+16x4xT4-16GB`), turned into a real `ClusterState` through
//! the same `RegisterNode` command the agents use.

use std::collections::BTreeMap;

use gpu_raft_store::{ApplyResult, ClusterState, Command, GpuRecord, Inventory, LogEntry};

use crate::gpu::sim::parse_spec;

/// Most nodes a simulated cluster may have.
pub(crate) const MAX_NODES: u64 = 100_000;

/// A cluster spec that cannot be built.
#[derive(Debug, thiserror::Error)]
#[error("invalid cluster {spec:?}: {reason}")]
pub(crate) struct BadCluster {
    pub spec: String,
    pub reason: String,
}

/// The state of a cluster of idle, healthy, registered nodes, and its GPU count.
pub(crate) fn build(spec: &str) -> Result<(ClusterState, u64), BadCluster> {
    let bad = |reason: String| BadCluster {
        spec: spec.to_owned(),
        reason,
    };
    if spec.trim().is_empty() {
        return Err(bad(
            "empty; expected NODESxGPUSxMODEL, e.g. 56x8xV100-32GB".into()
        ));
    }
    let mut state = ClusterState::new();
    let mut next_id = 1u64;
    let mut total_gpus = 0u64;
    for group in spec.split('+').map(str::trim) {
        let (count, per_node) = group
            .split_once('x')
            .ok_or_else(|| bad(format!("group {group:?} is not NODESxGPUSxMODEL")))?;
        let nodes: u64 = count
            .trim()
            .parse()
            .map_err(|_| bad(format!("node count {count:?} is not a whole number")))?;
        if nodes == 0 {
            return Err(bad(format!("group {group:?} has no nodes")));
        }
        if next_id - 1 + nodes > MAX_NODES {
            return Err(bad(format!("more than {MAX_NODES} nodes")));
        }
        let models = parse_spec(per_node).map_err(|e| bad(e.to_string()))?;
        let gpus = node_gpus(&models);
        for _ in 0..nodes {
            let result = state.apply(&LogEntry {
                proposed_at_ms: 0,
                cmd: Command::RegisterNode {
                    node: next_id,
                    addr: format!("sim-{next_id}:0"),
                    labels: BTreeMap::new(),
                    inventory: Inventory {
                        gpus: gpus.clone(),
                        cpu_cores: 64,
                        memory_mib: 512 * 1024,
                    },
                    edge: None,
                    protocol: 1,
                },
                meta: None,
                request: None,
            });
            if let ApplyResult::Rejected { reason } = result {
                return Err(bad(reason.to_string()));
            }
            next_id += 1;
            total_gpus += gpus.len() as u64;
        }
    }
    Ok((state, total_gpus))
}

/// A node's GPUs: two NUMA nodes split evenly; NVLink among all GPUs of an NVLink model.
fn node_gpus(models: &[(&'static crate::gpu::models::GpuModel, u32)]) -> Vec<GpuRecord> {
    let total: u32 = models.iter().map(|(_, n)| n).sum();
    let half = total.div_ceil(2).max(1);
    let mut out = Vec::new();
    for (model, count) in models {
        let first = out.len() as u32;
        for k in 0..*count {
            let index = first + k;
            let peers = if model.nvlink {
                (first..first + count).filter(|&p| p != index).collect()
            } else {
                vec![]
            };
            out.push(GpuRecord {
                index,
                uuid: format!("GPU-sim-{index}"),
                model: model.name.to_owned(),
                gpu_type: model.gpu_type.to_owned(),
                memory_mib: model.memory_mib,
                numa_node: Some(index / half),
                nvlink_peers: peers,
                healthy: true,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_the_requested_nodes() {
        let (s, gpus) = build("2x8xV100-32GB+1x4xT4-16GB").expect("build");
        assert_eq!(s.nodes.len(), 3);
        assert_eq!(gpus, 20);
        let n1 = &s.nodes[&1];
        assert_eq!(n1.inventory.gpus.len(), 8);
        assert_eq!(n1.inventory.gpus[5].numa_node, Some(1));
        assert_eq!(s.nodes[&3].inventory.gpus[0].gpu_type, "T4");
    }

    #[test]
    fn impossible_clusters_are_clear_errors() {
        for (spec, says) in [
            ("", "empty"),
            ("0x8xV100-32GB", "no nodes"),
            ("ax8xV100-32GB", "not a whole number"),
            ("4", "NODESxGPUSxMODEL"),
            ("4x0xV100-32GB", "count 0"),
            ("4x8xB300", "unknown GPU model"),
            ("4x9999xV100-32GB", "per node"),
            ("100001x8xV100-32GB", "more than 100000 nodes"),
        ] {
            let err = build(spec).expect_err(spec).to_string();
            assert!(err.contains(says), "{spec:?}: {err}");
        }
    }
}
