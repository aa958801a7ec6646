//! A leader whose disk fails stops (C15 in the suites shows it exits and says why in its log).
//! Here, the writers it was serving hear why too: the fatal error raft stopped on, not only that
//! it stopped (which is all a full disk in CI once told anyone). Uses the failpoints build.

use std::time::Duration;

use gpu_chaos::failpoints;
use gpu_proto::v1 as pb;
use gpu_proto::v1::job_service_client::JobServiceClient;
use gpu_tests::{Cluster, NO_REQUEST_LIMITS, Placement, shell_job};

/// Concurrent writers, so that some are in flight when the disk fails.
const WRITERS: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_lost_to_a_failing_disk_name_the_failure() {
    let agent = failpoints::command("").expect("the failpoints agent");
    // No request limit: a writer slowed down by one could be between writes when it fails.
    let mut c = Cluster::start_with(1, NO_REQUEST_LIMITS, vec![Placement::loopback()], agent).await;
    c.kill(1);
    c.agents
        .get_mut(&1)
        .expect("n1")
        .env
        .insert("FAIL_POINTS".into(), "fsync-error=300*off->return".into());
    c.start_agent(1);
    c.wait_serving().await;

    let mut writers = tokio::task::JoinSet::new();
    for w in 0..WRITERS {
        let mut jobs = JobServiceClient::new(c.channel(1).await.expect("connect to n1"));
        writers.spawn(async move {
            for n in 0.. {
                let submit = pb::SubmitJobRequest {
                    spec: Some(shell_job(&format!("w{w}-{n}"), 1, "true")),
                    idempotency_key: format!("w{w}-{n}"),
                    hold: false,
                };
                match jobs.submit_job(submit).await {
                    Ok(_) => continue,
                    // The agent has gone: refused, or the call cut off as it exited.
                    Err(status)
                        if matches!(
                            status.code(),
                            tonic::Code::Unavailable | tonic::Code::Cancelled
                        ) =>
                    {
                        return None;
                    }
                    Err(status) => return Some(status.message().to_owned()),
                }
            }
            None
        });
    }
    let answers = tokio::time::timeout(Duration::from_secs(120), writers.join_all())
        .await
        .expect("the disk failed within 2 minutes");
    let errors: Vec<String> = answers.into_iter().flatten().collect();
    assert!(
        errors.iter().any(|e| e.contains("failpoint fsync-error")),
        "no writer heard that the disk failed: {errors:?}"
    );
    for e in &errors {
        assert!(
            e.contains("failpoint fsync-error"),
            "a writer's error does not say why raft stopped: {e:?} (all: {errors:?})"
        );
    }
}
