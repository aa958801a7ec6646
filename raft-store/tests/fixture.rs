//! A data directory made by an earlier build opens with this one, its log replays to the state
//! it held, and this build's commands apply on top of it.
//!
//! `fixtures/datadir-f7e9f39/` is the data directory of a one-agent `gpu-agent dev` mesh run by
//! the release build of commit f7e9f39 (data format 1, internal protocol 9), stopped with
//! Ctrl-C after: five jobs submitted (j-1 with idempotency key `k1` and j-2 succeeded, j-3
//! failed, j-4 pending for 64 GPUs, j-5 cancelled), a user token created for tenant `research`,
//! node n1 labelled `rack=r7`, and the audit head signed. Its files (the `FORMAT` line and the
//! sled files under `raft/`) are committed as they were written; the test works on a copy.

use std::path::Path;

use gpu_raft_store::retention::Retention;
use gpu_raft_store::{ClusterState, Command, Entry, JobState, LogEntry, audit};
use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::{EntryPayload, LogId, RaftLogReader};

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create");
    for entry in std::fs::read_dir(from).expect("read fixture") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copy");
        }
    }
}

#[tokio::test]
async fn a_data_directory_of_f7e9f39_replays_and_takes_this_builds_commands() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/datadir-f7e9f39");
    let tmp = tempfile::tempdir().expect("tempdir");
    copy_dir(&fixture, tmp.path());
    let (_dir, mut log, mut sm) = gpu_raft_store::open(tmp.path()).expect("opens");
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("FORMAT")).expect("format"),
        format!("gpumesh-data {}\n", gpu_raft_store::DATA_FORMAT_VERSION),
        "migrated to this build's format"
    );

    // What openraft does on start: apply the committed log on top of the (absent) snapshot.
    let committed = log
        .read_committed()
        .await
        .expect("committed")
        .expect("the fixture committed entries");
    let entries = log
        .try_get_log_entries(0..=committed.index)
        .await
        .expect("log");
    assert_eq!(
        entries.last().map(|e| e.log_id),
        Some(committed),
        "the log holds every committed entry"
    );
    sm.apply(entries).await.expect("replays");

    let reader = sm.reader();
    let state: ClusterState = reader.read(ClusterState::clone);
    let states: Vec<(u64, JobState)> = state.jobs.values().map(|j| (j.id, j.state)).collect();
    assert_eq!(
        states,
        [
            (1, JobState::Succeeded),
            (2, JobState::Succeeded),
            (3, JobState::Failed),
            (4, JobState::Pending),
            (5, JobState::Cancelled),
        ]
    );
    assert_eq!(state.idempotency.get("default/k1"), Some(&1));
    assert!(
        state
            .tokens
            .values()
            .any(|t| t.tenant.as_deref() == Some("research"))
    );
    assert_eq!(
        state.nodes[&1]
            .effective_labels()
            .get("rack")
            .map(String::as_str),
        Some("r7")
    );
    assert!(state.audit_base.is_none() && !state.audit_heads.is_empty());
    assert_eq!(audit::verify(&state.audit), Ok(state.audit.len()));

    // This build's retention on the old state: every finished job leaves, the pending one
    // stays, the key still answers, and the chain goes on from what was archived.
    let next = LogId::new(committed.leader_id, committed.index + 1);
    let retention = Retention {
        finished_max_age_ms: 1,
        finished_keep: 0,
        audit_keep: 2,
    };
    let archive = Entry {
        log_id: next,
        payload: EntryPayload::Normal(LogEntry {
            proposed_at_ms: u64::MAX / 2,
            cmd: Command::Archive { retention },
            meta: None,
            request: None,
        }),
    };
    sm.apply(vec![archive]).await.expect("applies");
    let (jobs, kept, base, keys) = reader.read(|s| {
        let jobs: Vec<u64> = s.jobs.keys().copied().collect();
        (
            jobs,
            s.audit.clone(),
            s.audit_base.clone(),
            s.archived_keys.clone(),
        )
    });
    assert_eq!(jobs, [4]);
    assert_eq!(keys.get("default/k1").map(|k| k.job), Some(1));
    for id in [1, 2, 3, 5] {
        let archived = reader.archive().job(id).expect("read").expect("archived");
        assert_eq!(archived.job.id, id);
    }
    let archived: Vec<_> = (reader.archive().audit(0, u64::MAX))
        .map(|e| e.expect("read"))
        .collect();
    assert_eq!(base.map(|b| b.seq), archived.last().map(|e| e.seq));
    assert_eq!(
        audit::verify(archived.iter().chain(&kept)),
        Ok(state.audit.len())
    );
}
