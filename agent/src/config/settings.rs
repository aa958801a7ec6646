//! The validated settings of each config section, and the function per section that checks
//! its `[section]` of the file (flags already laid over it) and fills in the defaults.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, ensure};
use gpu_raft_store::validate;

use super::confine::Confine;
use super::file::{
    ApiSection, AutopilotSection, EdgeSection, JobsSection, LauncherChoice, MonitorSection,
    RaftSection, TlsSection,
};
use super::jobs_disk::{self, JobDiskSettings};
use super::{RunAs, UidRange};

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
    /// Build a snapshot (and allow purging the log) after this many commands applied (a batch
    /// entry counts each of its writes: `raft/snapshots.rs`).
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

pub(super) fn raft(r: RaftSection) -> anyhow::Result<RaftSettings> {
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
    Ok(raft)
}

#[derive(Clone, Debug)]
pub struct AutopilotSettings {
    /// A voter unreachable this long is replaced by a healthy learner.
    pub dead_voter_after: Duration,
}

pub(super) fn autopilot(
    a: AutopilotSection,
    raft: &RaftSettings,
) -> anyhow::Result<AutopilotSettings> {
    let autopilot = AutopilotSettings {
        dead_voter_after: a.dead_voter_after.unwrap_or(Duration::from_secs(30)),
    };
    ensure!(
        autopilot.dead_voter_after > raft.election_timeout_max,
        "autopilot.dead_voter_after must exceed raft.election_timeout_max"
    );
    Ok(autopilot)
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
    /// The uids a job of a cluster-mapped account (`JobSpec::account`) may run as here.
    pub uid_range: UidRange,
    /// Default limits, extra devices and the foreign-process policy (`config::confine`).
    pub confine: Confine,
    /// Where run directories live and how their disk use is bounded.
    pub disk: JobDiskSettings,
    /// How runs are started (`jobs.launcher`, default `auto`; see `executor::launcher`).
    pub launcher: LauncherChoice,
}

/// Where job cgroups live by default: a cgroup of our own directly under the cgroup v2 root,
/// beside systemd's slices (systemd leaves cgroups it did not create alone).
pub const DEFAULT_CGROUP_ROOT: &str = "/sys/fs/cgroup/gpumesh";

/// `[jobs]`, checked against the Raft timing: a node's lease outlasts an election, and the
/// leader's grace outlasts the lease.
pub(super) fn jobs(
    j: JobsSection,
    raft: &RaftSettings,
    data_dir: &Path,
) -> anyhow::Result<JobSettings> {
    let confine = super::confine::confine(&j)?;
    let disk = jobs_disk::settings(j.dir, j.log_max, j.min_free, j.keep_finished_runs, data_dir)?;
    let jobs = JobSettings {
        confine,
        lease: j.lease.unwrap_or(Duration::from_secs(10)),
        down_after: j.down_after.unwrap_or(Duration::from_secs(20)),
        stop_grace: j.stop_grace.unwrap_or(Duration::from_secs(10)),
        run_as: RunAs::resolve(j.run_as.as_deref())?,
        run_as_by_tenant: run_as_by_tenant(j.run_as_by_tenant.unwrap_or_default())?,
        cgroup_root: j
            .cgroup_root
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CGROUP_ROOT)),
        uid_range: match j.uid_range {
            Some(r) => r.parse().map_err(anyhow::Error::msg)?,
            None => UidRange::default(),
        },
        disk,
        launcher: j.launcher.unwrap_or_default(),
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
    Ok(jobs)
}

