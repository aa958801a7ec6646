//! `ClusterState::apply`, driven through whole command sequences: node and job life cycles,
//! idempotent submission, bind re-validation, and the GPU-exclusivity invariant under random
//! command mixes.

use std::collections::{BTreeMap, BTreeSet};

use gpu_raft_store::testing::{at, register, spec, submit};
use gpu_raft_store::{
    ApplyResult, Bind, CERT_RECORD_GRACE_MS, ClusterState, Command, GpuRecord,
    IDEMPOTENCY_WINDOW_MS, JobSpec, JobState, LogEntry, NodeStatus, Outcome, Rejection,
    RequestMeta, RequestStamp, Role, SchedulerSettings, TokenRecord, audit, requests, scheduler,
};
use proptest::prelude::*;

/// A test GPU of `gpu_type` (model `<type>-test`).
fn gpu(index: u32, gpu_type: &str, memory_mib: u64) -> GpuRecord {
    gpu_raft_store::testing::gpu(index, &format!("{gpu_type}-test"), gpu_type, memory_mib)
}

fn cluster() -> ClusterState {
    let mut s = ClusterState::new();
    s.apply(&at(
        1,
        register(1, vec![gpu(0, "A100", 81920), gpu(1, "A100", 81920)]),
    ));
    s.apply(&at(1, register(2, vec![gpu(0, "T4", 15360)])));
    s
}

#[test]
fn registration_keeps_operator_labels() {
    let mut s = cluster();
    let set = Command::SetNodeLabels {
        node: 1,
        set: BTreeMap::from([("zone".into(), "b".into())]),
        remove: BTreeSet::new(),
    };
    assert_eq!(s.apply(&at(2, set)), ApplyResult::Ok);
    s.apply(&at(3, register(1, vec![gpu(0, "A100", 81920)])));
    assert_eq!(
        s.nodes[&1]
            .effective_labels()
            .get("zone")
            .map(String::as_str),
        Some("b")
    );
    assert_eq!(s.nodes[&1].registered_at_ms, 1);
}

#[test]
fn rejected_commands_change_nothing() {
    let mut s = cluster();
    let before = s.clone();
    let bad = [
        Command::SetNodeLabels {
            node: 9,
            set: BTreeMap::from([("a".into(), "b".into())]),
            remove: BTreeSet::new(),
        },
        Command::SetNodeLabels {
            node: 1,
            set: BTreeMap::from([("ok".into(), "v".into()), ("../evil".into(), "v".into())]),
            remove: BTreeSet::new(),
        },
        Command::submit(JobSpec {
            command: vec![],
            ..spec(1)
        }),
        Command::CancelJob { job: 99 },
        Command::JobStarted {
            job: 99,
            generation: 1,
        },
        Command::CordonNode {
            node: 9,
            cordoned: true,
        },
    ];
    for cmd in bad {
        assert!(
            matches!(s.apply(&at(5, cmd.clone())), ApplyResult::Rejected { .. }),
            "{cmd}"
        );
        assert_eq!(s, before, "{cmd} must not half-apply");
    }
}

#[test]
fn idempotency_key_returns_the_first_job_and_refuses_a_different_spec() {
    let mut s = cluster();
    assert_eq!(
        submit(&mut s, spec(1), Some("k1")),
        ApplyResult::JobSubmitted {
            job: 1,
            existing: false
        }
    );
    assert_eq!(
        submit(&mut s, spec(1), Some("k1")),
        ApplyResult::JobSubmitted {
            job: 1,
            existing: true
        }
    );
    assert_eq!(
        submit(&mut s, spec(2), Some("k1")),
        ApplyResult::Rejected {
            reason: Rejection::IdempotencyConflict {
                key: "k1".into(),
                job: 1
            }
        }
    );
    // Keys are per tenant.
    let other = JobSpec {
        tenant: "other".into(),
        ..spec(1)
    };
    assert_eq!(
        submit(&mut s, other, Some("k1")),
        ApplyResult::JobSubmitted {
            job: 2,
            existing: false
        }
    );
    assert_eq!(s.jobs.len(), 2);
}

