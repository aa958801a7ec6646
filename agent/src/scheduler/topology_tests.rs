//! Gangs and the network topology the nodes declare (`nvlink-domain`, `rack`, `block` labels):
//! a gang goes inside the narrowest domain that can hold it now; one that requires a level
//! (`JobSpec::topology`) waits for one domain of it, reserves inside one, and preemption frees
//! nodes inside one.

use std::collections::{BTreeMap, BTreeSet};

use gpu_raft_store::scheduler::Preemption;
use gpu_raft_store::{ApplyResult, ClusterState, Command, JobSpec, SchedulerSettings};

use super::testkit::{apply, gpu, node, spec, submit};
use super::{PendingIndex, Plan, PlanEnv, Policy, plan, preemptions};

/// Four-GPU nodes, each with these labels.
fn cluster(labels: &[&[(&str, &str)]]) -> ClusterState {
    let mut s = ClusterState::new();
    for (i, l) in labels.iter().enumerate() {
        let id = i as u64 + 1;
        node(&mut s, id, (0..4).map(|g| gpu(g, "A100", 0)).collect());
        let set: BTreeMap<String, String> = l
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        apply(
            &mut s,
            Command::SetNodeLabels {
                node: id,
                set,
                remove: BTreeSet::new(),
            },
        );
    }
    s
}

fn gang(nodes: u32, gpus: u32, topology: Option<&str>) -> JobSpec {
    JobSpec {
        nodes,
        topology: topology.map(str::to_owned),
        runtime_estimate_s: Some(600),
        ..spec(gpus, 0)
    }
}

/// A 2-GPU job of 100 s on node `id` (placed with fcfs, which fills the tightest node first:
/// the caller makes that node the only one with room).
fn hold_two(s: &mut ClusterState, id: u64) {
    submit(
        s,
        JobSpec {
            runtime_estimate_s: Some(100),
            node_selector: BTreeMap::from([("host".to_owned(), format!("n{id}"))]),
            ..spec(2, 0)
        },
    );
    let p = pass(s, "fcfs");
    apply(s, Command::BindJobs { binds: p.binds });
}

fn pass(s: &ClusterState, policy: &str) -> Plan {
    let p: Policy = policy.parse().expect("policy");
    plan(s, &p, &PlanEnv::new(1, &p))
}

fn nodes_of(p: &Plan, job: u64) -> Vec<u64> {
    p.binds
        .iter()
        .filter(|b| b.job == job)
        .map(|b| b.node)
        .collect()
}

#[test]
fn a_gang_goes_inside_the_narrowest_domain_that_can_hold_it() {
    // n1, n2 in rack a; n3, n4 in rack b; n1 has only 2 GPUs free.
    let mut s = cluster(&[
        &[("rack", "a"), ("host", "n1")],
        &[("rack", "a"), ("host", "n2")],
        &[("rack", "b"), ("host", "n3")],
        &[("rack", "b"), ("host", "n4")],
    ]);
    hold_two(&mut s, 1);
    submit(&mut s, gang(2, 8, None)); // j-2
    // Without the labels the tightest fits would be n2 and n3, across racks.
    assert_eq!(nodes_of(&pass(&s, "fcfs"), 2), vec![3, 4]);

    // A narrower level wins over a wider one: n2 and n4 share an NVLink domain.
    let mut s = cluster(&[
        &[("rack", "a"), ("host", "n1")],
        &[("rack", "a"), ("host", "n2"), ("nvlink-domain", "x")],
        &[("rack", "a"), ("host", "n3")],
        &[("rack", "a"), ("host", "n4"), ("nvlink-domain", "x")],
    ]);
    submit(&mut s, gang(2, 8, None));
    assert_eq!(nodes_of(&pass(&s, "fcfs"), 1), vec![2, 4]);

    // No domain holds it: spread anyway, since it requires none.
    let mut s = cluster(&[
        &[("rack", "a"), ("host", "n1")],
        &[("rack", "b"), ("host", "n2")],
    ]);
    submit(&mut s, gang(2, 8, None));
    assert_eq!(nodes_of(&pass(&s, "fcfs"), 1), vec![1, 2]);
}

