//! Retries of failed runs and the record of every run, through `ClusterState::apply`: a failed
//! run of a job with a retry backoff goes back to Pending, not placeable before its backoff
//! (doubled per attempt, capped); time limits, cancels and used-up attempts end the job; an
//! eviction still gives its attempt back; a gang is requeued whole; `Job::runs` keeps each
//! run's attempt, generation, nodes, times and outcome.

use gpu_raft_store::testing::{at, register, spec, submit};
use gpu_raft_store::{
    ApplyResult, Bind, ClusterState, Command, GpuRecord, Job, JobSpec, JobState, MAX_RETRY_DELAY_S,
    MAX_RUNS_KEPT, NodeStatus, Outcome, retry_delay_s,
};

fn gpu(index: u32) -> GpuRecord {
    gpu_raft_store::testing::gpu(index, "A100-test", "A100", 81920)
}

/// Nodes 1 and 2, two GPUs each.
fn cluster() -> ClusterState {
    let mut s = ClusterState::new();
    s.apply(&at(1, register(1, vec![gpu(0), gpu(1)])));
    s.apply(&at(1, register(2, vec![gpu(0), gpu(1)])));
    s
}

/// One GPU, `attempts` attempts, failed runs retried after `backoff_s`.
fn retried(attempts: u32, backoff_s: u64) -> JobSpec {
    JobSpec {
        max_attempts: attempts,
        retry_backoff_s: Some(backoff_s),
        ..spec(1)
    }
}

fn bind(s: &mut ClusterState, ms: u64, job: u64, node: u64) -> ApplyResult {
    let binds = vec![Bind {
        job,
        node,
        gpus: vec![0],
    }];
    s.apply(&at(ms, Command::BindJobs { binds }))
}

fn bound(r: &ApplyResult) -> bool {
    matches!(r, ApplyResult::Bound { bound, .. } if !bound.is_empty())
}

/// Bind job 1 on node 1 at `ms`, start it, and end it with `outcome` a second later.
fn run(s: &mut ClusterState, ms: u64, outcome: Outcome) {
    assert!(bound(&bind(s, ms, 1, 1)), "bind at {ms}");
    let generation = s.jobs[&1].generation;
    s.apply(&at(ms, Command::JobStarted { job: 1, generation }));
    let end = Command::JobFinished {
        job: 1,
        generation,
        outcome,
    };
    assert_eq!(s.apply(&at(ms + 1_000, end)), ApplyResult::Ok);
}

fn job(s: &ClusterState) -> &Job {
    &s.jobs[&1]
}

#[test]
fn failed_runs_wait_a_doubling_backoff_then_the_job_fails_when_attempts_are_used() {
    let mut s = cluster();
    submit(&mut s, retried(3, 10), None);
    run(&mut s, 10_000, Outcome::Exited { code: 1 });
    let j = job(&s);
    assert_eq!((j.state, j.attempts), (JobState::Pending, 1));
    assert_eq!(j.not_before_ms, Some(21_000), "ended at 11 s, 10 s backoff");
    assert_eq!(
        j.reason.as_deref(),
        Some("requeued: exited with code 1; attempt 2/3 after 10 s")
    );
    assert!(s.nodes[&1].allocations.is_empty(), "its GPU is free");
    assert!(j.waits_for_retry(20_999) && !j.waits_for_retry(21_000));

    // Apply refuses a bind before the retry time, whatever the scheduler believed.
    let early = bind(&mut s, 20_999, 1, 1);
    assert!(
        matches!(&early, ApplyResult::Bound { bound, rejected }
            if bound.is_empty() && rejected[0].1.contains("waits to retry")),
        "{early:?}"
    );
    run(&mut s, 21_000, Outcome::Signaled { signal: 9 });
    let j = job(&s);
    assert_eq!(j.not_before_ms, Some(42_000), "doubled: 20 s after 22 s");
    assert_eq!(
        j.reason.as_deref(),
        Some("requeued: killed by signal 9; attempt 3/3 after 20 s")
    );
    run(
        &mut s,
        42_000,
        Outcome::FailedToStart {
            message: "no such file".into(),
        },
    );
    let j = job(&s);
    assert_eq!((j.state, j.attempts), (JobState::Failed, 3));
    assert_eq!(j.finished_at_ms, Some(43_000));
    assert_eq!(j.reason.as_deref(), Some("failed to start: no such file"));

    // Every run is on record, in order, with where and how it ran.
    let runs: Vec<String> = j
        .runs
        .iter()
        .map(|r| {
            let outcome = r.outcome.as_ref().map(ToString::to_string);
            format!(
                "attempt {} g{} on {:?}: bound {}, started {:?}, ended {:?}: {}",
                r.attempt,
                r.generation,
                r.nodes,
                r.bound_at_ms,
                r.started_at_ms,
                r.finished_at_ms,
                outcome.unwrap_or_default()
            )
        })
        .collect();
    assert_eq!(
        runs,
        [
            "attempt 1 g1 on [1]: bound 10000, started Some(10000), ended Some(11000): exited with code 1",
            "attempt 2 g2 on [1]: bound 21000, started Some(21000), ended Some(22000): killed by signal 9",
            "attempt 3 g3 on [1]: bound 42000, started Some(42000), ended Some(43000): failed to start: no such file",
        ]
    );
}

