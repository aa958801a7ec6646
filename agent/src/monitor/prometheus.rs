//! The Prometheus text exposition of one agent: its GPUs under dcgm-exporter's metric names and
//! labels (so existing Grafana dashboards work), with the job and tenant a GPU is bound to, and
//! gpumesh's own figures (Raft, jobs, queue per tenant). Pure: `render` formats what it is given.

use std::collections::BTreeMap;
use std::fmt::Write;

use gpu_raft_store::{JobId, NodeId};

use super::Reading;
use crate::gpu::{GpuDevice, GpuSample};
use crate::raft::RaftView;

/// The job a GPU is bound to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BoundJob {
    pub id: JobId,
    pub tenant: String,
}

/// Everything one scrape shows.
pub(crate) struct Scrape<'a> {
    pub hostname: &'a str,
    pub node_id: NodeId,
    pub devices: &'a [GpuDevice],
    /// The newest reading of each GPU.
    pub latest: &'a [Reading],
    /// GPU index → the job bound to it in the replicated state.
    pub bound: &'a BTreeMap<u32, BoundJob>,
    /// (GPU index, job id or `None` for a process of no job) → MiB its processes hold.
    pub process_memory: &'a BTreeMap<(u32, Option<JobId>), u64>,
    pub raft: &'a RaftView,
    /// Jobs in the replicated state by state name (`Pending`, `Running`, ...).
    pub jobs_by_state: &'a BTreeMap<String, u64>,
    /// Pending jobs per tenant.
    pub pending_by_tenant: &'a BTreeMap<String, u64>,
    /// Open alerts in the cluster, by severity (`warning`, `critical`).
    pub open_alerts: &'a BTreeMap<&'static str, u64>,
    /// How good users' runtime estimates and the history's predictions were.
    pub accuracy: &'a crate::scheduler::Accuracy,
}

/// A GPU metric: dcgm-exporter's name (or one of ours, `gpumesh_gpu_*`, where DCGM has no
/// field for it), its type, help, and how to read it from a sample.
///
/// Two deliberate departures from dcgm-exporter, both so `promtool check metrics` accepts the
/// exposition: DCGM's cumulative counts keep their names but are declared `untyped` (a
/// `counter` must end in `_total`; PromQL's `rate()` works the same on either), and the model
/// label is `model_name`, not `modelName` (label names are snake_case); PCIe replays are
/// `gpumesh_gpu_pcie_replays_total`, since a name may not contain its type (`..._COUNTER`). NVIDIA's Grafana
/// dashboard selects by metric name, `gpu`, `UUID`, `Hostname` and `instance`, which are kept.
struct GpuMetric {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    value: fn(&GpuSample) -> f64,
}

