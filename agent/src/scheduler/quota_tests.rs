//! Quotas in `plan`: a tenant runs up to its guarantee, borrows idle GPUs up to its limit, is
//! steered to GPU types it still has room for, and waits with a reason when it has none; the
//! property test checks that no sequence of passes ever takes a tenant over its limit.

use std::collections::BTreeMap;

use gpu_raft_store::tenant::{Quota, TenantRecord};
use gpu_raft_store::{ApplyResult, ClusterState, Command, JobId, JobSpec, JobState, Outcome};
use proptest::prelude::*;

use super::plan::plan_default;
use super::testkit::{apply, gpu, node, spec, submit};
use super::{PlanEnv, Policy, plan};

fn tenant(s: &mut ClusterState, name: &str, quotas: &[(&str, u32, u32)], weight: u32) {
    let quotas = quotas
        .iter()
        .map(|(t, guaranteed, borrow)| {
            (
                (*t).to_owned(),
                Quota {
                    guaranteed: *guaranteed,
                    borrow: *borrow,
                },
            )
        })
        .collect();
    let r = apply(
        s,
        Command::CreateTenant {
            tenant: TenantRecord {
                account: None,
                name: name.into(),
                quotas,
                weight,
                default_priority: 0,
                created_at_ms: 0,
                updated_at_ms: 0,
                allowed_mounts: Vec::new(),
                max_priority: None,
                max_pending_jobs: None,
                webhook: None,
            },
        },
    );
    assert_eq!(r, ApplyResult::Ok);
}

fn of(tenant: &str, gpus: u32) -> JobSpec {
    JobSpec {
        tenant: tenant.into(),
        ..spec(gpus, 0)
    }
}

/// Plan, apply the binds, record the reasons; the jobs bound in this pass.
fn pass(s: &mut ClusterState, policy: &Policy) -> Vec<JobId> {
    let p = plan(s, policy, &PlanEnv::new(1, policy));
    let ApplyResult::Bound { bound, rejected } = apply(s, Command::BindJobs { binds: p.binds })
    else {
        panic!("bind result");
    };
    assert!(rejected.is_empty(), "{rejected:?}");
    apply(
        s,
        Command::NoteUnschedulable {
            reasons: p.unschedulable,
        },
    );
    bound
}

fn live_of(s: &ClusterState, tenant: &str) -> usize {
    s.jobs
        .values()
        .filter(|j| j.state.is_live() && j.spec.tenant == tenant)
        .map(|j| j.spec.gpus as usize)
        .sum()
}

#[test]
fn a_tenant_is_held_at_its_quota_while_another_runs() {
    let mut s = ClusterState::new();
    node(&mut s, 1, (0..4).map(|i| gpu(i, "A100", 0)).collect());
    tenant(&mut s, "a", &[("A100", 2, 0)], 1);
    for _ in 0..3 {
        submit(&mut s, of("a", 1));
    }
    for _ in 0..2 {
        submit(&mut s, of("b", 1));
    }
    let bound = pass(&mut s, &Policy::default());
    assert_eq!(
        bound,
        vec![1, 2, 4, 5],
        "a's third job waits, b (no record) runs"
    );
    assert_eq!(
        s.jobs[&3].reason.as_deref(),
        Some(
            "over quota: tenant a holds 2 of its 2 A100 GPUs (2 guaranteed + 0 borrowed) and needs 1 more"
        )
    );
    assert_eq!(live_of(&s, "a"), 2);
}

#[test]
fn borrowing_takes_idle_gpus_up_to_the_limit_and_no_further() {
    let mut s = ClusterState::new();
    node(&mut s, 1, (0..8).map(|i| gpu(i, "A100", 0)).collect());
    tenant(&mut s, "a", &[("A100", 2, 3)], 1);
    for _ in 0..8 {
        submit(&mut s, of("a", 1));
    }
    pass(&mut s, &Policy::default());
    assert_eq!(live_of(&s, "a"), 5, "2 guaranteed + 3 borrowed");
    assert!(
        s.jobs[&6]
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with("over quota: tenant a holds 5 of its 5 A100")),
        "{:?}",
        s.jobs[&6].reason
    );
}

#[test]
fn a_tenant_at_its_limit_for_one_type_uses_another() {
    let mut s = ClusterState::new();
    node(
        &mut s,
        1,
        vec![
            gpu(0, "A100", 0),
            gpu(1, "A100", 0),
            gpu(2, "T4", 0),
            gpu(3, "T4", 0),
        ],
    );
    tenant(&mut s, "a", &[("A100", 1, 0)], 1);
    submit(&mut s, of("a", 2));
    let p = plan_default(&s);
    assert_eq!(p.binds.len(), 1);
    assert_eq!(p.binds[0].gpus, vec![2, 3], "the T4s: A100 is limited to 1");
}

