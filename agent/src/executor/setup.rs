//! What this host offers jobs, found once when the executor starts: the jobs directory, the
//! job users, and whether job cgroups are available.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use tracing::{info, warn};

use super::{Executor, isolation};
use crate::config::RunAs;

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
        if self.launcher.is_systemd() {
            // Each run's unit carries its limits and device allow-list; the supervisor makes
            // no cgroup of its own.
            return Host::default();
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
