//! Dependencies, singletons, holds and arrays through `ClusterState::apply`: dependencies
//! checked at submission (an unknown job, another tenant's, one already ended the wrong way),
//! crossed off as the jobs they name change state, a job whose dependency can never be met
//! cancelled with the reason (down a whole pipeline); an array one submission of a task per
//! index; and `apply` refusing to bind a job that must still wait (held, waiting, a singleton's
//! namesake running, its array at its limit), whatever the scheduler believed.

use gpu_raft_store::testing::{at, register, spec, submit};
use gpu_raft_store::{
    ApplyResult, Bind, ClusterState, Command, GpuRecord, JobId, JobSpec, JobState, JobUpdate,
    LogEntry, Outcome, Rejection, parse_dependencies,
};

fn gpu(index: u32) -> GpuRecord {
    gpu_raft_store::testing::gpu(index, "A100-test", "A100", 81920)
}

/// Node 1 with four GPUs.
fn cluster() -> ClusterState {
    let mut s = ClusterState::new();
    s.apply(&at(1, register(1, vec![gpu(0), gpu(1), gpu(2), gpu(3)])));
    s
}

fn after(deps: &str) -> JobSpec {
    JobSpec {
        after: parse_dependencies(deps).expect("parses"),
        ..spec(1)
    }
}

fn submitted(r: ApplyResult) -> JobId {
    match r {
        ApplyResult::JobSubmitted { job, .. } => job,
        other => panic!("not submitted: {other:?}"),
    }
}

fn refusal(r: ApplyResult) -> String {
    match r {
        ApplyResult::Rejected { reason } => reason.to_string(),
        other => panic!("not refused: {other:?}"),
    }
}

/// Bind `job` on node 1 to GPU `gpu` at 10 ms; whether apply bound it, or why not.
fn bind(s: &mut ClusterState, job: JobId, gpu: u32) -> Result<(), String> {
    let binds = vec![Bind {
        job,
        node: 1,
        gpus: vec![gpu],
    }];
    match s.apply(&at(10, Command::BindJobs { binds })) {
        ApplyResult::Bound { bound, .. } if bound == [job] => Ok(()),
        ApplyResult::Bound { rejected, .. } => Err(rejected[0].1.clone()),
        other => panic!("{other:?}"),
    }
}

/// Bind, start and end `job` with exit code `code`.
fn run(s: &mut ClusterState, job: JobId, code: i32) {
    bind(s, job, 0).expect("binds");
    let generation = s.jobs[&job].generation;
    s.apply(&at(20, Command::JobStarted { job, generation }));
    let outcome = Outcome::Exited { code };
    let end = Command::JobFinished {
        job,
        generation,
        outcome,
    };
    assert_eq!(s.apply(&at(30, end)), ApplyResult::Ok);
}

#[test]
fn a_pipeline_whose_middle_stage_fails_ends_its_last_stage_with_the_reason() {
    let mut s = cluster();
    let prepare = submitted(submit(&mut s, spec(1), None));
    let train = submitted(submit(&mut s, after(&format!("ok:j-{prepare}")), None));
    let report = submitted(submit(&mut s, after(&format!("ok:j-{train}")), None));
    let cleanup = submitted(submit(&mut s, after(&format!("any:j-{report}")), None));
    assert_eq!(s.jobs[&train].waiting_for, [prepare].into());

    let early = bind(&mut s, train, 1).expect_err("train waits for prepare");
    assert!(
        early.contains(&format!("waiting for j-{prepare} to succeed")),
        "{early}"
    );

    run(&mut s, prepare, 0);
    assert!(s.jobs[&train].waiting_for.is_empty(), "prepare succeeded");
    run(&mut s, train, 3);

    let r = &s.jobs[&report];
    assert_eq!(r.state, JobState::Cancelled);
    assert_eq!(
        r.reason.as_deref(),
        Some(format!("dependency never satisfied: ok:j-{train}: j-{train} failed").as_str())
    );
    assert_eq!(r.finished_at_ms, Some(30));
    // Its own dependents are settled at the same entry: `any` is met by a cancellation.
    assert!(s.jobs[&cleanup].waiting_for.is_empty());
    assert_eq!(s.jobs[&cleanup].state, JobState::Pending);
    assert!(s.dependents.is_empty(), "nothing left to settle");
}