#[test]
fn the_backoff_doubles_up_to_its_cap() {
    assert_eq!(
        (1..=5).map(|a| retry_delay_s(10, a)).collect::<Vec<_>>(),
        [10, 20, 40, 80, 160]
    );
    assert_eq!(retry_delay_s(10, 10), MAX_RETRY_DELAY_S, "5120 s capped");
    assert_eq!(retry_delay_s(MAX_RETRY_DELAY_S, 100), MAX_RETRY_DELAY_S);
    assert_eq!(retry_delay_s(0, 7), 0, "no backoff: at once");

    // In apply: the retry after attempt 10 waits the cap, not 10 × 2⁹ s.
    let mut s = cluster();
    submit(&mut s, retried(12, 10), None);
    let mut t = 1_000;
    for _ in 0..10 {
        t = job(&s).not_before_ms.unwrap_or(t);
        run(&mut s, t, Outcome::Exited { code: 2 });
    }
    let j = job(&s);
    assert_eq!(j.attempts, 10);
    assert_eq!(j.not_before_ms, Some(t + 1_000 + MAX_RETRY_DELAY_S * 1_000));
}

#[test]
fn time_limits_cancels_and_jobs_without_a_backoff_are_not_retried() {
    // A time limit ends the job: another run would most likely be stopped the same way.
    let mut s = cluster();
    submit(&mut s, retried(3, 1), None);
    run(&mut s, 1_000, Outcome::WallTimeExceeded);
    assert_eq!(job(&s).state, JobState::Failed);
    assert_eq!(job(&s).reason.as_deref(), Some("time limit exceeded"));

    // A run that fails while a cancel is on its way is not tried again.
    let mut s = cluster();
    submit(&mut s, retried(3, 1), None);
    assert!(bound(&bind(&mut s, 1_000, 1, 1)));
    s.apply(&at(1_100, Command::CancelJob { job: 1 }));
    let end = Command::JobFinished {
        job: 1,
        generation: 1,
        outcome: Outcome::Signaled { signal: 15 },
    };
    s.apply(&at(1_200, end));
    assert_eq!(job(&s).state, JobState::Failed);

    // Without a backoff (a job from before retries, or one attempt) a failed run ends it.
    let mut s = cluster();
    submit(&mut s, spec(1), None);
    run(
        &mut s,
        1_000,
        Outcome::OutOfMemory {
            limit_mib: Some(64),
        },
    );
    assert_eq!(job(&s).state, JobState::Failed);
    assert_eq!(job(&s).not_before_ms, None);
}

#[test]
fn a_retry_waiting_job_cancelled_is_cancelled_at_once() {
    let mut s = cluster();
    submit(&mut s, retried(3, 60), None);
    run(&mut s, 1_000, Outcome::Exited { code: 1 });
    assert_eq!(
        s.apply(&at(3_000, Command::CancelJob { job: 1 })),
        ApplyResult::Ok
    );
    let j = job(&s);
    assert_eq!((j.state, j.not_before_ms), (JobState::Cancelled, None));
}

