//! `Command::Archive`: which finished jobs and audit entries leave the state, what stays behind
//! for them (idempotency keys, the chain's base), and that replicas move the same records.

use gpu_raft_store::audit::{self, ChainBase};
use gpu_raft_store::energy::EnergyReport;
use gpu_raft_store::retention::Retention;
use gpu_raft_store::testing::{at, register, spec};
use gpu_raft_store::{
    ApplyResult, ClusterState, Command, IDEMPOTENCY_WINDOW_MS, JobState, LogEntry, Rejection,
    RequestMeta, digest,
};

const MINUTE: u64 = 60_000;

fn retention(max_age_ms: u64, keep: u64, audit_keep: u64) -> Retention {
    Retention {
        finished_max_age_ms: max_age_ms,
        finished_keep: keep,
        audit_keep,
    }
}

fn submit_at(s: &mut ClusterState, ms: u64, key: Option<&str>) -> u64 {
    let cmd = Command::SubmitJob {
        spec: Box::new(spec(0)),
        idempotency_key: key.map(Into::into),
        hold: false,
        owner: None,
    };
    match s.apply(&at(ms, cmd)) {
        ApplyResult::JobSubmitted { job, .. } => job,
        other => panic!("submit: {other:?}"),
    }
}

fn cancel_at(s: &mut ClusterState, ms: u64, job: u64) {
    assert_eq!(
        s.apply(&at(ms, Command::CancelJob { job })),
        ApplyResult::Ok
    );
}

/// Jobs 1-3 finished at 10, 20 and 30 minutes, job 4 still pending; job 1 used energy and was
/// submitted with key `k`.
fn history() -> ClusterState {
    let mut s = ClusterState::new();
    s.apply(&at(1, register(1, Vec::new())));
    for (i, key) in [Some("k"), None, None, None].into_iter().enumerate() {
        submit_at(&mut s, 1 + i as u64, key);
    }
    for job in 1..=3 {
        cancel_at(&mut s, job * 10 * MINUTE, job);
    }
    let report = EnergyReport {
        node: 1,
        seq: 1,
        gpu_mj: 9,
        green_capped_ms: 0,
        jobs: vec![(1, 7)],
    };
    s.apply(&at(31 * MINUTE, Command::RecordEnergy { report }));
    s
}

fn archive(s: &mut ClusterState, ms: u64, r: Retention) {
    assert_eq!(
        s.apply(&at(ms, Command::Archive { retention: r })),
        ApplyResult::Ok
    );
}

#[test]
fn finished_jobs_leave_by_age_and_by_count_the_earliest_finished_first() {
    // By age: at 35 minutes, those finished 20 minutes ago or more.
    let mut s = history();
    archive(&mut s, 35 * MINUTE, retention(20 * MINUTE, 100, 100));
    let moved: Vec<u64> = s.archive_outbox.jobs.iter().map(|a| a.job.id).collect();
    assert_eq!(moved, [1]);
    assert_eq!(s.jobs.keys().copied().collect::<Vec<_>>(), [2, 3, 4]);
    assert_eq!(
        s.archive_outbox.jobs[0].energy_mj, 7,
        "its energy left with it"
    );
    assert!(!s.energy.by_job.contains_key(&1));

    // By count: keep the newest finished one; the pending job is never archived.
    let mut s = history();
    archive(&mut s, 35 * MINUTE, retention(24 * 60 * MINUTE, 1, 100));
    let moved: Vec<u64> = s.archive_outbox.jobs.iter().map(|a| a.job.id).collect();
    assert_eq!(moved, [1, 2]);
    assert_eq!(s.jobs.keys().copied().collect::<Vec<_>>(), [3, 4]);
    assert_eq!(s.jobs[&4].state, JobState::Pending);
    assert!(!s.has_archivable(&retention(24 * 60 * MINUTE, 1, 100), 35 * MINUTE));
}

