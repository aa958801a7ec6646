//! Behaviour of each policy through the one entry point, `plan`: examples first, then
//! randomized properties (no double booking, gangs all-or-nothing, backfill never delays the
//! reserved job).

use std::collections::{BTreeMap, BTreeSet};

use gpu_raft_store::{ApplyResult, Bind, ClusterState, Command, JobSpec, gpu_fits};
use proptest::prelude::*;

use super::testkit::{POLICIES, apply_at, gpu, node, spec, submit_at};
use super::{Backfill, Ordering, Plan, PlanEnv, Policy, Reservation, plan};

fn policy(s: &str) -> Policy {
    s.parse().expect("policy")
}

fn with_estimate(gpus: u32, estimate_s: u64) -> JobSpec {
    JobSpec {
        runtime_estimate_s: Some(estimate_s),
        ..spec(gpus, 0)
    }
}

fn tenant(t: &str, gpus: u32) -> JobSpec {
    JobSpec {
        tenant: t.into(),
        ..spec(gpus, 0)
    }
}

fn plan_at(s: &ClusterState, p: &Policy, now_ms: u64) -> Plan {
    plan(s, p, &PlanEnv::new(now_ms, p))
}

/// Plan and apply until nothing more binds, at `now_ms`.
fn bind_all(s: &mut ClusterState, p: &Policy, now_ms: u64) -> Vec<Bind> {
    let pass = plan_at(s, p, now_ms);
    let binds = pass.binds.clone();
    let ApplyResult::Bound { rejected, .. } =
        apply_at(s, now_ms, Command::BindJobs { binds: pass.binds })
    else {
        panic!("bind result")
    };
    assert!(rejected.is_empty(), "{rejected:?}");
    binds
}

fn four_gpu_node(s: &mut ClusterState, id: u64) {
    node(s, id, (0..4).map(|i| gpu(i, "A100", 0)).collect());
}

#[test]
fn strict_fcfs_blocks_behind_the_head_and_greedy_does_not() {
    let mut s = ClusterState::new();
    four_gpu_node(&mut s, 1);
    submit_at(&mut s, 0, spec(2, 0));
    bind_all(&mut s, &policy("fcfs"), 0);
    submit_at(&mut s, 1, spec(4, 0)); // j-2 waits for the whole node
    submit_at(&mut s, 2, spec(1, 0)); // j-3 would fit now
    let strict = plan_at(&s, &policy("fcfs"), 10);
    assert!(strict.binds.is_empty());
    assert_eq!(
        strict.unschedulable,
        vec![
            (2, "waiting for 4 GPUs to be free".to_owned()),
            (3, "queued behind j-2 (fcfs+strict queue)".to_owned())
        ]
    );
    let greedy = plan_at(&s, &policy("fcfs+greedy"), 10);
    assert_eq!(
        greedy.binds.iter().map(|b| b.job).collect::<Vec<_>>(),
        vec![3]
    );
}

#[test]
fn impossible_jobs_never_block_a_strict_queue() {
    let mut s = ClusterState::new();
    four_gpu_node(&mut s, 1);
    submit_at(&mut s, 0, spec(8, 0));
    submit_at(&mut s, 1, spec(1, 0));
    let p = plan_at(&s, &policy("fcfs"), 5);
    assert_eq!(p.binds.iter().map(|b| b.job).collect::<Vec<_>>(), vec![2]);
}

#[test]
fn sjf_starts_the_shortest_estimate_first() {
    let mut s = ClusterState::new();
    node(&mut s, 1, vec![gpu(0, "A100", 0)]);
    submit_at(&mut s, 0, with_estimate(1, 3600));
    submit_at(&mut s, 1, spec(1, 0)); // no estimate: last
    submit_at(&mut s, 2, with_estimate(1, 60));
    let p = plan_at(&s, &policy("sjf"), 10);
    assert_eq!(p.binds.iter().map(|b| b.job).collect::<Vec<_>>(), vec![3]);
    // FCFS takes the oldest instead.
    let p = plan_at(&s, &policy("fcfs"), 10);
    assert_eq!(p.binds.iter().map(|b| b.job).collect::<Vec<_>>(), vec![1]);
}

#[test]
fn sjf_uses_predictions_from_history() {
    let mut s = ClusterState::new();
    node(&mut s, 1, vec![gpu(0, "A100", 0)]);
    let named = |name: &str| JobSpec {
        name: name.into(),
        ..spec(1, 0)
    };
    submit_at(&mut s, 0, named("long"));
    submit_at(&mut s, 1, named("short"));
    let p = policy("sjf");
    let mut env = PlanEnv::new(10, &p);
    env.history.record(&named("long"), 3_600_000);
    env.history.record(&named("short"), 60_000);
    let pass = plan(&s, &p, &env);
    assert_eq!(
        pass.binds.iter().map(|b| b.job).collect::<Vec<_>>(),
        vec![2]
    );
    let no_prediction = Policy {
        predict: false,
        ..p.clone()
    };
    let pass = plan(&s, &no_prediction, &env);
    assert_eq!(
        pass.binds.iter().map(|b| b.job).collect::<Vec<_>>(),
        vec![1]
    );
}

