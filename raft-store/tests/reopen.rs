//! Durability across drop + reopen: vote, log, committed index, state machine and snapshot all
//! come back exactly; bad directories are refused with a reason.

use gpu_raft_store::testing::register_entry as register;
use gpu_raft_store::{ApplyResult, Entry, OpenError};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{
    CommittedLeaderId, EntryPayload, LogId, Membership, RaftLogReader, RaftSnapshotBuilder, Vote,
};

fn log_id(term: u64, index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn membership(index: u64) -> Entry {
    let m = Membership::new(vec![[1u64].into()], None);
    Entry {
        log_id: log_id(1, index),
        payload: EntryPayload::Membership(m),
    }
}

#[tokio::test]
async fn everything_survives_reopen() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let entries: Vec<Entry> = std::iter::once(membership(1))
        .chain((2..=20).map(register))
        .collect();
    {
        let (_dir, mut log, mut sm) = gpu_raft_store::open(tmp.path()).expect("open");
        log.save_vote(&Vote::new_committed(1, 1))
            .await
            .expect("vote");
        log.blocking_append(entries.clone()).await.expect("append");
        log.save_committed(Some(log_id(1, 20)))
            .await
            .expect("committed");
        let results = sm.apply(entries[..10].to_vec()).await.expect("apply");
        assert!(results.iter().all(|r| *r == ApplyResult::Ok));
        let mut builder = sm.get_snapshot_builder().await;
        builder.build_snapshot().await.expect("snapshot");
        sm.apply(entries[10..].to_vec()).await.expect("apply rest");
        log.purge(log_id(1, 5)).await.expect("purge");
    }
    let (_dir, mut log, mut sm) = gpu_raft_store::open(tmp.path()).expect("reopen");
    assert_eq!(
        log.read_vote().await.expect("vote"),
        Some(Vote::new_committed(1, 1))
    );
    assert_eq!(
        log.read_committed().await.expect("committed"),
        Some(log_id(1, 20))
    );
    let state = log.get_log_state().await.expect("log state");
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 5)));
    assert_eq!(state.last_log_id, Some(log_id(1, 20)));
    let kept = log.try_get_log_entries(0..=20).await.expect("entries");
    assert_eq!(
        kept,
        entries[5..].to_vec(),
        "purged prefix gone, the rest intact and in order"
    );

    // The state machine comes back from the snapshot (taken after entry 10); openraft replays the
    // rest from the log up to the committed index.
    let (applied, members) = sm.applied_state().await.expect("applied");
    assert_eq!(applied, Some(log_id(1, 10)));
    assert_eq!(members.log_id(), &Some(log_id(1, 1)));
    let nodes: Vec<u64> = sm.reader().read(|s| s.nodes.keys().copied().collect());
    assert_eq!(nodes, (2..=10).collect::<Vec<_>>());
    let snapshot = sm
        .get_current_snapshot()
        .await
        .expect("read")
        .expect("present");
    assert_eq!(snapshot.meta.last_log_id, Some(log_id(1, 10)));
}

#[tokio::test]
async fn truncate_is_durable() {
    let tmp = tempfile::tempdir().expect("tempdir");
    {
        let (_dir, mut log, _) = gpu_raft_store::open(tmp.path()).expect("open");
        log.blocking_append((1..=10).map(register))
            .await
            .expect("append");
        log.truncate(log_id(1, 6)).await.expect("truncate");
    }
    let (_dir, mut log, _) = gpu_raft_store::open(tmp.path()).expect("reopen");
    let state = log.get_log_state().await.expect("state");
    assert_eq!(state.last_log_id, Some(log_id(1, 5)));
}

#[test]
fn a_locked_directory_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let _held = gpu_raft_store::open(tmp.path()).expect("first open");
    let err = gpu_raft_store::open(tmp.path()).expect_err("second open must fail");
    assert!(matches!(err, OpenError::Locked { .. }), "{err}");
    assert!(
        err.to_string().contains("in use by another process"),
        "{err}"
    );
}

#[test]
fn a_future_format_is_refused_and_left_untouched() {
    let tmp = tempfile::tempdir().expect("tempdir");
    drop(gpu_raft_store::open(tmp.path()).expect("create"));
    std::fs::write(tmp.path().join("FORMAT"), "gpumesh-data 7\n").expect("bump");
    let err = gpu_raft_store::open(tmp.path()).expect_err("future version");
    assert!(
        matches!(err, OpenError::FutureVersion { found: 7, .. }),
        "{err}"
    );
    let format = std::fs::read_to_string(tmp.path().join("FORMAT")).expect("format");
    assert_eq!(
        format, "gpumesh-data 7\n",
        "refusing must not rewrite anything"
    );
}

#[test]
fn data_without_format_file_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    drop(gpu_raft_store::open(tmp.path()).expect("create"));
    std::fs::remove_file(tmp.path().join("FORMAT")).expect("remove");
    let err = gpu_raft_store::open(tmp.path()).expect_err("no format");
    assert!(matches!(err, OpenError::Corrupt { .. }), "{err}");
}

#[tokio::test]
async fn a_corrupted_snapshot_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    {
        let (_dir, _log, mut sm) = gpu_raft_store::open(tmp.path()).expect("open");
        sm.apply(vec![membership(1), register(2)])
            .await
            .expect("apply");
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("snapshot");
    }
    let path = tmp.path().join("snapshot");
    let mut bytes = std::fs::read(&path).expect("read");
    let n = bytes.len();
    bytes[n - 3] ^= 0x20;
    std::fs::write(&path, bytes).expect("corrupt");
    let err = gpu_raft_store::open(tmp.path()).expect_err("corrupt snapshot");
    assert!(matches!(err, OpenError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("checksum"), "{err}");
}

/// Regression (found by chaos C14 `snapshot-install-before-write`): openraft 0.9 purges the
/// log for a snapshot install without waiting for the install to be durable; a crash in
/// between left the log purged past the snapshot on disk and the agent panicked on every
/// start. A purge past the durable snapshot while one is being received now waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_waits_for_the_snapshot_being_installed() {
    let entries: Vec<Entry> = std::iter::once(membership(1))
        .chain((2..=12).map(register))
        .collect();
    // The leader's snapshot at index 12.
    let leader_dir = tempfile::tempdir().expect("tempdir");
    let (_ld, _ll, mut leader) = gpu_raft_store::open(leader_dir.path()).expect("open");
    leader.apply(entries.clone()).await.expect("apply");
    let snapshot = leader
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .expect("snapshot");

    // A follower with the first 4 entries starts receiving it.
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_dir, mut log, mut sm) = gpu_raft_store::open(tmp.path()).expect("open");
    log.blocking_append(entries[..4].to_vec())
        .await
        .expect("append");
    sm.apply(entries[..4].to_vec()).await.expect("apply");
    sm.begin_receiving_snapshot().await.expect("begin");
    let mut purging = log.clone();
    let purge = tokio::spawn(async move { purging.purge(log_id(1, 12)).await });
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(
        !purge.is_finished(),
        "the purge ran ahead of the snapshot install"
    );
    assert_eq!(
        log.get_log_state().await.expect("state").last_purged_log_id,
        None
    );

    sm.install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .expect("install");
    purge.await.expect("join").expect("purge");
    let state = log.get_log_state().await.expect("state");
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 12)));

    // Purges covered by the snapshot on disk never wait.
    log.purge(log_id(1, 12)).await.expect("purge again");
}
