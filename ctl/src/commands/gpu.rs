//! `gpuctl gpu list` (with partitions and slices), `gpuctl gpu stats NODE/GPU --since 10m` and
//! `gpuctl gpu energy`; `gpu partition` is in `gpu_partition.rs`.
//!
//! JSON of `list` (stable): an array of GPUs, each `{"node_id", "index", "uuid", "model",
//! "gpu_type", "memory_mib", "numa_node" (null when unknown), "nvlink_peers": [index],
//! "healthy", "job_id" (null when no job holds it), "quarantined_by" (the alert rule that took
//! it out of scheduling, null when in service), "mode" (whole, mig, shared, passthrough),
//! "mig_layout": ["profile@start"], "pending_partition" (the partition waiting for the GPU to
//! drain, null if none), "slices": ["j-7 mig 1g.10gb@3"], "shared_memory_used_mib",
//! "shared_share_used", "mig_profiles": [profile the model supports], "telemetry"}` where `telemetry` is null when
//! the node's agent did not answer in time, else a telemetry object. A node's `gpus` (see
//! `node`) are these objects without `node_id` and `telemetry`.
//!
//! JSON of `energy` (stable): `{"nodes": [{"node_id", "gpu_mj" (used by the node's GPUs, busy
//! or idle, in millijoules), "green_capped_ms" (idle GPU time under a green-mode cap)}],
//! "tenants": [{"tenant", "gpu_mj" (used by the GPUs of its jobs), "jobs"}]}`.
//!
//! JSON of `stats` (stable): `{"node_id", "gpu_index", "readings": [{"at_ms", "telemetry"}]}`,
//! oldest first; `at_ms` is the sample's wall-clock time in milliseconds since the Unix epoch.
//!
//! A telemetry object: `{"utilization_pct", "memory_utilization_pct", "memory_used_mib",
//! "memory_total_mib", "temperature_c", "memory_temperature_c" (0 without a memory sensor),
//! "power_w", "power_limit_w", "energy_mj", "sm_clock_mhz", "memory_clock_mhz",
//! "throttle_reasons": [name], "pcie_tx_kib_s", "pcie_rx_kib_s", "pcie_replays",
//! "nvlink_tx_kib", "nvlink_rx_kib", "nvlink_errors", "xid_events": [xid], "ecc_single_bit",
//! "ecc_double_bit", "retired_pages", "processes": [{"pid", "used_mib", "job_id" (null: not a
//! gpumesh job)}], "healthy", "error"}`; the floats are null when not finite.

use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_proto::v1::gpu_service_client::GpuServiceClient;
use serde_json::{Value, json};

use super::gpu_view::{job_cell, partition_cell, slices_cell, state, status_json, telemetry_json};
use super::{Answer, Ctx, Failure};
use crate::cli::GpuVerb;
use crate::output::{table, table_of};
use crate::units;

pub(crate) async fn run(ctx: &Ctx, verb: GpuVerb) -> Result<Answer, Failure> {
    match verb {
        GpuVerb::List { node } => list(ctx, node).await,
        GpuVerb::Stats {
            gpu: (node_id, gpu_index),
            since,
        } => stats(ctx, node_id, gpu_index, since).await,
        GpuVerb::Energy { stale } => energy(ctx, stale).await,
        GpuVerb::Partition { gpu, mode, layout } => {
            super::gpu_partition::run(ctx, gpu, mode, layout).await
        }
    }
}

async fn energy(ctx: &Ctx, stale: bool) -> Result<Answer, Failure> {
    let req = pb::GetEnergyRequest { stale };
    let report = ctx
        .call(GpuServiceClient::new, req, async |mut c, r| {
            c.get_energy(r).await
        })
        .await?;
    Ok(ctx.answer(|| energy_json(&report), || energy_table(&report)))
}

fn energy_json(report: &pb::EnergyReport) -> Value {
    json!({
        "nodes": report.nodes.iter().map(|n| json!({
            "node_id": n.node_id,
            "gpu_mj": n.gpu_mj,
            "green_capped_ms": n.green_capped_ms,
        })).collect::<Vec<_>>(),
        "tenants": report.tenants.iter().map(|t| json!({
            "tenant": t.tenant,
            "gpu_mj": t.gpu_mj,
            "jobs": t.jobs,
        })).collect::<Vec<_>>(),
    })
}

fn energy_table(report: &pb::EnergyReport) -> String {
    let nodes: Vec<Vec<String>> = report
        .nodes
        .iter()
        .map(|n| {
            vec![
                format!("n{}", n.node_id),
                units::energy(n.gpu_mj),
                format!("{:.2}", n.green_capped_ms as f64 / 3_600_000.0),
            ]
        })
        .collect();
    let tenants: Vec<Vec<String>> = report
        .tenants
        .iter()
        .map(|t| {
            vec![
                t.tenant.clone(),
                units::energy(t.gpu_mj),
                t.jobs.to_string(),
            ]
        })
        .collect();
    format!(
        "{}\n{}",
        table(&["NODE", "GPU ENERGY", "GREEN-CAPPED GPU-H"], &nodes),
        table(&["TENANT", "GPU ENERGY", "JOBS"], &tenants)
    )
}

