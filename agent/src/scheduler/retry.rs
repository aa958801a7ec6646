//! Jobs waiting for their retry time: a job requeued after a failed run (`Job::not_before_ms`,
//! set by `apply` from its retry backoff) is not placed, preempted for or reserved for before
//! that time, and its pending reason says until when. It does not hold up the jobs behind it,
//! nor the rest of its class (their times differ). Pure: "now" comes from the caller.

use std::time::{Duration, UNIX_EPOCH};

use gpu_raft_store::{Job, retry_delay_s};

/// Why `job` waits at `now_ms`, if it waits for its retry time:
/// `requeued: exited with code 1; attempt 2/3 after 10 s; waiting until 2026-01-02T03:04:05Z`.
pub(crate) fn waiting_reason(job: &Job, now_ms: u64) -> Option<String> {
    if !job.waits_for_retry(now_ms) {
        return None;
    }
    let until = job.not_before_ms?;
    let delay_s = retry_delay_s(job.spec.retry_backoff_s.unwrap_or(0), job.attempts);
    let last = job
        .outcome
        .as_ref()
        .map_or_else(|| "a failed run".to_owned(), ToString::to_string);
    Some(format!(
        "requeued: {last}; {}; waiting until {}",
        job.retry_note(delay_s),
        rfc3339(until)
    ))
}

/// Milliseconds since the epoch as an RFC 3339 UTC time, whole seconds (rounded up, so the
/// time shown is never before the retry time).
fn rfc3339(ms: u64) -> String {
    let at = UNIX_EPOCH + Duration::from_secs(ms.div_ceil(1000));
    humantime::format_rfc3339_seconds(at).to_string()
}

#[cfg(test)]
mod tests {
    use gpu_raft_store::{Bind, ClusterState, Command, JobSpec, Outcome};

    use super::*;
    use crate::scheduler::plan::plan;
    use crate::scheduler::testkit::{apply_at, gpu, node, spec, submit};
    use crate::scheduler::{PlanEnv, Policy};

    /// Job 1 (retried after 10 s) failed at 1 s; job 2 of the same spec waits behind it.
    fn failed_once() -> ClusterState {
        let mut s = ClusterState::new();
        node(&mut s, 1, vec![gpu(0, "A100", 0)]);
        let retried = JobSpec {
            max_attempts: 3,
            retry_backoff_s: Some(10),
            ..spec(1, 0)
        };
        submit(&mut s, retried.clone());
        let binds = vec![Bind {
            job: 1,
            node: 1,
            gpus: vec![0],
        }];
        apply_at(&mut s, 500, Command::BindJobs { binds });
        let end = Command::JobFinished {
            job: 1,
            generation: 1,
            outcome: Outcome::Exited { code: 1 },
        };
        apply_at(&mut s, 1_000, end);
        submit(&mut s, retried);
        s
    }

    #[test]
    fn a_job_is_not_placed_before_its_retry_time_and_says_until_when() {
        let s = failed_once();
        for name in crate::scheduler::testkit::POLICIES {
            let policy: Policy = name.parse().expect("policy");
            // Before its time the job behind it (same class) gets the GPU.
            let early = plan(&s, &policy, &PlanEnv::new(10_999, &policy));
            assert_eq!(
                early.binds.iter().map(|b| b.job).collect::<Vec<_>>(),
                [2],
                "{name}"
            );
            assert_eq!(
                early.unschedulable,
                [(
                    1,
                    "requeued: exited with code 1; attempt 2/3 after 10 s; waiting until 1970-01-01T00:00:11Z"
                        .to_owned()
                )],
                "{name}"
            );
            // From its time on, it is first again.
            let due = plan(&s, &policy, &PlanEnv::new(11_000, &policy));
            assert_eq!(due.binds.first().map(|b| b.job), Some(1), "{name}");
        }
    }

    #[test]
    fn the_reason_rounds_up_to_the_second() {
        let mut s = failed_once();
        s.jobs.get_mut(&1).expect("job").not_before_ms = Some(11_001);
        let reason = waiting_reason(&s.jobs[&1], 5_000).expect("waits");
        assert!(reason.ends_with("until 1970-01-01T00:00:12Z"), "{reason}");
        assert_eq!(waiting_reason(&s.jobs[&1], 11_001), None);
    }
}
