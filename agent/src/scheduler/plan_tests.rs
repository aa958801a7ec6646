//! The planner's own cases: whole-GPU placement, ordering, backfill and its properties.

use std::collections::{BTreeMap, BTreeSet};

use gpu_raft_store::{ApplyResult, Bind, ClusterState, Command, JobId, JobSpec, gpu_fits};
use proptest::prelude::*;

use super::plan::plan_default;
use super::testkit::{apply, apply_at, gpu, node, spec, submit};

#[test]
fn best_fit_leaves_the_big_node_for_the_big_job() {
    let mut s = ClusterState::new();
    node(&mut s, 1, (0..8).map(|i| gpu(i, "A100", i / 4)).collect());
    node(&mut s, 2, (0..2).map(|i| gpu(i, "A100", 0)).collect());
    submit(&mut s, spec(1, 0));
    submit(&mut s, spec(8, 0));
    let p = plan_default(&s);
    assert_eq!(
        p.binds,
        vec![
            Bind {
                job: 1,
                node: 2,
                gpus: vec![0]
            },
            Bind {
                job: 2,
                node: 1,
                gpus: (0..8).collect()
            }
        ]
    );
}

#[test]
fn priority_then_submission_order() {
    let mut s = ClusterState::new();
    node(&mut s, 1, vec![gpu(0, "A100", 0)]);
    submit(&mut s, spec(1, 0));
    submit(&mut s, spec(1, 5));
    let p = plan_default(&s);
    assert_eq!(
        p.binds,
        vec![Bind {
            job: 2,
            node: 1,
            gpus: vec![0]
        }]
    );
    assert_eq!(
        p.unschedulable,
        vec![(1, "waiting for 1 GPU to be free".to_owned())]
    );
}

#[test]
fn gpus_come_from_one_numa_node_when_possible() {
    let mut s = ClusterState::new();
    node(
        &mut s,
        1,
        vec![
            gpu(0, "A100", 0),
            gpu(1, "A100", 1),
            gpu(2, "A100", 1),
            gpu(3, "A100", 0),
        ],
    );
    submit(&mut s, spec(2, 0));
    assert_eq!(plan_default(&s).binds[0].gpus, vec![0, 3]);
}

#[test]
fn a_job_takes_its_preferred_gpu_type_when_it_has_room_and_another_when_not() {
    let mut s = ClusterState::new();
    // The V100 node is the tighter fit: without a preference best fit would take it.
    node(&mut s, 1, (0..4).map(|i| gpu(i, "A100", 0)).collect());
    node(&mut s, 2, vec![gpu(0, "V100", 0)]);
    let prefer_a100 = JobSpec {
        gpu_types: vec!["A100".into(), "V100".into()],
        ..spec(1, 0)
    };
    submit(&mut s, prefer_a100.clone());
    let p = plan_default(&s);
    assert_eq!((p.binds[0].node, p.binds[0].gpus.len()), (1, 1));
    // Listed the other way round, the same job goes to the V100.
    let prefer_v100 = JobSpec {
        gpu_types: vec!["V100".into(), "A100".into()],
        ..spec(1, 0)
    };
    let mut t = ClusterState::new();
    node(&mut t, 1, (0..4).map(|i| gpu(i, "A100", 0)).collect());
    node(&mut t, 2, vec![gpu(0, "V100", 0)]);
    submit(&mut t, prefer_v100);
    assert_eq!(plan_default(&t).binds[0].node, 2);
    // With every A100 busy it accepts the V100.
    apply(&mut s, Command::BindJobs { binds: p.binds });
    for _ in 0..3 {
        submit(
            &mut s,
            JobSpec {
                gpu_types: vec!["A100".into()],
                ..spec(1, 0)
            },
        );
    }
    let p = plan_default(&s);
    apply(&mut s, Command::BindJobs { binds: p.binds });
    submit(&mut s, prefer_a100);
    let p = plan_default(&s);
    assert_eq!(p.binds.len(), 1);
    assert_eq!(p.binds[0].node, 2, "{p:?}");
}