async fn list(ctx: &Ctx, node: Option<u64>) -> Result<Answer, Failure> {
    let req = pb::ListGpusRequest { node_id: node };
    let gpus = ctx
        .call(GpuServiceClient::new, req, async |mut c, r| {
            c.list_gpus(r).await
        })
        .await?
        .gpus;
    Ok(ctx.answer_list(&gpus, status_json, gpus_table))
}

async fn stats(
    ctx: &Ctx,
    node_id: u64,
    gpu_index: u32,
    since: Duration,
) -> Result<Answer, Failure> {
    let since_ms = u64::try_from(since.as_millis()).unwrap_or(u64::MAX);
    let req = pb::GetGpuStatsRequest {
        node_id,
        gpu_index,
        since_ms,
    };
    let stats = ctx
        .call(GpuServiceClient::new, req, async |mut c, r| {
            c.get_gpu_stats(r).await
        })
        .await?;
    Ok(ctx.answer(
        || {
            json!({
                "node_id": stats.node_id,
                "gpu_index": stats.gpu_index,
                "readings": stats.readings.iter().map(|r| json!({
                    "at_ms": r.at_ms,
                    "telemetry": r.telemetry.as_ref().map_or(Value::Null, telemetry_json),
                })).collect::<Vec<_>>(),
            })
        },
        || stats_table(&stats.readings),
    ))
}

fn stats_table(readings: &[pb::GpuReading]) -> String {
    let newest = readings.last().map_or(0, |r| r.at_ms);
    table_of(
        &[
            "AGO", "UTIL", "MEMORY", "TEMP", "POWER", "SM", "THROTTLE", "XID", "ECC-DBE", "HEALTHY",
        ],
        readings,
        |r| {
            let t = r.telemetry.clone().unwrap_or_default();
            let ago = Duration::from_millis(newest.saturating_sub(r.at_ms));
            let dash_if_empty = |s: String| if s.is_empty() { "-".to_owned() } else { s };
            vec![
                format!("-{}", units::format_duration(ago)),
                format!("{:.0}%", t.utilization_pct),
                format!(
                    "{}/{}",
                    units::gib(t.memory_used_mib),
                    units::gib(t.memory_total_mib)
                ),
                format!("{:.0}°C", t.temperature_c),
                power(&t),
                format!("{}MHz", t.sm_clock_mhz),
                dash_if_empty(t.throttle_reason_names.join(",")),
                dash_if_empty(
                    t.xid_events
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(","),
                ),
                t.ecc_double_bit.to_string(),
                if t.healthy { "yes".into() } else { "no".into() },
            ]
        },
    )
}

fn gpus_table(gpus: &[pb::GpuStatus]) -> String {
    table_of(
        &[
            "NODE", "GPU", "MODEL", "MEMORY", "STATE", "MODE", "SLICES", "JOB", "UTIL", "TEMP",
            "POWER",
        ],
        gpus,
        |s| {
            let g = s.gpu.clone().unwrap_or_default();
            let t = s.telemetry.as_ref();
            vec![
                format!("n{}", s.node_id),
                g.index.to_string(),
                g.model.clone(),
                units::gib(g.memory_mib),
                state(&g).into(),
                partition_cell(&g),
                slices_cell(&g),
                job_cell(&g),
                t.map_or_else(|| "-".into(), |t| format!("{:.0}%", t.utilization_pct)),
                t.map_or_else(|| "-".into(), |t| format!("{:.0}°C", t.temperature_c)),
                t.map_or_else(|| "-".into(), power),
            ]
        },
    )
}

