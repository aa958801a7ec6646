//! A leader cut off by a partition decides nothing for the cluster after it heals: its node
//! liveness verdicts, made while it could hear nobody, are not replayed through the new leader.

mod common;

use std::time::{Duration, Instant};

use gpu_chaos::partition::{self, Cut};
use gpu_proto::v1 as pb;
use gpu_tests::{is_terminal, records, shell_job};

use common::{Fenced, fenced_cluster};

/// Regression: the isolated old leader's liveness loop judged every peer silent and proposed
/// "n<peer> Down"; the write could not commit, so the shared write path retried it — and after
/// the heal forwarded it to the new leader, which applied it: a healthy node (often the new
/// leader itself) was marked down and its running jobs were stopped and placed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_leaders_liveness_verdicts_are_not_applied_after_a_heal() {
    let Some(Fenced {
        net,
        c,
        all,
        records,
        leader: old,
    }) = fenced_cluster().await
    else {
        return;
    };
    let followers: Vec<u64> = all.iter().copied().filter(|n| *n != old).collect();
    // One four-GPU job on each follower (every node has four GPUs), running through the cut.
    let mut ids = Vec::new();
    for k in 0..2 {
        let spec = pb::JobSpec {
            node_selector: [("pool".to_owned(), "followers".to_owned())].into(),
            ..shell_job(&format!("busy-{k}"), 4, &records::script(&records, "10"))
        };
        ids.push(
            c.submit(old, spec, &format!("busy-{k}"))
                .await
                .expect("submit")
                .job_id,
        );
    }
    let start = Instant::now();
    loop {
        let mut nodes = Vec::new();
        for id in &ids {
            if let Ok(j) = c.job(old, *id).await
                && j.state == pb::JobState::Running as i32
            {
                nodes.extend(j.node_id);
            }
        }
        nodes.sort_unstable();
        if nodes == followers {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the jobs did not start on {followers:?} (running on {nodes:?})\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Cut the leader off long enough for its liveness loop to judge the followers silent
    // (`down_after` = 3 s), then heal while its verdict is still pending.
    Cut::isolate(old, &all).apply(&net, &all).expect("isolate");
    tokio::time::sleep(Duration::from_secs(5)).await;
    partition::heal(&net, &all).expect("heal");
    for id in &ids {
        let done = c.wait_job(*id, Duration::from_secs(60), is_terminal).await;
        assert_eq!(
            (done.state, done.generation),
            (pb::JobState::Succeeded as i32, 1),
            "j-{id} was disturbed after the heal: {} {}\n{}",
            done.reason,
            done.outcome,
            c.logs()
        );
    }
}