#[test]
fn a_job_runs_through_its_life() {
    let mut s = cluster();
    submit(&mut s, spec(2), None);
    let bind = Command::BindJobs {
        binds: vec![Bind {
            job: 1,
            node: 1,
            gpus: vec![0, 1],
        }],
    };
    assert_eq!(
        s.apply(&at(2, bind)),
        ApplyResult::Bound {
            bound: vec![1],
            rejected: vec![]
        }
    );
    assert_eq!(s.jobs[&1].state, JobState::Bound);
    assert_eq!(s.nodes[&1].allocations.len(), 2);
    assert_eq!(
        s.apply(&at(
            3,
            Command::JobStarted {
                job: 1,
                generation: 1
            }
        )),
        ApplyResult::Ok
    );
    let done = Command::JobFinished {
        job: 1,
        generation: 1,
        outcome: Outcome::Exited { code: 0 },
    };
    assert_eq!(s.apply(&at(4, done.clone())), ApplyResult::Ok);
    let j = &s.jobs[&1];
    assert_eq!(
        (j.state, j.started_at_ms, j.finished_at_ms),
        (JobState::Succeeded, Some(3), Some(4))
    );
    assert!(s.nodes[&1].allocations.is_empty());
    assert!(matches!(
        s.apply(&at(5, done)),
        ApplyResult::Rejected {
            reason: Rejection::Stale { .. }
        }
    ));
    assert!(matches!(
        s.apply(&at(5, Command::CancelJob { job: 1 })),
        ApplyResult::Rejected {
            reason: Rejection::JobFinished { .. }
        }
    ));
}

#[test]
fn binds_are_revalidated() {
    let mut s = cluster();
    submit(&mut s, spec(1), None);
    submit(&mut s, spec(1), None);
    submit(
        &mut s,
        JobSpec {
            gpu_types: vec!["A100".into()],
            ..spec(1)
        },
        None,
    );
    let binds = vec![
        Bind {
            job: 1,
            node: 1,
            gpus: vec![0],
        },
        Bind {
            job: 2,
            node: 1,
            gpus: vec![0],
        }, // same GPU: must lose
        Bind {
            job: 1,
            node: 1,
            gpus: vec![1],
        }, // job no longer pending
        Bind {
            job: 3,
            node: 2,
            gpus: vec![0],
        }, // T4 does not match A100
        Bind {
            job: 2,
            node: 1,
            gpus: vec![7],
        }, // no such GPU
        Bind {
            job: 2,
            node: 3,
            gpus: vec![0],
        }, // no such node
        Bind {
            job: 2,
            node: 1,
            gpus: vec![],
        }, // wrong count
    ];
    let ApplyResult::Bound { bound, rejected } = s.apply(&at(2, Command::BindJobs { binds }))
    else {
        panic!("bind result");
    };
    assert_eq!(bound, vec![1]);
    assert_eq!(rejected.len(), 6, "{rejected:?}");
    assert!(rejected[0].1.contains("held by j-1"), "{rejected:?}");
}

#[test]
fn a_stamped_request_applied_twice_takes_effect_once_and_answers_the_same() {
    let mut s = cluster();
    let submission = |request_id: &str, at_ms: u64| {
        let mut entry = by("alice", Command::submit(spec(1)));
        entry.proposed_at_ms = at_ms;
        entry.meta.as_mut().expect("meta").request_id = request_id.into();
        entry.request = RequestStamp::of(entry.meta.as_ref().expect("meta"), &entry.cmd);
        entry
    };
    let first = s.apply(&submission("r1", 10));
    let audited = s.audit.len();
    let after_first = s.clone();
    assert_eq!(
        s.apply(&submission("r1", 20)),
        first,
        "the copy gets the first answer"
    );
    assert_eq!(
        s, after_first,
        "and changes nothing, not even the audit log"
    );
    assert_eq!(s.audit.len(), audited);
    // Another request is applied, and a copy past the window is applied again.
    let second = s.apply(&submission("r2", 30));
    assert_ne!(second, first);
    let late = s.apply(&submission("r1", 10 + requests::WINDOW_MS + 1));
    assert_ne!(late, first);
    assert_eq!(s.jobs.len(), 3);
    // An unstamped entry (written before every member spoke PROTOCOL_9) is never matched.
    let mut unstamped = submission("r2", 40);
    unstamped.request = None;
    s.apply(&unstamped);
    assert_eq!(s.jobs.len(), 4);
}

