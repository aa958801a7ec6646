//! A data directory made by an earlier build opens with this one, its log replays to the state
//! it held, and this build's commands apply on top of it.
//!
//! `fixtures/datadir-f7e9f39/` is the data directory of a one-agent `gpu-agent dev` mesh run by
//! the release build of commit f7e9f39 (data format 1, internal protocol 9), stopped with
//! Ctrl-C after: five jobs submitted (j-1 with idempotency key `k1` and j-2 succeeded, j-3
//! failed, j-4 pending for 64 GPUs, j-5 cancelled), a user token created for tenant `research`,
//! node n1 labelled `rack=r7`, and the audit head signed. Its files (the `FORMAT` line and the
//! sled files under `raft/`) are committed as they were written; the test works on a copy.

//!
//! `fixtures/datadir-c22f961/` is the data directory (data format 2: JSON records, a JSON
//! snapshot) of a one-agent `gpu-agent dev` mesh run by the debug build of commit c22f961
//! (internal protocol 15): j-1 (key `k1`) succeeded, j-2 failed, j-3 pending for 64 GPUs, j-4
//! held and cancelled, the array j-5[0-2] succeeded, j-8 (after ok:j-1, label team=vision)
//! succeeded, tenant `research` created and node n1 labelled `rack=r7`; the agent was then
//! restarted with `raft.snapshot_every = 1` (a snapshot at index 38), ran j-9 for `research`,
//! and restarted again with the default, and j-10 was submitted held. Its `FORMAT`, `raft/`,
//! `snapshot` and `archive/` are committed as written (not its TLS keys).

use std::path::Path;

use gpu_raft_store::retention::Retention;
use gpu_raft_store::testing::{at, register};
use gpu_raft_store::{
    ClusterState, Command, Entry, JobState, KvEngine, LogEntry, PROTOCOL_16, SledEngine, Space,
    audit, codec,
};
use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::{EntryPayload, LogId, RaftLogReader, RaftSnapshotBuilder};

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
        audit::verify(archived.iter().chain(kept.iter().map(AsRef::as_ref))),
        Ok(state.audit.len())
    );
}

/// Open a copy of the c22f961 fixture (or `dir`, already a copy) and replay it as openraft does
/// on start: the snapshot, then the committed log behind it.
async fn open_and_replay(
    dir: &Path,
) -> (
    gpu_raft_store::DataDir,
    gpu_raft_store::LogStore,
    gpu_raft_store::StateMachineStore,
) {
    let (data_dir, mut log, mut sm) = gpu_raft_store::open(dir).expect("opens");
    let (applied, _) = sm.applied_state().await.expect("applied");
    let committed = log
        .read_committed()
        .await
        .expect("committed")
        .expect("the fixture committed entries");
    // What this test applied past the log (it appended nothing) is already in the snapshot.
    let from = applied.map_or(0, |l| l.index + 1);
    if from <= committed.index {
        let entries = log
            .try_get_log_entries(from..=committed.index)
            .await
            .expect("the log reads");
        assert_eq!(entries.last().map(|e| e.log_id), Some(committed));
        sm.apply(entries).await.expect("replays");
    }
    (data_dir, log, sm)
}

fn check_c22f961_state(state: &ClusterState) {
    let jobs: Vec<(u64, JobState)> = state.jobs.values().map(|j| (j.id, j.state)).collect();
    use JobState::*;
    assert_eq!(
        jobs,
        [
            (1, Succeeded),
            (2, Failed),
            (3, Pending),
            (4, Cancelled),
            (5, Succeeded),
            (6, Succeeded),
            (7, Succeeded),
            (8, Succeeded),
            (9, Succeeded),
            (10, Pending),
        ]
    );
    assert_eq!(state.idempotency.get("default/k1"), Some(&1));
    assert_eq!(state.jobs[&9].spec.tenant, "research");
    assert!(state.jobs[&10].held);
    assert!(state.tenants.contains_key("research"));
    let labels = state.nodes[&1].effective_labels();
    assert_eq!(labels.get("rack").map(String::as_str), Some("r7"));
    assert_eq!(audit::verify(&state.audit), Ok(state.audit.len()));
}