#[test]
fn impossible_jobs_say_why_and_stay_pending() {
    let mut s = ClusterState::new();
    node(&mut s, 1, vec![gpu(0, "T4", 0), gpu(1, "T4", 0)]);
    submit(&mut s, spec(4, 0));
    submit(
        &mut s,
        JobSpec {
            gpu_types: vec!["H100".into()],
            ..spec(1, 0)
        },
    );
    submit(
        &mut s,
        JobSpec {
            node_selector: BTreeMap::from([("site".into(), "edge".into())]),
            ..spec(0, 0)
        },
    );
    let p = plan_default(&s);
    assert!(p.binds.is_empty());
    let reasons: BTreeMap<JobId, String> = p.unschedulable.iter().cloned().collect();
    assert_eq!(
        reasons[&1],
        "no schedulable node has 4 GPUs (the most any has is 2)"
    );
    assert_eq!(
        reasons[&2],
        "no schedulable node has 1 GPU of type H100 (the most any has is 0)"
    );
    assert_eq!(reasons[&3], "no schedulable node matches the node selector");
    // Reasons already recorded are not proposed again.
    apply(
        &mut s,
        Command::NoteUnschedulable {
            reasons: p.unschedulable,
        },
    );
    assert!(plan_default(&s).unschedulable.is_empty());
}

#[test]
fn container_jobs_go_only_to_nodes_with_a_container_runtime() {
    let mut s = ClusterState::new();
    // Best fit alone would take the one-GPU node, which runs no container runtime.
    node(&mut s, 1, vec![gpu(0, "A100", 0)]);
    node(&mut s, 2, (0..4).map(|i| gpu(i, "A100", 0)).collect());
    let container = JobSpec {
        container: Some(Box::new(gpu_raft_store::container::ContainerSpec {
            image: "busybox".into(),
            mounts: vec![],
        })),
        ..spec(1, 0)
    };
    submit(&mut s, container.clone());
    let p = plan_default(&s);
    assert!(p.binds.is_empty());
    assert_eq!(
        p.unschedulable,
        vec![(1, "no schedulable node has a container runtime".to_owned())]
    );
    apply(
        &mut s,
        Command::SetNodeLabels {
            node: 2,
            set: BTreeMap::from([(
                gpu_raft_store::CONTAINER_RUNTIME_LABEL.to_owned(),
                "podman".to_owned(),
            )]),
            remove: BTreeSet::new(),
        },
    );
    submit(&mut s, spec(1, 0));
    let p = plan_default(&s);
    let placed: BTreeMap<JobId, u64> = p.binds.iter().map(|b| (b.job, b.node)).collect();
    assert_eq!(placed, BTreeMap::from([(1, 2), (2, 1)]), "{:?}", p.binds);
}

#[test]
fn fragmentation_is_named() {
    let mut s = ClusterState::new();
    node(&mut s, 1, (0..2).map(|i| gpu(i, "A100", 0)).collect());
    node(&mut s, 2, (0..2).map(|i| gpu(i, "A100", 0)).collect());
    submit(&mut s, spec(1, 0));
    submit(&mut s, spec(1, 0));
    let binds = (1..=2)
        .map(|n| Bind {
            job: n,
            node: n,
            gpus: vec![0],
        })
        .collect();
    apply(&mut s, Command::BindJobs { binds });
    submit(&mut s, spec(2, 0));
    assert_eq!(
        plan_default(&s).unschedulable,
        vec![(
            3,
            "waiting for 2 GPUs on one node: 2 matching GPUs are free, but spread over several nodes (fragmentation)".to_owned()
        )]
    );
}

#[test]
fn cpu_only_jobs_are_placed_without_gpus() {
    let mut s = ClusterState::new();
    node(&mut s, 1, vec![]);
    submit(&mut s, spec(0, 0));
    assert_eq!(
        plan_default(&s).binds,
        vec![Bind {
            job: 1,
            node: 1,
            gpus: vec![]
        }]
    );
}

fn arb_gpu_type() -> impl Strategy<Value = &'static str> {
    prop_oneof![Just("A100"), Just("T4"), Just("H100")]
}