#[test]
fn easy_backfill_admits_only_what_cannot_delay_the_head() {
    let mut s = ClusterState::new();
    four_gpu_node(&mut s, 1);
    submit_at(&mut s, 0, with_estimate(2, 100)); // runs 0..100 s
    bind_all(&mut s, &policy("fcfs"), 0);
    submit_at(&mut s, 1, with_estimate(4, 100)); // j-2: head, reserved at 100 s
    submit_at(&mut s, 2, with_estimate(1, 500)); // j-3: would still run at 100 s
    submit_at(&mut s, 3, with_estimate(1, 50)); // j-4: ends at 60 s, fine
    let p = plan_at(&s, &policy("fcfs+easy"), 10_000);
    assert_eq!(p.binds.iter().map(|b| b.job).collect::<Vec<_>>(), vec![4]);
    let r = p.reservations.first().expect("reservation");
    assert_eq!((r.job, r.start_ms, r.spare), (2, 100_000, 0));
    assert!(
        p.unschedulable
            .iter()
            .any(|(j, why)| *j == 3 && why.contains("delay j-2")),
        "{:?}",
        p.unschedulable
    );
}

/// EASY protects only the first job that cannot start; conservative backfill reserves for
/// each one, each after the GPUs those before it booked, and holds back what would delay any.
#[test]
fn conservative_backfill_protects_every_reservation() {
    let mut s = ClusterState::new();
    four_gpu_node(&mut s, 1);
    four_gpu_node(&mut s, 2);
    submit_at(&mut s, 0, with_estimate(4, 100)); // j-1 on n1 until 100 s
    submit_at(&mut s, 0, with_estimate(3, 200)); // j-2 on n2 until 200 s
    bind_all(&mut s, &policy("fcfs"), 0);
    submit_at(&mut s, 1, with_estimate(4, 1000)); // j-3: n1 from 100 s
    submit_at(&mut s, 2, with_estimate(4, 100)); // j-4: n1 is booked, so n2 from 200 s
    submit_at(&mut s, 3, with_estimate(1, 1000)); // j-5: would run on n2 past 200 s
    submit_at(&mut s, 4, with_estimate(1, 100)); // j-6: done on n2 by 110 s
    let started = |p: &Plan| p.binds.iter().map(|b| b.job).collect::<Vec<_>>();
    let reserved = |p: &Plan| {
        p.reservations
            .iter()
            .map(|r| (r.job, r.start_ms, r.nodes.clone()))
            .collect::<Vec<_>>()
    };

    let easy = plan_at(&s, &policy("fcfs+easy"), 10_000);
    assert_eq!(started(&easy), vec![5], "EASY lets j-5 take n2 from j-4");
    assert_eq!(reserved(&easy), vec![(3, 100_000, vec![1])]);

    let conservative = Policy {
        explain: true,
        ..policy("fcfs+conservative")
    };
    let p = plan_at(&s, &conservative, 10_000);
    assert_eq!(
        started(&p),
        vec![6],
        "only what delays no reservation starts"
    );
    assert_eq!(
        reserved(&p),
        vec![
            (3, 100_000, vec![1]),
            (4, 200_000, vec![2]),
            // Held back, it gets its own: on n2 once j-4 is done.
            (5, 300_000, vec![2]),
        ]
    );
    assert!(
        p.unschedulable.iter().any(|(j, why)| *j == 5
            && why.contains("would delay j-4")
            && why.contains("conservative backfill")),
        "{:?}",
        p.unschedulable
    );
}

#[test]
fn easy_backfill_uses_other_nodes_freely() {
    let mut s = ClusterState::new();
    four_gpu_node(&mut s, 1);
    node(&mut s, 2, vec![gpu(0, "T4", 0)]);
    submit_at(&mut s, 0, with_estimate(2, 100));
    bind_all(&mut s, &policy("fcfs"), 0);
    submit_at(&mut s, 1, with_estimate(4, 100));
    submit_at(&mut s, 2, with_estimate(1, 5000)); // long, but fits on the T4 node
    let p = plan_at(&s, &policy("fcfs+easy"), 10_000);
    assert_eq!(
        p.binds,
        vec![Bind {
            job: 3,
            node: 2,
            gpus: vec![0]
        }]
    );
}