#[test]
fn an_over_quota_job_does_not_hold_a_strict_queue() {
    let mut s = ClusterState::new();
    node(&mut s, 1, (0..2).map(|i| gpu(i, "A100", 0)).collect());
    tenant(&mut s, "a", &[("A100", 0, 0)], 1);
    submit(&mut s, of("a", 1));
    submit(&mut s, of("b", 1));
    let fcfs: Policy = "fcfs+strict".parse().expect("policy");
    assert_eq!(pass(&mut s, &fcfs), vec![2]);
    assert_eq!(s.jobs[&1].state, JobState::Pending);
}

#[test]
fn fair_share_divides_by_weight() {
    let mut s = ClusterState::new();
    node(&mut s, 1, (0..4).map(|i| gpu(i, "A100", 0)).collect());
    tenant(&mut s, "heavy", &[], 3);
    for _ in 0..4 {
        submit(&mut s, of("light", 1));
        submit(&mut s, of("heavy", 1));
    }
    let fair: Policy = "fairshare+greedy".parse().expect("policy");
    pass(&mut s, &fair);
    assert_eq!((live_of(&s, "heavy"), live_of(&s, "light")), (3, 1));
}

#[test]
fn a_quota_above_the_cluster_is_allowed_and_changes_nothing() {
    let mut s = ClusterState::new();
    node(&mut s, 1, (0..2).map(|i| gpu(i, "A100", 0)).collect());
    tenant(&mut s, "a", &[("A100", 1000, 0), ("B200", 8, 0)], 1);
    submit(&mut s, of("a", 2));
    assert_eq!(pass(&mut s, &Policy::default()), vec![1]);
}

fn arb_type() -> impl Strategy<Value = &'static str> {
    prop_oneof![Just("A100"), Just("T4")]
}

proptest! {
    /// Over random clusters, quotas, job mixes and policies, with jobs finishing between
    /// passes: no tenant ever holds more GPUs of a type than guarantee + borrowing.
    #[test]
    fn quota_is_never_exceeded_except_by_borrowing_within_limits(
        nodes in proptest::collection::vec(proptest::collection::vec(arb_type(), 1..6), 1..4),
        quotas in proptest::collection::vec((0u32..4, 0u32..3, 0u32..3, 0u32..3), 3),
        jobs in proptest::collection::vec((0usize..4, 0u32..4, proptest::option::of(arb_type())), 1..40),
        policy in prop_oneof![Just("fcfs+strict"), Just("fcfs+easy"), Just("priority+greedy"), Just("fairshare+greedy")],
        finish in proptest::collection::vec(any::<bool>(), 40),
    ) {
        let mut s = ClusterState::new();
        for (i, types) in nodes.iter().enumerate() {
            let gpus = types.iter().enumerate().map(|(g, t)| gpu(g as u32, t, 0)).collect();
            node(&mut s, i as u64 + 1, gpus);
        }
        let names = ["t0", "t1", "t2", "t3"];
        let mut limits = BTreeMap::new();
        for (i, (ga, ba, gt, bt)) in quotas.iter().enumerate() {
            tenant(&mut s, names[i], &[("A100", *ga, *ba), ("T4", *gt, *bt)], 1 + i as u32);
            limits.insert((names[i], "A100"), ga + ba);
            limits.insert((names[i], "T4"), gt + bt);
        }
        for (t, gpus, ty) in &jobs {
            let gpu_types = ty.map(|t| vec![t.to_owned()]).unwrap_or_default();
            submit(&mut s, JobSpec { gpu_types, ..of(names[*t], *gpus) });
        }
        let policy: Policy = policy.parse().expect("policy");
        for round in 0..4 {
            pass(&mut s, &policy);
            let mut held: BTreeMap<(&str, &str), u32> = BTreeMap::new();
            for j in s.jobs.values().filter(|j| j.state.is_live()) {
                let b = j.binding.as_ref().expect("binding");
                for g in &b.gpus {
                    let t = s.nodes[&b.node].gpu(*g).expect("gpu").gpu_type.as_str();
                    let key = names.iter().find(|n| **n == j.spec.tenant).expect("tenant");
                    *held.entry((*key, if t == "A100" { "A100" } else { "T4" })).or_insert(0) += 1;
                }
            }
            // t3 has no record: unlimited.
            for (key, n) in &held {
                if let Some(limit) = limits.get(key) {
                    prop_assert!(n <= limit, "{key:?} holds {n}, limit {limit}");
                }
            }
            prop_assert!(held.keys().all(|(t, _)| *t == "t3" || limits.contains_key(&(*t, "A100"))));
            // Some live jobs end before the next pass.
            let live: Vec<(JobId, u64)> = s.jobs.values().filter(|j| j.state.is_live()).map(|j| (j.id, j.generation)).collect();
            for (k, (job, generation)) in live.into_iter().enumerate() {
                if finish[(k + round) % finish.len()] {
                    apply(&mut s, Command::JobFinished { job, generation, outcome: Outcome::Exited { code: 0 } });
                }
            }
        }
    }
}