const GPU_METRICS: &[GpuMetric] = &[
    GpuMetric {
        name: "DCGM_FI_DEV_SM_CLOCK",
        kind: "gauge",
        help: "SM clock frequency (in MHz).",
        value: |s| f64::from(s.sm_clock_mhz),
    },
    GpuMetric {
        name: "DCGM_FI_DEV_MEM_CLOCK",
        kind: "gauge",
        help: "Memory clock frequency (in MHz).",
        value: |s| f64::from(s.memory_clock_mhz),
    },
    GpuMetric {
        name: "DCGM_FI_DEV_MEMORY_TEMP",
        kind: "gauge",
        help: "Memory temperature (in C).",
        value: |s| f64::from(s.memory_temperature_c),
    },
    GpuMetric {
        name: "DCGM_FI_DEV_GPU_TEMP",
        kind: "gauge",
        help: "GPU temperature (in C).",
        value: |s| f64::from(s.temperature_c),
    },
    GpuMetric {
        name: "DCGM_FI_DEV_POWER_USAGE",
        kind: "gauge",
        help: "Power draw (in W).",
        value: |s| f64::from(s.power_w),
    },
    GpuMetric {
        name: "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        kind: "gauge",
        help: "Power management limit (in W).",
        value: |s| f64::from(s.power_limit_w),
    },
    GpuMetric {
        name: "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        kind: "untyped",
        help: "Total energy consumption since boot (in mJ).",
        value: |s| s.energy_mj as f64,
    },
    GpuMetric {
        name: "DCGM_FI_DEV_GPU_UTIL",
        kind: "gauge",
        help: "GPU utilization (in %).",
        value: |s| f64::from(s.utilization_pct),
    },
    GpuMetric {
        name: "DCGM_FI_DEV_MEM_COPY_UTIL",
        kind: "gauge",
        help: "Memory utilization (in %).",
        value: |s| f64::from(s.memory_utilization_pct),
    },
    GpuMetric {
        name: "DCGM_FI_DEV_FB_USED",
        kind: "gauge",
        help: "Framebuffer memory used (in MiB).",
        value: |s| s.memory_used_mib as f64,
    },
    GpuMetric {
        name: "DCGM_FI_DEV_FB_FREE",
        kind: "gauge",
        help: "Framebuffer memory free (in MiB).",
        value: |s| s.memory_total_mib.saturating_sub(s.memory_used_mib) as f64,
    },
    GpuMetric {
        name: "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        kind: "gauge",
        help: "Current clock throttle reasons (NVML bit mask).",
        value: |s| s.throttle_reasons as f64,
    },
    GpuMetric {
        name: "DCGM_FI_PROF_PCIE_TX_BYTES",
        kind: "gauge",
        help: "PCIe bytes transmitted per second.",
        value: |s| f64::from(s.pcie_tx_kib_s) * 1024.0,
    },
    GpuMetric {
        name: "DCGM_FI_PROF_PCIE_RX_BYTES",
        kind: "gauge",
        help: "PCIe bytes received per second.",
        value: |s| f64::from(s.pcie_rx_kib_s) * 1024.0,
    },
    GpuMetric {
        name: "gpumesh_gpu_pcie_replays_total",
        kind: "counter",
        help: "Total number of PCIe retries.",
        value: |s| s.pcie_replays as f64,
    },
    GpuMetric {
        name: "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        kind: "untyped",
        help: "Total NVLink data sent and received over all lanes (in KiB).",
        value: |s| (s.nvlink_tx_kib + s.nvlink_rx_kib) as f64,
    },
    GpuMetric {
        name: "gpumesh_gpu_nvlink_errors_total",
        kind: "counter",
        help: "NVLink CRC, replay and recovery errors over all links.",
        value: |s| s.nvlink_errors as f64,
    },
    GpuMetric {
        name: "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        kind: "untyped",
        help: "Total number of single-bit volatile ECC errors.",
        value: |s| s.ecc_single_bit as f64,
    },
    GpuMetric {
        name: "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        kind: "untyped",
        help: "Total number of double-bit volatile ECC errors.",
        value: |s| s.ecc_double_bit as f64,
    },
    GpuMetric {
        name: "gpumesh_gpu_retired_pages",
        kind: "gauge",
        help: "Memory pages retired or rows remapped for ECC errors.",
        value: |s| s.retired_pages as f64,
    },
    GpuMetric {
        name: "DCGM_FI_DEV_XID_ERRORS",
        kind: "gauge",
        help: "Value of the last XID error encountered (0: none in the last sample).",
        value: |s| s.xid_events.last().copied().map_or(0.0, f64::from),
    },
];

/// The whole exposition.
pub(crate) fn render(s: &Scrape) -> String {
    let mut out = String::new();
    let devices: BTreeMap<u32, &GpuDevice> = s.devices.iter().map(|d| (d.index, d)).collect();
    let gpu_labels: Vec<(u32, String, &GpuSample)> = s
        .latest
        .iter()
        .filter_map(|r| {
            let d = devices.get(&r.sample.index)?;
            Some((d.index, gpu_labels(s, d), &r.sample))
        })
        .collect();
    for m in GPU_METRICS {
        family(&mut out, m.name, m.kind, m.help);
        for (_, labels, sample) in &gpu_labels {
            if sample.healthy {
                line(&mut out, m.name, labels, (m.value)(sample));
            }
        }
    }
    family(
        &mut out,
        "gpumesh_gpu_healthy",
        "gauge",
        "1 if the GPU answered its last read, 0 if it is lost (fallen off the bus).",
    );
    for (_, labels, sample) in &gpu_labels {
        line(
            &mut out,
            "gpumesh_gpu_healthy",
            labels,
            f64::from(u8::from(sample.healthy)),
        );
    }
    family(
        &mut out,
        "gpumesh_gpu_process_memory_used_mib",
        "gauge",
        "GPU memory held by the processes of one job (job=\"\": processes of no job).",
    );
    for ((index, job), mib) in s.process_memory {
        let Some(d) = devices.get(index) else {
            continue;
        };
        let job = job.map(|j| j.to_string()).unwrap_or_default();
        let labels = format!("gpu=\"{index}\",UUID=\"{}\",job=\"{job}\"", escape(&d.uuid));
        line(
            &mut out,
            "gpumesh_gpu_process_memory_used_mib",
            &labels,
            *mib as f64,
        );
    }
    raft(&mut out, s);
    jobs(&mut out, s);
    out
}

fn gpu_labels(s: &Scrape, d: &GpuDevice) -> String {
    let mut labels = format!(
        "gpu=\"{}\",UUID=\"{}\",pci_bus_id=\"{}\",device=\"nvidia{}\",model_name=\"{}\",\
         Hostname=\"{}\",node_id=\"{}\"",
        d.index,
        escape(&d.uuid),
        escape(&d.pci_bus_id),
        d.index,
        escape(&d.model),
        escape(s.hostname),
        s.node_id
    );
    if let Some(job) = s.bound.get(&d.index) {
        let _ = write!(
            labels,
            ",job=\"{}\",tenant=\"{}\"",
            job.id,
            escape(&job.tenant)
        );
    }
    labels
}

