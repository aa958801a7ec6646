//! What this host reports when it registers: its GPUs (from the backend), CPU cores and memory.

use gpu_raft_store::{GpuRecord, Inventory};

use crate::gpu::GpuBackend;

pub fn collect(gpus: &dyn GpuBackend) -> Inventory {
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
                nvlink_peers: d.nvlink_peers,
                healthy: true,
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
