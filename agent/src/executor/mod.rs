//! The executor (every agent): makes this node run exactly the placements the replicated state
//! gives it. Each pass compares desired (bindings for this node) with observed (its job
//! directories and supervisor processes), acts, and reports transitions through Raft.
//!
//! This file holds the loop. One pass, in order: `observe.rs` reads the job directories,
//! `desired.rs` reads this node's placements from the state, `mig.rs` re-applies the GPUs'
//! MIG layouts, `reconcile.rs` diffs desired against observed (pure), and `act.rs` carries out
//! each action, launching runs through `launch.rs` (who the job runs as: `identity.rs`; its
//! environment, handed to the supervisor in a file: `job_env.rs`). `setup.rs` prepares the
//! host once at start.
//!
//! What confines a run (`confine.rs`: `limits.rs`, `device_fence.rs`) is decided here and carried out by
//! its supervisor (`shim.rs`) in job cgroups (`cgroups.rs`, over `isolation.rs` for v2 and
//! `cgroup_v1.rs`), which the job enters before it execs (`pre_exec.rs`).
//! `launcher.rs` starts each supervisor: a child process, or a systemd transient unit
//! (`systemd_unit.rs` computes its properties, `systemd_bus.rs` talks to systemd).

pub mod cgroup_tree;
pub mod cgroup_v1;
pub mod cgroups;
pub mod confine;
pub mod container_cmd;
pub(crate) mod container_supervise;
pub mod device_fence;
mod disk_space;
mod image_pull;
pub mod isolation;
pub mod job_dir;
pub(crate) mod lease;
pub mod limits;
pub(crate) mod log_files;
pub mod shim;

mod act;
mod desired;
mod identity;
mod job_env;
mod jobs_owner;
mod launch;
pub mod launcher;
mod log_writer;
mod mig;
mod observe;
mod phase_report;
mod pre_exec;
mod pull_progress;
mod reconcile;
mod registry_auth;
pub mod retention;
pub(crate) mod setup;
mod systemd_bus;
mod systemd_unit;
mod vm;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use gpu_raft_store::JobId;
use tokio::process::Child;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use self::desired::{Mine, desired_runs};
pub use self::launch::prepare_run;
pub use self::launcher::{Launcher, supervisor_command};
use self::phase_report::PhaseReports;
use self::reconcile::{Action, reconcile};
pub use self::setup::Host;
use crate::config::{Confine, ContainerSettings, RunAs, UidRange};
use crate::gpu::GpuBackend;
use crate::raft::Cluster;

#[derive(Clone, Debug)]
pub struct ExecutorSettings {
    /// `<data_dir>/jobs`.
    pub jobs_dir: PathBuf,
    /// `<data_dir>/lease`, renewed by `LeaseKeeper`.
    pub lease_path: PathBuf,
    pub lease: Duration,
    /// SIGTERM → SIGKILL grace when stopping a job.
    pub stop_grace: Duration,
    /// This binary, run as `shim`.
    pub agent_exe: PathBuf,
    pub tick: Duration,
    /// The user jobs run as (`jobs.run_as`).
    pub run_as: RunAs,
    /// Per-tenant users (`jobs.run_as_by_tenant`).
    pub run_as_by_tenant: BTreeMap<String, RunAs>,
    /// Where job cgroups go when the node has cgroup v2 (`jobs.cgroup_root`; on cgroup v1, its
    /// last component names the directory in each hierarchy).
    pub cgroup_root: PathBuf,
    /// The uids a cluster-mapped account may run as here (`jobs.uid_range`).
    pub uid_range: UidRange,
    /// Default limits, extra devices, foreign-process policy (`jobs.*`).
    pub confine: Confine,
    /// Bounds on the runs' disk use.
    pub disk: DiskLimits,
    /// How container jobs run here (`[containers]`).
    pub containers: ContainerSettings,
}

/// How much disk runs may use: `jobs.log_max`, `jobs.min_free`, `jobs.keep_finished_runs`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskLimits {
    /// Each log file is rotated at this size (a stream keeps at most twice this).
    pub log_max: u64,
    /// No run starts while the jobs filesystem has less space available.
    pub min_free: u64,
    /// An ended, reported run's directory is removed this long after it was reported.
    pub keep_finished_runs: Duration,
}

impl Default for DiskLimits {
    fn default() -> Self {
        Self::from(&crate::config::JobDiskSettings::defaults())
    }
}

impl From<&crate::config::JobDiskSettings> for DiskLimits {
    fn from(s: &crate::config::JobDiskSettings) -> Self {
        Self {
            log_max: s.log_max.0,
            min_free: s.min_free.0,
            keep_finished_runs: s.keep_finished_runs,
        }
    }
}

impl ExecutorSettings {
    /// The user a job of `tenant` runs as.
    pub fn user_for(&self, tenant: &str) -> &RunAs {
        self.run_as_by_tenant.get(tenant).unwrap_or(&self.run_as)
    }
}