/// Every record of the log store (log entries, vote, committed, last purged) is MessagePack.
fn assert_all_packed(raft_dir: &Path) -> usize {
    let engine = SledEngine::open(raft_dir).expect("sled");
    let rows = engine
        .range(Space::Log, &[], &u64::MAX.to_be_bytes())
        .expect("log");
    for (key, bytes) in &rows {
        assert!(!codec::is_json(bytes), "log entry {key:?} is still JSON");
    }
    for key in [&b"vote"[..], b"committed"] {
        let bytes = engine
            .get(Space::Meta, key)
            .expect("meta")
            .expect("present");
        assert!(!codec::is_json(&bytes), "{key:?} is still JSON");
    }
    rows.len()
}

#[tokio::test]
async fn a_data_directory_of_c22f961_is_repacked_and_keeps_its_state() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/datadir-c22f961");
    let tmp = tempfile::tempdir().expect("tempdir");
    copy_dir(&fixture, tmp.path());
    let snapshot = std::fs::read(tmp.path().join("snapshot")).expect("snapshot");
    let payload = &snapshot[snapshot.iter().position(|&b| b == b'\n').expect("header") + 1..];
    assert!(
        codec::is_json(payload),
        "the fixture's snapshot is format 2's JSON"
    );

    let (dir, log, mut sm) = open_and_replay(tmp.path()).await;
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("FORMAT")).expect("format"),
        format!("gpumesh-data {}\n", gpu_raft_store::DATA_FORMAT_VERSION),
        "migrated to this build's format"
    );
    check_c22f961_state(&sm.reader().read(ClusterState::clone));

    // The agent registers again with this build's protocol; the next snapshot is packed.
    let (applied, _) = sm.applied_state().await.expect("applied");
    let next = applied.expect("applied").index + 1;
    let mut again = register(1, vec![]);
    if let Command::RegisterNode { protocol, .. } = &mut again {
        *protocol = PROTOCOL_16;
    }
    let entry = Entry {
        log_id: LogId::new(applied.expect("applied").leader_id, next),
        payload: EntryPayload::Normal(at(u64::MAX / 2, again)),
    };
    sm.apply(vec![entry]).await.expect("applies");
    let built = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .expect("snapshot");
    let packed = built.snapshot.into_inner();
    assert!(!codec::is_json(&packed), "every member speaks 16: packed");
    assert!(
        packed.len() < payload.len(),
        "{} bytes packed against {} as JSON",
        packed.len(),
        payload.len()
    );
    drop((dir, log, sm));
    let entries = assert_all_packed(&tmp.path().join("raft"));
    assert!(
        entries > 30,
        "the log behind and after the snapshot: {entries} entries"
    );

    // A crash in the middle of the migration left a format-2 directory with JSON and
    // MessagePack records mixed: the next open finishes it.
    std::fs::write(tmp.path().join("FORMAT"), "gpumesh-data 2\n").expect("format 2");
    {
        let engine = SledEngine::open(&tmp.path().join("raft")).expect("sled");
        let (key, bytes) = engine.last(Space::Log).expect("log").expect("an entry");
        let entry: Entry = codec::from_slice(&bytes).expect("packed");
        let json = serde_json::to_vec(&entry).expect("json");
        engine
            .write(Space::Log, vec![(key, Some(json))])
            .expect("write");
        engine.flush().expect("flush");
    }
    let (dir, log, sm) = open_and_replay(tmp.path()).await;
    let state = sm.reader().read(ClusterState::clone);
    check_c22f961_state(&state);
    assert_eq!(state.nodes[&1].protocol, PROTOCOL_16);
    drop((dir, log, sm));
    assert_all_packed(&tmp.path().join("raft"));
}
