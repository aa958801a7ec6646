//! A live run's phase before its command starts (pulling its image), through
//! `ClusterState::apply`: a node reports it for the live run only; its start time is kept while
//! the text changes; a bad text or a report about another run changes nothing; it ends with the
//! run and never outlives it into the next placement; only protocol 7 agents read it.

use gpu_raft_store::testing::{at, register, spec, submit};
use gpu_raft_store::{
    ApplyResult, Bind, ClusterState, Command, MAX_PHASE_LEN, Outcome, PROTOCOL_7, Rejection,
};

fn cluster_with_a_bound_job() -> ClusterState {
    let mut s = ClusterState::new();
    let gpu = gpu_raft_store::testing::gpu(0, "A100-test", "A100", 81920);
    s.apply(&at(1, register(1, vec![gpu])));
    submit(
        &mut s,
        gpu_raft_store::JobSpec {
            max_attempts: 2,
            ..spec(1)
        },
        None,
    );
    let binds = vec![Bind {
        job: 1,
        node: 1,
        gpus: vec![0],
    }];
    s.apply(&at(2, Command::BindJobs { binds }));
    s
}

fn phase(generation: u64, text: Option<&str>) -> Command {
    Command::ReportRunPhase {
        job: 1,
        generation,
        phase: text.map(str::to_owned),
    }
}

fn shown(s: &ClusterState) -> Option<(String, u64)> {
    s.jobs[&1]
        .live_phase()
        .map(|p| (p.text.clone(), p.since_ms))
}

#[test]
fn a_phase_is_the_live_runs_and_keeps_its_start_while_it_changes() {
    let mut s = cluster_with_a_bound_job();
    assert_eq!(shown(&s), None);
    let first = s.apply(&at(10, phase(1, Some("pulling image busybox"))));
    assert_eq!(first, ApplyResult::Ok);
    assert_eq!(shown(&s), Some(("pulling image busybox".into(), 10)));
    s.apply(&at(
        5_000,
        phase(1, Some("pulling image busybox: copying layers (2)")),
    ));
    assert_eq!(
        shown(&s),
        Some(("pulling image busybox: copying layers (2)".into(), 10)),
        "the phase began at 10 ms"
    );
    assert_eq!(s.apply(&at(6_000, phase(1, None))), ApplyResult::Ok);
    assert_eq!(shown(&s), None, "over");
    s.apply(&at(7_000, phase(1, Some("pulling image again"))));
    assert_eq!(shown(&s), Some(("pulling image again".into(), 7_000)));
}

#[test]
fn bad_or_stale_phases_change_nothing() {
    let mut s = cluster_with_a_bound_job();
    s.apply(&at(10, phase(1, Some("pulling image busybox"))));
    let before = s.jobs[&1].clone();
    let long = "x".repeat(MAX_PHASE_LEN + 1);
    for (text, generation) in [
        (Some(long.as_str()), 1),
        (Some("two\nlines"), 1),
        (Some(""), 1),
        (Some("an older run"), 0),
        (Some("a later run"), 2),
    ] {
        let r = s.apply(&at(20, phase(generation, text)));
        assert!(
            matches!(
                r,
                ApplyResult::Rejected {
                    reason: Rejection::Invalid { .. } | Rejection::Stale { .. }
                }
            ),
            "{text:?} g{generation}: {r:?}"
        );
        assert_eq!(s.jobs[&1], before, "{text:?} g{generation}: untouched");
    }
    let unknown = Command::ReportRunPhase {
        job: 9,
        generation: 1,
        phase: Some("x".into()),
    };
    assert!(matches!(
        s.apply(&at(20, unknown)),
        ApplyResult::Rejected {
            reason: Rejection::UnknownJob { job: 9 }
        }
    ));
}

#[test]
fn the_phase_ends_with_its_run_and_never_reaches_the_next_placement() {
    let mut s = cluster_with_a_bound_job();
    s.apply(&at(10, phase(1, Some("pulling image busybox"))));
    let lost = Command::JobFinished {
        job: 1,
        generation: 1,
        outcome: Outcome::Lost {
            message: "gone".into(),
        },
    };
    assert_eq!(s.apply(&at(20, lost)), ApplyResult::Ok);
    assert_eq!(shown(&s), None, "requeued: no phase");
    assert_eq!(s.jobs[&1].phase, None, "not kept in the state either");
    let binds = vec![Bind {
        job: 1,
        node: 1,
        gpus: vec![0],
    }];
    s.apply(&at(30, Command::BindJobs { binds }));
    assert_eq!(s.jobs[&1].generation, 2);
    assert_eq!(
        s.apply(&at(40, phase(1, Some("late report of run 1")))),
        ApplyResult::Rejected {
            reason: Rejection::Stale {
                job: 1,
                generation: 1,
                current: 2,
                state: gpu_raft_store::JobState::Bound,
            }
        }
    );
    assert_eq!(shown(&s), None);
}

#[test]
fn only_protocol_7_agents_read_a_phase() {
    assert_eq!(phase(1, Some("x")).protocol(), PROTOCOL_7);
    assert_eq!(phase(1, None).protocol(), PROTOCOL_7);
    assert_eq!(
        phase(3, Some("pulling image busybox")).to_string(),
        "phase j-1 g3: pulling image busybox"
    );
}
