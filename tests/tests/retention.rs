//! Retention on real agents: finished jobs and old audit entries leave the replicated state for
//! every agent's archive, and stay queryable through any agent (`job get`, `job logs`,
//! `job list --finished`, `audit list`, `audit verify` across both), including through a
//! follower that was down meanwhile and came back from a snapshot.

use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_tests::{Cluster, is_terminal, shell_job};
use serde_json::Value;

const JOBS: u64 = 8;

/// Snapshots every 20 entries, 5 log entries kept behind them; at most 2 finished jobs and 10
/// audit entries kept in the state, looked at every 200 ms.
const CONFIG: &str = "snapshot_every = 20\nkeep_logs = 5\n[retention]\nfinished_jobs_kept = 2\naudit_entries_kept = 10\ninterval = \"200ms\"\n";

fn gpuctl_ok(c: &Cluster, via: u64, args: &[&str]) -> Value {
    let (code, answer, stderr) = c.gpuctl_json(via, args);
    assert_eq!(
        code,
        Some(0),
        "gpuctl {args:?} via n{via}: {answer} {stderr}"
    );
    answer
}

fn logs(c: &Cluster, via: u64, id: u64) -> String {
    let out = c
        .gpuctl()
        .args(["--endpoint", c.addr(via), "job", "logs", &format!("j-{id}")])
        .output()
        .expect("run gpuctl");
    assert!(
        out.status.success(),
        "job logs j-{id} via n{via}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Job `id` through agent `via`, asking again while it answers Unavailable (its archive is
/// being filled from its peers), as gpuctl does.
async fn job_through(c: &Cluster, via: u64, id: u64) -> pb::Job {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match c.job(via, id).await {
            Ok(job) => return job,
            Err(e)
                if e.code() == tonic::Code::Unavailable && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("job get j-{id} via n{via}: {e}"),
        }
    }
}

/// What agent `via` can say of the archived history: every job through `job get` and in
/// `job list --finished`, the first job's output, and the whole audit chain.
async fn assert_history_through(c: &Cluster, via: u64) {
    for id in 1..=JOBS {
        let job = job_through(c, via, id).await;
        assert_eq!(job.state, pb::JobState::Succeeded as i32, "j-{id}");
    }
    assert_eq!(logs(c, via, 1).trim(), "out-1");
    let listed = gpuctl_ok(c, via, &["job", "list", "--finished", "--since", "1h"]);
    let ids: Vec<u64> = (listed.as_array().expect("a list").iter())
        .map(|j| j["id"].as_u64().expect("id"))
        .collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (1..=JOBS).collect::<Vec<_>>(),
        "via n{via}: {ids:?}"
    );
    let verified = gpuctl_ok(c, via, &["audit", "verify"]);
    assert_eq!(verified["ok"], true, "via n{via}: {verified}");
    let entries = verified["entries"].as_u64().expect("entries");
    assert!(entries >= JOBS, "via n{via}: {verified}");
    let listed = gpuctl_ok(c, via, &["audit", "list", "--limit", "100000"]);
    let seqs: Vec<u64> = (listed.as_array().expect("a list").iter())
        .map(|e| e["seq"].as_u64().expect("seq"))
        .collect();
    assert_eq!(seqs, (1..=entries).collect::<Vec<_>>(), "via n{via}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_jobs_leave_the_state_and_every_agent_still_answers_for_them() {
    let mut c = Cluster::start(3, 3, CONFIG).await;
    let leader = c.leader().await;
    let behind = c
        .running()
        .into_iter()
        .find(|n| *n != leader)
        .expect("a follower");
    c.kill(behind);
    let alive = c.running();
    for i in 1..=JOBS {
        let spec = shell_job(&format!("job-{i}"), 0, &format!("echo out-{i}"));
        let via = alive[i as usize % alive.len()];
        let id = c.submit(via, spec, "").await.expect("submit").job_id;
        assert_eq!(id, i);
    }
    for id in 1..=JOBS {
        let job = c.wait_job(id, Duration::from_secs(60), is_terminal).await;
        assert_eq!(
            job.state,
            pb::JobState::Succeeded as i32,
            "j-{id}: {}",
            job.reason
        );
    }
    c.wait_for(
        "finished jobs to leave the state",
        Duration::from_secs(30),
        |c| async move { c.list_jobs(leader).await.is_ok_and(|jobs| jobs.len() <= 2) },
    )
    .await;
    for via in c.running() {
        assert_history_through(&c, via).await;
    }

    // The follower was down throughout: it comes back from a snapshot that no longer holds the
    // archived jobs, and fills its archive from its peers.
    c.start_agent(behind);
    let commit = c.status(leader, false).await.expect("status").commit_index;
    c.wait_applied(behind, commit, Duration::from_secs(60))
        .await;
    assert_history_through(&c, behind).await;
}
