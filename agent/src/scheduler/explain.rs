//! Why a job is pending, where it stands in the queue, and when it is expected to start.
//!
//! The reason is the one `plan` recorded (`NoteUnschedulable`); the position is the policy's
//! own queue order; the start estimate comes from running the same `plan` forward in virtual
//! time on a copy of the state — each live job ending at its expected end, the planner
//! placing what then fits (backfill included) — until the job is placed. It assumes no new
//! submissions and that every run ends at its estimate; a run with no estimate never ends in
//! that timeline, so a job waiting for its GPUs gets no estimate.

use gpu_raft_store::{ClusterState, Command, JobId, JobState, LogEntry, Outcome};

use super::env::PlanEnv;
use super::order;
use super::pending::PendingIndex;
use super::plan::plan;
use super::policy::Policy;

/// Work allowed for one estimate, in job and node visits: the virtual passes are capped at
/// this divided by the size of the state (between `MIN_STEPS` and `MAX_STEPS`), so a large
/// cluster answers in seconds, estimating only jobs near the head of the queue.
const WORK: usize = 1_000_000;
const MIN_STEPS: usize = 8;
const MAX_STEPS: usize = 2_000;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explanation {
    pub state: JobState,
    /// The scheduler's reason (pending), or why the job failed.
    pub reason: Option<String>,
    /// 1-based position among pending jobs in the policy's order; 0 when not pending.
    pub position: usize,
    pub pending: usize,
    /// The expected start, when the timeline reaches one.
    pub start_ms: Option<u64>,
    /// How the start was estimated, or why there is no estimate.
    pub note: String,
}

/// Explain `job` in `state` under `policy`, as of `env.now_ms`. `None` for an unknown job.
pub fn explain(
    state: &ClusterState,
    policy: &Policy,
    env: &PlanEnv,
    job: JobId,
) -> Option<Explanation> {
    let j = state.jobs.get(&job)?;
    let mut out = Explanation {
        state: j.state,
        // A hold, a dependency or a retry time says so, even before a pass noted it.
        reason: state
            .gate(j)
            .or_else(|| super::retry::waiting_reason(j, env.now_ms))
            .or_else(|| j.reason.clone()),
        position: 0,
        pending: state
            .jobs
            .values()
            .filter(|j| j.state == JobState::Pending)
            .count(),
        start_ms: None,
        note: String::new(),
    };
    if j.state != JobState::Pending {
        out.start_ms = j.started_at_ms.or(j.bound_at_ms);
        out.note = format!("the job is {}", j.state);
        return Some(out);
    }
    if j.held {
        out.note = "no estimate: it is held until released".to_owned();
        return Some(out);
    }
    let pending = PendingIndex::of(state, policy.ordering);
    out.position = order::queue(state, policy, env, &pending)
        .position(|q| q.id == job)
        .map_or(0, |p| p + 1);
    (out.start_ms, out.note) = match timeline(state, policy, env, job) {
        Ok(start) if start <= env.now_ms => (Some(start), "it can start now".to_owned()),
        Ok(start) if j.not_before_ms == Some(start) => (
            Some(start),
            "it waits for its retry time (the backoff after its failed run)".to_owned(),
        ),
        Ok(start) => (
            Some(start),
            "if every running job ends at its estimate and nothing new is submitted".to_owned(),
        ),
        Err(why) => (None, why),
    };
    Some(out)
}

/// A copy of what planning reads (not the audit log, tokens or certificates): take it under
/// the state's lock, explain outside it.
pub fn planning_copy(state: &ClusterState) -> ClusterState {
    ClusterState {
        nodes: state.nodes.clone(),
        jobs: state.jobs.clone(),
        next_job_id: state.next_job_id,
        dependents: state.dependents.clone(),
        array_live: state.array_live.clone(),
        scheduler: state.scheduler.clone(),
        tenants: state.tenants.clone(),
        ..ClusterState::default()
    }
}

