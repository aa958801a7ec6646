//! The configuration file as the operator writes it: TOML → these serde structs, every key
//! optional and unknown keys refused by name. Defaults and rules live in
//! `Config::parse_and_validate`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use gpu_raft_store::NodeId;
use serde::Deserialize;

use crate::gpu::BackendKind;

/// The file as written by the operator. Every key is optional; defaults live in `parse_and_validate`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub node_id: Option<NodeId>,
    pub listen: Option<SocketAddr>,
    pub advertise: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub bootstrap: Option<bool>,
    pub join: Option<Vec<String>>,
    #[serde(default, with = "humantime_serde")]
    pub join_timeout: Option<Duration>,
    pub labels: Option<BTreeMap<String, String>>,
    pub gpu_backend: Option<BackendKind>,
    pub sim_gpus: Option<String>,
    pub bootstrap_token_file: Option<PathBuf>,
    #[serde(default)]
    pub raft: RaftSection,
    #[serde(default)]
    pub autopilot: AutopilotSection,
    #[serde(default)]
    pub jobs: JobsSection,
    #[serde(default)]
    pub tls: TlsSection,
    #[serde(default)]
    pub api: ApiSection,
    #[serde(default)]
    pub monitor: MonitorSection,
    #[serde(default)]
    pub edge: EdgeSection,
    #[serde(default)]
    pub containers: super::ContainersSection,
    #[serde(default)]
    pub retention: super::RetentionSection,
}

/// `[edge]`, validated into `EdgeSettings`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeSection {
    /// This agent is at an edge site (named by its `site` label).
    pub enabled: Option<bool>,
    #[serde(default, with = "humantime_serde")]
    pub lease: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub down_after: Option<Duration>,
}

/// `[monitor]`, validated into `MonitorSettings`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MonitorSection {
    #[serde(default, with = "humantime_serde")]
    pub interval: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub retention: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub sample_timeout: Option<Duration>,
    /// Where to serve Prometheus `/metrics` (plain HTTP); absent: nowhere.
    pub metrics_listen: Option<SocketAddr>,
    /// Alert rules of this agent (replicated rules of the same name win).
    #[serde(default)]
    pub rules: Vec<crate::monitor::rules::FlatRule>,
    /// `http://` URLs alert notices are POSTed to.
    #[serde(default)]
    pub webhooks: Vec<String>,
    /// Green mode: cap an idle GPU's power after this long without a job (absent: off).
    #[serde(default, with = "humantime_serde")]
    pub green_idle_after: Option<Duration>,
    pub green_power_pct: Option<u32>,
    /// How often measured GPU energy is reported through Raft.
    #[serde(default, with = "humantime_serde")]
    pub energy_report_every: Option<Duration>,
}

/// `[api]`, validated into `ApiSettings`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiSection {
    pub requests_per_second: Option<u32>,
    pub burst: Option<u32>,
    pub tenant_requests_per_second: Option<u32>,
    pub source_requests_per_second: Option<u32>,
    pub max_array_tasks: Option<u64>,
    pub webhook_ca_file: Option<std::path::PathBuf>,
}

/// `[tls]`, validated into `TlsSettings`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// Plaintext, no certificates: loopback only.
    pub insecure: Option<bool>,
    #[serde(default, with = "humantime_serde")]
    pub cert_validity: Option<Duration>,
    /// For joining: the cluster CA certificate to trust.
    pub ca_file: Option<PathBuf>,
    /// For joining: a file holding a join token (role node, operator or admin).
    pub join_token_file: Option<PathBuf>,
}

/// `[jobs]`, validated into `JobSettings`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobsSection {
    #[serde(default, with = "humantime_serde")]
    pub lease: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub down_after: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub stop_grace: Option<Duration>,
    /// User name jobs run as.
    pub run_as: Option<String>,
    /// Tenant → the user its jobs run as (overrides `run_as` for that tenant).
    pub run_as_by_tenant: Option<BTreeMap<String, String>>,
    /// The cgroup v2 directory job cgroups are created under.
    pub cgroup_root: Option<PathBuf>,
    /// `FIRST-LAST`: the uids a cluster-mapped account may have on this node.
    pub uid_range: Option<String>,
    /// CPU limit of a CPU-only job that asked for none, thousandths of a core.
    pub default_cpu_millis: Option<u32>,
    /// Memory limit of a CPU-only job that asked for none, MiB.
    pub default_memory_mib: Option<u64>,
    /// Most tasks (processes and threads) of every job.
    pub default_tasks_max: Option<u64>,
    /// Device nodes every job may open besides the usual ones and its GPUs'.
    pub extra_devices: Option<Vec<String>>,
    /// `report` (default) or `kill` a process on a job's GPU that is not the job's.
    pub foreign_processes: Option<String>,
    /// Where run directories (scratch, logs, records) live.
    pub dir: Option<PathBuf>,
    /// Each log file is rotated at this size.
    pub log_max: Option<super::size::ByteSize>,
    /// No run starts while the jobs filesystem has less free space.
    pub min_free: Option<super::size::ByteSize>,
    /// How long an ended, reported run's directory is kept.
    #[serde(default, with = "humantime_serde")]
    pub keep_finished_runs: Option<Duration>,
    /// How runs are started: `auto`, `systemd` or `direct`.
    pub launcher: Option<LauncherChoice>,
}

/// `jobs.launcher`: how the executor starts each run's supervisor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LauncherChoice {
    /// systemd when the host was booted with it and its D-Bus API answers, else direct.
    #[default]
    Auto,
    /// Each run is a transient unit of its own in `gpumesh.slice`, started through systemd's
    /// D-Bus API: outside the agent's own service sandbox, with its limits and device
    /// allow-list.
    Systemd,
    /// Each run's supervisor is a child process of the agent (inside whatever sandbox the agent
    /// runs in).
    Direct,
}

impl std::fmt::Display for LauncherChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LauncherChoice::Auto => "auto",
            LauncherChoice::Systemd => "systemd",
            LauncherChoice::Direct => "direct",
        })
    }
}

/// `[raft]`, validated into `RaftSettings`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RaftSection {
    #[serde(default, with = "humantime_serde")]
    pub heartbeat_interval: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub election_timeout_min: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub election_timeout_max: Option<Duration>,
    pub snapshot_every: Option<u64>,
    pub keep_logs: Option<u64>,
    pub voter_target: Option<usize>,
    pub fault_injection: Option<bool>,
}

/// `[autopilot]`, validated into `AutopilotSettings`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutopilotSection {
    #[serde(default, with = "humantime_serde")]
    pub dead_voter_after: Option<Duration>,
}

impl FileConfig {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config file {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("parsing config file {}", path.display()))
    }

    pub fn parse(text: &str) -> anyhow::Result<Self> {
        Ok(toml::from_str(text)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_named() {
        let err =
            FileConfig::parse("node_id = 1\nlisten_adress = \"1.2.3.4:1\"\n").expect_err("typo");
        assert!(err.to_string().contains("listen_adress"), "{err}");
        let err = FileConfig::parse("[raft]\nheartbeat = \"1s\"\n").expect_err("typo");
        assert!(err.to_string().contains("heartbeat"), "{err}");
    }
}