#[test]
fn fair_share_interleaves_tenants() {
    let mut s = ClusterState::new();
    node(&mut s, 1, (0..2).map(|i| gpu(i, "A100", 0)).collect());
    for t in 0..3 {
        submit_at(&mut s, t, tenant("a", 1));
    }
    submit_at(&mut s, 10, tenant("b", 1));
    let p = plan_at(&s, &policy("fairshare"), 20);
    let tenants: BTreeSet<String> = p
        .binds
        .iter()
        .map(|b| s.jobs[&b.job].spec.tenant.clone())
        .collect();
    assert_eq!(tenants, BTreeSet::from(["a".to_owned(), "b".to_owned()]));
    // FCFS gives both GPUs to a.
    let p = plan_at(&s, &policy("fcfs"), 20);
    assert!(p.binds.iter().all(|b| s.jobs[&b.job].spec.tenant == "a"));
}

#[test]
fn fair_share_favours_the_tenant_with_less_past_usage() {
    let mut s = ClusterState::new();
    node(&mut s, 1, vec![gpu(0, "A100", 0)]);
    submit_at(&mut s, 0, tenant("heavy", 1));
    submit_at(&mut s, 1, tenant("light", 1));
    let p = policy("fairshare");
    let mut env = PlanEnv::new(7_200_000, &p);
    env.usage.record("heavy", 8, 0, 3_600_000);
    let pass = plan(&s, &p, &env);
    assert_eq!(s.jobs[&pass.binds[0].job].spec.tenant, "light");
}

#[test]
fn priority_ages_waiting_jobs() {
    let mut s = ClusterState::new();
    node(&mut s, 1, vec![gpu(0, "A100", 0)]);
    submit_at(&mut s, 0, spec(1, 0));
    submit_at(&mut s, 9 * 3_600_000, spec(1, 5));
    let p = policy("priority");
    assert_eq!(p.aging_per_hour, 1.0);
    // After 10 hours the old job has 10 points against 5 + 1.
    let pass = plan_at(&s, &p, 10 * 3_600_000);
    assert_eq!(pass.binds[0].job, 1);
    // Without aging (v1), priority wins.
    let pass = plan_at(&s, &Policy::default(), 10 * 3_600_000);
    assert_eq!(pass.binds[0].job, 2);
}

#[test]
fn gangs_span_nodes_all_or_nothing() {
    let gangs = Policy {
        multi_node_gangs: true,
        ..Policy::new(Ordering::Fcfs, Backfill::Greedy)
    };
    let mut s = ClusterState::new();
    four_gpu_node(&mut s, 1);
    four_gpu_node(&mut s, 2);
    submit_at(&mut s, 0, spec(8, 0));
    let p = plan_at(&s, &gangs, 1);
    assert_eq!(p.binds.len(), 2);
    assert_eq!(p.binds.iter().map(|b| b.gpus.len()).sum::<usize>(), 8);
    // Without gangs, an 8-GPU job cannot go on 4-GPU nodes.
    assert!(plan_at(&s, &policy("fcfs+greedy"), 1).binds.is_empty());
    // One GPU busy: nothing at all is bound for the gang.
    let mut s = ClusterState::new();
    four_gpu_node(&mut s, 1);
    four_gpu_node(&mut s, 2);
    submit_at(&mut s, 0, spec(1, 0));
    bind_all(&mut s, &policy("fcfs"), 0);
    submit_at(&mut s, 1, spec(8, 0));
    assert!(plan_at(&s, &gangs, 1).binds.is_empty());
}

/// Matching GPUs for `head` on the nodes of the reservation that are free at `at_ms`: not held
/// by any run (before or after this pass) that is expected to end later.
fn free_for_head_at(
    s: &ClusterState,
    head: &JobSpec,
    slot_node: Option<u64>,
    at_ms: u64,
    ends: &BTreeMap<u64, Option<u64>>,
) -> usize {
    s.nodes
        .values()
        .filter(|n| n.accepts_work() && slot_node.is_none_or(|id| id == n.id))
        .filter(|n| {
            head.node_selector
                .iter()
                .all(|(k, v)| n.effective_labels().get(k) == Some(v))
        })
        .map(|n| {
            n.inventory
                .gpus
                .iter()
                .filter(|g| g.healthy && gpu_fits(g, head))
                .filter(|g| match n.allocations.get(&g.index) {
                    None => true,
                    Some(job) => ends[job].is_some_and(|end| end <= at_ms),
                })
                .count()
        })
        .sum()
}

