//! Alerts through `apply`: raising deduplicates, quarantine takes only that GPU out of
//! scheduling, migrate also evicts its job (requeued without using an attempt), resolving
//! returns the GPU to service only when no other quarantining alert holds it, and bad rules
//! are refused with nothing changed.

use gpu_raft_store::alert::{
    AlertRule, Condition, KEEP_RESOLVED, Metric, Number, Remediation, Severity, effective_rules,
};
use gpu_raft_store::testing::{at, register};
use gpu_raft_store::{
    ApplyResult, Bind, ClusterState, Command, GpuRecord, JobSpec, JobState, Outcome,
};

fn gpu(index: u32) -> GpuRecord {
    gpu_raft_store::testing::gpu(index, "A100-80GB", "A100", 81_920)
}

/// Node 1 with two GPUs and job 1 running on GPU 0.
fn cluster() -> ClusterState {
    let mut s = ClusterState::new();
    s.apply(&at(1, register(1, vec![gpu(0), gpu(1)])));
    let spec: JobSpec = serde_json::from_value(serde_json::json!({
        "name": "train", "command": ["true"], "gpus": 1, "max_attempts": 1
    }))
    .expect("a job spec");
    s.apply(&at(2, Command::submit(spec)));
    let bound = s.apply(&at(
        3,
        Command::BindJobs {
            binds: vec![Bind {
                job: 1,
                node: 1,
                gpus: vec![0],
            }],
        },
    ));
    assert!(
        matches!(bound, ApplyResult::Bound { ref bound, .. } if bound == &[1]),
        "{bound:?}"
    );
    s.apply(&at(
        4,
        Command::JobStarted {
            job: 1,
            generation: 1,
        },
    ));
    s
}

fn raise(rule: &str, gpu: u32, remediation: Remediation) -> Command {
    Command::RaiseAlert {
        node: 1,
        gpu,
        rule: rule.into(),
        severity: Severity::Critical,
        remediation,
        message: "XID 79 (fallen off the bus)".into(),
    }
}

fn resolve(rule: &str, gpu: u32) -> Command {
    Command::ResolveAlert {
        node: 1,
        gpu,
        rule: rule.into(),
    }
}

fn free(s: &ClusterState) -> Vec<u32> {
    s.nodes[&1].free_gpus().map(|g| g.index).collect()
}

#[test]
fn raising_twice_opens_one_alert() {
    let mut s = cluster();
    let first = s.apply(&at(10, raise("gpu-overheat", 1, Remediation::None)));
    let again = s.apply(&at(11, raise("gpu-overheat", 1, Remediation::None)));
    assert_eq!(
        first,
        ApplyResult::AlertRaised {
            alert: 1,
            existing: false
        }
    );
    assert_eq!(
        again,
        ApplyResult::AlertRaised {
            alert: 1,
            existing: true
        }
    );
    assert_eq!(s.alerts.len(), 1);
    assert_eq!(free(&s), [1], "no remediation: the GPU stays in service");
    let other = s.apply(&at(12, raise("gpu-overheat", 0, Remediation::None)));
    assert_eq!(
        other,
        ApplyResult::AlertRaised {
            alert: 2,
            existing: false
        }
    );
}

