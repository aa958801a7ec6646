//! What this host offers jobs, found once when the agent starts: the jobs directory (and
//! whether it shares the Raft data's filesystem), the job users, which job cgroups (and so
//! limits and device fence) are available, and the agent's own shield from the OOM killer.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tracing::{error, info, warn};

use super::cgroups::CgroupLayout;
use super::{ExecutorSettings, disk_space, isolation, jobs_owner};
use crate::config::{DirOrigin, ForeignPolicy, JobDiskSettings, RunAs};

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
#[derive(Clone, Debug)]
pub struct Host {
    /// Where job cgroups go (and whether there are any).
    pub cgroups: CgroupLayout,
}

/// The kernel's OOM score adjustment that exempts a process from the OOM killer.
const OOM_NEVER: &str = "-1000";

impl Host {
    /// Create the jobs directory, check the job user can reach it, set up job cgroups and
    /// shield the agent from the OOM killer, saying once what jobs will and will not get on
    /// this host.
    /// With `systemd_units` each run is a systemd unit whose cgroup carries its limits and
    /// device allow-list: the supervisors make no cgroups of their own.
    pub fn prepare(s: &ExecutorSettings, systemd_units: bool) -> Self {
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
        // The agent (and the supervisors it starts) must outlive any job that runs the host
        // out of memory; each job resets its own score before it execs.
        match std::fs::write("/proc/self/oom_score_adj", OOM_NEVER) {
            Ok(()) => info!("the agent is shielded from the OOM killer (oom_score_adj -1000)"),
            Err(e) => warn!(error = %e, "cannot shield the agent from the OOM killer (needs root)"),
        }
        if systemd_units {
            info!(
                "each run is a systemd unit of its own: its limits and device allow-list are the unit's"
            );
            return Host {
                cgroups: CgroupLayout::None {
                    reason: "each run is a systemd unit, whose cgroup is systemd's".into(),
                },
            };
        }
        let cgroups = CgroupLayout::detect(&s.cgroup_root);
        let swept = cgroups.sweep_leftovers();
        if swept > 0 {
            info!(
                swept,
                "removed the empty cgroups of runs whose supervisors were killed outright"
            );
        }
        let layout = cgroups.describe();
        let confine = &s.confine;
        if cgroups.has_job_cgroups() {
            info!(cgroups = %layout, tasks_max = confine.default_tasks_max, "each job runs in cgroups of its own with its limits");
        } else {
            warn!(cgroups = %layout, "jobs run without CPU, memory or task limits");
        }
        match cgroups.unfenced_reason() {
            None => info!(
                extra_devices = confine.extra_devices.len(),
                "each job can open only its own GPUs' device nodes (devices cgroup)"
            ),
            Some(why) => warn!(
                "{why}: jobs' devices are not fenced (any job can open every GPU's device node)"
            ),
        }
        if confine.foreign_processes == ForeignPolicy::Kill && !cgroups.has_job_cgroups() {
            warn!(
                "jobs.foreign_processes = \"kill\" needs job cgroups to tell a job's processes apart: foreign processes are only reported"
            );
        }
        Host { cgroups }
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
