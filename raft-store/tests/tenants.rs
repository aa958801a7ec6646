//! Tenant records: their rules, and `apply` creating and replacing them (refusals change
//! nothing), and the GPU time each run is accounted by type.

use std::collections::BTreeMap;

use gpu_raft_store::tenant::{
    MAX_QUOTA_GPUS, MAX_QUOTA_TYPES, Quota, TenantRecord, job_gpu_time, validate,
};
use gpu_raft_store::testing::{self, at};
use gpu_raft_store::{ApplyResult, Bind, ClusterState, Command, JobSpec, Outcome, Rejection};

fn record() -> TenantRecord {
    TenantRecord {
        name: "vision".into(),
        quotas: BTreeMap::from([(
            "A100".into(),
            Quota {
                guaranteed: 4,
                borrow: 2,
            },
        )]),
        weight: 2,
        default_priority: 3,
        created_at_ms: 0,
        updated_at_ms: 0,
        account: None,
        allowed_mounts: Vec::new(),
        max_priority: None,
        max_pending_jobs: None,
        webhook: None,
    }
}

#[test]
fn the_rules() {
    assert_eq!(validate(&record()), Ok(()));
    assert_eq!(record().quota("A100").map(|q| q.limit()), Some(6));
    let above_any_cluster = TenantRecord {
        quotas: BTreeMap::from([(
            "H100".into(),
            Quota {
                guaranteed: MAX_QUOTA_GPUS,
                borrow: 0,
            },
        )]),
        ..record()
    };
    assert_eq!(validate(&above_any_cluster), Ok(()), "allowed, reported");
    let bad = [
        TenantRecord {
            name: "../x".into(),
            ..record()
        },
        TenantRecord {
            weight: 0,
            ..record()
        },
        TenantRecord {
            weight: 10_001,
            ..record()
        },
        TenantRecord {
            default_priority: i32::MIN,
            ..record()
        },
        TenantRecord {
            quotas: BTreeMap::from([(
                "A100".into(),
                Quota {
                    guaranteed: MAX_QUOTA_GPUS + 1,
                    borrow: 0,
                },
            )]),
            ..record()
        },
        TenantRecord {
            quotas: BTreeMap::from([(
                "A100".into(),
                Quota {
                    guaranteed: 0,
                    borrow: u32::MAX,
                },
            )]),
            ..record()
        },
        TenantRecord {
            quotas: BTreeMap::from([("A 100\n".into(), Quota::default())]),
            ..record()
        },
        TenantRecord {
            quotas: (0..=MAX_QUOTA_TYPES)
                .map(|i| (format!("T{i}"), Quota::default()))
                .collect(),
            ..record()
        },
    ];
    for b in bad {
        assert!(validate(&b).is_err(), "{b:?} must be refused");
    }
}

fn apply(s: &mut ClusterState, ms: u64, cmd: Command) -> ApplyResult {
    s.apply(&at(ms, cmd))
}

#[test]
fn apply_creates_updates_and_refuses_with_nothing_changed() {
    let mut s = ClusterState::new();
    let create = |t: TenantRecord| Command::CreateTenant { tenant: t };
    assert_eq!(apply(&mut s, 10, create(record())), ApplyResult::Ok);
    assert_eq!(s.tenants["vision"].created_at_ms, 10);
    let before = s.clone();
    for cmd in [
        create(record()),
        Command::UpdateTenant {
            tenant: TenantRecord {
                name: "nobody".into(),
                ..record()
            },
        },
        Command::UpdateTenant {
            tenant: TenantRecord {
                weight: 0,
                ..record()
            },
        },
    ] {
        let r = apply(&mut s, 20, cmd.clone());
        assert!(matches!(r, ApplyResult::Rejected { .. }), "{cmd}: {r:?}");
        assert_eq!(s, before, "{cmd} changed the state");
    }
    let update = Command::UpdateTenant {
        tenant: TenantRecord {
            weight: 5,
            created_at_ms: 999,
            ..record()
        },
    };
    assert_eq!(apply(&mut s, 30, update), ApplyResult::Ok);
    let t = &s.tenants["vision"];
    assert_eq!((t.weight, t.created_at_ms, t.updated_at_ms), (5, 10, 30));
    assert!(matches!(
        apply(
            &mut s,
            40,
            Command::UpdateTenant {
                tenant: TenantRecord {
                    name: "ghost".into(),
                    ..record()
                }
            }
        ),
        ApplyResult::Rejected {
            reason: Rejection::UnknownTenant { .. }
        }
    ));
}

#[test]
fn gpu_time_is_accounted_per_run_by_type() {
    let gpu = |index: u32, gpu_type: &str| testing::gpu(index, gpu_type, gpu_type, 1);
    let mut s = ClusterState::new();
    apply(
        &mut s,
        0,
        testing::register(1, vec![gpu(0, "A100"), gpu(1, "T4"), gpu(2, "T4")]),
    );
    let spec = JobSpec {
        name: "j".into(),
        tenant: "vision".into(),
        max_attempts: 3,
        ..testing::spec(2)
    };
    apply(&mut s, 0, Command::submit(spec));
    let bind = |gpus: Vec<u32>| Command::BindJobs {
        binds: vec![Bind {
            job: 1,
            node: 1,
            gpus,
        }],
    };
    // Run 1: A100 + T4 from 1 s to 4 s, lost and requeued; run 2: two T4s from 5 s.
    apply(&mut s, 1_000, bind(vec![0, 1]));
    let lost = Outcome::Lost {
        message: "x".into(),
    };
    apply(
        &mut s,
        4_000,
        Command::JobFinished {
            job: 1,
            generation: 1,
            outcome: lost,
        },
    );
    apply(&mut s, 5_000, bind(vec![1, 2]));
    let job = &s.jobs[&1];
    assert_eq!(
        job.gpu_ms,
        BTreeMap::from([("A100".into(), 3_000), ("T4".into(), 3_000)])
    );
    assert_eq!(
        job_gpu_time(job, &s.nodes, 6_000),
        BTreeMap::from([("A100".into(), 3_000), ("T4".into(), 5_000)]),
        "the live run counts up to now"
    );
}

#[test]
fn users_stay_under_their_tenants_priority_ceiling() {
    use gpu_raft_store::Role;
    use gpu_raft_store::tenant::{TenantRecord, check_priority, validate};
    let record = TenantRecord {
        name: "a".into(),
        quotas: BTreeMap::new(),
        weight: 1,
        default_priority: 5,
        created_at_ms: 0,
        updated_at_ms: 0,
        account: None,
        allowed_mounts: vec![],
        max_priority: None,
        max_pending_jobs: None,
        webhook: None,
    };
    assert_eq!(check_priority(5, Some(&record), Role::User), Ok(()));
    assert!(check_priority(6, Some(&record), Role::User).is_err());
    assert!(
        check_priority(1, None, Role::TenantAdmin).is_err(),
        "no record: 0"
    );
    assert_eq!(check_priority(9_000, None, Role::Admin), Ok(()));
    assert!(
        check_priority(i32::MAX, None, Role::Admin).is_err(),
        "out of range"
    );
    let raised = TenantRecord {
        max_priority: Some(50),
        ..record.clone()
    };
    assert_eq!(check_priority(50, Some(&raised), Role::User), Ok(()));
    assert!(check_priority(51, Some(&raised), Role::User).is_err());
    let below_default = TenantRecord {
        max_priority: Some(4),
        ..record
    };
    assert!(validate(&below_default).is_err());
}