#[test]
fn expired_certificate_records_and_old_idempotency_keys_are_forgotten() {
    let mut s = cluster();
    let record = |serial: &str, not_after_ms| Command::RecordCertificate {
        cert: gpu_raft_store::CertRecord {
            serial: serial.into(),
            subject: "node 2".into(),
            not_after_ms,
            issued_at_ms: 1,
            revoked: false,
            revoked_reason: String::new(),
            issuer: String::new(),
        },
        enrolled_with: None,
    };
    s.apply(&at(1, record("0a", 1_000)));
    s.apply(&at(1, record("0b", 1_000)));
    s.apply(&at(1, record("0c", u64::MAX / 2)));
    s.apply(&at(
        2,
        Command::RevokeCertificate {
            serial: "0b".into(),
            reason: "stolen".into(),
        },
    ));
    let first = submit(&mut s, spec(1), Some("k"));
    let ApplyResult::JobSubmitted { job, .. } = first else {
        panic!("{first:?}")
    };

    let in_grace = 1_000 + CERT_RECORD_GRACE_MS;
    assert!(s.expired(in_grace).is_empty(), "{:?}", s.expired(in_grace));
    let expired = s.expired(in_grace + 1);
    assert_eq!(expired.certificates, ["0a", "0b"], "revoked or not");
    assert!(
        expired.idempotency_keys.is_empty(),
        "the key's window is open"
    );

    let later = 1 + IDEMPOTENCY_WINDOW_MS + 1;
    let before = s.clone();
    assert_eq!(s.apply(&at(later, Command::ForgetExpired)), ApplyResult::Ok);
    assert_eq!(
        s.certificates.keys().collect::<Vec<_>>(),
        ["0c"],
        "the valid certificate stays"
    );
    assert!(s.idempotency.is_empty());
    assert_eq!(s.jobs, before.jobs, "the job itself stays");
    assert!(s.expired(later).is_empty());
    // Past its window the key is free: the same submission makes a new job.
    let again = s.apply(&at(
        later,
        Command::SubmitJob {
            spec: Box::new(spec(1)),
            idempotency_key: Some("k".into()),
            hold: false,
            owner: None,
        },
    ));
    assert!(
        matches!(again, ApplyResult::JobSubmitted { job: j, existing: false } if j != job),
        "{again:?}"
    );
}

#[test]
fn cordoned_and_down_nodes_take_no_work_and_down_requeues() {
    let mut s = cluster();
    submit(&mut s, spec(1), None);
    s.apply(&at(
        2,
        Command::CordonNode {
            node: 2,
            cordoned: true,
        },
    ));
    let r = s.apply(&at(
        3,
        Command::BindJobs {
            binds: vec![Bind {
                job: 1,
                node: 2,
                gpus: vec![0],
            }],
        },
    ));
    assert!(matches!(r, ApplyResult::Bound { ref bound, .. } if bound.is_empty()));
    s.apply(&at(
        4,
        Command::BindJobs {
            binds: vec![Bind {
                job: 1,
                node: 1,
                gpus: vec![0],
            }],
        },
    ));
    s.apply(&at(
        5,
        Command::SetNodeStatus {
            node: 1,
            status: NodeStatus::Down,
            requeue_evicting: false,
        },
    ));
    let j = &s.jobs[&1];
    assert_eq!(
        (j.state, j.attempts),
        (JobState::Pending, 1),
        "requeued while attempts remain"
    );
    assert!(s.nodes[&1].allocations.is_empty());
    // The second loss uses the last attempt: the job fails.
    s.apply(&at(6, register(1, vec![gpu(0, "A100", 81920)])));
    s.apply(&at(
        7,
        Command::BindJobs {
            binds: vec![Bind {
                job: 1,
                node: 1,
                gpus: vec![0],
            }],
        },
    ));
    s.apply(&at(
        8,
        Command::SetNodeStatus {
            node: 1,
            status: NodeStatus::Down,
            requeue_evicting: false,
        },
    ));
    assert_eq!(s.jobs[&1].state, JobState::Failed);
}