/// The virtual time at which `plan` first places `job`, or why it never does.
fn timeline(
    state: &ClusterState,
    policy: &Policy,
    env: &PlanEnv,
    job: JobId,
) -> Result<u64, String> {
    let mut s = planning_copy(state);
    let policy = Policy {
        explain: false,
        ..policy.clone()
    };
    let mut env = env.clone();
    let apply = |s: &mut ClusterState, at: u64, cmd: Command| {
        s.apply(&LogEntry {
            proposed_at_ms: at,
            cmd,
            meta: None,
            request: None,
        })
    };
    let size = s.jobs.values().filter(|j| !j.state.is_terminal()).count() + s.nodes.len();
    let steps = (WORK / size.max(1)).clamp(MIN_STEPS, MAX_STEPS);
    for _ in 0..steps {
        let planned = plan(&s, &policy, &env);
        let (binds, slice_binds) = (planned.binds, planned.slice_binds);
        // Whole GPUs and slices (MIG instances, shared slices) alike: a sliced job is placed
        // by a slice bind.
        if binds.iter().any(|b| b.job == job) || slice_binds.iter().any(|b| b.job == job) {
            return Ok(env.now_ms);
        }
        if !binds.is_empty() {
            apply(&mut s, env.now_ms, Command::BindJobs { binds });
        }
        if !slice_binds.is_empty() {
            let binds = slice_binds;
            apply(&mut s, env.now_ms, Command::BindSlices { binds });
        }
        let ends: Vec<(u64, JobId, u64)> = s
            .jobs
            .values()
            .filter(|j| j.state.is_live())
            .filter_map(|j| Some((env.expected_end_ms(j, &policy)?, j.id, j.generation)))
            .collect();
        // Jobs waiting for their retry time become placeable at it.
        let retries = s
            .jobs
            .values()
            .filter(|j| j.waits_for_retry(env.now_ms))
            .filter_map(|j| j.not_before_ms);
        let Some(next) = ends.iter().map(|(end, ..)| *end).chain(retries).min() else {
            let live = s.jobs.values().any(|j| j.state.is_live());
            return Err(if live {
                "no estimate: it waits, itself or behind jobs ahead of it, for GPUs held by runs without a runtime estimate or wall-time limit".to_owned()
            } else {
                "no estimate: it would not start even on an idle cluster (see the reason)"
                    .to_owned()
            });
        };
        env.now_ms = next.max(env.now_ms);
        for (end, id, generation) in ends {
            if end <= env.now_ms {
                let outcome = Outcome::Exited { code: 0 };
                apply(
                    &mut s,
                    env.now_ms,
                    Command::JobFinished {
                        job: id,
                        generation,
                        outcome,
                    },
                );
            }
        }
    }
    Err(format!(
        "no estimate: not placed within {steps} virtual passes (too far down the queue)"
    ))
}

#[cfg(test)]
mod tests {
    use gpu_raft_store::{Bind, JobSpec};

    use super::*;
    use crate::scheduler::testkit::{apply_at, gpu, node, spec, submit_at};

    fn with_estimate(gpus: u32, s: u64) -> JobSpec {
        JobSpec {
            runtime_estimate_s: Some(s),
            ..spec(gpus, 0)
        }
    }

    fn bind(s: &mut ClusterState, at: u64, job: JobId, gpus: Vec<u32>) {
        apply_at(
            s,
            at,
            Command::BindJobs {
                binds: vec![Bind { job, node: 1, gpus }],
            },
        );
    }

    #[test]
    fn position_and_start_come_from_the_queue_and_the_timeline() {
        let mut s = ClusterState::new();
        node(&mut s, 1, (0..4).map(|i| gpu(i, "A100", 0)).collect());
        // Two running jobs: 2 GPUs until 100 s, 2 GPUs until 300 s.
        submit_at(&mut s, 0, with_estimate(2, 100));
        submit_at(&mut s, 0, with_estimate(2, 300));
        bind(&mut s, 0, 1, vec![0, 1]);
        bind(&mut s, 0, 2, vec![2, 3]);
        // Pending, FCFS: j-3 (4 GPUs, 50 s) then j-4 (2 GPUs, 10 s).
        submit_at(&mut s, 1, with_estimate(4, 50));
        submit_at(&mut s, 2, with_estimate(2, 10));
        let policy: Policy = "fcfs+strict".parse().expect("policy");
        let env = PlanEnv::new(10_000, &policy);
        let head = explain(&s, &policy, &env, 3).expect("known");
        assert_eq!((head.position, head.pending), (1, 2));
        assert_eq!(head.start_ms, Some(300_000), "when all four GPUs are free");
        // Strict: j-4 waits for j-3, which ends at 350 s.
        let second = explain(&s, &policy, &env, 4).expect("known");
        assert_eq!((second.position, second.start_ms), (2, Some(350_000)));
        // EASY: j-4 ends (100 s + 10 s) before j-3's reservation at 300 s, so it backfills
        // at 100 s.
        let easy: Policy = "fcfs+easy".parse().expect("policy");
        let second = explain(&s, &easy, &PlanEnv::new(10_000, &easy), 4).expect("known");
        assert_eq!(second.start_ms, Some(100_000));
        // The running job is not pending; an unknown job is None.
        let running = explain(&s, &policy, &env, 1).expect("known");
        assert_eq!((running.position, running.start_ms), (0, Some(0)));
        assert!(explain(&s, &policy, &env, 99).is_none());
    }

