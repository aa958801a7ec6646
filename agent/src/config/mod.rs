//! Agent configuration: TOML file → `FileConfig` (unknown keys rejected by name) → command-line
//! `Overrides` laid over it → `Config::parse_and_validate`, the only place defaults and rules
//! live: one step per section, each in `settings` beside the struct it fills.

mod confine;
mod containers;
mod file;
mod flags;
mod jobs_disk;
mod retention;
mod run_as;
mod settings;
mod size;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use gpu_raft_store::{NodeId, validate};

use crate::gpu::BackendKind;
use crate::raft::cluster::ClusterSettings;

// One flat path, `config::X`, for everything the configuration is made of.
pub use confine::{Confine, DevicePattern, ForeignPolicy};
pub use containers::{ContainerNetwork, ContainerSettings, ContainersSection, RuntimeKind};
pub use file::{
    ApiSection, AutopilotSection, EdgeSection, FileConfig, JobsSection, LauncherChoice,
    MonitorSection, RaftSection, TlsSection,
};
pub use flags::Overrides;
pub(crate) use jobs_disk::DEFAULT_LOG_MAX;
pub use jobs_disk::{DirOrigin, JobDiskSettings};
pub use retention::{RetentionSection, RetentionSettings};
pub use run_as::{RunAs, UidRange};
pub use settings::{
    ApiSettings, AutopilotSettings, DEFAULT_CGROUP_ROOT, EdgeSettings, JobSettings,
    MAX_HISTORY_LEN, MonitorSettings, RaftSettings, TlsSettings,
};
pub use size::ByteSize;

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
    /// Where `--bootstrap` writes the first admin token (mode 0600).
    pub bootstrap_token_file: PathBuf,
    pub raft: RaftSettings,
    pub autopilot: AutopilotSettings,
    pub jobs: JobSettings,
    /// How container jobs run here (`[containers]`).
    pub containers: ContainerSettings,
    pub tls: TlsSettings,
    pub api: ApiSettings,
    pub monitor: MonitorSettings,
    /// Set when this agent is at an edge site.
    pub edge: Option<EdgeSettings>,
    /// What the leader archives, and how often it looks (`[retention]`).
    pub retention: RetentionSettings,
}

/// Log entries per AppendEntries message (openraft's default is 300). A group-commit batch is up
/// to `proposer::MAX_BATCH_BYTES`, so this many of them stay well inside
/// `gpu_proto::MAX_MESSAGE_BYTES`.
pub const MAX_PAYLOAD_ENTRIES: u64 = 32;

impl Config {
    /// The Raft handle's settings: a client operation keeps retrying for ten election timeouts
    /// (at least 5 s).
    pub fn cluster_settings(&self) -> ClusterSettings {
        ClusterSettings {
            node_id: self.node_id,
            op_timeout: (self.raft.election_timeout_max * 10).max(Duration::from_secs(5)),
            voter_target: self.raft.voter_target,
            edge: self.edge.is_some(),
            lease: self.raft.election_timeout_max,
        }
    }

    /// The file with the flags laid over it, checked section by section in this order (a
    /// later section may be checked against an earlier one); the first rule broken is the error.
    pub fn parse_and_validate(file: FileConfig, flags: Overrides) -> anyhow::Result<Self> {
        let file = flags.apply(file);
        let Identity {
            node_id,
            listen,
            advertise,
            data_dir,
            bootstrap,
            join,
            labels,
        } = identity(&file)?;
        let raft = settings::raft(file.raft)?;
        let autopilot = settings::autopilot(file.autopilot, &raft)?;
        let jobs = settings::jobs(file.jobs, &raft, &data_dir)?;
        let containers = containers::settings(file.containers)?;
        let edge = settings::edge(file.edge, &labels, bootstrap, &jobs, &raft)?;
        let tls = settings::tls(file.tls, listen, &advertise)?;
        let api = settings::api(file.api)?;
        let monitor = settings::monitor(file.monitor)?;
        let retention = retention::settings(file.retention)?;
        Ok(Self {
            node_id,
            listen,
            advertise,
            bootstrap_token_file: file
                .bootstrap_token_file
                .unwrap_or_else(|| data_dir.join("bootstrap-admin.token")),
            data_dir,
            bootstrap,
            join,
            join_timeout: file.join_timeout.unwrap_or(Duration::from_secs(60)),
            labels,
            gpu_backend: file.gpu_backend.unwrap_or_default(),
            sim_gpus: file.sim_gpus.unwrap_or_else(|| "4xA100-80GB".to_owned()),
            raft,
            autopilot,
            jobs,
            containers,
            tls,
            api,
            monitor,
            edge,
            retention,
        })
    }

