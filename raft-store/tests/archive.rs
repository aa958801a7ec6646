//! The archive store on a real data directory: what `Command::Archive` moves out of the state
//! is found in the archive under the same lock, survives a restart once a snapshot is written,
//! and is stored again, unchanged, when a restart re-applies the entries that moved it.

use gpu_raft_store::archive::{Gaps, GapsFrom};
use gpu_raft_store::retention::{ArchiveOutbox, Retention};
use gpu_raft_store::testing::spec;
use gpu_raft_store::{Command, Entry, LogEntry, RequestMeta, audit};
use openraft::storage::RaftStateMachine;
use openraft::{CommittedLeaderId, EntryPayload, LogId, RaftSnapshotBuilder};

fn entry(index: u64, cmd: Command, meta: Option<RequestMeta>) -> Entry {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(LogEntry {
            proposed_at_ms: index * 1000,
            cmd,
            meta,
            request: None,
        }),
    }
}

fn meta(n: u64) -> Option<RequestMeta> {
    Some(RequestMeta {
        actor: "t1".into(),
        verb: "job.submit".into(),
        object: format!("job/j-{n}"),
        request_id: format!("r{n}"),
        source: "127.0.0.1:5".into(),
    })
}

/// Jobs 1-3 submitted (each audited) and cancelled at 4, 5 and 6 s, then archived at 20 s with
/// a 10 s age and the newest audit entry kept.
fn history() -> Vec<Entry> {
    let mut out = Vec::new();
    for n in 1..=3 {
        let submit = Command::submit(spec(0));
        out.push(entry(n, submit, meta(n)));
    }
    for job in 1..=3 {
        out.push(entry(3 + job, Command::CancelJob { job }, None));
    }
    let retention = Retention {
        finished_max_age_ms: 10_000,
        finished_keep: 100,
        audit_keep: 1,
    };
    out.push(entry(20, Command::Archive { retention }, None));
    out
}

#[tokio::test]
async fn archived_records_are_found_and_survive_a_restart() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let entries = history();
    {
        let (_dir, _log, mut sm) = gpu_raft_store::open(tmp.path()).expect("open");
        sm.apply(entries.clone()).await.expect("apply");
        let reader = sm.reader();
        assert!(
            reader.read(|s| s.jobs.is_empty()),
            "every job left the state"
        );
        let archive = reader.archive();
        let job = archive.job(2).expect("read").expect("archived");
        assert_eq!(job.job.id, 2);
        assert_eq!(job.finished_at_ms(), 5000);
        assert_eq!(job.archived_at_ms, 20_000);
        let finished: Vec<u64> = archive
            .finished_since(4500)
            .map(|a| a.expect("read").job.id)
            .collect();
        assert_eq!(
            finished,
            [2, 3],
            "in the order they finished, from 4.5 s on"
        );
        let audited: Vec<u64> = archive
            .audit(0, u64::MAX)
            .map(|e| e.expect("read").seq)
            .collect();
        assert_eq!(audited, [1, 2]);
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("snapshot");
    }
    let (_dir, _log, sm) = gpu_raft_store::open(tmp.path()).expect("reopen");
    let reader = sm.reader();
    assert!(reader.read(|s| s.jobs.is_empty()));
    assert_eq!(reader.archive().job_count().expect("count"), 3);
    let (base, kept) = reader.read(|s| (s.audit_base.clone(), s.audit.clone()));
    let archived: Vec<_> = reader
        .archive()
        .audit(0, u64::MAX)
        .map(|e| e.expect("read"))
        .collect();
    assert_eq!(
        audit::verify(archived.iter().chain(kept.iter().map(AsRef::as_ref))),
        Ok(3)
    );
    assert_eq!(base.map(|b| b.seq), Some(2));
}

#[tokio::test]
async fn a_restart_before_the_snapshot_archives_the_same_records_again() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let entries = history();
    {
        let (_dir, _log, mut sm) = gpu_raft_store::open(tmp.path()).expect("open");
        sm.apply(entries.clone()).await.expect("apply");
    }
    // No snapshot: the state comes back empty and the log is applied again.
    let (_dir, _log, mut sm) = gpu_raft_store::open(tmp.path()).expect("reopen");
    assert!(
        sm.reader()
            .read(|s| s.jobs.is_empty() && s.audit.is_empty())
    );
    sm.apply(entries).await.expect("apply again");
    let reader = sm.reader();
    assert!(reader.read(|s| s.jobs.is_empty()));
    assert_eq!(
        reader.archive().job_count().expect("count"),
        3,
        "no job twice"
    );
    let audited: Vec<u64> = reader
        .archive()
        .audit(0, u64::MAX)
        .map(|e| e.expect("read").seq)
        .collect();
    assert_eq!(audited, [1, 2]);
}

#[tokio::test]
async fn an_agent_that_installs_a_snapshot_finds_what_it_lacks_from_a_cursor_on() {
    let (a, b) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    let (_dir_a, _log_a, mut sm_a) = gpu_raft_store::open(a.path()).expect("open a");
    sm_a.apply(history()).await.expect("apply");
    let snapshot = sm_a
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .expect("snapshot");

    // B never applied the entries: it installs the snapshot, which carries no archive.
    let (_dir_b, _log_b, mut sm_b) = gpu_raft_store::open(b.path()).expect("open b");
    sm_b.begin_receiving_snapshot().await.expect("begin");
    sm_b.install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .expect("install");
    let reader = sm_b.reader();
    assert!(!reader.archive().is_complete(), "readers are told to wait");
    let gaps = reader.archive_gaps(GapsFrom::default(), 100).expect("gaps");
    assert_eq!(
        gaps,
        Gaps {
            jobs: vec![1, 2, 3],
            audit: Some((0, 2)),
        }
    );
    let from = GapsFrom { jobs: 3, audit: 1 };
    let rest = reader.archive_gaps(from, 100).expect("gaps");
    assert_eq!(
        rest,
        Gaps {
            jobs: vec![3],
            audit: Some((1, 2))
        }
    );
    assert_eq!(
        reader
            .archive_gaps(GapsFrom::default(), 2)
            .expect("gaps")
            .jobs,
        [1, 2],
        "at most the limit"
    );

    // What A holds fills them.
    let a_archive = sm_a.reader().archive().clone();
    let records = ArchiveOutbox {
        jobs: (1..=3)
            .map(|id| a_archive.job(id).expect("read").expect("archived"))
            .collect(),
        audit: a_archive.audit(0, 2).map(|e| e.expect("read")).collect(),
        heads: Vec::new(),
    };
    reader.archive().store(records).expect("store");
    assert!(
        reader
            .archive_gaps(GapsFrom::default(), 100)
            .expect("gaps")
            .is_empty()
    );
}
