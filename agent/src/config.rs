//! Agent configuration: TOML file → `FileConfig` (unknown keys rejected by name) → command-line
//! overrides → `Config::parse_and_validate`, the only place defaults and rules live.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use gpu_raft_store::{NodeId, validate};

use crate::gpu::BackendKind;
use serde::Deserialize;

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
    #[serde(default)]
    pub raft: RaftSection,
    #[serde(default)]
    pub autopilot: AutopilotSection,
    #[serde(default)]
    pub jobs: JobsSection,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobsSection {
    #[serde(default, with = "humantime_serde")]
    pub lease: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub down_after: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub stop_grace: Option<Duration>,
}

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
}

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

/// The validated configuration the agent runs with.
#[derive(Clone, Debug)]
pub struct Config {
    pub node_id: NodeId,
    pub listen: SocketAddr,
    /// The address peers and clients use to reach this agent.
    pub advertise: String,
    pub data_dir: PathBuf,
    pub bootstrap: bool,
    pub join: Vec<String>,
    pub join_timeout: Duration,
    pub labels: BTreeMap<String, String>,
    pub gpu_backend: BackendKind,
    /// Simulated GPUs (`4xA100-80GB,2xT4-16GB`), used by the sim backend.
    pub sim_gpus: String,
    pub raft: RaftSettings,
    pub autopilot: AutopilotSettings,
    pub jobs: JobSettings,
}

/// Job supervision timing. A node that cannot reach the cluster for `lease` stops its own jobs;
/// the leader declares a node down (and re-places its jobs) only after `down_after`, which must
/// be comfortably longer, so a job never runs on two nodes at once.
#[derive(Clone, Debug)]
pub struct JobSettings {
    pub lease: Duration,
    pub down_after: Duration,
    /// SIGTERM → SIGKILL grace when a job is cancelled, evicted or fenced.
    pub stop_grace: Duration,
}

/// Raft timing. Defaults suit a LAN: heartbeat 100 ms; election timeout 300–600 ms. In openraft
/// 0.9 a follower waits out the leader lease (= `election_timeout_max`) plus one election timeout
/// before campaigning, so a killed leader is replaced after ≈ 0.9–1.2 s. openraft 0.9 also uses
/// the heartbeat interval as the deadline of every AppendEntries RPC: at 50 ms a loaded 2-core
/// host missed heartbeats and elected spuriously, which is why the default is 100 ms. WAN and
/// edge deployments should use several times these values.
#[derive(Clone, Debug)]
pub struct RaftSettings {
    pub heartbeat_interval: Duration,
    pub election_timeout_min: Duration,
    pub election_timeout_max: Duration,
    /// Build a snapshot (and allow purging the log) after this many entries.
    pub snapshot_every: u64,
    /// Log entries kept behind the last snapshot, so slightly lagging followers catch up from
    /// the log instead of a snapshot.
    pub keep_logs: u64,
    /// How many voters the cluster aims for; every other member is a learner.
    pub voter_target: usize,
}

#[derive(Clone, Debug)]
pub struct AutopilotSettings {
    /// A voter unreachable this long is replaced by a healthy learner.
    pub dead_voter_after: Duration,
}

/// Command-line values that override the file.
#[derive(Debug, Default)]
pub struct Overrides {
    pub node_id: Option<NodeId>,
    pub listen: Option<SocketAddr>,
    pub advertise: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub bootstrap: bool,
    pub join: Option<Vec<String>>,
    pub labels: Option<BTreeMap<String, String>>,
    pub gpu_backend: Option<BackendKind>,
    pub sim_gpus: Option<String>,
}

