//! Agent configuration: TOML file → `FileConfig` (unknown keys rejected by name) → command-line
//! overrides → `Config::parse_and_validate`, the only place defaults and rules live.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use gpu_raft_store::{NodeId, validate};

use crate::gpu::BackendKind;
use crate::raft::cluster::ClusterSettings;
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
}

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

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiSection {
    pub requests_per_second: Option<u32>,
    pub burst: Option<u32>,
}

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
    pub fault_injection: Option<bool>,
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
    /// Where `--bootstrap` writes the first admin token (mode 0600).
    pub bootstrap_token_file: PathBuf,
    pub raft: RaftSettings,
    pub autopilot: AutopilotSettings,
    pub jobs: JobSettings,
    pub tls: TlsSettings,
    pub api: ApiSettings,
    pub monitor: MonitorSettings,
    /// Set when this agent is at an edge site.
    pub edge: Option<EdgeSettings>,
}

/// An edge-site agent (`[edge] enabled = true`): a learner only, on a slow or unreliable link.
/// It fences its jobs `lease` after it last heard from the cluster (instead of `jobs.lease`),
/// and the leader declares it Down after `down_after` (instead of `jobs.down_after`). Both are
/// recorded in the replicated state when it registers (`EdgeTerms`), where the leader reads
/// them; every agent of one site must be configured alike, or its registration is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EdgeSettings {
    /// The agent's `site` label.
    pub site: String,
    pub lease: Duration,
    pub down_after: Duration,
}

impl EdgeSettings {
    /// The terms this agent registers with.
    pub fn terms(&self) -> gpu_raft_store::EdgeTerms {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        gpu_raft_store::EdgeTerms {
            site: self.site.clone(),
            lease_ms: ms(self.lease),
            down_after_ms: ms(self.down_after),
        }
    }
}

/// GPU sampling: every `interval`, kept for `retention` in memory (a ring per GPU, so the
/// history's size is bounded by `retention / interval` samples); a sample that takes longer
/// than `sample_timeout` (a hung driver) is abandoned and the next one waits for it.
#[derive(Clone, Debug)]
pub struct MonitorSettings {
    pub interval: Duration,
    pub retention: Duration,
    pub sample_timeout: Duration,
    pub metrics_listen: Option<SocketAddr>,
    pub rules: Vec<gpu_raft_store::AlertRule>,
    pub webhooks: Vec<hyper::Uri>,
    pub green: Option<crate::monitor::power::Green>,
    pub energy_report_every: Duration,
}

impl MonitorSettings {
    /// Samples kept per GPU.
    pub fn history_len(&self) -> usize {
        (self.retention.as_millis() / self.interval.as_millis().max(1)).max(1) as usize
    }
}

/// Limits on the public API, per caller: each token may make `requests_per_second` requests
/// (with bursts up to `burst`); refusals of unauthenticated requests are audited at the same
/// rate per source address. 0 disables the limit.
#[derive(Clone, Copy, Debug)]
pub struct ApiSettings {
    pub requests_per_second: u32,
    pub burst: u32,
}

/// Mutual TLS. Material lives in `<data_dir>/tls/`; a joining agent enrols with the CA file and
/// a join token, once.
#[derive(Clone, Debug)]
pub struct TlsSettings {
    /// No TLS at all: only allowed when the agent listens and advertises on loopback.
    pub insecure: bool,
    /// Lifetime of the certificates this agent signs; renewed with a third of it left.
    pub cert_validity: Duration,
    pub ca_file: Option<PathBuf>,
    pub join_token_file: Option<PathBuf>,
}

