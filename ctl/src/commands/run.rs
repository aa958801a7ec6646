//! `gpuctl run [submit flags] -- CMD`: an interactive job, like Slurm's `srun`.
//!
//! It submits the job (with an idempotency key, as `job submit` does), tells on stderr what
//! the job waits for until it is placed ("pending: <reason>", "bound to n2") and what its run
//! does before its command starts ("pulling image REF: copying layers (3)"), then copies the
//! run's stdout to stdout and its stderr to stderr, both live; a job whose failed runs are
//! retried is followed into each new run. The first Ctrl-C (SIGINT) cancels the job and keeps
//! streaming until it has stopped; a second one exits at once. The exit code is the job's:
//! 0 when it succeeded, its exit code, 128+N when killed by signal N, 130 when cancelled by
//! Ctrl-C, 1 for any other end (failed to start, lost, time limit, cancelled elsewhere), with
//! the outcome on stderr. Errors reaching the cluster exit 2, as everywhere.

use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_proto::v1::job_service_client::JobServiceClient;
use tokio::signal::unix::{SignalKind, signal};

use super::job_logs::{self, LogSource, Sink};
use super::job_view::{is_terminal, state};
use super::{Answer, Ctx, Failure, job_submit, job_wait};
use crate::cli::SubmitArgs;

/// How often the job's state is read while it waits to be placed or between runs.
const POLL: Duration = Duration::from_millis(200);

/// The exit code after a Ctrl-C: 128 + SIGINT.
const INTERRUPTED: u8 = 130;

pub(crate) async fn run(ctx: &Ctx, args: SubmitArgs) -> Result<Answer, Failure> {
    // Before the submission: a Ctrl-C while it is on its way is kept, and acted on (the job
    // cancelled) once its id is known, instead of killing gpuctl with the job queued.
    let mut interrupts = signal(SignalKind::interrupt())
        .map_err(|e| Failure::Usage(format!("catching Ctrl-C: {e}")))?;
    let id = job_submit::submit(ctx, args).await?.job_id;
    note(&format!("submitted j-{id}"));
    let follow = follow(ctx, id);
    tokio::pin!(follow);
    let mut cancelled = false;
    let job = loop {
        tokio::select! {
            job = &mut follow => break job?,
            _ = interrupts.recv() => {
                if cancelled {
                    note(&format!("not waiting for j-{id} to stop"));
                    return Err(Failure::JobEnded(INTERRUPTED));
                }
                cancelled = true;
                note(&format!("cancelling j-{id} (Ctrl-C again to stop waiting)"));
                if let Err(e) = cancel(ctx, id).await {
                    note(&format!("could not cancel j-{id}: {e}"));
                }
            }
        }
    };
    match exit_code(&job, cancelled) {
        0 => Ok(Answer::ok(String::new())),
        code => {
            let how = if job.outcome.is_empty() {
                &job.reason
            } else {
                &job.outcome
            };
            let title = super::job_view::state_title(state(&job));
            note(&format!("j-{id} {title}: {how}"));
            Err(Failure::JobEnded(code))
        }
    }
}

/// A progress line on stderr, marked as gpuctl's own (the job's stderr goes there too).
fn note(text: &str) {
    eprintln!("gpuctl: {text}");
}

async fn cancel(ctx: &Ctx, id: u64) -> Result<(), Failure> {
    let req = pb::CancelJobRequest {
        id,
        array_index: None,
    };
    ctx.call(JobServiceClient::new, req, async |mut c, r| {
        c.cancel_job(r).await
    })
    .await?;
    Ok(())
}

