//! Preemption in the pure core and in `apply`: only downward, quota reclaim from borrowers,
//! never for a borrower, one round at a time, the victim requeued without using an attempt and
//! held back until the job it made room for has started.

use gpu_raft_store::scheduler::Preemption;
use gpu_raft_store::tenant::{Quota, TenantRecord};
use gpu_raft_store::{
    ApplyResult, Bind, ClusterState, Command, JobId, JobSpec, JobState, Outcome, Preempt,
    SchedulerSettings,
};

use super::testkit::{apply, apply_at, gpu, node, spec, submit};
use super::{PendingIndex, PlanEnv, Policy, plan, preemptions};

fn cluster(mode: Preemption, gpus: u32) -> ClusterState {
    let mut s = ClusterState::new();
    node(&mut s, 1, (0..gpus).map(|i| gpu(i, "A100", 0)).collect());
    apply(
        &mut s,
        Command::SetSchedulerPolicy {
            settings: SchedulerSettings {
                preemption: mode,
                ..SchedulerSettings::default()
            },
        },
    );
    s
}

fn tenant(s: &mut ClusterState, name: &str, guaranteed: u32, borrow: u32) {
    let quotas = [("A100".to_owned(), Quota { guaranteed, borrow })].into();
    apply(
        s,
        Command::CreateTenant {
            tenant: TenantRecord {
                quotas,
                ..TenantRecord::named(name)
            },
        },
    );
}

fn job(tenant: &str, gpus: u32, priority: i32) -> JobSpec {
    JobSpec {
        tenant: tenant.into(),
        ..spec(gpus, priority)
    }
}

/// Plan one pass and apply its binds.
fn pass(s: &mut ClusterState) {
    let policy = Policy::default().with_settings(&s.scheduler);
    let binds = plan(s, &policy, &PlanEnv::new(1, &policy)).binds;
    apply(s, Command::BindJobs { binds });
}

fn victims(s: &ClusterState) -> Vec<Preempt> {
    let policy = Policy::default().with_settings(&s.scheduler);
    let pending = PendingIndex::of(s, policy.ordering);
    preemptions(s, &policy, &PlanEnv::new(1, &policy), &pending)
}

fn preempt(job: JobId, generation: u64, for_job: JobId) -> Preempt {
    Preempt {
        job,
        generation,
        for_job,
    }
}

#[test]
fn a_higher_priority_job_preempts_a_lower_one_and_never_upward() {
    let mut s = cluster(Preemption::Priority, 2);
    submit(&mut s, job("t", 2, 0));
    pass(&mut s);
    submit(&mut s, job("t", 2, 5));
    submit(&mut s, job("t", 2, 0));
    assert_eq!(
        victims(&s),
        vec![preempt(1, 1, 2)],
        "j-3 (priority 0) gets nothing"
    );

    // Equal priority is not enough; neither is reclaim mode without quotas.
    let mut same = cluster(Preemption::Priority, 2);
    submit(&mut same, job("t", 2, 5));
    pass(&mut same);
    submit(&mut same, job("t", 2, 5));
    assert_eq!(victims(&same), vec![]);
    let mut reclaim_only = cluster(Preemption::Reclaim, 2);
    submit(&mut reclaim_only, job("t", 2, 0));
    pass(&mut reclaim_only);
    submit(&mut reclaim_only, job("t", 2, 5));
    assert_eq!(victims(&reclaim_only), vec![]);
    // Off: nothing, and apply refuses a hand-made preemption.
    let mut off = cluster(Preemption::Off, 2);
    submit(&mut off, job("t", 2, 0));
    pass(&mut off);
    submit(&mut off, job("t", 2, 5));
    assert_eq!(victims(&off), vec![]);
    let before = off.clone();
    let r = apply(
        &mut off,
        Command::PreemptJobs {
            preemptions: vec![preempt(1, 1, 2)],
        },
    );
    assert!(
        matches!(&r, ApplyResult::Preempted { preempted, .. } if preempted.is_empty()),
        "{r:?}"
    );
    assert_eq!(off, before);
}

#[test]
fn apply_refuses_upward_and_stale_preemptions_with_nothing_changed() {
    let mut s = cluster(Preemption::Priority, 2);
    submit(&mut s, job("t", 2, 5));
    pass(&mut s);
    submit(&mut s, job("t", 2, 0));
    let before = s.clone();
    for bad in [
        preempt(1, 1, 2), // upward: 5 for 0
        preempt(1, 7, 2), // stale generation
        preempt(2, 0, 1), // the "victim" is pending, the "beneficiary" running
        preempt(9, 1, 2), // unknown
    ] {
        let r = apply(
            &mut s,
            Command::PreemptJobs {
                preemptions: vec![bad.clone()],
            },
        );
        let ApplyResult::Preempted {
            preempted,
            rejected,
        } = r
        else {
            panic!("{r:?}");
        };
        assert!(preempted.is_empty() && rejected.len() == 1, "{bad:?}");
        assert_eq!(s, before, "{bad:?} changed the state");
    }
}

