//! Which job a process on a GPU belongs to: the executor starts every job with
//! `GPUMESH_JOB_ID` in its environment, which its children inherit, so `/proc/<pid>/environ`
//! names the job. A process without it is not one of ours.

use gpu_raft_store::JobId;

const JOB_VARIABLE: &[u8] = b"GPUMESH_JOB_ID=";

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
    fn our_own_process_is_no_job_unless_it_says_so() {
        let me = std::process::id();
        let expected = std::env::var("GPUMESH_JOB_ID")
            .ok()
            .and_then(|v| v.parse().ok());
        assert_eq!(job_of_pid(me), expected);
        assert_eq!(job_of_pid(u32::MAX), None, "no such process");
    }
}