#[test]
fn submission_refuses_unknown_foreign_and_hopeless_dependencies() {
    let mut s = cluster();
    let mine = submitted(submit(&mut s, spec(1), None));
    let theirs = submitted(submit(
        &mut s,
        JobSpec {
            tenant: "other".into(),
            ..spec(1)
        },
        None,
    ));
    let unknown = refusal(submit(&mut s, after("ok:j-99"), None));
    let foreign = refusal(submit(&mut s, after(&format!("ok:j-{theirs}")), None));
    // Another tenant's job is refused in the very words an id that never existed is.
    assert_eq!(
        foreign.replace(&format!("j-{theirs}"), "j-99"),
        unknown.replace(&format!("j-{theirs}"), "j-99")
    );
    assert!(unknown.contains("has no job j-99"), "{unknown}");

    run(&mut s, mine, 0);
    let hopeless = refusal(submit(&mut s, after(&format!("notok:j-{mine}")), None));
    assert!(hopeless.contains("can never be met"), "{hopeless}");
    let met = submitted(submit(&mut s, after(&format!("ok:j-{mine}")), None));
    assert!(s.jobs[&met].waiting_for.is_empty(), "already met");
    bind(&mut s, met, 1).expect("may start at once");

    let twice = refusal(submit(&mut s, after("ok:j-1,ok:j-1"), None));
    assert!(twice.contains("listed twice"), "{twice}");
    let jobs = s.jobs.len();
    refusal(submit(&mut s, after("ok:j-99"), None));
    assert_eq!(s.jobs.len(), jobs, "refusals leave no job behind");
}

#[test]
fn start_dependencies_are_met_when_the_job_runs() {
    let mut s = cluster();
    let server = submitted(submit(&mut s, spec(1), None));
    let client = submitted(submit(&mut s, after(&format!("start:j-{server}")), None));
    bind(&mut s, server, 0).expect("binds");
    assert!(bind(&mut s, client, 1).is_err(), "bound is not started");
    let generation = s.jobs[&server].generation;
    s.apply(&at(
        20,
        Command::JobStarted {
            job: server,
            generation,
        },
    ));
    bind(&mut s, client, 1).expect("the server runs");
}

#[test]
fn a_held_job_is_not_bound_until_released() {
    let mut s = cluster();
    let job = submitted(submit(&mut s, spec(1), None));
    let hold = |hold| at(5, Command::HoldJob { job, hold });
    assert_eq!(s.apply(&hold(true)), ApplyResult::Ok);
    let refused = bind(&mut s, job, 0).expect_err("held");
    assert!(refused.contains("held"), "{refused}");
    assert_eq!(s.apply(&hold(false)), ApplyResult::Ok);
    bind(&mut s, job, 0).expect("released");
    let running = s.apply(&hold(true));
    assert!(
        matches!(
            running,
            ApplyResult::Rejected {
                reason: Rejection::NotNow { .. }
            }
        ),
        "{running:?}"
    );
}

#[test]
fn singletons_of_one_name_hold_gpus_one_at_a_time() {
    let mut s = cluster();
    let single = JobSpec {
        name: "nightly".into(),
        singleton: true,
        ..spec(1)
    };
    let first = submitted(submit(&mut s, single.clone(), None));
    let second = submitted(submit(&mut s, single.clone(), None));
    let other_tenant = submitted(submit(
        &mut s,
        JobSpec {
            tenant: "other".into(),
            ..single
        },
        None,
    ));
    run(&mut s, first, 0);
    bind(&mut s, second, 1).expect("the first ended");
    let refused = bind(&mut s, first + 100, 2).expect_err("no such job");
    assert!(refused.contains("does not exist"));
    bind(&mut s, other_tenant, 2).expect("another tenant's namesake is not a sibling");
    let third = submitted(submit(
        &mut s,
        JobSpec {
            name: "nightly".into(),
            singleton: true,
            ..spec(1)
        },
        None,
    ));
    let refused = bind(&mut s, third, 3).expect_err("the second runs");
    assert!(
        refused.contains(&format!("singleton: waiting for j-{second}")),
        "{refused}"
    );
}