#[test]
fn an_eviction_gives_its_attempt_back_and_a_lost_run_is_requeued_at_once() {
    let mut s = cluster();
    submit(&mut s, retried(2, 30), None);
    run(&mut s, 1_000, Outcome::Evicted);
    let j = job(&s);
    assert_eq!(
        (j.state, j.attempts, j.not_before_ms),
        (JobState::Pending, 0, None)
    );
    assert_eq!(j.reason.as_deref(), Some("requeued: evicted"));

    // The run after an eviction has the same attempt number, another generation.
    assert!(bound(&bind(&mut s, 3_000, 1, 2)));
    s.apply(&at(
        4_000,
        Command::SetNodeStatus {
            node: 2,
            status: NodeStatus::Down,
            requeue_evicting: false,
        },
    ));
    let j = job(&s);
    assert_eq!(
        (j.state, j.attempts, j.not_before_ms),
        (JobState::Pending, 1, None)
    );
    assert_eq!(
        j.reason.as_deref(),
        Some("requeued: lost: node n2 went down")
    );
    let runs: Vec<(u32, u64, Vec<u64>)> = j
        .runs
        .iter()
        .map(|r| (r.attempt, r.generation, r.nodes.clone()))
        .collect();
    assert_eq!(runs, [(1, 1, vec![1]), (1, 2, vec![2])]);

    // The last attempt fails: no retry left, the job ends.
    run(&mut s, 5_000, Outcome::Exited { code: 1 });
    assert_eq!((job(&s).state, job(&s).attempts), (JobState::Failed, 2));
}

#[test]
fn a_gang_whose_member_fails_is_requeued_whole() {
    let mut s = cluster();
    let gang = JobSpec {
        gpus: 2,
        nodes: 2,
        ..retried(2, 5)
    };
    submit(&mut s, gang, None);
    let binds = vec![
        Bind {
            job: 1,
            node: 1,
            gpus: vec![0],
        },
        Bind {
            job: 1,
            node: 2,
            gpus: vec![1],
        },
    ];
    assert!(bound(&s.apply(&at(
        1_000,
        Command::BindJobs {
            binds: binds.clone()
        }
    ))));
    assert_eq!(job(&s).runs[0].nodes, [1, 2], "the node of each rank");
    // Rank 0 succeeds, then rank 1 fails: the whole gang waits for its retry.
    s.apply(&at(
        2_000,
        Command::GangMemberFinished {
            job: 1,
            generation: 1,
            node: 1,
        },
    ));
    let fail = Command::JobFinished {
        job: 1,
        generation: 1,
        outcome: Outcome::Exited { code: 3 },
    };
    assert_eq!(s.apply(&at(3_000, fail)), ApplyResult::Ok);
    let j = job(&s);
    assert_eq!((j.state, j.not_before_ms), (JobState::Pending, Some(8_000)));
    assert!(
        s.nodes.values().all(|n| n.allocations.is_empty()),
        "every member's GPU is free"
    );
    // Placed again as a whole, with no member counted done.
    assert!(bound(&s.apply(&at(8_000, Command::BindJobs { binds }))));
    let j = job(&s);
    assert_eq!((j.generation, j.gang.len()), (2, 2));
    assert!(j.gang_done.is_empty());
    assert_eq!(j.runs.len(), 2);
}

#[test]
fn the_run_history_keeps_the_latest_runs() {
    let mut s = cluster();
    submit(
        &mut s,
        JobSpec {
            max_attempts: 1,
            ..spec(1)
        },
        None,
    );
    // Evictions give the attempt back, so one job can run many times.
    let runs = MAX_RUNS_KEPT as u64 + 5;
    for i in 0..runs {
        run(&mut s, 1_000 * (2 * i + 1), Outcome::Evicted);
    }
    let j = job(&s);
    assert_eq!(j.runs.len(), MAX_RUNS_KEPT);
    assert_eq!(j.runs[0].generation, 6, "the oldest five are dropped");
    assert_eq!(j.runs.last().map(|r| r.generation), Some(runs));
    assert!(j.run(runs).is_some() && j.run(1).is_none());
}

#[test]
fn a_retry_backoff_needs_attempts_to_retry_and_at_most_an_hour() {
    let mut s = cluster();
    let before = s.clone();
    for bad in [retried(1, 10), retried(3, MAX_RETRY_DELAY_S + 1)] {
        let r = submit(&mut s, bad, None);
        assert!(matches!(r, ApplyResult::Rejected { .. }), "{r:?}");
        assert_eq!(s, before);
    }
    assert!(matches!(
        submit(&mut s, retried(3, 0), None),
        ApplyResult::JobSubmitted { .. }
    ));
}
