//! Gangs the user asks for (`nodes` > 1) in the planner and in `apply`: an even split over
//! distinct nodes, bound all or nothing, one unit for success (every member exits 0), failure
//! and node loss, and a reason when no such set of nodes exists.

use std::collections::BTreeMap;

use gpu_raft_store::{
    ApplyResult, Bind, ClusterState, Command, JobSpec, JobState, NodeStatus, Outcome,
};

use super::plan::plan_default;
use super::testkit::{apply, gpu, node, spec, submit};

fn gang(nodes: u32, gpus: u32) -> JobSpec {
    JobSpec {
        nodes,
        max_attempts: 2,
        ..spec(gpus, 0)
    }
}

fn cluster() -> ClusterState {
    let mut s = ClusterState::new();
    node(&mut s, 1, (0..4).map(|i| gpu(i, "A100", 0)).collect());
    node(&mut s, 2, (0..2).map(|i| gpu(i, "A100", 0)).collect());
    node(&mut s, 3, (0..4).map(|i| gpu(i, "A100", 0)).collect());
    s
}

fn held(s: &ClusterState) -> BTreeMap<u64, usize> {
    s.nodes
        .values()
        .map(|n| (n.id, n.allocations.len()))
        .collect()
}

#[test]
fn a_gang_is_split_evenly_over_distinct_nodes_and_bound_as_one() {
    let mut s = cluster();
    submit(&mut s, gang(2, 4));
    let p = plan_default(&s);
    // Tightest fits first: n2 (exactly 2 free) is rank 0, then n1.
    assert_eq!(
        p.binds,
        vec![
            Bind {
                job: 1,
                node: 2,
                gpus: vec![0, 1]
            },
            Bind {
                job: 1,
                node: 1,
                gpus: vec![0, 1]
            }
        ]
    );
    let r = apply(&mut s, Command::BindJobs { binds: p.binds });
    assert_eq!(
        r,
        ApplyResult::Bound {
            bound: vec![1],
            rejected: vec![]
        }
    );
    let j = &s.jobs[&1];
    assert_eq!(
        j.gang.iter().map(|b| b.node).collect::<Vec<_>>(),
        vec![2, 1]
    );
    assert_eq!(j.binding.as_ref().map(|b| b.node), Some(2));
    assert_eq!(held(&s), BTreeMap::from([(1, 2), (2, 2), (3, 0)]));
    // GPU time and quotas see both members.
    assert_eq!(gpu_raft_store::tenant::bound_types(j, &s.nodes).count(), 4);

    // One member exiting 0 is not the end; the last one is.
    let member = |node| Command::GangMemberFinished {
        job: 1,
        generation: 1,
        node,
    };
    apply(
        &mut s,
        Command::JobStarted {
            job: 1,
            generation: 1,
        },
    );
    assert_eq!(apply(&mut s, member(2)), ApplyResult::Ok);
    assert_eq!(s.jobs[&1].state, JobState::Running);
    assert!(
        matches!(apply(&mut s, member(3)), ApplyResult::Rejected { .. }),
        "n3 is not a member"
    );
    apply(&mut s, member(1));
    assert_eq!(s.jobs[&1].state, JobState::Succeeded);
    assert_eq!(held(&s), BTreeMap::from([(1, 0), (2, 0), (3, 0)]));
}

#[test]
fn apply_binds_a_gang_all_or_nothing() {
    let mut s = cluster();
    submit(&mut s, gang(2, 4));
    let before = s.clone();
    for binds in [
        // One member only.
        vec![Bind {
            job: 1,
            node: 1,
            gpus: vec![0, 1],
        }],
        // The same node twice.
        vec![
            Bind {
                job: 1,
                node: 1,
                gpus: vec![0, 1],
            },
            Bind {
                job: 1,
                node: 1,
                gpus: vec![2, 3],
            },
        ],
        // An uneven split.
        vec![
            Bind {
                job: 1,
                node: 1,
                gpus: vec![0, 1, 2],
            },
            Bind {
                job: 1,
                node: 3,
                gpus: vec![0],
            },
        ],
        // A member GPU that does not exist.
        vec![
            Bind {
                job: 1,
                node: 1,
                gpus: vec![0, 1],
            },
            Bind {
                job: 1,
                node: 2,
                gpus: vec![1, 7],
            },
        ],
    ] {
        let r = apply(
            &mut s,
            Command::BindJobs {
                binds: binds.clone(),
            },
        );
        let ApplyResult::Bound { bound, rejected } = r else {
            panic!("{r:?}");
        };
        assert!(bound.is_empty() && rejected.len() == 1, "{binds:?}");
        assert_eq!(s, before, "{binds:?} changed the state");
    }
}

#[test]
fn a_member_failing_or_its_node_going_down_ends_the_whole_gang() {
    let mut s = cluster();
    submit(&mut s, gang(2, 4));
    let binds = plan_default(&s).binds;
    apply(&mut s, Command::BindJobs { binds });
    // n1 (rank 1) goes down: the whole gang is lost and requeued (an attempt remains).
    apply(
        &mut s,
        Command::SetNodeStatus {
            node: 1,
            status: NodeStatus::Down,
            requeue_evicting: false,
        },
    );
    let j = &s.jobs[&1];
    assert_eq!((j.state, j.attempts), (JobState::Pending, 1));
    assert_eq!(held(&s), BTreeMap::from([(1, 0), (2, 0), (3, 0)]));
    // Placed again (on n2 and n3 now); a member exiting 1 fails it for good.
    let binds = plan_default(&s).binds;
    apply(&mut s, Command::BindJobs { binds });
    assert_eq!(s.jobs[&1].generation, 2);
    apply(
        &mut s,
        Command::JobFinished {
            job: 1,
            generation: 2,
            outcome: Outcome::Exited { code: 1 },
        },
    );
    assert_eq!(s.jobs[&1].state, JobState::Failed);
    assert!(held(&s).values().all(|n| *n == 0));
}

#[test]
fn an_unsatisfiable_gang_says_why_and_does_not_hold_the_queue() {
    let mut s = cluster();
    submit(&mut s, gang(3, 9)); // 3 GPUs on each of 3 nodes: only n1 and n3 have 3
    submit(&mut s, spec(1, 0));
    let p = plan_default(&s);
    assert_eq!(p.binds.len(), 1);
    assert_eq!(p.binds[0].job, 2);
    assert_eq!(
        p.unschedulable,
        vec![(
            1,
            "gang of 3 nodes: only 2 schedulable nodes have 3 GPUs each".to_owned()
        )]
    );
    // Validation: an uneven split is refused at submission.
    let r = apply(&mut s, Command::submit(gang(2, 3)));
    assert!(matches!(r, ApplyResult::Rejected { .. }), "{r:?}");
}
