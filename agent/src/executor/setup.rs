//! What this host offers jobs, found once when the agent starts: the jobs directory, the
//! job users, which job cgroups (and so limits and device fence) are available, and the
//! agent's own shield from the OOM killer.

use std::os::unix::fs::PermissionsExt;

use tracing::{info, warn};

use super::cgroups::CgroupLayout;
use super::{ExecutorSettings, isolation};
use crate::config::{ForeignPolicy, RunAs};

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
    pub fn prepare(s: &ExecutorSettings) -> Self {
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
        // The agent (and the supervisors it starts) must outlive any job that runs the host
        // out of memory; each job resets its own score before it execs.
        match std::fs::write("/proc/self/oom_score_adj", OOM_NEVER) {
            Ok(()) => info!("the agent is shielded from the OOM killer (oom_score_adj -1000)"),
            Err(e) => warn!(error = %e, "cannot shield the agent from the OOM killer (needs root)"),
        }
        let cgroups = CgroupLayout::detect(&s.cgroup_root);
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
