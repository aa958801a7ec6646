//! Which run's log a `JobLogs` request names, and on which node it lies: the rank (a gang
//! member, 0-based) and attempt of the request, resolved against the job's replicated run
//! history (`Job::runs`). Pure: the handlers read the state and carry out the answer.

use std::fmt;

use gpu_raft_store::{Job, JobId, MAX_RUNS_KEPT, NodeId};

/// One member of one run: where its log lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LogTarget {
    pub node: NodeId,
    pub generation: u64,
    pub rank: u32,
    /// Whether it is the latest run (the one a protocol 1 or 2 agent serves).
    pub latest: bool,
}

/// Why a request names no log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LogTargetError {
    /// The job was never placed.
    NotRunYet { job: JobId },
    /// Attempt numbers start at 1.
    AttemptZero,
    /// No run of the job has had this attempt number yet.
    NoSuchAttempt {
        job: JobId,
        attempt: u32,
        attempts: u32,
    },
    /// The run was dropped from the job's history (only the latest runs are kept).
    NotKept { job: JobId, attempt: u32 },
    /// The run has fewer members.
    NoSuchRank {
        job: JobId,
        rank: u32,
        members: usize,
    },
}

impl fmt::Display for LogTargetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotRunYet { job } => write!(f, "job j-{job} has not run yet"),
            Self::AttemptZero => f.write_str("attempts are numbered from 1"),
            Self::NoSuchAttempt {
                job,
                attempt,
                attempts,
            } => write!(
                f,
                "job j-{job} has no attempt {attempt}: it has been placed {attempts} time{}",
                if *attempts == 1 { "" } else { "s" }
            ),
            Self::NotKept { job, attempt } => write!(
                f,
                "attempt {attempt} of job j-{job} is no longer in its run history (the latest {MAX_RUNS_KEPT} runs are kept)"
            ),
            Self::NoSuchRank { job, rank, members } => match members {
                1 => write!(
                    f,
                    "job j-{job} runs on one node: only rank 0, not rank {rank}"
                ),
                _ => write!(
                    f,
                    "job j-{job} is a gang of {members} nodes: ranks 0..={}, not rank {rank}",
                    members - 1
                ),
            },
        }
    }
}

/// The member `rank` (default 0) of the run with attempt number `attempt` (default: the latest
/// run; when an eviction gave an attempt back, the latest run of that number).
pub(crate) fn resolve(
    job: &Job,
    rank: Option<u32>,
    attempt: Option<u32>,
) -> Result<LogTarget, LogTargetError> {
    if attempt == Some(0) {
        return Err(LogTargetError::AttemptZero);
    }
    let last = job.runs.len().checked_sub(1);
    let (index, run) = match attempt {
        None => last.map(|i| (i, &job.runs[i])),
        Some(a) => job
            .runs
            .iter()
            .enumerate()
            .rev()
            .find(|(_, r)| r.attempt == a),
    }
    .map(|(i, r)| (Some(i), (r.generation, r.nodes.clone())))
    .or_else(|| from_binding(job, attempt).map(|run| (None, run)))
    .ok_or_else(|| missing(job, attempt))?;
    let (generation, nodes) = run;
    let rank_wanted = rank.unwrap_or(0);
    let node = usize::try_from(rank_wanted)
        .ok()
        .and_then(|r| nodes.get(r))
        .copied()
        .ok_or(LogTargetError::NoSuchRank {
            job: job.id,
            rank: rank_wanted,
            members: nodes.len(),
        })?;
    Ok(LogTarget {
        node,
        generation,
        rank: rank_wanted,
        latest: index == last || index.is_none(),
    })
}

/// A job placed before runs were recorded: its binding is its one known run.
fn from_binding(job: &Job, attempt: Option<u32>) -> Option<(u64, Vec<NodeId>)> {
    if !job.runs.is_empty() || attempt.is_some_and(|a| a != job.attempts) {
        return None;
    }
    let binding = job.binding.as_ref()?;
    Some((binding.generation, job.members().map(|b| b.node).collect()))
}