proptest! {
    /// Every policy: binds apply cleanly (nothing double-booked), a job gets all its GPUs or
    /// none, and with EASY backfill the reserved job can still start at its reserved time.
    #[test]
    fn every_policy_is_safe(
        nodes in proptest::collection::vec((1u32..9, prop_oneof![Just("A100"), Just("T4")]), 1..5),
        first in proptest::collection::vec((1u32..9, 1u64..500), 0..12),
        later in proptest::collection::vec((0u32..12, proptest::option::of(1u64..500), 0usize..3, any::<bool>()), 1..20),
        which in 0usize..POLICIES.len(),
        gangs in any::<bool>(),
    ) {
        let mut s = ClusterState::new();
        for (i, (n, ty)) in nodes.iter().enumerate() {
            node(&mut s, i as u64 + 1, (0..*n).map(|g| gpu(g, ty, g % 2)).collect());
        }
        for (g, est) in &first {
            submit_at(&mut s, 0, with_estimate(*g, *est));
        }
        bind_all(&mut s, &policy("fcfs+greedy"), 0);
        let tenants = ["a", "b", "c"];
        for (i, (g, est, t, asked_gang)) in later.iter().enumerate() {
            // Some even sizes are gangs asked for, over two nodes.
            let nodes = if *asked_gang && g % 2 == 0 && *g > 0 { 2 } else { 0 };
            let spec = JobSpec { runtime_estimate_s: *est, tenant: tenants[*t].into(), nodes, ..spec(*g, 0) };
            submit_at(&mut s, 1 + i as u64, spec);
        }
        let p = Policy { multi_node_gangs: gangs, ..policy(POLICIES[which]) };
        let now = 50_000;
        let env = PlanEnv::new(now, &p);
        let pass = plan(&s, &p, &env);

        // All or nothing, never twice the same GPU.
        let mut per_job: BTreeMap<u64, usize> = BTreeMap::new();
        let mut seen = BTreeSet::new();
        for b in &pass.binds {
            *per_job.entry(b.job).or_default() += b.gpus.len();
            for g in &b.gpus {
                prop_assert!(seen.insert((b.node, *g)), "GPU n{}/{} planned twice", b.node, g);
                prop_assert!(!s.nodes[&b.node].allocations.contains_key(g), "GPU n{}/{} is busy", b.node, g);
                prop_assert!(gpu_fits(s.nodes[&b.node].gpu(*g).expect("gpu"), &s.jobs[&b.job].spec));
            }
        }
        for (job, n) in &per_job {
            prop_assert_eq!(*n, s.jobs[job].spec.gpus as usize, "j-{} got part of its GPUs", job);
        }

        // After starting everything planned, each reserved job still has its GPUs from its
        // start to its end, beside those the reservations before it booked.
        let mut ends: BTreeMap<u64, Option<u64>> = BTreeMap::new();
        for j in s.jobs.values().filter(|j| j.state.is_live()) {
            ends.insert(j.id, env.expected_end_ms(j, &p));
        }
        for b in &pass.binds {
            let est = env.estimate_ms(&s.jobs[&b.job].spec, &p);
            ends.insert(b.job, est.map(|e| now + e));
        }
        // Apply the binds to see the new state.
        let mut after = s.clone();
        for b in &pass.binds {
            let node = after.nodes.get_mut(&b.node).expect("node");
            for g in &b.gpus {
                node.allocations.insert(*g, b.job);
            }
        }
        let during = |r: &Reservation, t: u64| r.start_ms <= t && r.end_ms.is_none_or(|end| t < end);
        for (i, r) in pass.reservations.iter().enumerate() {
            let head = s.jobs[&r.job].spec.clone();
            let before = &pass.reservations[..i];
            // When the GPUs free for it may fall: its start, and the later starts of those.
            let mut times = vec![r.start_ms];
            times.extend(before.iter().map(|b| b.start_ms).filter(|t| during(r, *t)));
            for t in times {
                let booked = |node: Option<u64>| -> usize {
                    before
                        .iter()
                        .filter(|b| during(b, t))
                        .map(|b| match node {
                            None => b.need * b.nodes.len().max(1),
                            Some(n) => b.need * usize::from(b.nodes.contains(&n)),
                        })
                        .sum()
                };
                if r.nodes.is_empty() {
                    let free = free_for_head_at(&after, &head, None, t, &ends).saturating_sub(booked(None));
                    prop_assert!(free >= head.gpus as usize,
                        "j-{} reserved at {} ms finds only {} GPUs at {}", r.job, r.start_ms, free, t);
                }
                // Each reserved node has the job's share of it (all of it but for a gang).
                let share = head.gpus_per_node() as usize;
                for node in &r.nodes {
                    let free = free_for_head_at(&after, &head, Some(*node), t, &ends)
                        .saturating_sub(booked(Some(*node)));
                    prop_assert!(free >= share,
                        "j-{} reserved at {} ms finds only {} GPUs on n{} at {}", r.job, r.start_ms, free, node, t);
                }
            }
        }
    }
}
