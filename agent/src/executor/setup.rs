//! What this host offers jobs, found once when the executor starts: the jobs directory, the
//! job users, and whether job cgroups are available.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tracing::{error, info, warn};

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
        // Jobs of cluster-mapped accounts may be any user: every directory on the way to their
        // `work/` must let others through. Only a root agent runs jobs as other users.
        if nix::unistd::geteuid().is_root()
            && let Some(closed) = closed_to_others(jobs_dir)
        {
            error!(
                dir = %closed.display(),
                "the jobs directory {} is not reachable by other users ({} is not o+x): jobs of \
                 cluster-mapped accounts cannot start on this node until it is (e.g. chmod o+x {})",
                jobs_dir.display(),
                closed.display(),
                closed.display()
            );
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

/// Whether a user who is neither owner nor in the group may pass through a directory.
fn others_may_search(mode: u32) -> bool {
    mode & 0o001 != 0
}

/// The first directory on the way to `path` (itself included) that others may not pass through
/// (or that cannot be read: a missing one is found by the first job anyway).
fn closed_to_others(path: &Path) -> Option<PathBuf> {
    path.ancestors()
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .find(|dir| std::fs::metadata(dir).is_ok_and(|m| !others_may_search(m.mode())))
        .map(Path::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_closed_to_others_on_the_way_is_found() {
        assert!(others_may_search(0o711) && others_may_search(0o755));
        assert!(!others_may_search(0o750) && !others_may_search(0o700));
        let tmp = tempfile::tempdir().expect("tempdir");
        let set = |p: &Path, mode| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
        };
        let data = tmp.path().join("data");
        let jobs = data.join("jobs");
        std::fs::create_dir_all(&jobs).expect("mkdir");
        set(tmp.path(), 0o755);
        set(&data, 0o711);
        set(&jobs, 0o711);
        let open = closed_to_others(&jobs);
        // Above the temporary directory nothing is ours to judge: only look below it.
        assert!(
            open.as_ref().is_none_or(|c| !c.starts_with(tmp.path())),
            "{open:?}"
        );
        set(&data, 0o700);
        assert_eq!(closed_to_others(&jobs), Some(data.clone()));
        set(&data, 0o711);
        set(&jobs, 0o750);
        assert_eq!(closed_to_others(&jobs), Some(jobs));
    }
}