/// Job supervision timing. A node that cannot reach the cluster for `lease` stops its own jobs;
/// the leader declares a node down (and re-places its jobs) only after `down_after`, which must
/// be comfortably longer, so a job never runs on two nodes at once.
#[derive(Clone, Debug)]
pub struct JobSettings {
    pub lease: Duration,
    pub down_after: Duration,
    /// SIGTERM → SIGKILL grace when a job is cancelled or evicted (fenced: at most lease / 4).
    pub stop_grace: Duration,
    /// The user jobs run as: `jobs.run_as`, by default `nobody` when the agent runs as root and
    /// the agent's own user otherwise. Never root unless the operator says `run_as = "root"`.
    pub run_as: RunAs,
    /// Per-tenant users (`jobs.run_as_by_tenant`), so tenants' jobs cannot touch each other's
    /// files on a shared host.
    pub run_as_by_tenant: BTreeMap<String, RunAs>,
    /// Every run gets a cgroup `<cgroup_root>/job-<id>-g<generation>` with its CPU and memory
    /// limits when this is (or can be made) a cgroup v2 directory with the `cpu` and `memory`
    /// controllers delegated; otherwise jobs run without limits (see `executor::isolation`).
    pub cgroup_root: PathBuf,
}

/// Where job cgroups live by default: a cgroup of our own directly under the cgroup v2 root,
/// beside systemd's slices (systemd leaves cgroups it did not create alone).
pub const DEFAULT_CGROUP_ROOT: &str = "/sys/fs/cgroup/gpumesh";

/// The user jobs run as, resolved to ids when the configuration is validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunAs {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

impl RunAs {
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// `jobs.run_as` (or its default) resolved against this host's users and the agent's own
    /// effective ids.
    fn resolve(requested: Option<&str>) -> anyhow::Result<Self> {
        use nix::unistd::{Uid, User, getegid, geteuid};
        let (uid, gid) = (geteuid().as_raw(), getegid().as_raw());
        let own_name = User::from_uid(Uid::from_raw(uid))
            .ok()
            .flatten()
            .map_or_else(|| uid.to_string(), |u| u.name);
        let lookup = |name: &str| -> anyhow::Result<Option<(u32, u32)>> {
            let user =
                User::from_name(name).with_context(|| format!("looking up user {name:?}"))?;
            Ok(user.map(|u| (u.uid.as_raw(), u.gid.as_raw())))
        };
        choose_run_as(requested, (uid, gid, &own_name), lookup)
    }
}

/// The pure part of `RunAs::resolve`: `agent` is the agent's own (uid, gid, name), `lookup`
/// finds a user's (uid, primary gid) by name.
fn choose_run_as(
    requested: Option<&str>,
    agent: (u32, u32, &str),
    lookup: impl Fn(&str) -> anyhow::Result<Option<(u32, u32)>>,
) -> anyhow::Result<RunAs> {
    let (agent_uid, agent_gid, agent_name) = agent;
    let Some(name) = requested else {
        if agent_uid != 0 {
            return Ok(RunAs {
                name: agent_name.to_owned(),
                uid: agent_uid,
                gid: agent_gid,
            });
        }
        let (uid, gid) = lookup("nobody")?.context(
            "jobs.run_as is not set and this host has no user \"nobody\" to run jobs as; \
             set jobs.run_as to an unprivileged user",
        )?;
        return Ok(RunAs {
            name: "nobody".into(),
            uid,
            gid,
        });
    };
    ensure!(!name.is_empty(), "jobs.run_as must name a user");
    let (uid, gid) =
        lookup(name)?.with_context(|| format!("jobs.run_as: this host has no user {name:?}"))?;
    if agent_uid == 0 {
        return Ok(RunAs {
            name: name.to_owned(),
            uid,
            gid,
        });
    }
    ensure!(
        uid == agent_uid,
        "jobs.run_as = {name:?} (uid {uid}) needs the agent to run as root; it runs as uid {agent_uid}"
    );
    // Not root: jobs keep the agent's own ids (it could not switch to the user's primary group).
    Ok(RunAs {
        name: name.to_owned(),
        uid,
        gid: agent_gid,
    })
}