/// `jobs.run_as_by_tenant`: each tenant name checked and its user resolved.
fn run_as_by_tenant(users: BTreeMap<String, String>) -> anyhow::Result<BTreeMap<String, RunAs>> {
    users
        .into_iter()
        .map(|(tenant, user)| {
            validate::name("tenant", &tenant)
                .map_err(anyhow::Error::msg)
                .context("jobs.run_as_by_tenant")?;
            let run_as = RunAs::resolve(Some(&user))
                .with_context(|| format!("jobs.run_as_by_tenant.{tenant}"))?;
            Ok((tenant, run_as))
        })
        .collect()
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

/// The `[edge]` section checked against the rest: an edge agent needs a `site` label, never
/// bootstraps (it would be the first voter), and tolerates at least what the cluster's own
/// timings do; its lease is strictly inside its grace (`down_after` ≥ 1.5 × lease).
pub(super) fn edge(
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

/// How long the certificates an agent signs live unless configured: a day, renewed with eight
/// hours left, so a stolen agent certificate is worth hours, not weeks.
const DEFAULT_CERT_VALIDITY: Duration = Duration::from_secs(86_400);

/// `[tls]`; plaintext only where nothing off this machine can reach the agent.
pub(super) fn tls(
    t: TlsSection,
    listen: SocketAddr,
    advertise: &str,
) -> anyhow::Result<TlsSettings> {
    let tls = TlsSettings {
        insecure: t.insecure.unwrap_or(false),
        cert_validity: t.cert_validity.unwrap_or(DEFAULT_CERT_VALIDITY),
        ca_file: t.ca_file,
        join_token_file: t.join_token_file,
    };
    ensure!(
        tls.cert_validity >= Duration::from_secs(10),
        "tls.cert_validity must be at least 10s"
    );
    if tls.insecure {
        ensure!(
            listen.ip().is_loopback() && is_loopback_addr(advertise),
            "plaintext (tls.insecure / --insecure) is only allowed on loopback; this agent \
             listens on {listen} and advertises {advertise}"
        );
    }
    Ok(tls)
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

/// Limits on the public API, per agent: each token may make `requests_per_second` requests
/// (with bursts up to `burst`), every token of one tenant together
/// `tenant_requests_per_second`, every token used from one source address together
/// `source_requests_per_second` (bursts of twice as many); refusals of unauthenticated
/// requests are logged at the token rate per source address. 0 disables a limit.
#[derive(Clone, Debug)]
pub struct ApiSettings {
    pub requests_per_second: u32,
    pub burst: u32,
    pub tenant_requests_per_second: u32,
    pub source_requests_per_second: u32,
    /// The most tasks one job array may have.
    pub max_array_tasks: u64,
    /// CA certificates (PEM) trusted for https webhooks beside the system's.
    pub webhook_ca_file: Option<std::path::PathBuf>,
}

pub(super) fn api(a: ApiSection) -> anyhow::Result<ApiSettings> {
    let api = ApiSettings {
        requests_per_second: a.requests_per_second.unwrap_or(100),
        burst: a.burst.unwrap_or(200),
        tenant_requests_per_second: a.tenant_requests_per_second.unwrap_or(500),
        source_requests_per_second: a.source_requests_per_second.unwrap_or(1000),
        max_array_tasks: a.max_array_tasks.unwrap_or(10_000),
        webhook_ca_file: a.webhook_ca_file,
    };
    ensure!(
        (1..=gpu_raft_store::MAX_ARRAY_TASKS).contains(&api.max_array_tasks),
        "api.max_array_tasks must be between 1 and {}",
        gpu_raft_store::MAX_ARRAY_TASKS
    );
    ensure!(
        api.requests_per_second == 0 || api.burst >= 1,
        "api.burst must be at least 1"
    );
    Ok(api)
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

/// Most samples kept per GPU (a day at 1 Hz; about 10 MB per GPU).
pub const MAX_HISTORY_LEN: usize = 86_400;

/// `[monitor]`: alert rules and webhooks parsed, green mode and the history's size bounded.
pub(super) fn monitor(m: MonitorSection) -> anyhow::Result<MonitorSettings> {
    let monitor = MonitorSettings {
        interval: m.interval.unwrap_or(Duration::from_secs(1)),
        retention: m.retention.unwrap_or(Duration::from_secs(3600)),
        sample_timeout: m.sample_timeout.unwrap_or(Duration::from_secs(2)),
        metrics_listen: m.metrics_listen,
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
    Ok(monitor)
}
