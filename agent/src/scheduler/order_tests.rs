//! The queue drawn from class heads is each ordering's plain sort of every pending job, and
//! passing over a class whose job found no room changes no placement.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use gpu_raft_store::{ClusterState, Command, Job, JobSpec, JobState};
use proptest::prelude::*;

use super::order::queue;
use super::testkit::{POLICIES, apply_at, gpu, node, spec, submit_at};
use super::{LearnedWeights, Ordering, PendingIndex, PlanEnv, Policy, plan};

const HOUR_MS: f64 = 3_600_000.0;
const TENANTS: [&str; 3] = ["a", "b", "c"];

/// Jobs from a few distinct specs (so classes have several members), submitted at times that
/// need not follow their ids, on a cluster where some already run.
fn cluster(jobs: &[(u32, i32, Option<u64>, usize, u64)], running: &[(u32, usize)]) -> ClusterState {
    let mut s = ClusterState::new();
    for id in 1..=3 {
        node(&mut s, id, (0..8).map(|g| gpu(g, "A100", g % 2)).collect());
    }
    // 16 GPUs: a gang asked for over two nodes.
    let with = |gpus: u32, priority: i32, estimate: Option<u64>, t: usize| JobSpec {
        tenant: TENANTS[t].into(),
        runtime_estimate_s: estimate,
        nodes: if gpus == 16 { 2 } else { 0 },
        ..spec(gpus, priority)
    };
    for &(gpus, t) in running {
        submit_at(&mut s, 0, with(gpus, 0, None, t));
    }
    let binds = plan(
        &s,
        &"fcfs+greedy".parse().expect("policy"),
        &PlanEnv::new(0, &Policy::default()),
    )
    .binds;
    apply_at(&mut s, 0, Command::BindJobs { binds });
    for &(gpus, priority, estimate, t, at) in jobs {
        submit_at(&mut s, at, with(gpus, priority, estimate, t));
    }
    s
}

/// The reference: every pending job keyed and sorted (fair share: tenants take turns by load).
fn sorted<'a>(s: &'a ClusterState, p: &Policy, env: &PlanEnv) -> Vec<&'a Job> {
    let mut pending: Vec<&Job> = s
        .jobs
        .values()
        .filter(|j| j.state == JobState::Pending)
        .collect();
    let live: Vec<&Job> = s.jobs.values().filter(|j| j.state.is_live()).collect();
    let usage = env.usage.at(&live, env.now_ms);
    let total: f64 = usage.values().sum();
    let share = |t: &str| {
        usage
            .get(t)
            .filter(|_| total > 0.0)
            .map_or(0.0, |u| u / total)
    };
    match p.ordering {
        Ordering::Fcfs => pending.sort_by_key(|j| j.id),
        Ordering::Sjf => pending.sort_by_key(|j| {
            (
                env.estimate_ms(&j.spec, p).unwrap_or(u64::MAX),
                j.submitted_at_ms,
                j.id,
            )
        }),
        Ordering::Priority => {
            let score = |j: &Job| {
                let waited_h = env.now_ms.saturating_sub(j.submitted_at_ms) as f64 / HOUR_MS;
                f64::from(j.spec.priority) + p.aging_per_hour * waited_h
                    - p.fairshare_weight * share(&j.spec.tenant)
            };
            pending.sort_by(|a, b| {
                score(b)
                    .total_cmp(&score(a))
                    .then((a.submitted_at_ms, a.id).cmp(&(b.submitted_at_ms, b.id)))
            });
        }
        Ordering::Learned => {
            let w = p.learned;
            let score = |j: &Job| {
                let base = w.class_term(
                    env.estimate_ms(&j.spec, p),
                    j.spec.gpus,
                    share(&j.spec.tenant),
                );
                w.score(base, j.submitted_at_ms, env.now_ms)
            };
            pending.sort_by(|a, b| {
                score(a)
                    .total_cmp(&score(b))
                    .then((a.submitted_at_ms, a.id).cmp(&(b.submitted_at_ms, b.id)))
            });
        }
        Ordering::FairShare => {
            let mut queues: BTreeMap<&str, Vec<&Job>> = BTreeMap::new();
            for j in pending.drain(..) {
                queues.entry(&j.spec.tenant).or_default().push(j);
            }
            let mut load: BTreeMap<&str, f64> = BTreeMap::new();
            for t in queues.keys() {
                let held: u32 = s
                    .jobs
                    .values()
                    .filter(|j| j.state.is_live() && j.spec.tenant == *t)
                    .map(|j| j.spec.gpus)
                    .sum();
                load.insert(t, usage.get(*t).copied().unwrap_or(0.0) + f64::from(held));
            }
            for q in queues.values_mut() {
                q.sort_by_key(|j| Reverse((Reverse(j.spec.priority), j.submitted_at_ms, j.id)));
            }
            while let Some((&t, _)) = queues
                .iter()
                .filter(|(_, q)| !q.is_empty())
                .min_by(|a, b| load[a.0].total_cmp(&load[b.0]))
            {
                let j = queues.get_mut(t).and_then(Vec::pop).expect("a job");
                pending.push(j);
                *load.get_mut(t).expect("load") += f64::from(j.spec.gpus.max(1));
            }
        }
    }
    pending
}