    /// How long after its last contact this agent fences its jobs: its edge lease at an edge
    /// site, `jobs.lease` elsewhere.
    pub fn node_lease(&self) -> Duration {
        self.edge.as_ref().map_or(self.jobs.lease, |e| e.lease)
    }

    /// The openraft configuration derived from ours.
    pub fn openraft(&self) -> anyhow::Result<openraft::Config> {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let config = openraft::Config {
            cluster_name: "gpumesh".into(),
            heartbeat_interval: ms(self.raft.heartbeat_interval),
            election_timeout_min: ms(self.raft.election_timeout_min),
            election_timeout_max: ms(self.raft.election_timeout_max),
            // Snapshots are counted in commands, not entries (`raft/snapshots.rs`).
            snapshot_policy: openraft::SnapshotPolicy::Never,
            max_in_snapshot_log_to_keep: self.raft.keep_logs,
            snapshot_max_chunk_size: 4 * 1024 * 1024,
            max_payload_entries: MAX_PAYLOAD_ENTRIES,
            ..Default::default()
        };
        config.validate().context("invalid raft settings")
    }

    /// How recently the leader must have heard from a member to call it reachable.
    pub fn reachable_within(&self) -> Duration {
        (self.raft.heartbeat_interval * 10).max(Duration::from_secs(1))
    }
}

/// Who this agent is and how it enters the cluster: the file's top-level keys that are checked.
struct Identity {
    node_id: NodeId,
    listen: SocketAddr,
    advertise: String,
    data_dir: PathBuf,
    bootstrap: bool,
    join: Vec<String>,
    labels: BTreeMap<String, String>,
}