/// Follow the job until it has ended, streaming each run's output, and answer its last state.
async fn follow(ctx: &Ctx, id: u64) -> Result<pb::Job, Failure> {
    let mut streamed = 0u64;
    let mut shown = String::new();
    loop {
        let job = read(ctx, id).await?;
        if job.generation > streamed {
            streamed = job.generation;
            let attempt = job
                .runs
                .last()
                .filter(|r| r.generation == job.generation)
                .map_or(job.attempts, |r| r.attempt);
            note(&format!("j-{id} {}", placement(&job, attempt)));
            // The run's phase (pulling its image) is told beside its output until it ends.
            tokio::select! {
                () = stream_run(ctx, id, attempt) => {}
                () = show_phases(ctx, id, job.generation) => {}
            }
            shown.clear();
            continue;
        }
        if is_terminal(state(&job)) {
            return Ok(job);
        }
        if state(&job) == pb::JobState::Pending && !job.reason.is_empty() && job.reason != shown {
            note(&format!("j-{id} pending: {}", job.reason));
            shown.clone_from(&job.reason);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// How often a run's phase is read while its output streams.
const PHASE_POLL: Duration = Duration::from_secs(1);

/// Tell each new phase of run `generation` (`pulling image REF: …`) on stderr while it lasts;
/// never returns (the run's output streaming decides when the run is over).
async fn show_phases(ctx: &Ctx, id: u64, generation: u64) {
    let mut shown = String::new();
    loop {
        if let Some(Ok(job)) = job_wait::poll(ctx, id, None).await
            && let Some(text) = new_phase(&job, generation, &shown)
        {
            note(&format!("j-{id} {text}"));
            shown = text;
        }
        tokio::time::sleep(PHASE_POLL).await;
    }
}

/// The phase of run `generation` to tell, when it is not the one `shown` last.
fn new_phase(job: &pb::Job, generation: u64, shown: &str) -> Option<String> {
    (job.generation == generation && !job.phase.is_empty() && job.phase != shown)
        .then(|| job.phase.clone())
}

/// `bound to n2 (attempt 1/3)`, `bound to n1,n2 (attempt 2/2)`.
fn placement(job: &pb::Job, attempt: u32) -> String {
    let nodes: Vec<String> = if job.gang_nodes.is_empty() {
        job.node_id.iter().map(|n| format!("n{n}")).collect()
    } else {
        job.gang_nodes.iter().map(|n| format!("n{n}")).collect()
    };
    let max = job.spec.as_ref().map_or(1, |s| s.max_attempts.max(1));
    format!("bound to {} (attempt {attempt}/{max})", nodes.join(","))
}

/// The job's state, waiting out transient failures (an election, a restarting agent).
async fn read(ctx: &Ctx, id: u64) -> Result<pb::Job, Failure> {
    loop {
        match job_wait::poll(ctx, id, None).await {
            Some(Ok(job)) => return Ok(job),
            Some(Err(e)) if e.is_transient() => tokio::time::sleep(POLL).await,
            Some(Err(e)) => return Err(e.into()),
            None => tokio::time::sleep(POLL).await,
        }
    }
}

/// Copy both streams of run `attempt` (rank 0) as they are written, until it has ended. A
/// stream that fails is reported, not fatal: the job's end still decides the exit code.
async fn stream_run(ctx: &Ctx, job_id: u64, attempt: u32) {
    let source = |stderr| LogSource {
        job_id,
        stderr,
        follow: true,
        rank: None,
        attempt: Some(attempt),
    };
    let (out, err) = tokio::join!(
        job_logs::copy(ctx, source(false), Sink::Stdout),
        job_logs::copy(ctx, source(true), Sink::Stderr),
    );
    for (what, result) in [("stdout", out), ("stderr", err)] {
        if let Err(e) = result {
            note(&format!("reading the job's {what}: {e}"));
        }
    }
}

/// The exit code for how the job ended.
fn exit_code(job: &pb::Job, interrupted: bool) -> u8 {
    match state(job) {
        pb::JobState::Succeeded => 0,
        pb::JobState::Cancelled if interrupted => INTERRUPTED,
        pb::JobState::Failed => match (job.exit_code, job.signal) {
            (Some(code), _) => u8::try_from(code).ok().filter(|c| *c != 0).unwrap_or(1),
            (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(1),
            (None, None) => 1,
        },
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(state: pb::JobState, exit_code: Option<i32>, signal: Option<i32>) -> pb::Job {
        pb::Job {
            state: state as i32,
            exit_code,
            signal,
            ..Default::default()
        }
    }

    #[test]
    fn exit_codes_follow_the_job() {
        use pb::JobState::{Cancelled, Failed, Succeeded};
        for (job, interrupted, code) in [
            (ended(Succeeded, Some(0), None), false, 0),
            (ended(Failed, Some(3), None), false, 3),
            (ended(Failed, Some(255), None), false, 255),
            (ended(Failed, Some(300), None), false, 1),
            (ended(Failed, None, Some(9)), false, 137),
            (ended(Failed, None, None), false, 1),
            (ended(Cancelled, None, None), true, 130),
            (ended(Cancelled, None, None), false, 1),
        ] {
            assert_eq!(exit_code(&job, interrupted), code, "{job:?}");
        }
    }

    #[test]
    fn each_new_phase_of_the_run_is_told_once() {
        let job = |generation, phase: &str| pb::Job {
            generation,
            phase: phase.into(),
            ..Default::default()
        };
        assert_eq!(
            new_phase(&job(1, "pulling image a"), 1, ""),
            Some("pulling image a".into())
        );
        assert_eq!(
            new_phase(&job(1, "pulling image a"), 1, "pulling image a"),
            None
        );
        assert_eq!(new_phase(&job(1, ""), 1, "pulling image a"), None, "over");
        assert_eq!(
            new_phase(&job(2, "pulling image a"), 1, ""),
            None,
            "another run"
        );
    }

    #[test]
    fn placements_name_each_node_and_the_attempt() {
        let job = pb::Job {
            node_id: Some(2),
            spec: Some(pb::JobSpec {
                max_attempts: 3,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(placement(&job, 1), "bound to n2 (attempt 1/3)");
        let gang = pb::Job {
            gang_nodes: vec![1, 2],
            ..job
        };
        assert_eq!(placement(&gang, 2), "bound to n1,n2 (attempt 2/3)");
    }
}
