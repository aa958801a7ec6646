//! The operator's drain, with real agents: `gpuctl node drain N --evict` and the agent stopped
//! at once (before the eviction is reported) requeues the job without spending its only
//! attempt; `--wait` returns once the node runs nothing, so stopping the agent then loses
//! nothing either; evicting the last schedulable node's job is refused.

use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_tests::{Cluster, shell_job};

fn running_elsewhere(j: &pb::Job, not: u64) -> bool {
    j.state == pb::JobState::Running as i32 && j.node_id.is_some_and(|n| n != not)
}

async fn drain(c: &Cluster, node: u64, wait: bool) {
    let mut cmd = c.gpuctl();
    cmd.args(["--endpoint", c.addr(1), "--timeout", "60s", "node", "drain"])
        .arg(node.to_string())
        .arg("--evict");
    if wait {
        cmd.arg("--wait");
    }
    let out = cmd.output().expect("gpuctl node drain");
    assert!(
        out.status.success(),
        "drain n{node}: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        c.logs()
    );
}

async fn cordon(c: &Cluster, node: u64, verb: &str) {
    let out = c
        .gpuctl()
        .args(["--endpoint", c.addr(1), "node", verb])
        .arg(node.to_string())
        .output()
        .expect("gpuctl node cordon");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_node_whose_agent_stops_at_once_loses_no_job() {
    let mut c = Cluster::start(3, 3, "").await;
    // The job runs on a follower: the leader is cordoned until the end.
    let leader = c.leader().await;
    cordon(&c, leader, "cordon").await;
    let job = c
        .submit(leader, shell_job("long", 1, "sleep 300"), "k-long")
        .await
        .unwrap_or_else(|e| panic!("submit: {e}\n{}", c.logs()))
        .job_id;
    let first = c
        .wait_job(job, Duration::from_secs(60), |j| {
            running_elsewhere(j, leader)
        })
        .await;
    let victim = first.node_id.expect("placed");

    // Drain with eviction, and stop the agent before it can report the eviction: the node
    // goes down with the job asked to stop, and it is requeued without spending its only
    // attempt (before the fix: failed, "lost: node went down", attempts 1/1).
    drain(&c, victim, false).await;
    c.kill(victim);
    let moved = c
        .wait_job(job, Duration::from_secs(60), |j| {
            running_elsewhere(j, victim) || j.state == pb::JobState::Failed as i32
        })
        .await;
    assert!(running_elsewhere(&moved, victim), "{moved:?}");
    assert_eq!(
        moved.attempts, 1,
        "the eviction spent no attempt: {moved:?}"
    );

    // Evicting the last schedulable node's job (the leader is cordoned, the victim down) is
    // refused, and changes nothing: the job keeps running where it is.
    let second = moved.node_id.expect("placed");
    let refused = c
        .gpuctl()
        .args([
            "--endpoint",
            c.addr(1),
            "node",
            "drain",
            &second.to_string(),
            "--evict",
        ])
        .output()
        .expect("gpuctl node drain");
    assert_eq!(refused.status.code(), Some(2));
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("last schedulable node"), "{why}");
    let now = c.job(leader, job).await.expect("job");
    assert!(
        running_elsewhere(&now, victim) && now.node_id == Some(second),
        "{now:?}"
    );

    // With somewhere to go, --wait returns once the node runs nothing (its agent may stop then,
    // which would leave one voter of three here, so it stays up).
    cordon(&c, leader, "uncordon").await;
    drain(&c, second, true).await;
    let now = c.job(leader, job).await.expect("job");
    assert_ne!(now.node_id, Some(second), "after --wait: {now:?}");
    let last = c
        .wait_job(job, Duration::from_secs(60), |j| {
            j.state == pb::JobState::Running as i32 || j.state == pb::JobState::Failed as i32
        })
        .await;
    assert_eq!(
        (last.state, last.node_id, last.attempts),
        (pb::JobState::Running as i32, Some(leader), 1),
        "{last:?}"
    );
}
