//! What this host offers jobs, found once when the executor starts: the jobs directory (and
//! whether it shares the Raft data's filesystem), the job users, and whether job cgroups are
//! available.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use tracing::{info, warn};

use super::{Executor, disk_space, isolation, jobs_owner};
use crate::config::{DirOrigin, JobDiskSettings, RunAs};

/// Make sure the jobs directory is this agent's (`jobs_owner`), say where runs live, and warn
/// when that is the Raft data's filesystem: a job can fill it, and the agent stops (by design)
/// when its Raft log cannot be written. An error when another agent may be using it.
pub(crate) fn check_jobs_dir(disk: &JobDiskSettings, data_dir: &Path) -> anyhow::Result<()> {
    let dir = &disk.dir;
    if let Err(e) = std::fs::create_dir_all(dir) {
        warn!(error = %e, dir = %dir.display(), "cannot create the jobs directory");
        return Ok(());
    }
    match jobs_owner::claim(dir, data_dir).map_err(anyhow::Error::msg)? {
        jobs_owner::Claimed::Ours => {}
        jobs_owner::Claimed::SetAside { runs, to } => warn!(
            runs,
            to = %to.display(),
            "the jobs directory held runs of another data directory (this one was wiped or replaced): set them aside, where they are neither run nor removed"
        ),
    }
    if disk.dir_origin == DirOrigin::Legacy {
        warn!(
            dir = %dir.display(),
            "runs are kept inside the data directory, where earlier versions put them, because that directory exists: set jobs.dir (and move or remove it once no run is left in it)"
        );
    }
    let free = disk_space::available(dir).unwrap_or(0);
    match disk_space::same_filesystem(dir, data_dir) {
        Some(true) => warn!(
            jobs_dir = %dir.display(),
            data_dir = %data_dir.display(),
            "the jobs directory is on the Raft data's filesystem: a job that fills it also stops this agent's Raft writes; give jobs.dir a filesystem of its own"
        ),
        Some(false) => {
            info!(jobs_dir = %dir.display(), "the jobs directory has a filesystem of its own")
        }
        None => {}
    }
    info!(
        jobs_dir = %dir.display(),
        available_mib = free >> 20,
        min_free = %disk.min_free,
        log_max = %disk.log_max,
        "runs start while the jobs filesystem has at least jobs.min_free available; each log file rotates at jobs.log_max"
    );
    Ok(())
}

/// What this host offers jobs, found once at start.
#[derive(Clone, Debug, Default)]
pub(super) struct Host {
    /// `cgroup_root`, ready for job cgroups; `None`: jobs run without CPU/memory limits.
    pub(super) cgroups: Option<PathBuf>,
}

impl Executor {
    /// Create the jobs directory, check the job user can reach it, and set up job cgroups,
    /// saying once what jobs will and will not get on this host.
    pub(super) fn prepare_host(&self) -> Host {
        let s = &self.settings;
        let jobs_dir = &s.jobs_dir;
        // Jobs pass through to their own `work/` directories but cannot list the runs.
        let created = std::fs::create_dir_all(jobs_dir).and_then(|()| {
            std::fs::set_permissions(jobs_dir, std::fs::Permissions::from_mode(0o711))
        });
        if let Err(e) = created {
            warn!(error = %e, dir = %jobs_dir.display(), "cannot create the jobs directory");
        }
        let RunAs { name, uid, gid } = &s.run_as;
        if s.run_as.is_root() {
            warn!(user = %name, "jobs run as root (jobs.run_as): a job can do anything on this host");
        } else {
            info!(user = %name, uid, gid, "jobs run as an unprivileged user");
        }
        for (tenant, user) in &s.run_as_by_tenant {
            if user.is_root() {
                warn!(
                    tenant,
                    "jobs of this tenant run as root (jobs.run_as_by_tenant)"
                );
            } else {
                info!(tenant, user = %user.name, uid = user.uid, "jobs of this tenant run as their own user");
            }
        }
        if let Some(blocked) = isolation::unreachable_ancestor(jobs_dir, *uid, *gid) {
            warn!(
                user = %name,
                dir = %blocked.display(),
                "the job user cannot reach the jobs directory {}: jobs will fail to start until {} is searchable by it (e.g. chmod o+x)",
                jobs_dir.display(),
                blocked.display()
            );
        }
        let root = &s.cgroup_root;
        match isolation::prepare_root(root) {
            Ok(()) => {
                info!(cgroup_root = %root.display(), "each job runs in a cgroup of its own with its CPU/memory limits");
                Host {
                    cgroups: Some(root.clone()),
                }
            }
            Err(reason) => {
                warn!(
                    "cgroup v2 with cpu/memory delegation not available at {}: {reason}: jobs run without CPU/memory limits",
                    root.display()
                );
                Host::default()
            }
        }
    }
}