fn raft(out: &mut String, s: &Scrape) {
    let r = s.raft;
    let node = format!("node_id=\"{}\"", s.node_id);
    let figures: [(&str, &str, &str, f64); 9] = [
        (
            "gpumesh_raft_term",
            "gauge",
            "Current Raft term.",
            r.term as f64,
        ),
        (
            "gpumesh_raft_is_leader",
            "gauge",
            "1 if this agent is the Raft leader.",
            f64::from(u8::from(r.is_leader)),
        ),
        (
            "gpumesh_raft_leader_id",
            "gauge",
            "Node id of the leader this agent knows (0: none).",
            r.leader.unwrap_or(0) as f64,
        ),
        (
            "gpumesh_raft_last_log_index",
            "gauge",
            "Index of the last entry in this agent's log.",
            r.last_log_index as f64,
        ),
        (
            "gpumesh_raft_commit_index",
            "gauge",
            "Highest log index known committed.",
            r.commit_index as f64,
        ),
        (
            "gpumesh_raft_applied_index",
            "gauge",
            "Highest log index applied to this agent's state.",
            r.applied_index as f64,
        ),
        (
            "gpumesh_raft_voters",
            "gauge",
            "Voting members of the Raft group.",
            r.voters.len() as f64,
        ),
        (
            "gpumesh_raft_writes_proposed_total",
            "counter",
            "Writes this agent proposed as leader since it started.",
            r.writes_proposed as f64,
        ),
        (
            "gpumesh_raft_entries_proposed_total",
            "counter",
            "Log entries those writes became (the leader's group commit batches them).",
            r.entries_proposed as f64,
        ),
    ];
    for (name, kind, help, value) in figures {
        family(out, name, kind, help);
        line(out, name, &node, value);
    }
}

fn jobs(out: &mut String, s: &Scrape) {
    family(
        out,
        "gpumesh_jobs",
        "gauge",
        "Jobs in the replicated state, by state.",
    );
    for (state, n) in s.jobs_by_state {
        line(
            out,
            "gpumesh_jobs",
            &format!("state=\"{}\"", escape(state)),
            *n as f64,
        );
    }
    family(
        out,
        "gpumesh_queue_length",
        "gauge",
        "Pending jobs per tenant.",
    );
    for (tenant, n) in s.pending_by_tenant {
        line(
            out,
            "gpumesh_queue_length",
            &format!("tenant=\"{}\"", escape(tenant)),
            *n as f64,
        );
    }
    family(
        out,
        "gpumesh_alerts_open",
        "gauge",
        "Open alerts in the cluster, by severity.",
    );
    for (severity, n) in s.open_alerts {
        line(
            out,
            "gpumesh_alerts_open",
            &format!("severity=\"{severity}\""),
            *n as f64,
        );
    }
    let kinds = [
        ("estimate", &s.accuracy.estimates),
        ("prediction", &s.accuracy.predictions),
    ];
    let families: [(&str, &str, ErrorFigure); 3] = [
        (
            "gpumesh_runtime_guesses",
            "Succeeded jobs in the state with a runtime guess: users' estimates, the history's predictions.",
            |e| e.count as f64,
        ),
        (
            "gpumesh_runtime_guess_median_relative_error",
            "Median of |guess - actual| / actual over those jobs.",
            |e| e.median_relative_error,
        ),
        (
            "gpumesh_runtime_guess_within_2x_ratio",
            "Share of those guesses within a factor of two of the actual runtime.",
            |e| e.within_2x,
        ),
    ];
    for (name, help, value) in families {
        family(out, name, "gauge", help);
        for (kind, errors) in kinds {
            line(out, name, &format!("kind=\"{kind}\""), value(errors));
        }
    }
}

/// One figure of a kind of runtime guess.
type ErrorFigure = fn(&crate::scheduler::Errors) -> f64;

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn line(out: &mut String, name: &str, labels: &str, value: f64) {
    if value.is_finite() {
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    }
}

