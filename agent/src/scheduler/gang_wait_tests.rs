//! Gangs do not starve: a gang asked for at the head of the queue gets an EASY reservation on
//! its K nodes, the starvation guard puts a gang pending past its limit first and lets it hold
//! the queue in any backfill mode, and preemption frees K nodes for a gang — for a starving
//! one, single-node runs of no higher priority — which `apply` checks by the entry's time.

use gpu_raft_store::scheduler::Preemption;
use gpu_raft_store::{ApplyResult, ClusterState, Command, JobSpec, Preempt, SchedulerSettings};

use super::testkit::{apply, apply_at, gpu, node, spec, submit_at};
use super::{PendingIndex, Plan, PlanEnv, Policy, plan, preemptions};

const HOUR_MS: u64 = 3_600_000;

/// `count` nodes of `gpus` A100s each, under `settings`.
fn cluster(count: u64, gpus: u32, settings: SchedulerSettings) -> ClusterState {
    let mut s = ClusterState::new();
    for id in 1..=count {
        node(&mut s, id, (0..gpus).map(|i| gpu(i, "A100", 0)).collect());
    }
    apply(&mut s, Command::SetSchedulerPolicy { settings });
    s
}

fn guarded(preemption: Preemption) -> SchedulerSettings {
    SchedulerSettings {
        preemption,
        gang_wait_limit_s: 3600,
        ..SchedulerSettings::default()
    }
}

fn priority_preemption() -> SchedulerSettings {
    SchedulerSettings {
        preemption: Preemption::Priority,
        ..SchedulerSettings::default()
    }
}

fn gang(nodes: u32, gpus: u32, estimate_s: u64) -> JobSpec {
    JobSpec {
        nodes,
        runtime_estimate_s: Some(estimate_s),
        ..spec(gpus, 0)
    }
}

fn single(gpus: u32, estimate_s: u64, priority: i32) -> JobSpec {
    JobSpec {
        runtime_estimate_s: Some(estimate_s),
        ..spec(gpus, priority)
    }
}

/// The cluster's policy with this ordering and backfill (`sjf+easy`).
fn policy(s: &ClusterState, spec: &str) -> Policy {
    let p: Policy = spec.parse().expect("policy");
    let settings = SchedulerSettings {
        ordering: p.ordering,
        backfill: p.backfill,
        ..s.scheduler.clone()
    };
    p.with_settings(&settings)
}

fn plan_at(s: &ClusterState, policy: &Policy, now_ms: u64) -> Plan {
    plan(s, policy, &PlanEnv::new(now_ms, policy))
}

/// Plan at `now_ms` and apply the binds then.
fn pass_at(s: &mut ClusterState, policy: &Policy, now_ms: u64) {
    let binds = plan_at(s, policy, now_ms).binds;
    apply_at(s, now_ms, Command::BindJobs { binds });
}

fn started(p: &Plan) -> Vec<u64> {
    let mut jobs: Vec<u64> = p.binds.iter().map(|b| b.job).collect();
    jobs.dedup();
    jobs
}

fn victims_at(s: &ClusterState, now_ms: u64) -> Vec<Preempt> {
    let policy = Policy::default().with_settings(&s.scheduler);
    let pending = PendingIndex::of(s, policy.ordering);
    preemptions(s, &policy, &PlanEnv::new(now_ms, &policy), &pending)
}

#[test]
fn a_gang_at_the_head_reserves_its_nodes_and_only_what_cannot_delay_it_backfills() {
    // Two 4-GPU nodes, each half held until 100 s; then a 2×4 gang, a long and a short job.
    let mut s = cluster(2, 4, SchedulerSettings::default());
    let fcfs_easy = policy(&s, "fcfs+easy");
    submit_at(&mut s, 0, single(2, 100, 0));
    submit_at(&mut s, 0, single(2, 100, 0));
    pass_at(&mut s, &fcfs_easy, 0);
    submit_at(&mut s, 1, gang(2, 8, 600)); // j-3
    submit_at(&mut s, 2, single(1, 1000, 0)); // j-4: would hold a GPU past 100 s
    submit_at(&mut s, 3, single(1, 50, 0)); // j-5: ends before 100 s
    let p = plan_at(&s, &fcfs_easy, 10_000);
    assert_eq!(started(&p), vec![5]);
    let r = p.reservations.first().expect("the gang's reservation");
    assert_eq!(
        (r.job, r.start_ms, r.nodes.clone(), r.spare),
        (3, 100_000, vec![1, 2], 0)
    );
    assert!(
        p.unschedulable
            .iter()
            .any(|(j, why)| *j == 4 && why.contains("delay j-3")),
        "{:?}",
        p.unschedulable
    );
    // Greedy, without the guard, starts the long job and the gang waits on.
    assert_eq!(
        started(&plan_at(&s, &policy(&s, "fcfs+greedy"), 10_000)),
        vec![4, 5]
    );
}

