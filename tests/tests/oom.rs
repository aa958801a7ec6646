//! A job that allocates past its `--mem` against real agents: the kernel's memory cgroup kills
//! it, it ends "out of memory (limit 64 MiB)", and the agent that ran it is unharmed: it still
//! answers, the mesh still accepts writes, and its next job succeeds.
//!
//! Job cgroups need root: without it the test says so and returns, unless
//! `GPUMESH_REQUIRE_ROOT=1` (CI), where it fails.

use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_tests::{Cluster, is_terminal, shell_job};

fn is_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("GPUMESH_REQUIRE_ROOT").is_none_or(|v| v != "1"),
        "GPUMESH_REQUIRE_ROOT=1 but this test is not root"
    );
    eprintln!("SKIPPED: job cgroups need root");
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_past_its_memory_limit_ends_out_of_memory_and_the_agent_is_unharmed() {
    if !is_root() {
        return;
    }
    let c = Cluster::start(1, 1, "").await;
    // `tail` keeps a line without a newline in memory: 500 MiB of zeros under a 64 MiB limit.
    let hog = pb::JobSpec {
        memory_mib: Some(64),
        ..shell_job("hog", 1, "head -c 500m /dev/zero | tail")
    };
    let id = c.submit(1, hog, "").await.expect("submit").job_id;
    let job = c.wait_job(id, Duration::from_secs(60), is_terminal).await;
    assert_eq!(job.state, pb::JobState::Failed as i32, "{job:?}");
    assert_eq!(job.outcome, "out of memory (limit 64 MiB)", "{job:?}");

    // The agent answers, the mesh takes a write, and the next job on it runs to the end.
    let next = c
        .submit(1, shell_job("after", 1, "echo fine"), "")
        .await
        .expect("the mesh accepts writes")
        .job_id;
    let after = c.wait_job(next, Duration::from_secs(60), is_terminal).await;
    assert_eq!(after.state, pb::JobState::Succeeded as i32, "{after:?}");
}