/// Learned weights with every term at work (the shipped ones may leave some at 0).
fn with_test_weights(p: Policy) -> Policy {
    Policy {
        learned: LearnedWeights {
            runtime: 1.0,
            gpus: 0.7,
            usage: 3.0,
            wait: 0.4,
            unknown_runtime_s: 86_400.0,
        },
        ..p
    }
}

fn arb_jobs() -> impl Strategy<Value = Vec<(u32, i32, Option<u64>, usize, u64)>> {
    proptest::collection::vec(
        (
            prop_oneof![Just(0u32), Just(1), Just(2), Just(8), Just(12), Just(16)],
            -1i32..2,
            proptest::option::of(prop_oneof![Just(60u64), Just(600), Just(6000)]),
            0usize..3,
            0u64..7_200_000,
        ),
        0..40,
    )
}

fn arb_running() -> impl Strategy<Value = Vec<(u32, usize)>> {
    proptest::collection::vec((1u32..5, 0usize..3), 0..5)
}

proptest! {
    #[test]
    fn the_queue_is_each_orderings_sort(
        jobs in arb_jobs(),
        running in arb_running(),
        which in 0usize..POLICIES.len(),
        past in proptest::collection::vec((0usize..3, 1u32..8, 0u64..3_600_000), 0..4),
    ) {
        let s = cluster(&jobs, &running);
        let p = with_test_weights(POLICIES[which].parse().expect("policy"));
        let now = 7_200_000;
        let mut env = PlanEnv::new(now, &p);
        for (t, gpus, start) in past {
            env.usage.record(TENANTS[t], gpus, start, start + 600_000);
        }
        // Ties in the score are ties in the reference too, so compare ids.
        let ids = |q: Vec<&Job>| q.into_iter().map(|j| j.id).collect::<Vec<_>>();
        let pending = PendingIndex::of(&s, p.ordering);
        prop_assert_eq!(ids(queue(&s, &p, &env, &pending).collect()), ids(sorted(&s, &p, &env)));
    }

    #[test]
    fn passing_over_classes_changes_no_bind(
        jobs in arb_jobs(),
        running in arb_running(),
        which in 0usize..POLICIES.len(),
        gangs in any::<bool>(),
        guard in any::<bool>(),
    ) {
        let s = cluster(&jobs, &running);
        let base = with_test_weights(POLICIES[which].parse().expect("policy"));
        let env = PlanEnv::new(7_200_000, &base);
        // A pass that explains looks at every job; one that does not passes over classes.
        let pass = |explain: bool| {
            let p = Policy {
                explain,
                multi_node_gangs: gangs,
                // Gangs submitted in the first hour are starving.
                gang_wait_limit_ms: guard.then_some(3_600_000),
                ..base.clone()
            };
            plan(&s, &p, &env)
        };
        let (plain, explained) = (pass(false), pass(true));
        prop_assert_eq!(&plain.binds, &explained.binds);
        // A pass that explains goes on once nothing more starts, taking more reservations.
        prop_assert!(explained.reservations.starts_with(&plain.reservations),
            "{:?} then {:?}", plain.reservations, explained.reservations);
    }
}