fn missing(job: &Job, attempt: Option<u32>) -> LogTargetError {
    match attempt {
        None => LogTargetError::NotRunYet { job: job.id },
        Some(a) if a <= job.attempts && !job.runs.is_empty() => LogTargetError::NotKept {
            job: job.id,
            attempt: a,
        },
        Some(a) => LogTargetError::NoSuchAttempt {
            job: job.id,
            attempt: a,
            attempts: job.attempts,
        },
    }
}

#[cfg(test)]
mod tests {
    use gpu_raft_store::{Binding, JobSpec, Outcome, Run};

    use super::*;

    fn run(attempt: u32, generation: u64, nodes: &[NodeId]) -> Run {
        Run {
            attempt,
            generation,
            nodes: nodes.to_vec(),
            bound_at_ms: generation,
            started_at_ms: None,
            finished_at_ms: None,
            outcome: Some(Outcome::Exited { code: 1 }),
        }
    }

    fn job(runs: Vec<Run>) -> Job {
        let mut j = Job::pending(7, JobSpec::default(), None, 0);
        j.attempts = runs.last().map_or(0, |r| r.attempt);
        j.generation = runs.last().map_or(0, |r| r.generation);
        j.runs = runs;
        j
    }

    fn at(node: NodeId, generation: u64, rank: u32, latest: bool) -> LogTarget {
        LogTarget {
            node,
            generation,
            rank,
            latest,
        }
    }

    #[test]
    fn ranks_and_attempts_name_a_node_and_generation() {
        // A gang over n2 and n3; its second run after an eviction kept attempt 1 on n4, n3.
        let j = job(vec![
            run(1, 1, &[2, 3]),
            run(1, 2, &[4, 3]),
            run(2, 3, &[3, 2]),
        ]);
        assert_eq!(resolve(&j, None, None), Ok(at(3, 3, 0, true)));
        assert_eq!(resolve(&j, Some(1), None), Ok(at(2, 3, 1, true)));
        assert_eq!(resolve(&j, Some(0), Some(1)), Ok(at(4, 2, 0, false)));
        assert_eq!(resolve(&j, Some(1), Some(2)), Ok(at(2, 3, 1, true)));
    }

    #[test]
    fn what_does_not_exist_is_named() {
        let j = job(vec![run(2, 5, &[1])]);
        let err = |rank, attempt| resolve(&j, rank, attempt).expect_err("refused").to_string();
        assert_eq!(
            err(Some(1), None),
            "job j-7 runs on one node: only rank 0, not rank 1"
        );
        assert_eq!(
            err(None, Some(3)),
            "job j-7 has no attempt 3: it has been placed 2 times"
        );
        assert_eq!(
            err(None, Some(1)),
            "attempt 1 of job j-7 is no longer in its run history (the latest 32 runs are kept)"
        );
        assert_eq!(err(None, Some(0)), "attempts are numbered from 1");
        let gang = job(vec![run(1, 1, &[1, 2])]);
        assert_eq!(
            resolve(&gang, Some(2), None).map_err(|e| e.to_string()),
            Err("job j-7 is a gang of 2 nodes: ranks 0..=1, not rank 2".to_owned())
        );
        assert_eq!(
            resolve(&job(vec![]), None, None),
            Err(LogTargetError::NotRunYet { job: 7 })
        );
    }

    #[test]
    fn a_job_placed_before_runs_were_recorded_has_its_binding() {
        let mut j = job(vec![]);
        j.attempts = 1;
        j.binding = Some(Binding {
            node: 4,
            gpus: vec![0],
            generation: 3,
            slice: None,
        });
        assert_eq!(resolve(&j, None, Some(1)), Ok(at(4, 3, 0, true)));
        assert!(resolve(&j, None, Some(2)).is_err());
    }
}
