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
    use gpu_raft_store::{JobSpec, JobState, Outcome};

    use super::*;

    #[test]
    fn the_reason_rounds_up_to_the_second() {
        let spec = JobSpec {
            max_attempts: 3,
            retry_backoff_s: Some(10),
            ..JobSpec::default()
        };
        let mut job = Job::pending(1, spec, None, 0);
        job.attempts = 2;
        job.outcome = Some(Outcome::Exited { code: 1 });
        job.not_before_ms = Some(11_001);
        assert_eq!(
            waiting_reason(&job, 5_000).as_deref(),
            Some(
                "requeued: exited with code 1; attempt 3/3 after 20 s; waiting until 1970-01-01T00:00:12Z"
            )
        );
        assert_eq!(waiting_reason(&job, 11_001), None, "due");
        job.state = JobState::Cancelled;
        assert_eq!(waiting_reason(&job, 5_000), None, "not pending");
    }
}
