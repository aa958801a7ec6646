//! The executor (every agent): makes this node run exactly the placements the replicated state
//! gives it. Each pass compares desired (bindings for this node) with observed (its job
//! directories and supervisor processes), acts, and reports transitions through Raft.
//!
//! This file holds the loop. One pass, in order: `observe.rs` reads the job directories,
//! `desired.rs` reads this node's placements from the state, `mig.rs` re-applies the GPUs'
//! MIG layouts, `reconcile.rs` diffs desired against observed (pure), and `act.rs` carries out
//! each action, launching runs through `launch.rs`. `setup.rs` prepares the host once at start.

mod disk_space;
pub mod isolation;
pub mod job_dir;
pub(crate) mod lease;
pub(crate) mod log_files;
pub mod shim;

mod act;
mod desired;
mod jobs_owner;
mod launch;
mod log_writer;
mod mig;
mod observe;
mod reconcile;
pub mod retention;
pub(crate) mod setup;
mod vm;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gpu_raft_store::JobId;
use tokio::process::Child;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use self::desired::{Mine, desired_runs};
pub use self::launch::shim_args;
use self::reconcile::{Action, reconcile};
use self::setup::Host;
use crate::config::RunAs;
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
    /// Where job cgroups go when the node has cgroup v2 (`jobs.cgroup_root`).
    pub cgroup_root: PathBuf,
    /// Bounds on the runs' disk use.
    pub disk: DiskLimits,
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
}

/// A supervisor this agent started (kept so it can be reaped).
type Children = HashMap<(JobId, u64), Child>;

impl Executor {
    pub async fn run(self, cancel: CancellationToken) {
        let host = self.prepare_host();
        let mut applied = self.cluster.state.subscribe();
        let mut children = Children::new();
        let mut mig_errors = HashMap::new();
        let mut mine = Mine::default();
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = applied.changed() => {}
                () = tokio::time::sleep(self.settings.tick) => {}
            }
            self.pass(&mut children, &host, &mut mig_errors, &mut mine)
                .await;
        }
    }

    async fn pass(
        &self,
        children: &mut Children,
        host: &Host,
        mig_errors: &mut HashMap<u32, String>,
        mine: &mut Mine,
    ) {
        children.retain(|_, child| matches!(child.try_wait(), Ok(None)));
        let me = self.cluster.id;
        let observed = match self.observe() {
            Ok(o) => o,
            Err(e) => {
                warn!(error = %e, "cannot read the jobs directory");
                return;
            }
        };
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
        for action in reconcile(&desired, &observed) {
            if !lease_fresh && matches!(action, Action::Start { .. }) {
                continue;
            }
            self.act(action, &jobs, children, host).await;
        }
    }
}
