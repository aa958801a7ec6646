//! What keeps a pending job from being placed whatever room there is: a hold, a dependency not
//! met, a live or just placed namesake of a singleton — under every policy, the reason noted,
//! and the expected start of a dependent job read from the timeline.

use gpu_raft_store::{ClusterState, Command, JobSpec, Outcome, parse_dependencies};

use super::env::PlanEnv;
use super::explain::explain;
use super::plan::plan;
use super::policy::Policy;
use super::testkit::{POLICIES, apply_at, gpu, node, spec, submit_at};

/// One node of four idle GPUs.
fn cluster() -> ClusterState {
    let mut s = ClusterState::new();
    node(&mut s, 1, (0..4).map(|i| gpu(i, "A100", 0)).collect());
    s
}

fn placed(s: &ClusterState, policy: &str) -> Vec<u64> {
    let policy: Policy = policy.parse().expect("a policy");
    let p = plan(s, &policy, &PlanEnv::new(10, &policy));
    p.binds.iter().map(|b| b.job).collect()
}

#[test]
fn held_dependent_and_singleton_jobs_wait_under_every_policy() {
    let mut s = cluster();
    submit_at(&mut s, 1, spec(1, 0)); // j-1: runs first
    let after = |deps: &str| JobSpec {
        after: parse_dependencies(deps).expect("parses"),
        ..spec(1, 0)
    };
    submit_at(&mut s, 1, after("ok:j-1")); // j-2
    submit_at(&mut s, 1, spec(1, 0)); // j-3: held
    apply_at(&mut s, 1, Command::HoldJob { job: 3, hold: true });
    let single = JobSpec {
        name: "nightly".into(),
        singleton: true,
        ..spec(1, 0)
    };
    submit_at(&mut s, 1, single.clone()); // j-4
    submit_at(&mut s, 1, single); // j-5: j-4's namesake
    for policy in POLICIES {
        assert_eq!(placed(&s, policy), [1, 4], "{policy}");
    }
}

#[test]
fn a_dependent_job_is_placed_once_its_dependency_is_met_and_noted_until_then() {
    let mut s = cluster();
    submit_at(&mut s, 1, spec(1, 0));
    let dependent = JobSpec {
        after: parse_dependencies("ok:j-1").expect("parses"),
        ..spec(1, 0)
    };
    submit_at(&mut s, 1, dependent);
    let policy = Policy {
        explain: true,
        ..Policy::default()
    };
    let p = plan(&s, &policy, &PlanEnv::new(10, &policy));
    assert_eq!(p.binds.len(), 1);
    assert_eq!(
        p.unschedulable,
        [(2, "dependency: waiting for j-1 to succeed".to_owned())]
    );
    apply_at(&mut s, 10, Command::BindJobs { binds: p.binds });
    let end = Command::JobFinished {
        job: 1,
        generation: 1,
        outcome: Outcome::Exited { code: 0 },
    };
    apply_at(&mut s, 20, end);
    assert_eq!(placed(&s, "fcfs"), [2]);
}

#[test]
fn a_dependent_jobs_expected_start_is_its_dependencys_expected_end() {
    let mut s = cluster();
    let estimated = JobSpec {
        runtime_estimate_s: Some(100),
        ..spec(1, 0)
    };
    submit_at(&mut s, 0, estimated);
    let dependent = JobSpec {
        after: parse_dependencies("any:j-1").expect("parses"),
        ..spec(1, 0)
    };
    submit_at(&mut s, 0, dependent);
    let policy = Policy::default();
    let binds = plan(&s, &policy, &PlanEnv::new(0, &policy)).binds;
    apply_at(&mut s, 0, Command::BindJobs { binds });
    let e = explain(&s, &policy, &PlanEnv::new(1_000, &policy), 2).expect("known");
    assert_eq!(e.start_ms, Some(100_000), "{e:?}");
    assert_eq!(
        e.reason.as_deref(),
        Some("dependency: waiting for j-1 to end")
    );
}