#[test]
fn eviction_requeues_without_using_an_attempt() {
    let mut s = cluster();
    submit(
        &mut s,
        JobSpec {
            max_attempts: 1,
            ..spec(1)
        },
        None,
    );
    s.apply(&at(
        2,
        Command::BindJobs {
            binds: vec![Bind {
                job: 1,
                node: 1,
                gpus: vec![0],
            }],
        },
    ));
    s.apply(&at(
        3,
        Command::DrainNode {
            node: 1,
            evict: true,
        },
    ));
    assert!(s.jobs[&1].evict_requested && s.nodes[&1].cordoned);
    s.apply(&at(
        4,
        Command::JobFinished {
            job: 1,
            generation: 1,
            outcome: Outcome::Evicted,
        },
    ));
    let j = &s.jobs[&1];
    assert_eq!(
        (j.state, j.attempts, j.evict_requested),
        (JobState::Pending, 0, false)
    );
}

#[test]
fn evicting_the_last_schedulable_node_would_strand_its_jobs() {
    let mut s = cluster();
    submit(&mut s, spec(1), None);
    s.apply(&at(
        2,
        Command::BindJobs {
            binds: vec![Bind {
                job: 1,
                node: 1,
                gpus: vec![0],
            }],
        },
    ));
    assert_eq!(s.eviction_strands(1), None, "n2 can take the job");
    assert_eq!(s.eviction_strands(2), None, "n2 runs nothing");
    s.apply(&at(
        3,
        Command::CordonNode {
            node: 2,
            cordoned: true,
        },
    ));
    let why = s
        .eviction_strands(1)
        .expect("n1 is the last schedulable node");
    assert!(why.contains("last schedulable node"), "{why}");
}

/// A drained node whose agent stops before its eviction is reported: the node goes down with
/// the job still asked to stop. The verdict of a protocol-6 leader requeues it as evicted (no
/// attempt spent); the old verdict fails a job on its last attempt.
#[test]
fn a_node_down_while_evicting_requeues_its_jobs_as_evicted() {
    for (requeue_evicting, want) in [(true, JobState::Pending), (false, JobState::Failed)] {
        let mut s = cluster();
        submit(
            &mut s,
            JobSpec {
                max_attempts: 1,
                ..spec(1)
            },
            None,
        );
        let bind = Command::BindJobs {
            binds: vec![Bind {
                job: 1,
                node: 1,
                gpus: vec![0],
            }],
        };
        s.apply(&at(2, bind));
        let drain = Command::DrainNode {
            node: 1,
            evict: true,
        };
        s.apply(&at(3, drain));
        let down = Command::SetNodeStatus {
            node: 1,
            status: NodeStatus::Down,
            requeue_evicting,
        };
        s.apply(&at(4, down));
        let j = &s.jobs[&1];
        assert_eq!(j.state, want, "{requeue_evicting}: {:?}", j.reason);
        if requeue_evicting {
            assert_eq!((j.attempts, j.evict_requested), (0, false));
            assert!(s.nodes[&1].allocations.is_empty());
        }
    }
}

#[test]
fn cancel_of_pending_is_immediate_and_of_running_is_requested() {
    let mut s = cluster();
    submit(&mut s, spec(1), None);
    submit(&mut s, spec(1), None);
    s.apply(&at(2, Command::CancelJob { job: 1 }));
    assert_eq!(s.jobs[&1].state, JobState::Cancelled);
    s.apply(&at(
        3,
        Command::BindJobs {
            binds: vec![Bind {
                job: 2,
                node: 1,
                gpus: vec![0],
            }],
        },
    ));
    s.apply(&at(4, Command::CancelJob { job: 2 }));
    assert!(s.jobs[&2].cancel_requested);
    s.apply(&at(
        5,
        Command::JobFinished {
            job: 2,
            generation: 1,
            outcome: Outcome::Cancelled,
        },
    ));
    assert_eq!(s.jobs[&2].state, JobState::Cancelled);
}