fn array(text: &str) -> JobSpec {
    JobSpec {
        array: Some(text.parse().expect("parses")),
        ..spec(1)
    }
}

#[test]
fn an_array_is_one_submission_of_a_task_per_index_throttled_by_its_limit() {
    let mut s = cluster();
    let first = submitted(submit(&mut s, array("10-14%2"), Some("sweep")));
    let tasks: Vec<(JobId, u32)> = s
        .array_tasks(first)
        .map(|j| (j.id, j.array_task.map_or(99, |t| t.index)))
        .collect();
    assert_eq!(
        tasks,
        (first..).zip(10..15).collect::<Vec<_>>(),
        "consecutive ids in index order"
    );
    assert_eq!(s.next_job_id, first + 5);
    // A retry of the submission is the same array.
    let again = submit(&mut s, array("10-14%2"), Some("sweep"));
    assert_eq!(
        again,
        ApplyResult::JobSubmitted {
            job: first,
            existing: true
        }
    );

    // Three binds in one entry: the third is beyond the limit.
    let binds = (0..3)
        .map(|i| Bind {
            job: first + i,
            node: 1,
            gpus: vec![i as u32],
        })
        .collect();
    let ApplyResult::Bound { bound, rejected } = s.apply(&at(10, Command::BindJobs { binds }))
    else {
        panic!("binds")
    };
    assert_eq!(bound, [first, first + 1]);
    assert!(rejected[0].1.contains("its limit (%2)"), "{rejected:?}");
    // One ends: the next may start.
    let generation = s.jobs[&first].generation;
    let end = Command::JobFinished {
        job: first,
        generation,
        outcome: Outcome::Exited { code: 0 },
    };
    s.apply(&at(20, end));
    assert_eq!(s.array_live[&first].len(), 1);
    bind(&mut s, first + 2, 0).expect("room under the limit");

    // The whole array: held, then cancelled.
    s.apply(&at(
        30,
        Command::HoldArray {
            array: first,
            hold: true,
        },
    ));
    assert!(s.jobs[&(first + 3)].held && s.jobs[&(first + 4)].held);
    assert!(!s.jobs[&(first + 2)].held, "a running task is not held");
    s.apply(&at(30, Command::CancelArray { array: first }));
    let states: Vec<JobState> = s.array_tasks(first).map(|j| j.state).collect();
    use JobState::*;
    assert_eq!(states, [Succeeded, Bound, Bound, Cancelled, Cancelled]);
    assert!(
        s.array_tasks(first)
            .skip(1)
            .take(2)
            .all(|j| j.cancel_requested)
    );
}

#[test]
fn arrays_out_of_bounds_are_refused_whole() {
    let mut s = cluster();
    let before = s.jobs.len();
    for bad in ["0-100000", "5-1", "0-9:0", "0-9%0"] {
        let why = refusal(submit(&mut s, array(bad), None));
        assert!(why.starts_with("invalid argument"), "{bad}: {why}");
    }
    let r = s.apply(&at(1, Command::CancelArray { array: 1 }));
    assert!(matches!(r, ApplyResult::Rejected { .. }), "{r:?}");
    assert_eq!(s.jobs.len(), before);
}

fn update(job: JobId, array: bool, update: JobUpdate) -> LogEntry {
    at(40, Command::UpdateJob { job, array, update })
}