#[test]
fn reclaim_takes_back_from_borrowers_and_never_serves_one() {
    // a is guaranteed 2 and borrows 2 more; c is guaranteed 2 and holds none.
    let mut s = cluster(Preemption::Reclaim, 4);
    tenant(&mut s, "a", 2, 2);
    tenant(&mut s, "c", 2, 0);
    for _ in 0..4 {
        submit(&mut s, job("a", 1, 9));
    }
    pass(&mut s);
    submit(&mut s, job("c", 2, 0)); // j-5: within c's guarantee
    let v = victims(&s);
    assert_eq!(v.len(), 2, "{v:?}");
    assert!(v.iter().all(|p| p.for_job == 5), "{v:?}");

    // A job that would make its tenant borrow never preempts, whatever its priority.
    let mut s = cluster(Preemption::Priority, 2);
    tenant(&mut s, "borrower", 0, 4);
    submit(&mut s, job("other", 2, 0));
    pass(&mut s);
    submit(&mut s, job("borrower", 2, 100));
    assert_eq!(victims(&s), vec![]);
    let r = apply(
        &mut s,
        Command::PreemptJobs {
            preemptions: vec![preempt(1, 1, 2)],
        },
    );
    let ApplyResult::Preempted { rejected, .. } = r else {
        panic!("{r:?}");
    };
    assert!(rejected[0].1.contains("borrow"), "{rejected:?}");
}

/// j-1 (priority 0) runs on both GPUs and is preempted for j-2 (priority 5).
fn preempted_for_a_higher_priority_job() -> ClusterState {
    let mut s = cluster(Preemption::Priority, 2);
    submit(&mut s, job("t", 2, 0));
    pass(&mut s);
    submit(&mut s, job("t", 2, 5));
    let v = victims(&s);
    apply(&mut s, Command::PreemptJobs { preemptions: v });
    s
}

/// The executor stopped `job`'s first run (SIGTERM, grace) and reports the eviction.
fn report_evicted(s: &mut ClusterState, job: JobId) {
    apply(
        s,
        Command::JobFinished {
            job,
            generation: 1,
            outcome: Outcome::Evicted,
        },
    );
}

#[test]
fn the_victim_is_requeued_without_using_an_attempt_and_waits_for_the_beneficiary() {
    let mut s = preempted_for_a_higher_priority_job();
    assert!(s.jobs[&1].evict_requested);
    assert_eq!(victims(&s), vec![], "one round at a time");
    report_evicted(&mut s, 1);
    let low = &s.jobs[&1];
    assert_eq!((low.state, low.attempts), (JobState::Pending, 0));
    assert_eq!(low.reason.as_deref(), Some("requeued: preempted for j-2"));
    // The next pass places j-2, not j-1 (which is older and would come first otherwise).
    let policy = Policy::default().with_settings(&s.scheduler);
    let fcfs = Policy {
        ordering: super::Ordering::Fcfs,
        ..policy
    };
    let p = plan(&s, &fcfs, &PlanEnv::new(1, &fcfs));
    assert_eq!(
        p.binds,
        vec![Bind {
            job: 2,
            node: 1,
            gpus: vec![0, 1]
        }]
    );
    assert!(
        p.unschedulable
            .iter()
            .any(|(j, r)| *j == 1 && r.starts_with("preempted for j-2")),
        "{:?}",
        p.unschedulable
    );
    apply(&mut s, Command::BindJobs { binds: p.binds });
    // Once j-2 has started, j-1 may run again when GPUs free up; it has its attempt.
    apply(
        &mut s,
        Command::JobFinished {
            job: 2,
            generation: 1,
            outcome: Outcome::Exited { code: 0 },
        },
    );
    pass(&mut s);
    let low = &s.jobs[&1];
    assert_eq!(
        (low.state, low.attempts, low.generation),
        (JobState::Bound, 1, 2)
    );
}

#[test]
fn a_job_never_preempts_the_run_it_was_preempted_for() {
    // j-1 is preempted for j-2, which starts; then j-1 outranks j-2 (its priority raised).
    let mut s = preempted_for_a_higher_priority_job();
    report_evicted(&mut s, 1);
    pass(&mut s);
    assert_eq!(s.jobs[&2].state, JobState::Bound);
    s.jobs.get_mut(&1).expect("j-1").spec.priority = 9;
    // Stopping j-2 for j-1 would leave each waiting for the other to start, forever.
    assert_eq!(victims(&s), vec![]);
}

/// A run placed less than the exempt time ago is never a victim, in the plan or in `apply`
/// (which judges by the entry's own time); after it, it is.
#[test]
fn a_run_is_exempt_from_preemption_for_its_first_minutes() {
    let mut s = cluster(Preemption::Priority, 2);
    let settings = SchedulerSettings {
        preempt_exempt_s: 600,
        ..s.scheduler.clone()
    };
    apply(&mut s, Command::SetSchedulerPolicy { settings });
    submit(&mut s, job("t", 2, 0));
    pass(&mut s); // j-1 placed at 1 ms
    submit(&mut s, job("t", 2, 5));
    let victims_at = |now_ms: u64| {
        let policy = Policy::default().with_settings(&s.scheduler);
        let pending = PendingIndex::of(&s, policy.ordering);
        preemptions(&s, &policy, &PlanEnv::new(now_ms, &policy), &pending)
    };
    assert_eq!(victims_at(600_000), vec![], "placed 599.999 s ago");
    assert_eq!(victims_at(600_001), vec![preempt(1, 1, 2)]);

    let before = s.clone();
    let early = Command::PreemptJobs {
        preemptions: vec![preempt(1, 1, 2)],
    };
    let ApplyResult::Preempted { rejected, .. } = apply_at(&mut s, 300_000, early.clone()) else {
        panic!("a preemption result");
    };
    assert!(rejected[0].1.contains("exempt"), "{rejected:?}");
    assert_eq!(s, before, "a refused preemption changes nothing");
    let ApplyResult::Preempted { preempted, .. } = apply_at(&mut s, 600_001, early) else {
        panic!("a preemption result");
    };
    assert_eq!(preempted.len(), 1);
}