fn assert_exclusive(s: &ClusterState) {
    let mut holders: BTreeMap<(u64, u32), u64> = BTreeMap::new();
    for job in s.jobs.values().filter(|j| j.state.is_live()) {
        let b = job.binding.as_ref().expect("a live job has a binding");
        assert_eq!(b.gpus.len() as u32, job.spec.gpus);
        for &g in &b.gpus {
            assert!(
                holders.insert((b.node, g), job.id).is_none(),
                "GPU n{}/{g} bound twice",
                b.node
            );
            assert_eq!(s.nodes[&b.node].allocations.get(&g), Some(&job.id));
        }
    }
    let allocated: usize = s.nodes.values().map(|n| n.allocations.len()).sum();
    assert_eq!(allocated, holders.len(), "allocations without a live job");
}

fn arb_command() -> impl Strategy<Value = Command> {
    prop_oneof![
        (0u32..4).prop_map(|g| Command::submit(spec(g))),
        (1u64..8, 1u64..4, proptest::collection::vec(0u32..3, 0..4)).prop_map(
            |(job, node, gpus)| Command::BindJobs {
                binds: vec![Bind { job, node, gpus }]
            }
        ),
        (1u64..8, 1u64..4).prop_map(|(job, generation)| Command::JobStarted { job, generation }),
        (1u64..8, 1u64..4).prop_map(|(job, generation)| Command::JobFinished {
            job,
            generation,
            outcome: Outcome::Lost {
                message: "x".into()
            }
        }),
        (1u64..8).prop_map(|job| Command::CancelJob { job }),
        (1u64..3, any::<bool>()).prop_map(|(node, requeue_evicting)| Command::SetNodeStatus {
            node,
            status: NodeStatus::Down,
            requeue_evicting,
        }),
        (1u64..3).prop_map(|node| register(
            node,
            vec![gpu(0, "A100", 1), gpu(1, "A100", 1), gpu(2, "T4", 1)]
        )),
    ]
}

proptest! {
    #[test]
    fn no_gpu_is_ever_bound_twice(cmds in proptest::collection::vec(arb_command(), 1..80)) {
        let mut s = cluster();
        for (i, cmd) in cmds.into_iter().enumerate() {
            s.apply(&at(i as u64, cmd));
            assert_exclusive(&s);
        }
    }

    #[test]
    fn apply_is_deterministic(cmds in proptest::collection::vec(arb_command(), 1..40)) {
        let (mut a, mut b) = (cluster(), cluster());
        for (i, cmd) in cmds.iter().enumerate() {
            prop_assert_eq!(a.apply(&at(i as u64, cmd.clone())), b.apply(&at(i as u64, cmd.clone())));
        }
        prop_assert_eq!(a, b);
    }

    /// The leader's group commit: entries applied as batches (cut anywhere, each entry with its
    /// own time and caller) leave the same state and give the same results as one by one.
    #[test]
    fn a_batch_applies_as_its_entries_would(
        cmds in proptest::collection::vec(arb_command(), 1..40),
        cuts in proptest::collection::vec(1usize..6, 1..40),
    ) {
        let entries: Vec<LogEntry> = cmds
            .into_iter()
            .enumerate()
            .map(|(i, cmd)| {
                let mut e = by("admin", cmd);
                e.proposed_at_ms = i as u64;
                e
            })
            .collect();
        let (mut one_by_one, mut batched) = (cluster(), cluster());
        one_by_one.apply(&at(0, Command::CreateToken { token: token("admin", Role::Admin, None) }));
        batched.apply(&at(0, Command::CreateToken { token: token("admin", Role::Admin, None) }));
        let expected: Vec<ApplyResult> = entries.iter().map(|e| one_by_one.apply(e)).collect();
        let mut got = Vec::new();
        let mut rest = entries.as_slice();
        for n in cuts.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (batch, tail) = rest.split_at((*n).min(rest.len()));
            rest = tail;
            let last = batch.last().map_or(0, |e| e.proposed_at_ms);
            match batched.apply(&at(last, Command::Batch { entries: batch.to_vec() })) {
                ApplyResult::Batch { results } => got.extend(results),
                other => prop_assert!(false, "a batch gave {:?}", other),
            }
        }
        prop_assert_eq!(got, expected);
        prop_assert_eq!(batched, one_by_one);
    }
}