#[test]
fn a_gang_that_requires_a_rack_waits_for_one_and_reserves_inside_one() {
    // n1 alone in rack a; n2 and n3 in rack b, n3 half busy until 100 s.
    let mut s = cluster(&[
        &[("rack", "a"), ("host", "n1")],
        &[("rack", "b"), ("host", "n2")],
        &[("rack", "b"), ("host", "n3")],
    ]);
    hold_two(&mut s, 3);
    submit(&mut s, gang(2, 8, Some("rack"))); // j-2
    let p = pass(&s, "fcfs+easy");
    assert!(
        nodes_of(&p, 2).is_empty(),
        "n1 and n2 are in different racks"
    );
    let r = p.reservations.first().expect("a reservation inside rack b");
    assert_eq!(
        (r.job, r.start_ms, r.nodes.clone()),
        (2, 100_001, vec![2, 3])
    );
    assert!(
        p.unschedulable
            .iter()
            .any(|(j, why)| *j == 2 && why.contains("in one rack not yet satisfiable")),
        "{:?}",
        p.unschedulable
    );
    // The same gang asking for nothing starts now, across racks.
    submit(&mut s, gang(2, 8, None)); // j-3
    assert_eq!(nodes_of(&pass(&s, "fcfs+greedy"), 3), vec![1, 2]);
}

#[test]
fn a_rack_too_small_for_the_gang_is_named_and_bad_levels_are_refused() {
    let mut s = cluster(&[
        &[("rack", "a"), ("host", "n1")],
        &[("rack", "b"), ("host", "n2")],
    ]);
    submit(&mut s, gang(2, 8, Some("rack")));
    let p = pass(&s, "fcfs");
    assert_eq!(
        p.unschedulable,
        vec![(
            1,
            "gang of 2 nodes in one rack: at most 1 schedulable nodes of one rack have 4 GPUs each"
                .to_owned()
        )]
    );
    for (bad, why) in [
        (gang(2, 8, Some("row")), "unknown topology level"),
        (gang(1, 4, Some("rack")), "for gangs"),
    ] {
        let before = s.clone();
        let r = apply(&mut s, Command::submit(bad));
        assert!(
            matches!(&r, ApplyResult::Rejected { reason } if reason.to_string().contains(why)),
            "{r:?}"
        );
        assert_eq!(s, before);
    }
}

#[test]
fn preemption_for_a_gang_that_requires_a_rack_frees_nodes_of_one_rack() {
    // Priority preemption; n1 (rack a) is idle, n2, n3 (rack b) run priority-0 jobs.
    let mut s = cluster(&[
        &[("rack", "a"), ("host", "n1")],
        &[("rack", "b"), ("host", "n2")],
        &[("rack", "b"), ("host", "n3")],
    ]);
    apply(
        &mut s,
        Command::SetSchedulerPolicy {
            settings: SchedulerSettings {
                preemption: Preemption::Priority,
                ..SchedulerSettings::default()
            },
        },
    );
    for id in [2, 3] {
        submit(
            &mut s,
            JobSpec {
                node_selector: BTreeMap::from([("host".to_owned(), format!("n{id}"))]),
                ..spec(4, 0)
            },
        );
    }
    let p = pass(&s, "fcfs");
    apply(&mut s, Command::BindJobs { binds: p.binds });
    submit(
        &mut s,
        JobSpec {
            priority: 5,
            ..gang(2, 8, Some("rack"))
        },
    ); // j-3
    let policy = Policy::default().with_settings(&s.scheduler);
    let pending = PendingIndex::of(&s, policy.ordering);
    let mut stopped: Vec<u64> = preemptions(&s, &policy, &PlanEnv::new(1, &policy), &pending)
        .iter()
        .map(|p| p.job)
        .collect();
    stopped.sort_unstable();
    // Idle n1 and one stopped node would be cheaper, but not in one rack.
    assert_eq!(stopped, vec![1, 2]);
}