#[test]
fn a_gang_past_its_wait_limit_goes_first_and_holds_the_queue_in_any_mode() {
    let mut s = cluster(2, 4, guarded(Preemption::Off));
    let sjf_greedy = policy(&s, "sjf+greedy");
    submit_at(&mut s, 0, single(2, 3 * 3600, 0));
    submit_at(&mut s, 0, single(2, 3 * 3600, 0));
    pass_at(&mut s, &sjf_greedy, 0);
    submit_at(&mut s, 0, gang(2, 8, 7200)); // j-3: the longest, last under SJF
    submit_at(&mut s, 1, single(2, 5 * 3600, 0)); // j-4: would hold 2 GPUs past 3 h
    // Within its limit the gang is passed by, as greedy does.
    assert_eq!(started(&plan_at(&s, &sjf_greedy, HOUR_MS / 2)), vec![4]);
    // Past it, the gang comes first: it reserves both nodes at 3 h and j-4 waits.
    let p = plan_at(&s, &sjf_greedy, HOUR_MS);
    assert_eq!(started(&p), Vec::<u64>::new());
    let r = p.reservations.first().expect("the starving gang reserves");
    assert_eq!(
        (r.job, r.start_ms, r.nodes.clone()),
        (3, 3 * HOUR_MS, vec![1, 2])
    );
    // Its place in the queue shows it first too.
    let pending = PendingIndex::of(&s, sjf_greedy.ordering);
    let env = PlanEnv::new(HOUR_MS, &sjf_greedy);
    let order: Vec<u64> = super::order::queue(&s, &sjf_greedy, &env, &pending)
        .map(|j| j.id)
        .collect();
    assert_eq!(order, vec![3, 4]);
}

#[test]
fn a_starving_gang_preempts_single_node_runs_of_no_higher_priority_and_apply_agrees() {
    // n1 and n2 run priority-0 jobs, n3 a priority-5 one; a 2×2 gang waits.
    let mut s = cluster(3, 2, guarded(Preemption::Reclaim));
    let fcfs = policy(&s, "fcfs");
    for priority in [0, 0, 5] {
        submit_at(&mut s, 0, single(2, 9 * 3600, priority));
    }
    pass_at(&mut s, &fcfs, 0);
    submit_at(&mut s, 0, gang(2, 4, 3600)); // j-4
    assert_eq!(victims_at(&s, HOUR_MS - 1), vec![], "not yet starving");
    let before = s.clone();
    let early = apply_at(
        &mut s,
        HOUR_MS - 1,
        Command::PreemptJobs {
            preemptions: vec![Preempt {
                job: 1,
                generation: 1,
                for_job: 4,
            }],
        },
    );
    assert!(
        matches!(&early, ApplyResult::Preempted { preempted, .. } if preempted.is_empty()),
        "{early:?}"
    );
    assert_eq!(s, before, "a refused preemption changes nothing");

    let v = victims_at(&s, HOUR_MS);
    let mut stopped: Vec<u64> = v.iter().map(|p| p.job).collect();
    stopped.sort_unstable();
    assert_eq!(stopped, vec![1, 2], "never the priority-5 run on n3");
    let r = apply_at(&mut s, HOUR_MS, Command::PreemptJobs { preemptions: v });
    assert!(
        matches!(&r, ApplyResult::Preempted { preempted, rejected } if preempted.len() == 2 && rejected.is_empty()),
        "{r:?}"
    );
}

#[test]
fn a_starving_gang_never_preempts_another_gang_and_off_means_off() {
    let mut s = cluster(2, 2, guarded(Preemption::Reclaim));
    let fcfs = policy(&s, "fcfs");
    submit_at(&mut s, 0, gang(2, 4, 9 * 3600)); // j-1 runs on both nodes
    pass_at(&mut s, &fcfs, 0);
    submit_at(&mut s, 0, gang(2, 4, 3600)); // j-2 starves behind it
    assert_eq!(victims_at(&s, 2 * HOUR_MS), vec![]);

    let mut off = cluster(2, 2, guarded(Preemption::Off));
    submit_at(&mut off, 0, single(2, 9 * 3600, 0));
    submit_at(&mut off, 0, single(2, 9 * 3600, 0));
    pass_at(&mut off, &fcfs, 0);
    submit_at(&mut off, 0, gang(2, 4, 3600));
    assert_eq!(victims_at(&off, 2 * HOUR_MS), vec![]);
}

#[test]
fn a_gang_of_higher_priority_preempts_on_k_nodes() {
    let mut s = cluster(3, 2, priority_preemption());
    let fcfs = policy(&s, "fcfs");
    for priority in [1, 0, 0] {
        submit_at(&mut s, 0, single(2, 3600, priority));
    }
    pass_at(&mut s, &fcfs, 0);
    submit_at(
        &mut s,
        0,
        JobSpec {
            priority: 5,
            ..gang(2, 4, 600)
        },
    );
    let mut stopped: Vec<u64> = victims_at(&s, 1).iter().map(|p| p.job).collect();
    stopped.sort_unstable();
    // Both priority-0 runs: the least important, one node each.
    assert_eq!(stopped, vec![2, 3]);
}

#[test]
fn runs_preempted_for_a_job_then_held_are_free_to_start_again() {
    let mut s = cluster(1, 2, priority_preemption());
    let fcfs = policy(&s, "fcfs");
    submit_at(&mut s, 0, single(2, 3600, 0));
    pass_at(&mut s, &fcfs, 0);
    submit_at(&mut s, 0, single(2, 3600, 5)); // j-2
    let v = victims_at(&s, 1);
    assert_eq!(v.len(), 1);
    apply(&mut s, Command::PreemptJobs { preemptions: v });
    apply(
        &mut s,
        Command::JobFinished {
            job: 1,
            generation: 1,
            outcome: gpu_raft_store::Outcome::Evicted,
        },
    );
    // The user holds j-2 before it starts: j-1 must not wait for it forever.
    apply(&mut s, Command::HoldJob { job: 2, hold: true });
    assert_eq!(started(&plan_at(&s, &fcfs, 2)), vec![1]);
}