#[test]
fn a_batch_inside_a_batch_is_refused_and_changes_nothing() {
    let mut s = cluster();
    let before = s.clone();
    let inner = at(
        1,
        Command::Batch {
            entries: vec![at(1, Command::submit(spec(1)))],
        },
    );
    let result = s.apply(&at(
        1,
        Command::Batch {
            entries: vec![inner],
        },
    ));
    let ApplyResult::Batch { results } = result else {
        panic!("a batch gave {result:?}")
    };
    assert!(
        matches!(&results[..], [ApplyResult::Rejected { reason }] if reason.to_string().contains("a batch cannot hold a batch")),
        "{results:?}"
    );
    assert_eq!(s, before);
}

fn token(id: &str, role: Role, tenant: Option<&str>) -> TokenRecord {
    TokenRecord {
        id: id.into(),
        secret_sha256: "ab".repeat(32),
        role,
        tenant: tenant.map(Into::into),
        description: String::new(),
        created_at_ms: 1,
        created_by: "system:test".into(),
        revoked: false,
        account: None,
        limits: Default::default(),
    }
}

fn by(actor: &str, cmd: Command) -> LogEntry {
    let meta = RequestMeta {
        actor: actor.into(),
        verb: "test".into(),
        object: "x".into(),
        request_id: "r".into(),
        source: "127.0.0.1:1".into(),
    };
    LogEntry {
        proposed_at_ms: 9,
        cmd,
        meta: Some(meta),
        request: None,
    }
}

#[test]
fn tokens_cannot_grant_more_than_their_holder_has() {
    let mut s = cluster();
    s.apply(&at(
        1,
        Command::CreateToken {
            token: token("root", Role::Admin, None),
        },
    ));
    s.apply(&by(
        "root",
        Command::CreateToken {
            token: token("ta", Role::TenantAdmin, Some("a")),
        },
    ));
    s.apply(&by(
        "root",
        Command::CreateToken {
            token: token("u", Role::User, Some("a")),
        },
    ));
    assert_eq!(s.tokens.len(), 3);
    let denied = [
        by(
            "u",
            Command::CreateToken {
                token: token("x1", Role::Viewer, Some("a")),
            },
        ),
        by(
            "ta",
            Command::CreateToken {
                token: token("x2", Role::Admin, None),
            },
        ),
        by(
            "ta",
            Command::CreateToken {
                token: token("x3", Role::User, Some("b")),
            },
        ),
        by("ta", Command::RevokeToken { id: "root".into() }),
        by(
            "nobody",
            Command::CreateToken {
                token: token("x4", Role::Viewer, None),
            },
        ),
    ];
    for e in denied {
        assert!(
            matches!(
                s.apply(&e),
                ApplyResult::Rejected {
                    reason: Rejection::PermissionDenied { .. }
                }
            ),
            "{}",
            e.cmd
        );
    }
    assert_eq!(s.tokens.len(), 3, "no denied token was created");
    assert_eq!(
        s.apply(&by(
            "ta",
            Command::CreateToken {
                token: token("v", Role::Viewer, Some("a"))
            }
        )),
        ApplyResult::Ok
    );
    // A revoked token loses its powers at once.
    s.apply(&by("root", Command::RevokeToken { id: "ta".into() }));
    assert!(matches!(
        s.apply(&by(
            "ta",
            Command::CreateToken {
                token: token("v2", Role::Viewer, Some("a"))
            }
        )),
        ApplyResult::Rejected { .. }
    ));
}

#[test]
fn every_api_request_leaves_exactly_one_chained_audit_entry() {
    let mut s = cluster();
    s.apply(&at(
        1,
        Command::CreateToken {
            token: token("root", Role::Admin, None),
        },
    ));
    let before = s.audit.len();
    let requests = [
        by("root", Command::submit(spec(1))),
        by("root", Command::CancelJob { job: 999 }),
        by(
            "root",
            Command::AuditDenied {
                reason: "viewer cannot submit".into(),
            },
        ),
        by(
            "root",
            Command::CordonNode {
                node: 1,
                cordoned: true,
            },
        ),
    ];
    for r in &requests {
        s.apply(r);
    }
    let outcomes: Vec<&str> = s.audit[before..]
        .iter()
        .map(|e| e.outcome.as_str())
        .collect();
    assert_eq!(
        outcomes,
        [
            "ok",
            "rejected: job j-999 does not exist",
            "denied: viewer cannot submit",
            "ok"
        ]
    );
    assert_eq!(audit::verify(&s.audit), Ok(requests.len() + before));
    // Internal commands (no meta) are not audited.
    s.apply(&at(
        3,
        Command::JobStarted {
            job: 1,
            generation: 9,
        },
    ));
    assert_eq!(s.audit.len(), before + requests.len());
}

