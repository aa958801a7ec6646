//! Test helpers for the scheduler: GPUs, nodes, specs, and applying commands to a state.

use std::collections::BTreeMap;

use gpu_raft_store::{
    ApplyResult, ClusterState, Command, GpuRecord, Inventory, JobSpec, LogEntry, NodeId,
};
pub(crate) fn gpu(index: u32, gpu_type: &str, numa: u32) -> GpuRecord {
    GpuRecord {
        index,
        uuid: format!("GPU-{index}"),
        model: format!("{gpu_type}-80GB"),
        gpu_type: gpu_type.into(),
        memory_mib: if gpu_type == "T4" { 15360 } else { 81920 },
        numa_node: Some(numa),
        nvlink_peers: vec![],
        healthy: true,
    }
}

pub(crate) fn apply_at(s: &mut ClusterState, now_ms: u64, cmd: Command) -> ApplyResult {
    s.apply(&LogEntry {
        proposed_at_ms: now_ms,
        cmd,
        meta: None,
        request: None,
    })
}

pub(crate) fn apply(s: &mut ClusterState, cmd: Command) -> ApplyResult {
    apply_at(s, 1, cmd)
}

pub(crate) fn node(s: &mut ClusterState, id: NodeId, gpus: Vec<GpuRecord>) {
    let inventory = Inventory {
        gpus,
        cpu_cores: 8,
        memory_mib: 1 << 16,
    };
    apply(
        s,
        Command::RegisterNode {
            node: id,
            addr: format!("h:{id}"),
            labels: BTreeMap::new(),
            inventory,
            edge: None,
            protocol: 1,
        },
    );
}

pub(crate) fn spec(gpus: u32, priority: i32) -> JobSpec {
    JobSpec {
        name: "j".into(),
        command: vec!["true".into()],
        gpus,
        priority,
        ..JobSpec::default()
    }
}

pub(crate) fn submit(s: &mut ClusterState, spec: JobSpec) {
    submit_at(s, 1, spec);
}

pub(crate) fn submit_at(s: &mut ClusterState, now_ms: u64, spec: JobSpec) {
    apply_at(s, now_ms, Command::submit(spec));
}

/// Every ordering with each backfill mode the property tests exercise.
pub(crate) const POLICIES: [&str; 14] = [
    "fcfs",
    "fcfs+easy",
    "fcfs+conservative",
    "sjf",
    "sjf+easy",
    "sjf+conservative",
    "priority",
    "priority+easy",
    "fairshare",
    "fairshare+easy",
    "fairshare+greedy",
    "fairshare+conservative",
    "learned",
    "learned+easy",
];
