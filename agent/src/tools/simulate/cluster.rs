//! The simulated cluster: `56x8xV100-32GB` (nodes × GPUs-per-node × model), several groups
//! joined with `+` (`40x8xV100-32GB+16x4xT4-16GB`), turned into a real `ClusterState` through
//! the same `RegisterNode` command the agents use. A group's GPUs may be partitioned, through
//! the same `SetGpuPartition` an admin's `gpuctl gpu partition` proposes: `:shared` (shares of
//! a GPU, for jobs on a fraction of one) or `:mig=PROFILE,PROFILE,...` (that MIG layout on every
//! GPU: `8x8xA100-80GB:mig=3g.40gb,2g.20gb,1g.10gb,1g.10gb`).

use std::collections::BTreeMap;

use gpu_raft_store::{
    ApplyResult, ClusterState, Command, GpuMode, GpuRecord, Inventory, LogEntry, PartitionSpec,
};

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
        let (group, partition) = match group.split_once(':') {
            Some((g, p)) => (g, Some(p)),
            None => (group, None),
        };
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
        let partition = partition
            .map(|p| partition_of(p, &gpus))
            .transpose()
            .map_err(bad)?;
        for _ in 0..nodes {
            let mut commands = vec![Command::RegisterNode {
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
            }];
            if let Some(partition) = &partition {
                commands.extend(gpus.iter().map(|gpu| Command::SetGpuPartition {
                    node: next_id,
                    gpu: gpu.index,
                    partition: partition.clone(),
                    if_idle: false,
                }));
            }
            for cmd in commands {
                let entry = LogEntry {
                    proposed_at_ms: 0,
                    cmd,
                    meta: None,
                    request: None,
                };
                if let ApplyResult::Rejected { reason } = state.apply(&entry) {
                    return Err(bad(reason.to_string()));
                }
            }
            next_id += 1;
            total_gpus += gpus.len() as u64;
        }
    }
    Ok((state, total_gpus))
}

/// The partition a group's `:shared` or `:mig=...` suffix puts on each of its GPUs (all of one
/// model for MIG).
fn partition_of(text: &str, gpus: &[GpuRecord]) -> Result<PartitionSpec, String> {
    if text == "shared" {
        return Ok(PartitionSpec {
            mode: GpuMode::Shared,
            mig: Vec::new(),
        });
    }
    let Some(profiles) = text.strip_prefix("mig=") else {
        return Err(format!(
            "partition {text:?} is not `shared` or `mig=PROFILE,...`"
        ));
    };
    let model = gpus.first().map(|g| g.model.as_str()).unwrap_or_default();
    if gpus.iter().any(|g| g.model != model) {
        return Err("a MIG layout needs a group of one GPU model".into());
    }
    let mig =
        gpu_raft_store::mig::model(model).ok_or_else(|| format!("{model} is not MIG-capable"))?;
    let entries: Vec<String> = profiles.split(',').map(|p| p.trim().to_owned()).collect();
    Ok(PartitionSpec {
        mode: GpuMode::Mig,
        mig: mig.parse_layout(&entries)?,
    })
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
    fn a_group_may_be_shared_or_split_into_mig_instances() {
        let (s, gpus) = build("1x2xA100-80GB:mig=3g.40gb,3g.40gb+1x4xT4-16GB:shared+1x1xT4-16GB")
            .expect("build");
        assert_eq!(gpus, 7);
        let modes = |n: u64| -> Vec<GpuMode> {
            (0..s.nodes[&n].inventory.gpus.len() as u32)
                .map(|g| s.nodes[&n].mode(g))
                .collect()
        };
        assert_eq!(modes(1), [GpuMode::Mig; 2]);
        assert_eq!(modes(2), [GpuMode::Shared; 4]);
        assert_eq!(modes(3), [GpuMode::Whole]);
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
            ("1x8xV100-32GB:mig=1g.10gb", "not MIG-capable"),
            ("1x8xA100-80GB:mig=9g.99gb", "does not support"),
            ("1x8xA100-80GB:whole", "is not `shared`"),
        ] {
            let err = build(spec).expect_err(spec).to_string();
            assert!(err.contains(says), "{spec:?}: {err}");
        }
    }
}
