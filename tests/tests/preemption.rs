//! Preemption with real processes: with `priority` preemption on, a high-priority job that
//! needs every A100 makes the leader preempt the low-priority job holding them; the low job's
//! executor sends SIGTERM (the job sees it), waits out the grace, reports the eviction; the
//! high job runs and succeeds; the low job is requeued without using its only attempt and runs
//! again.

use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_proto::v1::scheduler_service_client::SchedulerServiceClient;
use gpu_tests::{Cluster, shell_job};

const WAIT: Duration = Duration::from_secs(90);

fn a100s(name: &str, priority: i32, script: &str) -> pb::JobSpec {
    pb::JobSpec {
        gpu_types: vec!["A100".into()],
        priority: Some(priority),
        ..shell_job(name, 4, script)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_priority_job_preempts_a_lower_one_which_is_requeued_and_runs_again() {
    // n1 has the cluster's only A100s (4).
    let c = Cluster::start(3, 3, "").await;
    let mut sched = SchedulerServiceClient::new(c.channel(2).await.expect("channel"));
    let status = sched
        .set_scheduler_policy(pb::SetSchedulerPolicyRequest {
            policy: "priority+greedy".into(),
            preemption: Some("priority".into()),
            ..Default::default()
        })
        .await
        .expect("set policy")
        .into_inner();
    assert_eq!(status.policy.expect("policy").preemption, "priority");

    let low = c
        .submit(
            2,
            a100s(
                "low",
                0,
                "trap 'echo got SIGTERM; exit 143' TERM; echo started; while :; do sleep 0.1; done",
            ),
            "",
        )
        .await
        .expect("submit low")
        .job_id;
    let running = |j: &pb::Job| j.state == pb::JobState::Running as i32;
    let first = c.wait_job(low, WAIT, running).await;
    assert_eq!((first.generation, first.attempts), (1, 1));

    let high = c
        .submit(3, a100s("high", 10, "echo high"), "")
        .await
        .expect("submit high")
        .job_id;
    let done = c
        .wait_job(high, WAIT, |j| {
            j.state == pb::JobState::Succeeded as i32 || j.state == pb::JobState::Failed as i32
        })
        .await;
    assert_eq!(done.state, pb::JobState::Succeeded as i32, "{done:?}");

    // The low job runs again: a second placement, and its one attempt is still its own.
    let again = c
        .wait_job(low, WAIT, |j| running(j) && j.generation == 2)
        .await;
    assert_eq!(again.attempts, 1, "the preemption did not use an attempt");
    assert_eq!(again.spec.as_ref().map(|s| s.max_attempts), Some(1));
    // Its first run was asked to stop with SIGTERM and saw it.
    let log = c.run_dir(1, low, 1).join("stdout.log");
    let out = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{log:?}: {e}"));
    assert!(out.contains("got SIGTERM"), "first run's output: {out:?}");
    // The high job's GPUs were the ones the low job held (all four A100s of n1).
    assert_eq!(done.node_id, Some(1));
    assert_eq!(done.gpus.len(), 4);
}