/// A label value as the text format wants it: backslash, double quote and newline escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::gpu::{GpuBackend, SimBackend};

    fn raft() -> RaftView {
        RaftView {
            node_id: 2,
            leader: Some(1),
            term: 7,
            commit_index: 40,
            applied_index: 39,
            last_log_index: 41,
            voters: BTreeSet::from([1, 2, 3]),
            members: BTreeMap::new(),
            matched: BTreeMap::new(),
            is_leader: false,
            writes_proposed: 12,
            entries_proposed: 5,
        }
    }

    #[test]
    fn gpus_under_dcgm_names_with_their_job_and_raft_figures() {
        let sim = SimBackend::from_spec("2xA100-80GB", 2).expect("valid spec");
        sim.set_busy(0, true);
        let mut samples = sim.sample();
        samples[1].healthy = false;
        let latest: Vec<Reading> = samples
            .into_iter()
            .map(|sample| Reading { at_ms: 1, sample })
            .collect();
        let bound = BTreeMap::from([(
            0,
            BoundJob {
                id: 42,
                tenant: "vi\"sion".into(),
            },
        )]);
        let process_memory = BTreeMap::from([((0, Some(42)), 1024), ((0, None), 5)]);
        let text = render(&Scrape {
            hostname: "gpu-host-2",
            node_id: 2,
            devices: &sim.devices(),
            latest: &latest,
            bound: &bound,
            process_memory: &process_memory,
            raft: &raft(),
            jobs_by_state: &BTreeMap::from([("Running".to_owned(), 1)]),
            pending_by_tenant: &BTreeMap::from([("vision".to_owned(), 3)]),
            open_alerts: &BTreeMap::from([("critical", 2), ("warning", 0)]),
            accuracy: &crate::scheduler::Accuracy::default(),
        });
        let uuid = &sim.devices()[0].uuid;
        let labels = format!(
            "gpu=\"0\",UUID=\"{uuid}\",pci_bus_id=\"00000000:17:00.0\",device=\"nvidia0\",\
             model_name=\"A100-80GB\",Hostname=\"gpu-host-2\",node_id=\"2\",job=\"42\",\
             tenant=\"vi\\\"sion\""
        );
        for expected in [
            "# TYPE DCGM_FI_DEV_GPU_UTIL gauge".to_owned(),
            format!("DCGM_FI_DEV_GPU_UTIL{{{labels}}} 95"),
            format!("DCGM_FI_DEV_SM_CLOCK{{{labels}}} 1410"),
            format!("DCGM_FI_DEV_FB_USED{{{labels}}} 65536"),
            format!("DCGM_FI_DEV_FB_FREE{{{labels}}} 16384"),
            format!("gpumesh_gpu_healthy{{{labels}}} 1"),
            format!(
                "gpumesh_gpu_process_memory_used_mib{{gpu=\"0\",UUID=\"{uuid}\",job=\"42\"}} 1024"
            ),
            format!("gpumesh_gpu_process_memory_used_mib{{gpu=\"0\",UUID=\"{uuid}\",job=\"\"}} 5"),
            "gpumesh_raft_term{node_id=\"2\"} 7".to_owned(),
            "gpumesh_raft_leader_id{node_id=\"2\"} 1".to_owned(),
            "gpumesh_raft_applied_index{node_id=\"2\"} 39".to_owned(),
            "gpumesh_jobs{state=\"Running\"} 1".to_owned(),
            "gpumesh_runtime_guess_within_2x_ratio{kind=\"prediction\"} 0".to_owned(),
            "gpumesh_queue_length{tenant=\"vision\"} 3".to_owned(),
            "gpumesh_alerts_open{severity=\"critical\"} 2".to_owned(),
        ] {
            assert!(
                text.lines().any(|l| l == expected),
                "missing {expected:?} in\n{text}"
            );
        }
        let lost = text
            .lines()
            .filter(|l| l.starts_with("DCGM_FI_DEV_GPU_UTIL{gpu=\"1\""))
            .count();
        assert_eq!(lost, 0, "a lost GPU reports no readings");
        assert!(text.contains("gpumesh_gpu_healthy{gpu=\"1\""));
        assert!(
            text.lines().filter(|l| l.starts_with("# TYPE ")).count() >= GPU_METRICS.len(),
            "every family is declared"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}

/// The Grafana dashboard in `deploy/grafana/` queries only metrics this module exposes.
#[cfg(test)]
mod dashboard {
    #[test]
    fn every_metric_the_dashboard_queries_is_exposed() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/grafana/gpumesh-gpus.json"
        );
        let text = std::fs::read_to_string(path).expect("the dashboard");
        let dashboard: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
        let source = include_str!("prometheus.rs");
        let mut queried = 0;
        for panel in dashboard["panels"].as_array().expect("panels") {
            for target in panel["targets"].as_array().expect("targets") {
                let expr = target["expr"].as_str().expect("expr");
                let names = expr
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .filter(|w| w.starts_with("DCGM_") || w.starts_with("gpumesh_"));
                for name in names {
                    queried += 1;
                    assert!(
                        source.contains(&format!("\"{name}\"")),
                        "{name} is not exposed"
                    );
                }
            }
        }
        assert!(queried >= 15, "the dashboard queries {queried} metrics");
    }
}