proptest! {
    /// For random clusters and job mixes, plan + apply never binds a GPU twice and never
    /// binds a GPU that fails the job's selector; every planned bind applies.
    #[test]
    fn plan_then_apply_is_always_valid(
        nodes in proptest::collection::vec(proptest::collection::vec((arb_gpu_type(), 0u32..2), 0..6), 1..5),
        jobs in proptest::collection::vec((0u32..5, proptest::option::of(arb_gpu_type()), -2i32..3), 1..30),
        rounds in 1usize..4,
    ) {
        let mut s = ClusterState::new();
        for (i, gpus) in nodes.iter().enumerate() {
            let gpus = gpus.iter().enumerate().map(|(g, (t, numa))| gpu(g as u32, t, *numa)).collect();
            node(&mut s, i as u64 + 1, gpus);
        }
        for (gpus, ty, prio) in &jobs {
            let gpu_types = ty.map(|t| vec![t.to_owned()]).unwrap_or_default();
            submit(&mut s, JobSpec { gpu_types, ..spec(*gpus, *prio) });
        }
        for _ in 0..rounds {
            let p = plan_default(&s);
            let n = p.binds.len();
            let ApplyResult::Bound { bound, rejected } = apply(&mut s, Command::BindJobs { binds: p.binds.clone() }) else {
                panic!("bind result");
            };
            prop_assert!(rejected.is_empty(), "a fresh plan must apply cleanly: {:?}", rejected);
            prop_assert_eq!(bound.len(), n);
            for b in &p.binds {
                let job = &s.jobs[&b.job];
                for g in &b.gpus {
                    prop_assert!(gpu_fits(s.nodes[&b.node].gpu(*g).expect("gpu"), &job.spec));
                }
            }
            let mut seen = BTreeSet::new();
            for j in s.jobs.values().filter(|j| j.state.is_live()) {
                let b = j.binding.as_ref().expect("binding");
                for g in &b.gpus {
                    prop_assert!(seen.insert((b.node, *g)), "GPU n{}/{} bound twice", b.node, g);
                }
            }
            // A stale replay of the same plan must be refused entirely.
            let ApplyResult::Bound { bound, .. } = apply(&mut s, Command::BindJobs { binds: p.binds }) else {
                panic!("bind result");
            };
            prop_assert!(bound.is_empty(), "a replayed plan must not bind again");
        }
    }
}

/// Job 1 (retried after 10 s) failed at 1 s; job 2 of the same spec waits behind it.
fn failed_once() -> ClusterState {
    let mut s = ClusterState::new();
    node(&mut s, 1, vec![gpu(0, "A100", 0)]);
    let retried = JobSpec {
        max_attempts: 3,
        retry_backoff_s: Some(10),
        ..spec(1, 0)
    };
    submit(&mut s, retried.clone());
    let binds = vec![Bind {
        job: 1,
        node: 1,
        gpus: vec![0],
    }];
    apply_at(&mut s, 500, Command::BindJobs { binds });
    let end = Command::JobFinished {
        job: 1,
        generation: 1,
        outcome: gpu_raft_store::Outcome::Exited { code: 1 },
    };
    apply_at(&mut s, 1_000, end);
    submit(&mut s, retried);
    s
}

#[test]
fn a_job_is_not_placed_before_its_retry_time_and_says_until_when() {
    let s = failed_once();
    for name in super::testkit::POLICIES {
        let policy: super::Policy = name.parse().expect("policy");
        // Before its time the job behind it (same class) gets the GPU.
        let early = super::plan(&s, &policy, &super::PlanEnv::new(10_999, &policy));
        assert_eq!(
            early.binds.iter().map(|b| b.job).collect::<Vec<_>>(),
            [2],
            "{name}"
        );
        assert_eq!(
            early.unschedulable,
            [(
                1,
                "requeued: exited with code 1; attempt 2/3 after 10 s; waiting until 1970-01-01T00:00:11Z"
                    .to_owned()
            )],
            "{name}"
        );
        // From its time on, it is first again.
        let due = super::plan(&s, &policy, &super::PlanEnv::new(11_000, &policy));
        assert_eq!(due.binds.first().map(|b| b.job), Some(1), "{name}");
    }
}
