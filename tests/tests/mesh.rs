//! Multi-agent behaviour with real processes: failover, full restart, autopilot, rejoin.

use std::collections::BTreeMap;
use std::time::Duration;

use gpu_tests::{Cluster, voters};

/// Write `count` labels (`k{i}`) onto node `node`, round-robin through `via`. Every write must be
/// acknowledged; returns what was written.
async fn write_labels(
    c: &Cluster,
    via: &[u64],
    node: u64,
    range: std::ops::Range<u32>,
) -> BTreeMap<String, String> {
    let mut written = BTreeMap::new();
    for (n, i) in range.enumerate() {
        let (k, v) = (format!("k{i}"), format!("v{i}"));
        let agent = via[n % via.len()];
        c.label(agent, node, &k, &v)
            .await
            .unwrap_or_else(|e| panic!("write {k} via n{agent}: {e}\n{}", c.logs()));
        written.insert(k, v);
    }
    written
}

/// Every acknowledged label must be present in a linearizable read through `via`.
async fn assert_all_present(c: &Cluster, via: u64, node: u64, written: &BTreeMap<String, String>) {
    let labels = c
        .node(via, node, false)
        .await
        .unwrap_or_else(|e| panic!("read via n{via}: {e}\n{}", c.logs()))
        .labels;
    for (k, v) in written {
        assert_eq!(
            labels.get(k),
            Some(v),
            "acknowledged write {k} is missing via n{via}\n{}",
            c.logs()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_and_full_restart_lose_no_acknowledged_write() {
    let mut c = Cluster::start(3, 3, "").await;
    let leader = c.leader().await;
    let followers: Vec<u64> = c.running().into_iter().filter(|id| *id != leader).collect();

    // Writes through every agent: followers forward to the leader.
    let mut written = write_labels(&c, &[1, 2, 3], 1, 0..30).await;
    // Read-your-writes through another follower, linearizably.
    assert_all_present(&c, followers[0], 1, &written).await;

    c.kill(leader);
    let new_leader = c.leader().await;
    assert_ne!(new_leader, leader, "a killed agent cannot still lead");
    // Its port refused connections: a follower campaigned as the leader's lease ran out instead
    // of waiting for openraft's election timer (agent/src/failover.rs).
    assert!(
        followers
            .iter()
            .any(|f| c.log_of(*f).contains("fast failover")),
        "no follower took the fast path\n{}",
        c.logs()
    );
    written.extend(write_labels(&c, &followers, 1, 30..45).await);
    for &f in &followers {
        assert_all_present(&c, f, 1, &written).await;
    }

    // The old leader comes back on its data dir and catches up.
    c.start_agent(leader);
    let applied = c
        .status(new_leader, false)
        .await
        .expect("status")
        .commit_index;
    c.wait_applied(leader, applied, Duration::from_secs(20))
        .await;
    let stale = c
        .node(leader, 1, true)
        .await
        .expect("stale read on the restarted agent");
    let missing: Vec<&String> = written
        .iter()
        .filter(|(k, v)| stale.labels.get(*k) != Some(*v))
        .map(|(k, _)| k)
        .collect();
    assert!(
        missing.is_empty(),
        "restarted replica is missing {missing:?} (commit {applied}, its status {:?})",
        c.status(leader, true).await
    );

    // Everyone dies at once, then comes back: state intact, writes resume.
    for id in [1, 2, 3] {
        c.kill(id);
    }
    for id in [1, 2, 3] {
        c.start_agent(id);
    }
    c.leader().await;
    c.wait_serving().await;
    for id in [1, 2, 3] {
        assert_all_present(&c, id, 1, &written).await;
    }
    written.extend(write_labels(&c, &[1, 2, 3], 1, 45..48).await);
    assert_all_present(&c, 2, 1, &written).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_voter_is_replaced_by_a_learner_and_rejoins_as_learner() {
    let mut c = Cluster::start(5, 3, "[autopilot]\ndead_voter_after = \"2s\"\n").await;
    let status = c.status(1, false).await.expect("status");
    let before = voters(&status);
    assert_eq!(
        (status.members.len(), before.len()),
        (5, 3),
        "3 voters + 2 learners"
    );

    let leader = c.leader().await;
    let victim = *before
        .iter()
        .find(|v| **v != leader)
        .expect("a non-leader voter");
    c.kill(victim);
    c.wait_for(
        "a learner to take the dead voter's seat",
        Duration::from_secs(30),
        |c| async move {
            c.status(leader, false).await.is_ok_and(|s| {
                let v = voters(&s);
                v.len() == 3
                    && !v.contains(&victim)
                    && s.members.iter().all(|m| m.node_id != victim)
            })
        },
    )
    .await;
    let written = write_labels(&c, &c.running(), leader, 0..10).await;
    assert_all_present(&c, leader, leader, &written).await;

    // The removed agent restarts on its old data and is readmitted, as a learner.
    c.start_agent(victim);
    c.wait_for(
        "the old voter to rejoin as a learner",
        Duration::from_secs(30),
        |c| async move {
            c.status(leader, false).await.is_ok_and(|s| {
                s.members.len() == 5 && voters(&s).len() == 3 && !voters(&s).contains(&victim)
            })
        },
    )
    .await;
    let written_after = write_labels(&c, &[victim], leader, 10..12).await;
    assert_all_present(&c, victim, leader, &written_after).await;
}

/// The leader's group commit puts concurrent writes into one log entry, so a snapshot policy
/// counted in entries would not snapshot here at all: 600 writes from 64 clients arrive in far
/// fewer than 300 entries. Counted in commands, every agent snapshots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_count_writes_not_batched_entries() {
    let c = Cluster::start(3, 3, "snapshot_every = 300\n").await;
    let leader = c.leader().await;
    let writes = (0..64u32).map(|client| {
        let c = &c;
        async move {
            for i in (client..600).step_by(64) {
                let via = (u64::from(i) % 3) + 1;
                c.label(via, leader, &format!("k{}", client % 32), &i.to_string())
                    .await
                    .unwrap_or_else(|e| panic!("write {i}: {e}"));
            }
        }
    });
    futures::future::join_all(writes).await;
    let commit = c.status(leader, false).await.expect("status").commit_index;
    assert!(commit < 300, "the writes were batched: {commit} entries");
    for id in c.running() {
        c.wait_for(
            "a snapshot on every agent",
            Duration::from_secs(30),
            |c| async move { c.root.path().join(format!("node-{id}/snapshot")).exists() },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_a_purged_log_catches_up_from_a_snapshot() {
    let mut c = Cluster::start(3, 3, "snapshot_every = 20\nkeep_logs = 5\n").await;
    let leader = c.leader().await;
    let behind = c
        .running()
        .into_iter()
        .find(|n| *n != leader)
        .expect("a follower");
    let had = c.status(behind, true).await.expect("status").applied_index;
    c.kill(behind);
    let alive: Vec<u64> = c.running();
    // Far more entries than the leader keeps after a snapshot: the follower cannot catch up
    // from the log.
    for i in 0..120u32 {
        let via = alive[i as usize % alive.len()];
        c.label(via, leader, "counter", &i.to_string())
            .await
            .unwrap_or_else(|e| panic!("write {i}: {e}"));
    }
    let leader_status = c.status(leader, false).await.expect("status");
    c.start_agent(behind);
    c.wait_applied(behind, leader_status.commit_index, Duration::from_secs(30))
        .await;
    let node = c
        .node(behind, leader, true)
        .await
        .expect("stale read on the caught-up follower");
    assert_eq!(node.labels.get("counter").map(String::as_str), Some("119"));
    // Its snapshot now covers entries it never had in its log: it was installed from the leader.
    let snapshot = std::fs::read(c.root.path().join(format!("node-{behind}/snapshot")))
        .expect("snapshot file");
    let header = snapshot.split(|b| *b == b'\n').next().expect("header line");
    let header: serde_json::Value = serde_json::from_slice(header).expect("header json");
    let covered = header["meta"]["last_log_id"]["index"]
        .as_u64()
        .expect("snapshot index");
    assert!(
        covered > had + 20,
        "snapshot covers up to {covered}, the follower had {had} before it died"
    );
}