#[test]
fn a_pending_job_or_array_is_updated_all_or_nothing_and_a_running_one_not_at_all() {
    let mut s = cluster();
    let limited = JobSpec {
        wall_time_limit_s: Some(600),
        ..spec(1)
    };
    let job = submitted(submit(&mut s, limited.clone(), None));
    let shorter = JobUpdate {
        priority: Some(7),
        wall_time_limit_s: Some(300),
        gpus: Some(2),
    };
    assert_eq!(s.apply(&update(job, false, shorter)), ApplyResult::Ok);
    let spec = &s.jobs[&job].spec;
    assert_eq!(
        (spec.priority, spec.wall_time_limit_s, spec.gpus),
        (7, Some(300), 2)
    );
    let longer = JobUpdate {
        wall_time_limit_s: Some(301),
        ..JobUpdate::default()
    };
    let before = s.clone();
    assert!(refusal(s.apply(&update(job, false, longer.clone()))).contains("only be shortened"));
    assert_eq!(s.jobs, before.jobs, "a refused update changes nothing");

    // An array: every pending task or none. Task 0 runs and keeps its spec.
    let head = submitted(submit(&mut s, array("0-2"), None));
    bind(&mut s, head, 0).expect("binds");
    let two = JobUpdate {
        gpus: Some(2),
        ..JobUpdate::default()
    };
    assert_eq!(s.apply(&update(head, true, two.clone())), ApplyResult::Ok);
    let gpus: Vec<u32> = (head..head + 3).map(|id| s.jobs[&id].spec.gpus).collect();
    assert_eq!(gpus, [1, 2, 2]);
    let running = refusal(s.apply(&update(head, false, two)));
    assert!(running.contains("only a pending job"), "{running}");
}

#[test]
fn a_requeued_running_job_comes_back_without_spending_an_attempt_and_an_ended_one_at_once() {
    let mut s = cluster();
    let job = submitted(submit(&mut s, spec(1), None));
    bind(&mut s, job, 0).expect("binds");
    let generation = s.jobs[&job].generation;
    s.apply(&at(20, Command::JobStarted { job, generation }));
    let requeue = |job| at(40, Command::RequeueJob { job, array: false });
    assert_eq!(s.apply(&requeue(job)), ApplyResult::Ok);
    assert!(s.jobs[&job].evict_requested, "the run is asked to stop");
    let evicted = Command::JobFinished {
        job,
        generation,
        outcome: Outcome::Evicted,
    };
    s.apply(&at(50, evicted));
    let j = &s.jobs[&job];
    assert_eq!((j.state, j.attempts), (JobState::Pending, 0));
    assert_eq!(j.reason.as_deref(), Some("requeued on request"));

    let failed = submitted(submit(&mut s, spec(1), None));
    run(&mut s, failed, 3);
    assert_eq!(s.jobs[&failed].state, JobState::Failed);
    assert_eq!(s.apply(&requeue(failed)), ApplyResult::Ok);
    let j = &s.jobs[&failed];
    assert_eq!(
        (j.state, j.attempts, j.runs.len()),
        (JobState::Pending, 0, 1)
    );
    run(&mut s, failed, 0);
    assert_eq!(s.jobs[&failed].state, JobState::Succeeded);
    assert_eq!(s.jobs[&failed].runs.len(), 2, "both runs are its history");
}

#[test]
fn a_job_submitted_held_waits_for_its_release() {
    let mut s = cluster();
    let held = Command::SubmitJob {
        spec: Box::new(array("0-1")),
        idempotency_key: None,
        hold: true,
        owner: None,
    };
    let head = submitted(s.apply(&at(1, held)));
    assert!(s.jobs[&head].held && s.jobs[&(head + 1)].held);
    assert!(bind(&mut s, head, 0).expect_err("held").contains("held"));
    let release = Command::HoldArray {
        array: head,
        hold: false,
    };
    s.apply(&at(2, release));
    bind(&mut s, head, 0).expect("binds once released");
}