fn identity(file: &FileConfig) -> anyhow::Result<Identity> {
    let node_id = file
        .node_id
        .context("node_id is required (config key `node_id` or --node-id)")?;
    ensure!(node_id > 0, "node_id must be at least 1");
    let listen = file
        .listen
        .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 7070)));
    let advertise = match &file.advertise {
        Some(a) => a.clone(),
        None if listen.ip().is_unspecified() => {
            bail!("listening on {listen} needs an explicit `advertise` address peers can reach")
        }
        None => listen.to_string(),
    };
    validate::addr(&advertise)
        .map_err(anyhow::Error::msg)
        .context("invalid advertise")?;
    let data_dir = file
        .data_dir
        .clone()
        .context("data_dir is required (config key `data_dir` or --data-dir)")?;
    let bootstrap = file.bootstrap.unwrap_or(false);
    let join = file.join.clone().unwrap_or_default();
    ensure!(
        !bootstrap || join.is_empty(),
        "use either bootstrap or join, not both"
    );
    for addr in &join {
        validate::addr(addr)
            .map_err(anyhow::Error::msg)
            .context("invalid join address")?;
    }
    let labels = file.labels.clone().unwrap_or_default();
    validate::user_labels(&labels)
        .map_err(anyhow::Error::msg)
        .context("invalid labels")?;
    Ok(Identity {
        node_id,
        listen,
        advertise,
        data_dir,
        bootstrap,
        join,
        labels,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// The documented reference is a valid configuration, and every section in it is one we
    /// read (unknown keys would be refused).
    #[test]
    fn the_example_config_parses_and_validates() {
        let text = include_str!("../../../deploy/config/agent.example.toml");
        let file = FileConfig::parse(text).expect("the example parses");
        let c = Config::parse_and_validate(file, Overrides::default()).expect("and validates");
        assert_eq!(c.tls.cert_validity, Duration::from_secs(86_400));
        assert_eq!(c.jobs.lease, Duration::from_secs(10));
        assert!(
            !c.raft.fault_injection,
            "fault injection is off unless asked for"
        );
    }

    fn parse(text: &str) -> anyhow::Result<Config> {
        Config::parse_and_validate(FileConfig::parse(text)?, Overrides::default())
    }

    const EDGE_AGENT: &str = "node_id = 4\ndata_dir = \"d\"\njoin = [\"10.0.0.1:7070\"]\n\
                              labels = { site = \"edge-1\" }\n[edge]\nenabled = true\n";

    #[test]
    fn an_edge_agent_needs_its_site_and_never_bootstraps() {
        let c = parse(EDGE_AGENT).expect("valid");
        let edge = c.edge.clone().expect("edge");
        assert_eq!(
            (edge.site.as_str(), edge.lease, edge.down_after),
            ("edge-1", Duration::from_secs(600), Duration::from_secs(900))
        );
        assert_eq!(c.node_lease(), Duration::from_secs(600));
        assert_eq!(
            parse("node_id = 1\ndata_dir = \"d\"\n")
                .expect("valid")
                .node_lease(),
            Duration::from_secs(10),
            "not at an edge site: jobs.lease"
        );
        let no_site =
            parse(&EDGE_AGENT.replace("labels = { site = \"edge-1\" }", "")).expect_err("no site");
        assert!(no_site.to_string().contains("`site` label"), "{no_site}");
        let bootstrap =
            parse(&EDGE_AGENT.replace("join = [\"10.0.0.1:7070\"]", "bootstrap = true"))
                .expect_err("an edge voter");
        assert!(
            bootstrap
                .to_string()
                .contains("edge agents are learners only"),
            "{bootstrap}"
        );
        let stray = parse("node_id = 1\ndata_dir = \"d\"\n[edge]\nlease = \"5m\"\n")
            .expect_err("edge keys without edge");
        assert!(stray.to_string().contains("edge.enabled"), "{stray}");
    }

    #[test]
    fn an_edge_lease_stays_inside_its_grace() {
        let with = |keys: &str| parse(&format!("{EDGE_AGENT}{keys}"));
        let derived = with("lease = \"2m\"\n").expect("valid").edge.expect("edge");
        assert_eq!(derived.down_after, Duration::from_secs(180));
        let derived = with("down_after = \"3m\"\n")
            .expect("valid")
            .edge
            .expect("edge");
        assert_eq!(derived.lease, Duration::from_secs(120));
        let both = with("lease = \"2m\"\ndown_after = \"10m\"\n")
            .expect("valid")
            .edge
            .expect("edge");
        assert_eq!(
            (both.lease, both.down_after),
            (Duration::from_secs(120), Duration::from_secs(600))
        );
        let tight = with("lease = \"2m\"\ndown_after = \"179s\"\n").expect_err("tight");
        assert!(
            format!("{tight:#}").contains("1.5 x its lease"),
            "{tight:#}"
        );
        let below_jobs = with("lease = \"5s\"\n").expect_err("shorter than jobs.lease");
        assert!(
            below_jobs.to_string().contains("jobs.lease"),
            "{below_jobs}"
        );
    }

    #[test]
    fn plaintext_only_on_loopback() {
        let insecure = |listen: &str| Overrides {
            insecure: true,
            listen: Some(listen.parse().expect("addr")),
            advertise: Some(listen.to_owned()),
            ..Default::default()
        };
        assert!(Config::parse_and_validate(minimal(), insecure("127.0.0.1:7070")).is_ok());
        assert!(Config::parse_and_validate(minimal(), insecure("[::1]:7070")).is_ok());
        let err = Config::parse_and_validate(minimal(), insecure("10.1.2.3:7070"))
            .expect_err("plaintext on a real interface");
        assert!(
            err.to_string().contains("only allowed on loopback"),
            "{err}"
        );
        let c = Config::parse_and_validate(minimal(), Overrides::default()).expect("tls");
        assert!(!c.tls.insecure);
    }

    fn minimal() -> FileConfig {
        FileConfig::parse("node_id = 1\ndata_dir = \"/tmp/x\"\n").expect("parses")
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

    #[test]
    fn job_isolation_keys_parse() {
        let c = Config::parse_and_validate(minimal(), Overrides::default()).expect("valid");
        assert_eq!(c.jobs.cgroup_root, Path::new(DEFAULT_CGROUP_ROOT));
        assert!(!c.jobs.run_as.is_root(), "{:?}", c.jobs.run_as);
        let f = FileConfig::parse(
            "node_id = 1\ndata_dir = \"d\"\n[jobs]\ncgroup_root = \"/sys/fs/cgroup/jobs\"\n",
        )
        .expect("parses");
        let c = Config::parse_and_validate(f, Overrides::default()).expect("valid");
        assert_eq!(c.jobs.cgroup_root, Path::new("/sys/fs/cgroup/jobs"));
        let relative =
            FileConfig::parse("node_id = 1\ndata_dir = \"d\"\n[jobs]\ncgroup_root = \"jobs\"\n")
                .expect("parses");
        let err = Config::parse_and_validate(relative, Overrides::default()).expect_err("relative");
        assert!(err.to_string().contains("cgroup_root"), "{err}");
        let unknown = FileConfig::parse(
            "node_id = 1\ndata_dir = \"d\"\n[jobs]\nrun_as = \"no-such-user-here\"\n",
        )
        .expect("parses");
        let err = Config::parse_and_validate(unknown, Overrides::default()).expect_err("unknown");
        assert!(err.to_string().contains("no-such-user-here"), "{err}");
        assert_eq!(c.jobs.uid_range, UidRange::default());
        let range =
            FileConfig::parse("node_id = 1\ndata_dir = \"d\"\n[jobs]\nuid_range = \"2000-2999\"\n")
                .expect("parses");
        let c = Config::parse_and_validate(range, Overrides::default()).expect("valid");
        assert_eq!(
            c.jobs.uid_range,
            UidRange {
                first: 2000,
                last: 2999
            }
        );
        let root =
            FileConfig::parse("node_id = 1\ndata_dir = \"d\"\n[jobs]\nuid_range = \"0-100\"\n")
                .expect("parses");
        let err = Config::parse_and_validate(root, Overrides::default()).expect_err("root");
        assert!(err.to_string().contains("uid 0"), "{err}");
    }

    #[test]
    fn the_launcher_key_parses_and_a_bad_one_is_refused() {
        let c = Config::parse_and_validate(minimal(), Overrides::default()).expect("valid");
        assert_eq!(c.jobs.launcher, LauncherChoice::Auto);
        let jobs = |keys: &str| {
            FileConfig::parse(&format!("node_id = 1\ndata_dir = \"d\"\n[jobs]\n{keys}\n"))
                .and_then(|f| Config::parse_and_validate(f, Overrides::default()))
        };
        for (text, want) in [
            ("launcher = \"systemd\"", LauncherChoice::Systemd),
            ("launcher = \"direct\"", LauncherChoice::Direct),
            ("launcher = \"auto\"", LauncherChoice::Auto),
        ] {
            assert_eq!(jobs(text).expect(text).jobs.launcher, want);
        }
        let err = jobs("launcher = \"docker\"").expect_err("docker");
        assert!(
            format!("{err:#}").contains("expected one of `auto`, `systemd`, `direct`"),
            "{err:#}"
        );
    }
}
