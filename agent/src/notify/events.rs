//! Which webhook events a job's record holds that were not posted yet. Events come from the
//! job's runs (each start and each end that requeued it) and its end, with their times, not
//! from the states a look happened to catch: a job that started and ended between two looks
//! still posts both.

use gpu_raft_store::webhook::NotifyEvent;
use gpu_raft_store::{Job, JobId, JobState};
use serde_json::{Value, json};

/// One event of one job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Event {
    pub job: JobId,
    pub kind: NotifyEvent,
    /// The run it concerns (the job's last for its end).
    pub generation: u64,
    /// When it happened (the time of the log entry that recorded it).
    pub at_ms: u64,
}

impl Event {
    /// The same on every try and from every leader, for receivers to drop repeats:
    /// `j-7.2.start`.
    pub(crate) fn id(&self) -> String {
        format!("j-{}.{}.{}", self.job, self.generation, self.kind)
    }

    /// The JSON body posted for it, with the job as it is now.
    pub(crate) fn body(&self, job: &Job) -> Vec<u8> {
        let node = job.binding.as_ref().map(|b| b.node);
        let (exit_code, signal) = match &job.outcome {
            Some(gpu_raft_store::Outcome::Exited { code }) => (Some(*code), None),
            Some(gpu_raft_store::Outcome::Signaled { signal }) => (None, Some(*signal)),
            _ => (None, None),
        };
        let body: Value = json!({
            "id": self.id(),
            "event": self.kind.as_str(),
            "at_ms": self.at_ms,
            "job": {
                "id": job.id,
                "name": job.spec.name,
                "tenant": job.spec.tenant,
                "state": job.state.to_string().to_lowercase(),
                "generation": self.generation,
                "attempts": job.attempts,
                "node": node,
                "outcome": job.outcome.as_ref().map(ToString::to_string),
                "exit_code": exit_code,
                "signal": signal,
                "reason": job.reason,
                "labels": job.spec.labels,
                "submitted_by": job.submitted_by,
            },
        });
        serde_json::to_vec(&body).unwrap_or_default()
    }
}

/// What has been posted of one job: the runs whose start and whose end (requeue) are out, and
/// whether its end is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    started: u64,
    ended: u64,
    finished: bool,
}

impl Seen {
    /// Everything of `job` that happened before `cutoff_ms` counts as posted (a new leader
    /// posts what happened since shortly before it took over: at least once, never lost in a
    /// failover within that margin).
    pub(crate) fn as_of(job: &Job, cutoff_ms: u64) -> Self {
        let before = |t: Option<u64>| t.is_some_and(|t| t < cutoff_ms);
        let last = |f: fn(&gpu_raft_store::Run) -> Option<u64>| {
            (job.runs.iter())
                .filter(|r| before(f(r)))
                .map(|r| r.generation)
                .max()
                .unwrap_or(0)
        };
        Self {
            started: last(|r| r.started_at_ms),
            ended: last(|r| r.finished_at_ms),
            finished: job.state.is_terminal() && before(job.finished_at_ms),
        }
    }

    /// Whether nothing more can come of the job (it ended and that is posted). A job requeued
    /// after its end is seen anew from then on.
    pub(crate) fn is_done(&self) -> bool {
        self.finished
    }
}