pub struct Executor {
    pub cluster: Cluster,
    pub gpus: Arc<dyn GpuBackend>,
    pub settings: ExecutorSettings,
    /// What this host offers jobs (`Host::prepare`, once at start).
    pub host: Host,
    /// How supervisors are started, chosen once at start (`Launcher::choose`).
    pub launcher: Launcher,
    /// This agent's TLS material: a voter's CA key opens tenants' registry logins here;
    /// elsewhere a voter opens them (`RaftPeer.OpenRegistryLogin`).
    pub tls: Option<crate::tls::TlsIdentity>,
}

/// How soon a pass looks again while a supervisor it started has not written its pid.
const STARTING_POLL: Duration = Duration::from_millis(10);

/// The supervisors this agent started. Each is reaped by a task of its own, which wakes the
/// loop the moment it ends, so a run's outcome is reported then rather than at the next tick.
#[derive(Default)]
struct Children {
    ended: Arc<Notify>,
}

impl Children {
    fn watch(&self, mut child: Child) {
        let ended = self.ended.clone();
        tokio::spawn(async move {
            child.wait().await.ok();
            ended.notify_one();
        });
    }

    /// Runs started as systemd units are not our children: systemd says when one of them has
    /// gone (`UnitRemoved`, once its supervisor has exited and the unit was collected).
    fn watch_units(&self, launcher: &Launcher, cancel: CancellationToken) {
        let Some(bus) = launcher.systemd() else {
            return;
        };
        let (bus, ended) = (bus.clone(), self.ended.clone());
        tokio::spawn(async move {
            while !cancel.is_cancelled() {
                match bus.removed_units().await {
                    Ok(removed) => {
                        let mut removed = std::pin::pin!(removed);
                        loop {
                            tokio::select! {
                                () = cancel.cancelled() => return,
                                name = removed.next() => match name {
                                    Some(name) if name.starts_with("gpumesh-j") => ended.notify_one(),
                                    Some(_) => {}
                                    None => break,
                                },
                            }
                        }
                    }
                    Err(e) => {
                        warn!(error = %e, "cannot hear from systemd when job units end; ends are seen at the next tick")
                    }
                }
                // The connection dropped (systemd re-executed, say): listen again shortly.
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        });
    }
}

impl Executor {
    pub async fn run(self, cancel: CancellationToken) {
        let host = &self.host;
        let mut applied = self.cluster.state.subscribe();
        let children = Children::default();
        children.watch_units(&self.launcher, cancel.clone());
        let mut mig_errors = HashMap::new();
        let mut mine = Mine::default();
        let mut phases = PhaseReports::default();
        let mut wait = self.settings.tick;
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = applied.changed() => {}
                () = children.ended.notified() => {}
                () = tokio::time::sleep(wait) => {}
            }
            let starting = self
                .pass(&children, host, &mut mig_errors, &mut mine, &mut phases)
                .await;
            // A supervisor just started writes its pid within milliseconds; look again soon so
            // the start is reported then, not at the next tick (a job started while nothing else
            // changed used to wait a whole tick to be reported running).
            wait = if starting {
                STARTING_POLL
            } else {
                self.settings.tick
            };
        }
    }

    /// One pass; `true` while a run it started (or found starting) has not shown its
    /// supervisor yet.
    async fn pass(
        &self,
        children: &Children,
        host: &Host,
        mig_errors: &mut HashMap<u32, String>,
        mine: &mut Mine,
        phases: &mut PhaseReports,
    ) -> bool {
        let me = self.cluster.id;
        let observed = match self.observe() {
            Ok(o) => o,
            Err(e) => {
                warn!(error = %e, "cannot read the jobs directory");
                return false;
            }
        };
        let mut starting = observed.iter().any(|o| o.starting);
        let (desired, jobs) = self
            .cluster
            .state
            .read(|s| desired_runs(s, me, &observed, mine));
        self.mark_busy_gpus(&jobs, &observed);
        self.end_expired_vms(&jobs, &observed);
        self.reconcile_mig(mig_errors);
        // Start nothing while out of contact: the supervisor would fence it at once.
        let lease_fresh = lease::lease_age(&self.settings.lease_path)
            .is_some_and(|a| a < self.settings.lease / 2);
        // Starts and stops one by one; the reports of different runs at once, so the leader
        // commits a pass's reports together (one entry, one fsync) instead of one round trip
        // after another. A run's own reports stay in order (started, then finished).
        let mut reports: BTreeMap<(JobId, u64), Vec<Action>> = BTreeMap::new();
        for action in reconcile(&desired, &observed) {
            let start = matches!(action, Action::Start { .. });
            if !lease_fresh && start {
                continue;
            }
            starting |= start;
            match action {
                Action::ReportStarted { job, generation }
                | Action::ReportFinished {
                    job, generation, ..
                } => reports.entry((job, generation)).or_default().push(action),
                _ => self.act(action, &jobs, children, host).await,
            }
        }
        let runs = reports.into_values().map(|actions| async {
            for action in actions {
                self.act(action, &jobs, children, host).await;
            }
        });
        futures::future::join_all(runs).await;
        self.report_phases(&jobs, &observed, phases).await;
        starting
    }
}
