//! How a GPU looks: its scheduling state, the cells of the GPU tables and the stable JSON object
//! shared by `gpu`, `gpu partition`, `node` and `top`. The JSON schema is documented in `gpu.rs`.

use gpu_proto::v1 as pb;
use serde_json::{Map, Value, json};

use crate::output;
use crate::units;

/// What the scheduler can do with a GPU: `free`, `busy` (a job holds it), `sliced` (jobs hold
/// some of its MIG instances or shares), `draining` (a new partition waits for its jobs to end),
/// `unhealthy`, or `quarantined` (an alert took it out of scheduling; a job may still hold it).
pub(super) fn state(g: &pb::Gpu) -> &'static str {
    if !g.healthy {
        "unhealthy"
    } else if !g.quarantined_by.is_empty() {
        "quarantined"
    } else if g.job_id.is_some() {
        "busy"
    } else if !g.pending_partition.is_empty() {
        "draining"
    } else if !g.slices.is_empty() {
        "sliced"
    } else {
        "free"
    }
}

/// `j-42`, or `-` when no job holds the GPU.
pub(super) fn job_cell(g: &pb::Gpu) -> String {
    g.job_id.map_or_else(|| "-".into(), |j| format!("j-{j}"))
}

/// The GPU's partitioning mode; `whole` when the server left it empty.
pub(super) fn mode(g: &pb::Gpu) -> &str {
    if g.mode.is_empty() { "whole" } else { &g.mode }
}

/// Mode and layout in one cell: `whole`, `mig[3g.40gb@0,1g.10gb@6]`, `shared`, with
/// ` -> PENDING` while a requested partition waits for the GPU to drain.
pub(super) fn partition_cell(g: &pb::Gpu) -> String {
    let mut cell = mode(g).to_owned();
    if !g.mig_layout.is_empty() {
        cell = format!("{cell}[{}]", g.mig_layout.join(","));
    }
    if !g.pending_partition.is_empty() {
        cell = format!("{cell} -> {}", g.pending_partition);
    }
    cell
}

/// What live jobs hold of a partitioned GPU: `2/7 mig` (instances in use of those in the
/// layout), `30GiB/50% shared` (memory and compute share held); `-` for a whole GPU.
pub(super) fn slices_cell(g: &pb::Gpu) -> String {
    match mode(g) {
        "mig" => format!("{}/{} mig", g.slices.len(), g.mig_layout.len()),
        "shared" => format!(
            "{}/{}% shared",
            units::gib(g.shared_memory_used_mib),
            g.shared_share_used
        ),
        _ => "-".into(),
    }
}

/// A GPU as part of a node.
pub(super) fn gpu_json(g: &pb::Gpu) -> Map<String, Value> {
    let value = json!({
        "index": g.index,
        "uuid": g.uuid,
        "model": g.model,
        "gpu_type": g.gpu_type,
        "memory_mib": g.memory_mib,
        "numa_node": g.numa_node,
        "nvlink_peers": g.nvlink_peers,
        "healthy": g.healthy,
        "job_id": g.job_id,
        "quarantined_by": (!g.quarantined_by.is_empty()).then_some(&g.quarantined_by),
        "mode": mode(g),
        "mig_layout": g.mig_layout,
        "pending_partition": (!g.pending_partition.is_empty()).then_some(&g.pending_partition),
        "slices": g.slices,
        "shared_memory_used_mib": g.shared_memory_used_mib,
        "shared_share_used": g.shared_share_used,
        "mig_profiles": g.mig_profiles,
    });
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

pub(super) fn status_json(s: &pb::GpuStatus) -> Value {
    let mut map = gpu_json(&s.gpu.clone().unwrap_or_default());
    map.insert("node_id".into(), s.node_id.into());
    let telemetry = s.telemetry.as_ref().map_or(Value::Null, telemetry_json);
    map.insert("telemetry".into(), telemetry);
    Value::Object(map)
}

pub(super) fn telemetry_json(t: &pb::GpuTelemetry) -> Value {
    json!({
        "utilization_pct": output::float(t.utilization_pct),
        "memory_utilization_pct": output::float(t.memory_utilization_pct),
        "memory_used_mib": t.memory_used_mib,
        "memory_total_mib": t.memory_total_mib,
        "temperature_c": output::float(t.temperature_c),
        "memory_temperature_c": output::float(t.memory_temperature_c),
        "power_w": output::float(t.power_w),
        "power_limit_w": output::float(t.power_limit_w),
        "energy_mj": t.energy_mj,
        "sm_clock_mhz": t.sm_clock_mhz,
        "memory_clock_mhz": t.memory_clock_mhz,
        "throttle_reasons": t.throttle_reason_names,
        "pcie_tx_kib_s": t.pcie_tx_kib_s,
        "pcie_rx_kib_s": t.pcie_rx_kib_s,
        "pcie_replays": t.pcie_replays,
        "nvlink_tx_kib": t.nvlink_tx_kib,
        "nvlink_rx_kib": t.nvlink_rx_kib,
        "nvlink_errors": t.nvlink_errors,
        "xid_events": t.xid_events,
        "ecc_single_bit": t.ecc_single_bit,
        "ecc_double_bit": t.ecc_double_bit,
        "retired_pages": t.retired_pages,
        "processes": t.processes.iter().map(|p| json!({
            "pid": p.pid,
            "used_mib": p.used_mib,
            "job_id": p.job_id,
        })).collect::<Vec<_>>(),
        "healthy": t.healthy,
        "error": t.error,
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(crate) fn gpu(index: u32, job_id: Option<u64>, healthy: bool) -> pb::Gpu {
        pb::Gpu {
            index,
            uuid: format!("GPU-{index:04}"),
            model: "A100-80GB".into(),
            gpu_type: "a100".into(),
            memory_mib: 81_920,
            numa_node: Some(index / 2),
            nvlink_peers: vec![index ^ 1],
            healthy,
            job_id,
            quarantined_by: String::new(),
            ..Default::default()
        }
    }

    #[test]
    fn states() {
        assert_eq!(state(&gpu(0, None, true)), "free");
        assert_eq!(state(&gpu(0, Some(1), true)), "busy");
        assert_eq!(state(&gpu(0, Some(1), false)), "unhealthy");
    }
}
