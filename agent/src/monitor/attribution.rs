//! Which job a process on a GPU belongs to: the executor starts every job with
//! `GPUMESH_JOB_ID` in its environment, which its children inherit, so `/proc/<pid>/environ`
//! names the job. A process without it is not one of ours.
//!
//! Where runs have cgroups of their own (`executor::cgroups`), the process's cgroup is the
//! proof instead: a job enters its cgroups before it execs and cannot leave them, while anyone
//! can put `GPUMESH_JOB_ID` in an environment.

use gpu_raft_store::JobId;

use crate::run_cgroup_name::parse_cgroup_name;

const JOB_VARIABLE: &[u8] = b"GPUMESH_JOB_ID=";

/// The job whose run cgroup a process is in, from `/proc/<pid>/cgroup` (`hierarchy:controllers:
/// path` lines): a path whose last component is a run's cgroup, `job-<id>-g<generation>` with
/// the supervisor's `-s<pid>` after it.
pub(crate) fn job_from_cgroup(proc_cgroup: &str) -> Option<JobId> {
    proc_cgroup.lines().find_map(|line| {
        let path = line.splitn(3, ':').nth(2)?;
        parse_cgroup_name(path.rsplit('/').next()?).map(|run| run.job)
    })
}

/// The job a process belongs to: by its cgroup where runs have cgroups (`job_cgroups`), by its
/// environment elsewhere.
pub(crate) fn owner(
    proc_cgroup: Option<&str>,
    environ: Option<&[u8]>,
    job_cgroups: bool,
) -> Option<JobId> {
    if job_cgroups {
        proc_cgroup.and_then(job_from_cgroup)
    } else {
        environ.and_then(job_from_environ)
    }
}

/// The job process `pid` belongs to (see `owner`); `None` also when it is gone or unreadable.
pub(crate) fn owner_of_pid(pid: u32, job_cgroups: bool) -> Option<JobId> {
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok();
    let environ = if job_cgroups {
        None
    } else {
        std::fs::read(format!("/proc/{pid}/environ")).ok()
    };
    owner(cgroup.as_deref(), environ.as_deref(), job_cgroups)
}

/// The job named by a process environment (`/proc/<pid>/environ`: NUL-separated `K=V`).
pub(crate) fn job_from_environ(environ: &[u8]) -> Option<JobId> {
    environ
        .split(|&b| b == 0)
        .find_map(|entry| entry.strip_prefix(JOB_VARIABLE))
        .and_then(|value| std::str::from_utf8(value).ok()?.parse().ok())
}

/// The job process `pid` runs for, if any (`None` also when the process is gone or unreadable).
pub(crate) fn job_of_pid(pid: u32) -> Option<JobId> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    job_from_environ(&environ)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_job_id_from_an_environment() {
        assert_eq!(
            job_from_environ(b"HOME=/x\0GPUMESH_JOB_ID=42\0GPUMESH_GENERATION=3\0"),
            Some(42)
        );
        assert_eq!(job_from_environ(b"GPUMESH_JOB_ID=7"), Some(7));
        assert_eq!(job_from_environ(b"HOME=/x\0PATH=/bin\0"), None);
        assert_eq!(job_from_environ(b"GPUMESH_JOB_ID=forty\0"), None);
        assert_eq!(job_from_environ(b"XGPUMESH_JOB_ID=1\0"), None);
        assert_eq!(job_from_environ(b""), None);
    }

    #[test]
    fn reads_the_job_id_from_a_run_cgroup() {
        let v1 = "8:pids:/gpumesh/job-42-g3-s1234\n5:devices:/gpumesh/job-42-g3-s1234\n\
                  4:memory:/gpumesh/job-42-g3-s1234\n1:name=systemd:/\n0::/\n";
        assert_eq!(job_from_cgroup(v1), Some(42));
        assert_eq!(
            job_from_cgroup("0::/gpumesh/job-7-g1-s99\n"),
            Some(7),
            "cgroup v2"
        );
        assert_eq!(job_from_cgroup("0::/gpumesh/job-7-g1\n"), Some(7));
        assert_eq!(job_from_cgroup("4:memory:/process_api/abc\n0::/\n"), None);
        assert_eq!(job_from_cgroup("0::/job-x-g1-s2\n"), None);
        assert_eq!(job_from_cgroup("0::/job-7-gx-s2\n"), None);
        assert_eq!(
            job_from_cgroup("0::/gpumesh/job-7-g1-s2/inner\n"),
            None,
            "a nested cgroup is not a run's"
        );
        assert_eq!(job_from_cgroup(""), None);
    }

    #[test]
    fn with_job_cgroups_only_the_cgroup_counts() {
        let cgroup = Some("0::/gpumesh/job-5-g2-s10\n");
        let env: Option<&[u8]> = Some(b"GPUMESH_JOB_ID=9\0");
        assert_eq!(owner(cgroup, env, true), Some(5));
        assert_eq!(
            owner(Some("0::/user.slice\n"), env, true),
            None,
            "a forged environment does not make a job"
        );
        assert_eq!(
            owner(cgroup, env, false),
            Some(9),
            "no job cgroups: the environment"
        );
        assert_eq!(owner(None, None, false), None);
    }

    #[test]
    fn our_own_process_is_no_job_unless_it_says_so() {
        let me = std::process::id();
        let expected = std::env::var("GPUMESH_JOB_ID")
            .ok()
            .and_then(|v| v.parse().ok());
        assert_eq!(job_of_pid(me), expected);
        assert_eq!(job_of_pid(u32::MAX), None, "no such process");
    }
}