fn edge_terms(site: &str, lease_ms: u64, down_after_ms: u64) -> gpu_raft_store::EdgeTerms {
    gpu_raft_store::EdgeTerms {
        site: site.into(),
        lease_ms,
        down_after_ms,
    }
}

/// `register`, at `site`, with edge terms when given.
fn register_at(node: u64, site: &str, edge: Option<gpu_raft_store::EdgeTerms>) -> Command {
    match register(node, vec![gpu(0, "A100", 81920)]) {
        Command::RegisterNode {
            node,
            addr,
            inventory,
            ..
        } => Command::RegisterNode {
            node,
            addr,
            labels: BTreeMap::from([("site".into(), site.into())]),
            inventory,
            edge,
            protocol: 1,
        },
        _ => unreachable!("register builds RegisterNode"),
    }
}

fn refusal(result: ApplyResult) -> String {
    match result {
        ApplyResult::Rejected { reason } => reason.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A site's edge terms are recorded on its nodes at registration; a second node of the site
/// must bring the same terms, and a non-edge node cannot join an edge site (or the reverse):
/// one site, one grace, whichever agent's file the leader would otherwise have trusted.
#[test]
fn one_site_has_one_set_of_edge_terms() {
    let mut s = ClusterState::new();
    let terms = edge_terms("edge-1", 60_000, 90_000);
    assert_eq!(
        s.apply(&at(1, register_at(4, "edge-1", Some(terms.clone())))),
        ApplyResult::Ok
    );
    assert_eq!(s.nodes[&4].edge, Some(terms.clone()));
    assert_eq!(
        s.apply(&at(2, register_at(5, "edge-1", Some(terms.clone())))),
        ApplyResult::Ok
    );
    let before = s.clone();
    let longer = refusal(s.apply(&at(
        3,
        register_at(6, "edge-1", Some(edge_terms("edge-1", 60_000, 120_000))),
    )));
    assert!(longer.contains("same [edge] settings"), "{longer}");
    assert!(longer.contains("down_after 90000 ms"), "{longer}");
    let plain = refusal(s.apply(&at(3, register_at(6, "edge-1", None))));
    assert!(plain.contains("not an edge site"), "{plain}");
    assert_eq!(s, before, "refused registrations change nothing");
    // A plain site stays plain.
    assert_eq!(
        s.apply(&at(4, register_at(1, "dc-1", None))),
        ApplyResult::Ok
    );
    let edge_in_dc = refusal(s.apply(&at(
        5,
        register_at(2, "dc-1", Some(edge_terms("dc-1", 60_000, 90_000))),
    )));
    assert!(
        edge_in_dc.contains("\"dc-1\" is not an edge site"),
        "{edge_in_dc}"
    );
}

#[test]
fn edge_terms_must_fence_inside_the_grace_and_name_the_site_label() {
    let mut s = ClusterState::new();
    let tight = refusal(s.apply(&at(
        1,
        register_at(4, "edge-1", Some(edge_terms("edge-1", 60_000, 89_999))),
    )));
    assert!(tight.contains("at least 1.5 x its lease"), "{tight}");
    let other = refusal(s.apply(&at(
        1,
        register_at(4, "edge-1", Some(edge_terms("edge-2", 60_000, 90_000))),
    )));
    assert!(other.contains("must be the node's `site` label"), "{other}");
    let short = refusal(s.apply(&at(
        1,
        register_at(4, "edge-1", Some(edge_terms("edge-1", 10, 15))),
    )));
    assert!(short.contains("at least 1000 ms"), "{short}");
    assert!(s.nodes.is_empty());
}

/// A node's supervisors fence by the lease they were started with, so its terms (and with
/// them the leader's grace) stay while it holds jobs.
#[test]
fn edge_terms_do_not_change_under_running_jobs() {
    let mut s = ClusterState::new();
    let terms = edge_terms("edge-1", 60_000, 90_000);
    s.apply(&at(1, register_at(4, "edge-1", Some(terms.clone()))));
    submit(&mut s, spec(1), None);
    let bind = Command::BindJobs {
        binds: vec![Bind {
            job: 1,
            node: 4,
            gpus: vec![0],
        }],
    };
    assert!(matches!(s.apply(&at(2, bind)), ApplyResult::Bound { .. }));
    let changed = refusal(s.apply(&at(
        3,
        register_at(4, "edge-1", Some(edge_terms("edge-1", 30_000, 45_000))),
    )));
    assert!(changed.contains("drain it"), "{changed}");
    assert_eq!(s.nodes[&4].edge, Some(terms.clone()));
    // The same terms re-register fine (every agent restart does).
    assert_eq!(
        s.apply(&at(4, register_at(4, "edge-1", Some(terms)))),
        ApplyResult::Ok
    );
}

fn set_policy(s: &mut ClusterState, settings: SchedulerSettings) -> ApplyResult {
    s.apply(&at(1, Command::SetSchedulerPolicy { settings }))
}

#[test]
fn apply_sets_valid_settings_and_refuses_bad_ones_untouched() {
    let mut s = ClusterState::new();
    assert_eq!(s.scheduler, SchedulerSettings::default());
    let good = SchedulerSettings {
        ordering: scheduler::Ordering::Sjf,
        backfill: scheduler::Backfill::Easy,
        aging_per_hour: 5,
        fairshare_weight: 0,
        usage_half_life_s: 3600,
        preemption: scheduler::Preemption::Reclaim,
        gang_wait_limit_s: 6 * 3600,
        preempt_exempt_s: 600,
    };
    assert_eq!(set_policy(&mut s, good.clone()), ApplyResult::Ok);
    assert_eq!(s.scheduler, good);
    for bad in [
        SchedulerSettings {
            usage_half_life_s: 0,
            ..good.clone()
        },
        SchedulerSettings {
            usage_half_life_s: 400 * 86_400,
            ..good.clone()
        },
        SchedulerSettings {
            aging_per_hour: scheduler::MAX_POINTS + 1,
            ..good.clone()
        },
        SchedulerSettings {
            fairshare_weight: u32::MAX,
            ..good.clone()
        },
        SchedulerSettings {
            gang_wait_limit_s: 59,
            ..good.clone()
        },
        SchedulerSettings {
            gang_wait_limit_s: 31 * 86_400,
            ..good.clone()
        },
        SchedulerSettings {
            preempt_exempt_s: 59,
            ..good.clone()
        },
        SchedulerSettings {
            preempt_exempt_s: 8 * 86_400,
            ..good.clone()
        },
    ] {
        let before = s.clone();
        let result = set_policy(&mut s, bad.clone());
        assert!(
            matches!(
                result,
                ApplyResult::Rejected {
                    reason: Rejection::Invalid { .. }
                }
            ),
            "{bad:?}: {result:?}"
        );
        assert_eq!(s, before, "a rejected policy must change nothing");
    }
}

#[test]
fn free_gpus_are_the_healthy_unheld_ones_by_either_path_and_past_index_64() {
    let mut gpus: Vec<GpuRecord> = (0..70).map(|i| gpu(i, "A100", 81920)).collect();
    gpus[5].healthy = false;
    let mut s = ClusterState::new();
    s.apply(&at(1, register(1, gpus)));
    let mut node = s.nodes[&1].clone();
    node.allocations.insert(3, 7);
    node.allocations.insert(65, 7);
    let free = |n: &gpu_raft_store::NodeRecord| n.free_gpus().map(|g| g.index).collect::<Vec<_>>();
    let expected: Vec<u32> = (0..70).filter(|i| ![3, 5, 65].contains(i)).collect();
    // No partition, quarantine or slice: the allocations are looked at once, as bits.
    assert_eq!(free(&node), expected);
    // A quarantine takes the path that looks at everything: the same, less that GPU.
    node.quarantined.insert(9, "hot".into());
    let expected: Vec<u32> = expected.into_iter().filter(|&i| i != 9).collect();
    assert_eq!(free(&node), expected);
}