    #[test]
    fn no_estimate_when_the_gpus_are_held_without_one_or_never_exist() {
        let mut s = ClusterState::new();
        node(&mut s, 1, (0..2).map(|i| gpu(i, "A100", 0)).collect());
        submit_at(&mut s, 0, spec(2, 0));
        bind(&mut s, 0, 1, vec![0, 1]);
        submit_at(&mut s, 1, spec(1, 0));
        submit_at(&mut s, 1, spec(8, 0));
        let policy = Policy::default();
        let env = PlanEnv::new(5_000, &policy);
        let waiting = explain(&s, &policy, &env, 2).expect("known");
        assert_eq!(waiting.start_ms, None);
        assert!(
            waiting.note.contains("without a runtime estimate"),
            "{waiting:?}"
        );
        let never = explain(&s, &policy, &env, 3).expect("known");
        assert_eq!(never.start_ms, None);
        assert!(
            never.note.contains("idle cluster") || never.note.contains("estimate"),
            "{never:?}"
        );
    }

    #[test]
    fn no_estimate_behind_a_job_that_has_none() {
        let mut s = ClusterState::new();
        node(&mut s, 1, (0..2).map(|i| gpu(i, "A100", 0)).collect());
        // j-1 holds both GPUs with no estimate; j-2 (2 GPUs) waits for them, j-3 (1 GPU)
        // waits behind j-2 in FCFS order.
        submit_at(&mut s, 0, spec(2, 0));
        bind(&mut s, 0, 1, vec![0, 1]);
        submit_at(&mut s, 1, with_estimate(2, 50));
        submit_at(&mut s, 2, with_estimate(1, 10));
        let policy: Policy = "fcfs+strict".parse().expect("policy");
        let env = PlanEnv::new(5_000, &policy);
        let behind = explain(&s, &policy, &env, 3).expect("known");
        assert_eq!((behind.position, behind.start_ms), (2, None), "{behind:?}");
        assert!(behind.note.contains("behind jobs ahead"), "{behind:?}");
    }

    #[test]
    fn a_sliced_job_gets_the_start_of_the_slice_it_waits_for() {
        use gpu_raft_store::{GpuMode, PartitionSpec, SliceRequest, mig};

        let mut s = ClusterState::new();
        node(&mut s, 1, vec![gpu(0, "A100", 0)]);
        // The node's one GPU: an A100-80GB split into a single 7g.80gb instance.
        let layout = mig::model("A100-80GB")
            .expect("a MIG model")
            .parse_layout(&["7g.80gb".to_owned()])
            .expect("a layout");
        apply_at(
            &mut s,
            0,
            Command::SetGpuPartition {
                node: 1,
                gpu: 0,
                partition: PartitionSpec {
                    mode: GpuMode::Mig,
                    mig: layout,
                },
                if_idle: false,
            },
        );
        let sliced = |estimate_s| JobSpec {
            slice: Some(SliceRequest::Mig {
                profile: "7g.80gb".into(),
            }),
            runtime_estimate_s: Some(estimate_s),
            ..spec(1, 0)
        };
        submit_at(&mut s, 0, sliced(100));
        submit_at(&mut s, 1, sliced(10));
        let policy: Policy = "fcfs+strict".parse().expect("policy");
        let env = PlanEnv::new(0, &policy);
        let first = crate::scheduler::plan(&s, &policy, &env);
        assert_eq!(first.slice_binds.len(), 1, "{first:?}");
        apply_at(
            &mut s,
            0,
            Command::BindSlices {
                binds: first.slice_binds,
            },
        );
        let env = PlanEnv::new(5_000, &policy);
        let waiting = explain(&s, &policy, &env, 2).expect("known");
        assert_eq!(
            waiting.start_ms,
            Some(100_000),
            "when the instance is free again: {waiting:?}"
        );
    }

    #[test]
    fn a_job_waiting_to_retry_starts_at_its_retry_time() {
        let mut s = ClusterState::new();
        node(&mut s, 1, (0..2).map(|i| gpu(i, "A100", 0)).collect());
        submit_at(
            &mut s,
            0,
            JobSpec {
                max_attempts: 2,
                retry_backoff_s: Some(30),
                ..spec(1, 0)
            },
        );
        bind(&mut s, 1_000, 1, vec![0]);
        let failed = Command::JobFinished {
            job: 1,
            generation: 1,
            outcome: Outcome::Exited { code: 1 },
        };
        apply_at(&mut s, 2_000, failed);
        let policy = Policy::default();
        let e = explain(&s, &policy, &PlanEnv::new(5_000, &policy), 1).expect("known");
        assert_eq!(e.start_ms, Some(32_000), "{e:?}");
        assert!(e.note.contains("retry time"), "{e:?}");
        let reason = e.reason.unwrap_or_default();
        assert!(
            reason.ends_with("attempt 2/2 after 30 s; waiting until 1970-01-01T00:00:32Z"),
            "{reason}"
        );
    }
}