impl Config {
    pub fn parse_and_validate(file: FileConfig, flags: Overrides) -> anyhow::Result<Self> {
        let node_id = flags
            .node_id
            .or(file.node_id)
            .context("node_id is required (config key `node_id` or --node-id)")?;
        ensure!(node_id > 0, "node_id must be at least 1");
        let listen = flags
            .listen
            .or(file.listen)
            .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 7070)));
        let advertise = match flags.advertise.or(file.advertise) {
            Some(a) => a,
            None if listen.ip().is_unspecified() => {
                bail!("listening on {listen} needs an explicit `advertise` address peers can reach")
            }
            None => listen.to_string(),
        };
        validate::addr(&advertise)
            .map_err(anyhow::Error::msg)
            .context("invalid advertise")?;
        let data_dir = flags
            .data_dir
            .or(file.data_dir)
            .context("data_dir is required (config key `data_dir` or --data-dir)")?;
        let bootstrap = flags.bootstrap || file.bootstrap.unwrap_or(false);
        let join = flags.join.or(file.join).unwrap_or_default();
        ensure!(
            !bootstrap || join.is_empty(),
            "use either bootstrap or join, not both"
        );
        for addr in &join {
            validate::addr(addr)
                .map_err(anyhow::Error::msg)
                .context("invalid join address")?;
        }
        let labels = flags.labels.or(file.labels).unwrap_or_default();
        validate::labels(&labels)
            .map_err(anyhow::Error::msg)
            .context("invalid labels")?;

        let r = file.raft;
        let raft = RaftSettings {
            heartbeat_interval: r.heartbeat_interval.unwrap_or(Duration::from_millis(100)),
            election_timeout_min: r.election_timeout_min.unwrap_or(Duration::from_millis(300)),
            election_timeout_max: r.election_timeout_max.unwrap_or(Duration::from_millis(600)),
            snapshot_every: r.snapshot_every.unwrap_or(10_000),
            keep_logs: r.keep_logs.unwrap_or(1_000),
            voter_target: r.voter_target.unwrap_or(3),
        };
        ensure!(
            raft.heartbeat_interval < raft.election_timeout_min
                && raft.election_timeout_min < raft.election_timeout_max,
            "raft timeouts must satisfy heartbeat_interval < election_timeout_min < election_timeout_max"
        );
        ensure!(
            matches!(raft.voter_target, 1 | 3 | 5 | 7),
            "raft.voter_target must be 1, 3, 5 or 7, got {}",
            raft.voter_target
        );
        ensure!(
            raft.snapshot_every >= 1,
            "raft.snapshot_every must be at least 1"
        );
        let autopilot = AutopilotSettings {
            dead_voter_after: file
                .autopilot
                .dead_voter_after
                .unwrap_or(Duration::from_secs(30)),
        };
        ensure!(
            autopilot.dead_voter_after > raft.election_timeout_max,
            "autopilot.dead_voter_after must exceed raft.election_timeout_max"
        );
        let j = file.jobs;
        let jobs = JobSettings {
            lease: j.lease.unwrap_or(Duration::from_secs(10)),
            down_after: j.down_after.unwrap_or(Duration::from_secs(20)),
            stop_grace: j.stop_grace.unwrap_or(Duration::from_secs(10)),
        };
        ensure!(
            jobs.lease >= raft.election_timeout_max * 2,
            "jobs.lease must be at least twice raft.election_timeout_max"
        );
        ensure!(
            jobs.down_after >= jobs.lease + jobs.lease / 2,
            "jobs.down_after must be at least 1.5 x jobs.lease, so a cut-off node fences its jobs before they are re-placed"
        );
        Ok(Self {
            node_id,
            listen,
            advertise,
            data_dir,
            bootstrap,
            join,
            join_timeout: file.join_timeout.unwrap_or(Duration::from_secs(60)),
            labels,
            gpu_backend: flags.gpu_backend.or(file.gpu_backend).unwrap_or_default(),
            sim_gpus: flags
                .sim_gpus
                .or(file.sim_gpus)
                .unwrap_or_else(|| "4xA100-80GB".to_owned()),
            raft,
            autopilot,
            jobs,
        })
    }

    /// The openraft configuration derived from ours.
    pub fn openraft(&self) -> anyhow::Result<openraft::Config> {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let config = openraft::Config {
            cluster_name: "gpumesh".into(),
            heartbeat_interval: ms(self.raft.heartbeat_interval),
            election_timeout_min: ms(self.raft.election_timeout_min),
            election_timeout_max: ms(self.raft.election_timeout_max),
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.raft.snapshot_every),
            max_in_snapshot_log_to_keep: self.raft.keep_logs,
            snapshot_max_chunk_size: 4 * 1024 * 1024,
            ..Default::default()
        };
        config.validate().context("invalid raft settings")
    }

    /// How recently the leader must have heard from a member to call it reachable.
    pub fn reachable_within(&self) -> Duration {
        (self.raft.heartbeat_interval * 10).max(Duration::from_secs(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minimal() -> FileConfig {
        FileConfig::parse("node_id = 1\ndata_dir = \"/tmp/x\"\n").expect("parses")
    }

    #[test]
    fn unknown_keys_are_named() {
        let err =
            FileConfig::parse("node_id = 1\nlisten_adress = \"1.2.3.4:1\"\n").expect_err("typo");
        assert!(err.to_string().contains("listen_adress"), "{err}");
        let err = FileConfig::parse("[raft]\nheartbeat = \"1s\"\n").expect_err("typo");
        assert!(err.to_string().contains("heartbeat"), "{err}");
    }

    #[test]
    fn flags_override_the_file() {
        let flags = Overrides {
            node_id: Some(7),
            ..Default::default()
        };
        let c = Config::parse_and_validate(minimal(), flags).expect("valid");
        assert_eq!((c.node_id, c.advertise.as_str()), (7, "127.0.0.1:7070"));
    }

    #[test]
    fn durations_are_humantime() {
        let f = FileConfig::parse(
            "node_id = 1\ndata_dir = \"d\"\n[raft]\nheartbeat_interval = \"100ms\"\nelection_timeout_min = \"1s\"\nelection_timeout_max = \"2s\"\n[autopilot]\ndead_voter_after = \"5m\"\n",
        )
        .expect("parses");
        let c = Config::parse_and_validate(f, Overrides::default()).expect("valid");
        assert_eq!(c.raft.heartbeat_interval, Duration::from_millis(100));
        assert_eq!(c.autopilot.dead_voter_after, Duration::from_secs(300));
        c.openraft().expect("openraft accepts it");
    }

    #[test]
    fn bad_combinations_are_refused() {
        let both = Overrides {
            bootstrap: true,
            join: Some(vec!["a:1".into()]),
            ..Default::default()
        };
        assert!(Config::parse_and_validate(minimal(), both).is_err());
        let unspecified = Overrides {
            listen: Some("0.0.0.0:7070".parse().expect("addr")),
            ..Default::default()
        };
        let err = Config::parse_and_validate(minimal(), unspecified).expect_err("needs advertise");
        assert!(err.to_string().contains("advertise"), "{err}");
        let even = FileConfig::parse("node_id = 1\ndata_dir = \"d\"\n[raft]\nvoter_target = 4\n")
            .expect("parses");
        assert!(Config::parse_and_validate(even, Overrides::default()).is_err());
        let no_id = FileConfig::parse("data_dir = \"d\"\n").expect("parses");
        let err = Config::parse_and_validate(no_id, Overrides::default()).expect_err("no id");
        assert!(err.to_string().contains("node_id"), "{err}");
    }
}