#[test]
fn migrate_quarantines_the_gpu_and_evicts_its_job_which_keeps_its_attempt() {
    let mut s = cluster();
    s.apply(&at(10, raise("gpu-failing", 0, Remediation::Migrate)));
    assert_eq!(
        s.nodes[&1].quarantined.get(&0).map(String::as_str),
        Some("gpu-failing")
    );
    assert_eq!(free(&s), [1], "only GPU 0 is out; the node keeps working");
    assert!(s.jobs[&1].evict_requested);
    assert_eq!(s.alerts[&1].migrated_job, Some(1));

    // The executor stops it; it is requeued without using up its one attempt.
    s.apply(&at(
        11,
        Command::JobFinished {
            job: 1,
            generation: 1,
            outcome: Outcome::Evicted,
        },
    ));
    assert_eq!(s.jobs[&1].state, JobState::Pending);
    // The scheduler may not put it back on the quarantined GPU.
    let back = s.apply(&at(
        12,
        Command::BindJobs {
            binds: vec![Bind {
                job: 1,
                node: 1,
                gpus: vec![0],
            }],
        },
    ));
    match back {
        ApplyResult::Bound { bound, rejected } => {
            assert!(bound.is_empty());
            assert!(
                rejected[0].1.contains("quarantined (gpu-failing)"),
                "{rejected:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    let elsewhere = s.apply(&at(
        13,
        Command::BindJobs {
            binds: vec![Bind {
                job: 1,
                node: 1,
                gpus: vec![1],
            }],
        },
    ));
    assert!(matches!(elsewhere, ApplyResult::Bound { ref bound, .. } if bound == &[1]));
}

#[test]
fn quarantine_leaves_the_running_job_alone_and_resolving_returns_the_gpu() {
    let mut s = cluster();
    s.apply(&at(10, raise("flaky", 0, Remediation::Quarantine)));
    s.apply(&at(11, raise("dying", 0, Remediation::Migrate)));
    assert!(s.jobs[&1].evict_requested, "the second alert migrates");
    assert_eq!(free(&s), [1]);

    assert_eq!(
        s.apply(&at(20, resolve("flaky", 0))),
        ApplyResult::AlertResolved { alert: 1 }
    );
    assert!(
        s.nodes[&1].quarantined.contains_key(&0),
        "still held by the open 'dying' alert"
    );
    assert_eq!(
        s.apply(&at(21, resolve("dying", 0))),
        ApplyResult::AlertResolved { alert: 2 }
    );
    assert!(s.nodes[&1].quarantined.is_empty(), "back in service");
    assert_eq!(s.alerts[&2].resolved_at_ms, Some(21));
    assert_eq!(
        s.apply(&at(22, resolve("dying", 0))),
        ApplyResult::Ok,
        "idempotent"
    );
}

#[test]
fn a_long_message_is_cut_on_a_character_boundary() {
    let mut s = cluster();
    let message = format!("a{}", "é".repeat(1000));
    let raised = s.apply(&at(
        10,
        Command::RaiseAlert {
            node: 1,
            gpu: 1,
            rule: "long".into(),
            severity: Severity::Warning,
            remediation: Remediation::None,
            message,
        },
    ));
    assert_eq!(
        raised,
        ApplyResult::AlertRaised {
            alert: 1,
            existing: false
        }
    );
    let kept = &s.alerts[&1].message;
    assert_eq!(kept.len(), 1023, "1 + 511 two-byte characters");
    assert!(kept.ends_with('é'));
}

#[test]
fn resolved_alerts_are_bounded() {
    let mut s = cluster();
    for t in 0..(KEEP_RESOLVED as u64 + 10) {
        s.apply(&at(10 + 2 * t, raise("blip", 1, Remediation::None)));
        s.apply(&at(11 + 2 * t, resolve("blip", 1)));
    }
    assert_eq!(s.alerts.len(), KEEP_RESOLVED);
    s.apply(&at(1_000_000, raise("blip", 1, Remediation::None)));
    assert_eq!(s.alerts.values().filter(|a| a.is_open()).count(), 1);
}

#[test]
fn bad_raises_and_rules_change_nothing() {
    let mut s = cluster();
    let before = s.clone();
    for bad in [
        Command::RaiseAlert {
            node: 9,
            gpu: 0,
            rule: "x".into(),
            severity: Severity::Warning,
            remediation: Remediation::Migrate,
            message: String::new(),
        },
        raise("x", 7, Remediation::Migrate),
        raise("../bad\nname", 0, Remediation::Migrate),
        Command::DeleteAlertRule {
            name: "nope".into(),
        },
    ] {
        let result = s.apply(&at(10, bad.clone()));
        assert!(
            matches!(result, ApplyResult::Rejected { .. }),
            "{bad}: {result:?}"
        );
    }
    let rule = |condition, remediation| AlertRule {
        name: "hot".into(),
        condition,
        severity: Severity::Warning,
        remediation,
        clear_after_ms: 1000,
        enabled: true,
    };
    let above = |threshold: f64, for_ms| Condition::Above {
        metric: Metric::TemperatureC,
        threshold: Number(threshold),
        for_ms,
    };
    for (bad, why) in [
        (rule(above(f64::NAN, 1000), Remediation::None), "finite"),
        (
            rule(above(f64::INFINITY, 1000), Remediation::None),
            "finite",
        ),
        (
            rule(above(85.0, 2 * 86_400_000), Remediation::None),
            "one day",
        ),
        (
            rule(above(85.0, 1000), Remediation::Throttle { power_pct: 0 }),
            "10-100%",
        ),
        (
            rule(above(85.0, 1000), Remediation::Throttle { power_pct: 101 }),
            "10-100%",
        ),
        (
            rule(
                Condition::Rate {
                    metric: Metric::EccSingleBit,
                    per_minute: Number(-1.0),
                    window_ms: 60_000,
                },
                Remediation::None,
            ),
            "negative",
        ),
        (
            rule(
                Condition::Predict {
                    metric: Metric::TemperatureC,
                    limit: Number(90.0),
                    window_ms: 10,
                    within_ms: 1000,
                },
                Remediation::None,
            ),
            "window",
        ),
    ] {
        let result = s.apply(&at(10, Command::SetAlertRule { rule: bad.clone() }));
        match result {
            ApplyResult::Rejected { reason } => {
                assert!(reason.to_string().contains(why), "{reason} lacks {why:?}");
            }
            other => panic!("{bad:?} was accepted: {other:?}"),
        }
    }
    assert_eq!(s, before, "nothing changed");
}

#[test]
fn replicated_rules_override_configured_and_builtin_ones_by_name() {
    let mut s = cluster();
    let tuned = AlertRule {
        name: "gpu-overheat".into(),
        condition: Condition::Above {
            metric: Metric::TemperatureC,
            threshold: Number(80.0),
            for_ms: 10_000,
        },
        severity: Severity::Critical,
        remediation: Remediation::Throttle { power_pct: 50 },
        clear_after_ms: 5_000,
        enabled: true,
    };
    assert_eq!(
        s.apply(&at(
            10,
            Command::SetAlertRule {
                rule: tuned.clone()
            }
        )),
        ApplyResult::Ok
    );
    let off = AlertRule {
        name: "gpu-memory-will-fill".into(),
        enabled: false,
        ..tuned.clone()
    };
    s.apply(&at(11, Command::SetAlertRule { rule: off }));
    let rules = effective_rules(&[], s.alert_rules.values());
    let names: Vec<&str> = rules.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["gpu-failing", "gpu-overheat"]);
    assert_eq!(rules[1], tuned);
    s.apply(&at(
        12,
        Command::DeleteAlertRule {
            name: "gpu-overheat".into(),
        },
    ));
    let rules = effective_rules(&[], s.alert_rules.values());
    assert!(matches!(
        rules
            .iter()
            .find(|r| r.name == "gpu-overheat")
            .map(|r| &r.condition),
        Some(Condition::Above {
            threshold: Number(85.0),
            ..
        })
    ));
}
