//! Self-fencing across a real partition (network namespaces): a node cut off from the cluster
//! stops its runs before the leader declares it down and places them elsewhere.

mod common;

use std::time::{Duration, Instant};

use gpu_chaos::check::fencing;
use gpu_chaos::partition::{self, Cut};
use gpu_proto::v1 as pb;
use gpu_tests::{Cluster, records, shell_job};

use common::{Fenced, fenced_cluster, label_followers, run_job};

/// Regression: the node lease was renewed for as long as the last contact was younger than
/// `jobs.lease`, so its file stayed fresh up to `lease` after contact was lost and the runs
/// were fenced only about 2 × lease after it — later than `down_after` (which only has to be
/// 1.5 × lease). The leader had by then placed the job again: two runs of one job at once.
/// The tightest valid timing (`down_after` = 1.5 × lease) makes the race certain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_node_fences_its_runs_before_they_are_placed_again() {
    // The job may only run on the two followers, so cutting off the one that runs it leaves
    // the leader in place and the other follower free to take the job.
    let Some(Fenced {
        net,
        c,
        all,
        records,
        leader,
    }) = fenced_cluster().await
    else {
        return;
    };
    let spec = pb::JobSpec {
        max_attempts: 3,
        node_selector: [("pool".to_owned(), "followers".to_owned())].into(),
        ..shell_job("fenced", 1, &records::script(&records, "6"))
    };
    let (running, node) = run_job(&c, leader, spec).await;
    let id = running.id;
    assert_ne!(node, leader, "the selector keeps the job off the leader");
    // Let the first run get going, then cut its node off.
    tokio::time::sleep(Duration::from_millis(500)).await;
    Cut::isolate(node, &all).apply(&net, &all).expect("isolate");
    let others: Vec<u64> = all.iter().copied().filter(|n| *n != node).collect();
    let start = Instant::now();
    let replaced = loop {
        let mut seen = None;
        for via in &others {
            if let Ok(j) = c.job(*via, id).await {
                seen = Some(j);
                break;
            }
        }
        if let Some(j) = seen
            && j.generation > running.generation
            && j.state == pb::JobState::Running as i32
        {
            break j;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "j-{id} was not placed again after n{node} was cut off\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_ne!(replaced.node_id, Some(node));
    partition::heal(&net, &all).expect("heal");
    c.wait_job(id, Duration::from_secs(30), gpu_tests::is_terminal)
        .await;
    let runs = records::read_all(&records).expect("records");
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(
        runs[0].end_ns.is_some(),
        "the cut-off run never stopped: {runs:?}"
    );
    let violations = fencing::check(&runs);
    assert!(violations.is_empty(), "{violations:?}\n{runs:?}");
}

/// When a run ended: its own record, or else when its supervisor wrote the outcome (a run
/// killed with SIGKILL records nothing itself).
fn ended_at(c: &Cluster, run: &records::RunRecord) -> Option<u128> {
    run.end_ns.or_else(|| {
        // exit.json is reserved (blank) when the run starts: only a recorded outcome counts.
        c.run_outcome(run.node, run.job_id, run.generation)?;
        let exit = c
            .run_dir(run.node, run.job_id, run.generation)
            .join("exit.json");
        let modified = std::fs::metadata(exit).and_then(|m| m.modified()).ok()?;
        Some(
            modified
                .duration_since(std::time::UNIX_EPOCH)
                .ok()?
                .as_nanos(),
        )
    })
}

/// Regression: a fenced run got the whole `stop_grace` between SIGTERM and SIGKILL, so a job
/// slow to stop (one that checkpoints on SIGTERM) outlived `down_after` and still ran when
/// the leader placed it again. Fencing now kills within a quarter of the lease. The node is
/// paused (`SIGSTOP`), so this needs no network namespaces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_run_slow_to_stop_is_killed_before_it_is_placed_again() {
    let all = [1, 2, 3];
    let c = Cluster::start(
        3,
        3,
        "[jobs]\nlease = \"2s\"\ndown_after = \"3500ms\"\nstop_grace = \"3s\"\n",
    )
    .await;
    let records = records::prepare_dir(c.root.path()).expect("records dir");
    let leader = c.leader().await;
    label_followers(&c, leader, &all).await;
    // Records its start and end like `records::script`, but takes 5 s to stop on SIGTERM.
    let slow =
        records::script(&records, "8").replace("trap 'echo term", "trap 'sleep 5; echo term");
    assert!(slow.contains("sleep 5;"), "{slow}");
    let spec = pb::JobSpec {
        max_attempts: 3,
        node_selector: [("pool".to_owned(), "followers".to_owned())].into(),
        ..shell_job("slow-to-stop", 1, &slow)
    };
    let (running, node) = run_job(&c, leader, spec).await;
    let id = running.id;
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.pause(node);
    let replaced = c
        .wait_job(id, Duration::from_secs(30), |j| {
            j.generation > running.generation && j.state == pb::JobState::Running as i32
        })
        .await;
    c.resume(node);
    assert_ne!(replaced.node_id, Some(node));
    c.wait_job(id, Duration::from_secs(30), gpu_tests::is_terminal)
        .await;
    let mut runs = records::read_all(&records).expect("records");
    assert_eq!(runs.len(), 2, "{runs:?}");
    for run in &mut runs {
        run.end_ns = ended_at(&c, run);
    }
    let violations = fencing::check(&runs);
    assert!(violations.is_empty(), "{violations:?}\n{runs:?}");
}