#[test]
fn replicas_archive_the_same_records_at_the_same_entry() {
    let entries: Vec<LogEntry> = vec![at(
        40 * MINUTE,
        Command::Archive {
            retention: retention(15 * MINUTE, 100, 2),
        },
    )];
    let (mut a, mut b) = (history(), history());
    let mut b_copy = b.clone();
    for e in &entries {
        a.apply(e);
        b.apply(e);
        b_copy.apply(e);
    }
    assert_eq!(digest::state_digest(&a), digest::state_digest(&b));
    assert_eq!(digest::state_digest(&a), digest::state_digest(&b_copy));
    let ids = |s: &ClusterState| {
        s.archive_outbox
            .jobs
            .iter()
            .map(|a| a.job.id)
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&a), [1, 2]);
    assert_eq!(ids(&a), ids(&b));
    // A state read back from its snapshot encoding digests the same: the outbox is local.
    let decoded: ClusterState =
        serde_json::from_slice(&digest::canonical_bytes(&a)).expect("decodes");
    assert_eq!(digest::state_digest(&decoded), digest::state_digest(&a));
}

#[test]
fn an_archived_jobs_key_still_answers_retries_until_it_expires() {
    let mut s = history();
    archive(&mut s, 35 * MINUTE, retention(20 * MINUTE, 100, 100));
    assert!(!s.jobs.contains_key(&1) && !s.idempotency.contains_key("default/k"));
    let retry = Command::SubmitJob {
        spec: Box::new(spec(0)),
        idempotency_key: Some("k".into()),
        hold: false,
        owner: None,
    };
    assert_eq!(
        s.apply(&at(36 * MINUTE, retry.clone())),
        ApplyResult::JobSubmitted {
            job: 1,
            existing: true
        }
    );
    let other = Command::SubmitJob {
        spec: Box::new(spec(1)),
        idempotency_key: Some("k".into()),
        hold: false,
        owner: None,
    };
    let before = s.clone();
    match s.apply(&at(36 * MINUTE, other)) {
        ApplyResult::Rejected {
            reason: Rejection::IdempotencyConflict { job: 1, .. },
        } => {}
        r => panic!("a different spec under the key: {r:?}"),
    }
    assert_eq!(s, before);

    // Past the window the key is forgotten, and the same submission makes a new job.
    let later = 1 + IDEMPOTENCY_WINDOW_MS + 1;
    s.apply(&at(later, Command::ForgetExpired));
    assert!(s.archived_keys.is_empty());
    assert!(matches!(
        s.apply(&at(later, retry)),
        ApplyResult::JobSubmitted {
            existing: false,
            ..
        }
    ));
}

fn meta(n: u64) -> RequestMeta {
    RequestMeta {
        actor: "t1".into(),
        verb: "node.label".into(),
        object: format!("node/n{n}"),
        request_id: format!("r{n}"),
        source: "127.0.0.1:5".into(),
    }
}

#[test]
fn the_audit_chain_continues_from_its_archived_part() {
    let mut s = ClusterState::new();
    for n in 1..=5 {
        s.append_audit(n, &meta(n), "ok".into());
    }
    let head = gpu_raft_store::SignedHead {
        seq: 2,
        hash: s.audit[1].hash.clone(),
        time_ms: 0,
        key_id: "ab".repeat(32),
        signature: "3045".into(),
    };
    assert_eq!(
        s.apply(&at(6, Command::SignAuditHead { head })),
        ApplyResult::Ok
    );
    archive(&mut s, 7, retention(MINUTE, 100, 2));
    assert_eq!(
        s.audit.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [4, 5],
        "the newest two stay"
    );
    let outbox: Vec<u64> = s.archive_outbox.audit.iter().map(|e| e.seq).collect();
    assert_eq!(outbox, [1, 2, 3]);
    assert_eq!(
        s.archive_outbox.heads.len(),
        1,
        "the head of entry 2 left too"
    );
    assert!(s.audit_heads.is_empty());
    assert_eq!(
        s.audit_base,
        Some(ChainBase {
            seq: 3,
            hash: s.archive_outbox.audit[2].hash.clone()
        })
    );

    // New entries continue the chain: numbered after the archived ones, linked to the last.
    s.append_audit(8, &meta(6), "ok".into());
    assert_eq!(s.audit.last().map(|e| e.seq), Some(6));
    assert_eq!(audit::verify_from(s.audit_base.as_ref(), &s.audit), Ok(3));
    let whole: Vec<_> = (s.archive_outbox.audit.iter())
        .chain(s.audit.iter().map(AsRef::as_ref))
        .collect();
    assert_eq!(audit::verify(whole), Ok(6));
    assert_eq!(s.audit_entry(2), None, "archived");
    assert_eq!(s.audit_entry(5).map(|e| e.seq), Some(5));
}