fn power(t: &pb::GpuTelemetry) -> String {
    if t.power_limit_w > 0.0 {
        format!("{:.0}/{:.0}W", t.power_w, t.power_limit_w)
    } else {
        format!("{:.0}W", t.power_w)
    }
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;
    use crate::commands::gpu_view::tests::gpu;
    use crate::output;

    fn telemetry() -> pb::GpuTelemetry {
        pb::GpuTelemetry {
            utilization_pct: 95.4,
            memory_used_mib: 40_000,
            temperature_c: 61.2,
            power_w: 250.0,
            power_limit_w: 400.0,
            sm_clock_mhz: 1410,
            healthy: true,
            error: String::new(),
            ..Default::default()
        }
    }

    fn sample() -> Vec<pb::GpuStatus> {
        vec![
            pb::GpuStatus {
                node_id: 1,
                gpu: Some(gpu(0, Some(42), true)),
                telemetry: Some(telemetry()),
            },
            pb::GpuStatus {
                node_id: 1,
                gpu: Some(gpu(1, None, true)),
                telemetry: Some(pb::GpuTelemetry {
                    utilization_pct: 0.1,
                    power_limit_w: 0.0,
                    ..telemetry()
                }),
            },
            pb::GpuStatus {
                node_id: 12,
                gpu: Some(pb::Gpu {
                    model: "H100\u{1b}[2J".into(),
                    ..gpu(3, None, false)
                }),
                telemetry: None,
            },
            pb::GpuStatus {
                node_id: 2,
                gpu: Some(pb::Gpu {
                    mode: "mig".into(),
                    mig_layout: vec!["4g.40gb@0".into(), "2g.20gb@4".into(), "1g.10gb@6".into()],
                    slices: vec!["j-7 mig 1g.10gb@6".into()],
                    pending_partition: "mig[1g.10gb@0,1g.10gb@1]".into(),
                    ..gpu(0, None, true)
                }),
                telemetry: None,
            },
            pb::GpuStatus {
                node_id: 2,
                gpu: Some(pb::Gpu {
                    mode: "shared".into(),
                    slices: vec![
                        "j-8 shared 10240MiB/25%".into(),
                        "j-9 shared 20480MiB/25%".into(),
                    ],
                    shared_memory_used_mib: 30_720,
                    shared_share_used: 50,
                    ..gpu(1, None, true)
                }),
                telemetry: None,
            },
        ]
    }

    #[test]
    fn table_renders() {
        expect![[r#"
            NODE  GPU  MODEL      MEMORY  STATE      MODE                                                            SLICES             JOB   UTIL  TEMP  POWER
            n1    0    A100-80GB  80 GiB  busy       whole                                                           -                  j-42  95%   61°C  250/400W
            n1    1    A100-80GB  80 GiB  free       whole                                                           -                  -     0%    61°C  250W
            n12   3    H100?[2J   80 GiB  unhealthy  whole                                                           -                  -     -     -     -
            n2    0    A100-80GB  80 GiB  draining   mig[4g.40gb@0,2g.20gb@4,1g.10gb@6] -> mig[1g.10gb@0,1g.10gb@1]  1/3 mig            -     -     -     -
            n2    1    A100-80GB  80 GiB  sliced     shared                                                          30 GiB/50% shared  -     -     -     -
        "#]]
        .assert_eq(&gpus_table(&sample()));
    }

    #[test]
    fn json_renders() {
        let first = status_json(&sample()[0]);
        expect![[r#"
            {
              "gpu_type": "a100",
              "healthy": true,
              "index": 0,
              "job_id": 42,
              "memory_mib": 81920,
              "mig_layout": [],
              "mig_profiles": [],
              "mode": "whole",
              "model": "A100-80GB",
              "node_id": 1,
              "numa_node": 0,
              "nvlink_peers": [
                1
              ],
              "pending_partition": null,
              "quarantined_by": null,
              "shared_memory_used_mib": 0,
              "shared_share_used": 0,
              "slices": [],
              "telemetry": {
                "ecc_double_bit": 0,
                "ecc_single_bit": 0,
                "energy_mj": 0,
                "error": "",
                "healthy": true,
                "memory_clock_mhz": 0,
                "memory_temperature_c": 0.0,
                "memory_total_mib": 0,
                "memory_used_mib": 40000,
                "memory_utilization_pct": 0.0,
                "nvlink_errors": 0,
                "nvlink_rx_kib": 0,
                "nvlink_tx_kib": 0,
                "pcie_replays": 0,
                "pcie_rx_kib_s": 0,
                "pcie_tx_kib_s": 0,
                "power_limit_w": 400.0,
                "power_w": 250.0,
                "processes": [],
                "retired_pages": 0,
                "sm_clock_mhz": 1410,
                "temperature_c": 61.2,
                "throttle_reasons": [],
                "utilization_pct": 95.4,
                "xid_events": []
              },
              "uuid": "GPU-0000"
            }
        "#]]
        .assert_eq(&output::json(&first));
        // The second GPU differs from the first exactly where its fixture does.
        let mut expected = first;
        expected["index"] = json!(1);
        expected["uuid"] = json!("GPU-0001");
        expected["job_id"] = Value::Null;
        expected["nvlink_peers"] = json!([0]);
        expected["telemetry"]["utilization_pct"] = json!(0.1);
        expected["telemetry"]["power_limit_w"] = json!(0.0);
        assert_eq!(status_json(&sample()[1]), expected);
        let absent = status_json(&sample()[2]);
        assert_eq!(absent["telemetry"], Value::Null);
        assert_eq!(absent["node_id"], 12);
    }
}