/// Raft timing. Defaults suit a LAN: heartbeat 100 ms; election timeout 200–400 ms. In openraft
/// 0.9 a follower waits out the leader lease (= `election_timeout_max`) plus one election timeout
/// before campaigning, so a leader that goes silent is replaced after ≈ 0.6–0.9 s; a killed one
/// (its port refuses connections) after about the lease, 0.4 s (`failover.rs`). openraft 0.9
/// also uses the heartbeat interval as the deadline of every AppendEntries RPC: at 50 ms a loaded
/// 2-core host missed heartbeats and elected spuriously, which is why the heartbeat is 100 ms,
/// and the election timeout keeps it below half its minimum. WAN and edge deployments should use
/// several times these values.
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
    /// Whether an admin may inject delay, loss and duplication into this agent's outgoing Raft
    /// messages (`NodeService.InjectNetworkFault`; chaos testing only).
    pub fault_injection: bool,
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
    pub bootstrap_token_file: Option<PathBuf>,
    pub insecure: bool,
    pub ca_file: Option<PathBuf>,
    pub join_token_file: Option<PathBuf>,
    pub metrics_listen: Option<SocketAddr>,
}

/// Most samples kept per GPU (a day at 1 Hz; about 10 MB per GPU).
pub const MAX_HISTORY_LEN: usize = 86_400;

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
        }
    }

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
            election_timeout_min: r.election_timeout_min.unwrap_or(Duration::from_millis(200)),
            election_timeout_max: r.election_timeout_max.unwrap_or(Duration::from_millis(400)),
            snapshot_every: r.snapshot_every.unwrap_or(10_000),
            keep_logs: r.keep_logs.unwrap_or(1_000),
            voter_target: r.voter_target.unwrap_or(3),
            fault_injection: r.fault_injection.unwrap_or(false),
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
            run_as: RunAs::resolve(j.run_as.as_deref())?,
            run_as_by_tenant: j
                .run_as_by_tenant
                .unwrap_or_default()
                .into_iter()
                .map(|(tenant, user)| {
                    validate::name("tenant", &tenant)
                        .map_err(anyhow::Error::msg)
                        .context("jobs.run_as_by_tenant")?;
                    let run_as = RunAs::resolve(Some(&user))
                        .with_context(|| format!("jobs.run_as_by_tenant.{tenant}"))?;
                    Ok((tenant, run_as))
                })
                .collect::<anyhow::Result<_>>()?,
            cgroup_root: j
                .cgroup_root
                .unwrap_or_else(|| PathBuf::from(DEFAULT_CGROUP_ROOT)),
        };
        ensure!(
            jobs.cgroup_root.is_absolute(),
            "jobs.cgroup_root must be an absolute path, got {}",
            jobs.cgroup_root.display()
        );
        ensure!(
            jobs.lease >= raft.election_timeout_max * 2,
            "jobs.lease must be at least twice raft.election_timeout_max"
        );
        ensure!(
            jobs.down_after >= jobs.lease + jobs.lease / 2,
            "jobs.down_after must be at least 1.5 x jobs.lease, so a cut-off node fences its jobs before they are re-placed"
        );
        let edge = edge_settings(file.edge, &labels, bootstrap, &jobs, &raft)?;
        let t = file.tls;
        let tls = TlsSettings {
            insecure: flags.insecure || t.insecure.unwrap_or(false),
            cert_validity: t.cert_validity.unwrap_or(Duration::from_secs(30 * 86_400)),
            ca_file: flags.ca_file.or(t.ca_file),
            join_token_file: flags.join_token_file.or(t.join_token_file),
        };
        ensure!(
            tls.cert_validity >= Duration::from_secs(10),
            "tls.cert_validity must be at least 10s"
        );
        if tls.insecure {
            ensure!(
                listen.ip().is_loopback() && is_loopback_addr(&advertise),
                "plaintext (tls.insecure / --insecure) is only allowed on loopback; this agent \
                 listens on {listen} and advertises {advertise}"
            );
        }
        let api = ApiSettings {
            requests_per_second: file.api.requests_per_second.unwrap_or(100),
            burst: file.api.burst.unwrap_or(200),
        };
        ensure!(
            api.requests_per_second == 0 || api.burst >= 1,
            "api.burst must be at least 1"
        );
        let m = file.monitor;
        let monitor = MonitorSettings {
            interval: m.interval.unwrap_or(Duration::from_secs(1)),
            retention: m.retention.unwrap_or(Duration::from_secs(3600)),
            sample_timeout: m.sample_timeout.unwrap_or(Duration::from_secs(2)),
            metrics_listen: flags.metrics_listen.or(m.metrics_listen),
            rules: m
                .rules
                .iter()
                .map(|r| r.to_rule().map_err(anyhow::Error::msg))
                .collect::<anyhow::Result<_>>()
                .context("monitor.rules")?,
            webhooks: m
                .webhooks
                .iter()
                .map(|u| crate::monitor::webhook::parse_url(u).map_err(anyhow::Error::msg))
                .collect::<anyhow::Result<_>>()
                .context("monitor.webhooks")?,
            energy_report_every: m.energy_report_every.unwrap_or(Duration::from_secs(30)),
            green: m
                .green_idle_after
                .map(|after| crate::monitor::power::Green {
                    idle_after_ms: u64::try_from(after.as_millis()).unwrap_or(u64::MAX),
                    power_pct: m.green_power_pct.unwrap_or(50),
                }),
        };
        ensure!(
            monitor.energy_report_every >= Duration::from_secs(1),
            "monitor.energy_report_every must be at least 1s"
        );
        if let Some(green) = monitor.green {
            ensure!(
                (30..=100).contains(&green.power_pct),
                "monitor.green_power_pct must be 30-100, got {}",
                green.power_pct
            );
        }
        let mut names = std::collections::BTreeSet::new();
        for rule in &monitor.rules {
            ensure!(
                names.insert(&rule.name),
                "monitor.rules: rule {:?} is defined twice",
                rule.name
            );
        }
        ensure!(
            monitor.interval >= Duration::from_millis(100),
            "monitor.interval must be at least 100ms"
        );
        ensure!(
            monitor.retention >= monitor.interval,
            "monitor.retention must be at least monitor.interval"
        );
        ensure!(
            monitor.history_len() <= MAX_HISTORY_LEN,
            "monitor.retention / monitor.interval keeps {} samples per GPU, more than {MAX_HISTORY_LEN}",
            monitor.history_len()
        );
        ensure!(
            monitor.sample_timeout > Duration::ZERO,
            "monitor.sample_timeout must be positive"
        );
        Ok(Self {
            node_id,
            listen,
            advertise,
            data_dir: data_dir.clone(),
            bootstrap,
            join,
            join_timeout: file.join_timeout.unwrap_or(Duration::from_secs(60)),
            labels,
            gpu_backend: flags.gpu_backend.or(file.gpu_backend).unwrap_or_default(),
            bootstrap_token_file: flags
                .bootstrap_token_file
                .or(file.bootstrap_token_file)
                .unwrap_or_else(|| data_dir.join("bootstrap-admin.token")),
            sim_gpus: flags
                .sim_gpus
                .or(file.sim_gpus)
                .unwrap_or_else(|| "4xA100-80GB".to_owned()),
            raft,
            autopilot,
            jobs,
            tls,
            api,
            monitor,
            edge,
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
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.raft.snapshot_every),
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

/// The `[edge]` section checked against the rest: an edge agent needs a `site` label, never
/// bootstraps (it would be the first voter), and tolerates at least what the cluster's own
/// timings do; its lease is strictly inside its grace (`down_after` ≥ 1.5 × lease).
fn edge_settings(
    e: EdgeSection,
    labels: &BTreeMap<String, String>,
    bootstrap: bool,
    jobs: &JobSettings,
    raft: &RaftSettings,
) -> anyhow::Result<Option<EdgeSettings>> {
    if !e.enabled.unwrap_or(false) {
        ensure!(
            e.lease.is_none() && e.down_after.is_none(),
            "edge.lease and edge.down_after only apply with edge.enabled = true"
        );
        return Ok(None);
    }
    let site = labels
        .get(gpu_raft_store::SITE_LABEL)
        .context("edge.enabled needs a `site` label naming this agent's edge site (labels = { site = \"...\" })")?;
    ensure!(
        !bootstrap,
        "an edge agent cannot bootstrap a cluster: that would make it the first voter, and edge \
         agents are learners only; bootstrap a voter in the core site and join this agent to it"
    );
    // Either one given derives the other at the tightest safe ratio; neither: 10 and 15 minutes.
    let (lease, down_after) = match (e.lease, e.down_after) {
        (Some(lease), Some(down_after)) => (lease, down_after),
        (Some(lease), None) => (lease, lease + lease / 2),
        (None, Some(down_after)) => (down_after * 2 / 3, down_after),
        (None, None) => (Duration::from_secs(600), Duration::from_secs(900)),
    };
    ensure!(
        lease >= jobs.lease,
        "edge.lease ({}) must be at least jobs.lease ({})",
        humantime::format_duration(lease),
        humantime::format_duration(jobs.lease)
    );
    ensure!(
        lease >= raft.election_timeout_max * 2,
        "edge.lease must be at least twice raft.election_timeout_max"
    );
    let edge = EdgeSettings {
        site: site.clone(),
        lease,
        down_after,
    };
    edge.terms()
        .validate()
        .map_err(anyhow::Error::msg)
        .context("invalid [edge] settings")?;
    Ok(Some(edge))
}

/// Whether `host:port` names this machine's loopback (an IP in 127/8 or ::1, or `localhost`).
fn is_loopback_addr(addr: &str) -> bool {
    let host = addr
        .rsplit_once(':')
        .map_or(addr, |(h, _)| h)
        .trim_matches(['[', ']']);
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The documented reference is a valid configuration, and every section in it is one we
    /// read (unknown keys would be refused).
    #[test]
    fn the_example_config_parses_and_validates() {
        let text = include_str!("../../deploy/config/agent.example.toml");
        let file = FileConfig::parse(text).expect("the example parses");
        let c = Config::parse_and_validate(file, Overrides::default()).expect("and validates");
        assert_eq!(c.tls.cert_validity, Duration::from_secs(30 * 86_400));
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

    fn users(name: &str) -> anyhow::Result<Option<(u32, u32)>> {
        Ok(match name {
            "root" => Some((0, 0)),
            "nobody" => Some((65534, 65534)),
            "alice" => Some((1000, 1000)),
            _ => None,
        })
    }

    #[test]
    fn jobs_never_run_as_root_by_default() {
        let root = (0, 0, "root");
        let alice = (1000, 1001, "alice");
        let pick = |requested, agent| choose_run_as(requested, agent, users);
        let nobody = RunAs {
            name: "nobody".into(),
            uid: 65534,
            gid: 65534,
        };
        assert_eq!(pick(None, root).expect("default"), nobody);
        assert_eq!(pick(Some("nobody"), root).expect("named"), nobody);
        // An unprivileged agent runs jobs as itself, with its own group.
        let own = RunAs {
            name: "alice".into(),
            uid: 1000,
            gid: 1001,
        };
        assert_eq!(pick(None, alice).expect("own user"), own);
        assert_eq!(pick(Some("alice"), alice).expect("same user"), own);
        // Root only when asked for by name.
        assert!(pick(Some("root"), root).expect("explicit root").is_root());
    }

    #[test]
    fn impossible_run_as_users_are_config_errors() {
        let err = choose_run_as(Some("mallory"), (0, 0, "root"), users).expect_err("unknown");
        assert!(err.to_string().contains("no user \"mallory\""), "{err}");
        let err =
            choose_run_as(Some("nobody"), (1000, 1000, "alice"), users).expect_err("not root");
        assert!(
            err.to_string().contains("needs the agent to run as root"),
            "{err}"
        );
        assert!(choose_run_as(Some(""), (0, 0, "root"), users).is_err());
        let no_nobody = |_: &str| Ok(None);
        let err = choose_run_as(None, (0, 0, "root"), no_nobody).expect_err("no nobody");
        assert!(err.to_string().contains("jobs.run_as"), "{err}");
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
    }
}
