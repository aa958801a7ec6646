//! `gpuctl job wait`: poll the job until it has finished, showing progress on a terminal.
//!
//! The first answer must come, so a wrong id or an unreachable cluster fails at once; after
//! that, "no agent answered" and "unavailable" (an election, a restarting agent) are waited
//! out like any other delay, until `--timeout`.

use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_proto::v1::job_service_client::JobServiceClient;
use tokio::time::Instant;

use super::job_view::{is_terminal, render_one, state, state_title};
use super::{Answer, Ctx, Failure};
use crate::client::CallError;
use crate::output::{StatusLine, truncate};
use crate::units::format_duration;

const POLL_INTERVAL: Duration = Duration::from_millis(500);

pub(super) async fn run(ctx: &Ctx, id: u64) -> Result<Answer, Failure> {
    let start = Instant::now();
    let deadline = ctx.timeout.map(|t| start + t);
    let timed_out = |job: Option<&pb::Job>| {
        let limit = format_duration(ctx.timeout.unwrap_or_default());
        Failure::TimedOut(match job {
            Some(j) => format!("timed out after {limit}, job is {}", state_title(state(j))),
            None => format!("timed out after {limit} before any agent answered"),
        })
    };
    let mut line = StatusLine::for_stderr();
    let mut job = match poll(ctx, id, deadline).await {
        Some(answer) => answer?,
        None => return Err(timed_out(None)),
    };
    let mut retrying: Option<String> = None;
    loop {
        let s = state(&job);
        if is_terminal(s) {
            line.clear();
            return Ok(Answer {
                text: render_one(ctx.output, &job),
                positive: s == pb::JobState::Succeeded,
            });
        }
        line.show(&progress(&job, start.elapsed(), retrying.as_deref()));
        let next = Instant::now() + POLL_INTERVAL;
        match deadline {
            Some(d) if d <= Instant::now() => return Err(timed_out(Some(&job))),
            Some(d) => tokio::time::sleep_until(next.min(d)).await,
            None => tokio::time::sleep_until(next).await,
        }
        match poll(ctx, id, deadline).await {
            Some(Ok(j)) => {
                job = j;
                retrying = None;
            }
            Some(Err(e)) if e.is_transient() => retrying = Some(e.to_string()),
            Some(Err(e)) => return Err(e.into()),
            None => {}
        }
    }
}

/// One `GetJob`; `None` when the deadline cut it short (also when the request's own
/// deadline, which ends at about the same moment, got there first).
pub(super) async fn poll(
    ctx: &Ctx,
    id: u64,
    deadline: Option<Instant>,
) -> Option<Result<pb::Job, CallError>> {
    let req = pb::GetJobRequest {
        id,
        stale: false,
        array_index: None,
    };
    let call = ctx.call(JobServiceClient::new, req, async |mut c, r| {
        c.get_job(r).await
    });
    let Some(d) = deadline else {
        return Some(call.await);
    };
    let answer = tokio::time::timeout_at(d, call).await.ok()?;
    match answer {
        Err(e) if e.is_transient() && Instant::now() >= d => None,
        answer => Some(answer),
    }
}

/// `j-42  Pending  12s  no node has 8 free GPUs  (retrying: …)`
fn progress(job: &pb::Job, elapsed: Duration, retrying: Option<&str>) -> String {
    let elapsed = Duration::from_secs(elapsed.as_secs());
    let mut text = format!(
        "j-{}  {}  {}",
        job.id,
        state_title(state(job)),
        format_duration(elapsed)
    );
    if !job.reason.is_empty() {
        text.push_str("  ");
        text.push_str(&truncate(&job.reason, 60));
    }
    if let Some(e) = retrying {
        text.push_str(&format!("  (retrying: {})", truncate(e, 60)));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::job_view::tests::pending;

    #[test]
    fn progress_lines() {
        let job = pending();
        let line = progress(&job, Duration::from_millis(12_700), None);
        assert!(
            line.starts_with("j-43  Pending  12s  no node has 8 free GPUs"),
            "{line}"
        );
        assert_eq!(line.chars().count(), "j-43  Pending  12s  ".len() + 60);
        let plain = pb::Job {
            reason: String::new(),
            ..job
        };
        assert_eq!(
            progress(&plain, Duration::from_secs(75), Some("no agent answered")),
            "j-43  Pending  1m15s  (retrying: no agent answered)"
        );
    }
}