/// The events of `job` not in `seen`, oldest first, and `seen` brought up to date.
pub(crate) fn new_events(job: &Job, seen: &mut Seen) -> Vec<Event> {
    let mut out = Vec::new();
    let event = |kind, generation, at_ms| Event {
        job: job.id,
        kind,
        generation,
        at_ms,
    };
    let terminal = job.state.is_terminal();
    if !terminal {
        seen.finished = false;
    }
    let last = job.runs.last().map(|r| r.generation);
    for run in &job.runs {
        if run.generation > seen.started
            && let Some(at) = run.started_at_ms
        {
            out.push(event(NotifyEvent::Start, run.generation, at));
            seen.started = run.generation;
        }
        if run.generation > seen.ended
            && let Some(at) = run.finished_at_ms
        {
            // The run that ended the job is its end, not a requeue.
            if !(terminal && Some(run.generation) == last) {
                out.push(event(NotifyEvent::Requeue, run.generation, at));
            }
            seen.ended = run.generation;
        }
    }
    if terminal && !seen.finished {
        let kind = match job.state {
            JobState::Failed => NotifyEvent::Failure,
            _ => NotifyEvent::End,
        };
        let at = job.finished_at_ms.unwrap_or(job.submitted_at_ms);
        out.push(event(kind, job.generation, at));
        seen.finished = true;
    }
    out
}

#[cfg(test)]
mod tests {
    use gpu_raft_store::{JobSpec, Outcome, Run};

    use super::*;

    fn run(generation: u64, started: Option<u64>, finished: Option<u64>) -> Run {
        Run {
            attempt: 1,
            generation,
            nodes: vec![1],
            bound_at_ms: 0,
            started_at_ms: started,
            finished_at_ms: finished,
            outcome: finished.map(|_| Outcome::Exited { code: 1 }),
        }
    }

    fn kinds(events: &[Event]) -> Vec<(NotifyEvent, u64)> {
        events.iter().map(|e| (e.kind, e.generation)).collect()
    }

    #[test]
    fn a_job_that_failed_once_then_succeeded_between_two_looks_posts_every_step() {
        let mut job = Job::pending(7, JobSpec::default(), None, 0);
        let mut seen = Seen::default();
        assert!(new_events(&job, &mut seen).is_empty());
        job.runs = vec![run(1, Some(10), Some(20)), run(2, Some(30), Some(40))];
        job.generation = 2;
        job.state = JobState::Succeeded;
        job.finished_at_ms = Some(40);
        let events = new_events(&job, &mut seen);
        assert_eq!(
            kinds(&events),
            [
                (NotifyEvent::Start, 1),
                (NotifyEvent::Requeue, 1),
                (NotifyEvent::Start, 2),
                (NotifyEvent::End, 2)
            ]
        );
        assert_eq!(events[1].id(), "j-7.1.requeue");
        assert!(
            new_events(&job, &mut seen).is_empty(),
            "each is posted once"
        );
        assert!(seen.is_done());
    }

    #[test]
    fn a_failure_and_a_pending_cancel_are_ends() {
        let mut job = Job::pending(3, JobSpec::default(), None, 5);
        job.runs = vec![run(1, Some(10), Some(20))];
        job.generation = 1;
        job.state = JobState::Failed;
        job.finished_at_ms = Some(20);
        let failed = new_events(&job, &mut Seen::default());
        assert_eq!(
            kinds(&failed),
            [(NotifyEvent::Start, 1), (NotifyEvent::Failure, 1)]
        );
        let mut never_ran = Job::pending(4, JobSpec::default(), None, 5);
        never_ran.state = JobState::Cancelled;
        never_ran.finished_at_ms = Some(6);
        let cancelled = new_events(&never_ran, &mut Seen::default());
        assert_eq!(kinds(&cancelled), [(NotifyEvent::End, 0)]);
        assert_eq!(cancelled[0].at_ms, 6);
    }

    #[test]
    fn a_new_leader_posts_what_happened_since_its_cutoff() {
        let mut job = Job::pending(9, JobSpec::default(), None, 0);
        job.runs = vec![run(1, Some(10), Some(20)), run(2, Some(30), None)];
        job.generation = 2;
        job.state = JobState::Running;
        let mut seen = Seen::as_of(&job, 25);
        assert_eq!(
            kinds(&new_events(&job, &mut seen)),
            [(NotifyEvent::Start, 2)]
        );
        let mut all_old = Seen::as_of(&job, 1_000);
        assert!(new_events(&job, &mut all_old).is_empty());
    }
}
