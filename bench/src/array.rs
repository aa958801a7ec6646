//! A job array end to end, as a user meets it: `gpuctl job submit --array 0-(N-1) -- true` on a
//! mesh of 4 agents with 8 simulated GPUs each (real processes, each task run by the executor
//! through its supervisor), timed from the command's start to its exit (submitted) and to the
//! last task's end (drained, read from a folded `job list` every 250 ms).

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use gpu_proto::v1 as pb;
use gpu_proto::v1::job_service_client::JobServiceClient;
use gpu_tests::{AgentCommand, Cluster, Placement};
use serde::Serialize;

/// What one array took.
#[derive(Debug, Serialize)]
pub struct ArrayRun {
    pub tasks: u64,
    pub agents: u64,
    pub gpus_per_agent: u32,
    /// `gpuctl job submit --array …`, process start to exit.
    pub submit: Duration,
    /// From the submission's start until every task has ended.
    pub drain: Duration,
    pub succeeded: u64,
}

/// Submit an array of `tasks` one-GPU `true` tasks and wait until every one has ended.
pub async fn measure(tasks: u64, agents: u64, gpus_per_agent: u32) -> anyhow::Result<ArrayRun> {
    let placements = (0..agents).map(|_| Placement::loopback()).collect();
    let command = AgentCommand {
        sim_gpus: Some(format!("{gpus_per_agent}xA100-80GB")),
        ..AgentCommand::default()
    };
    let cluster = Cluster::start_with(3, "", placements, command).await;
    let indexes = format!("0-{}", tasks - 1);
    let start = Instant::now();
    let out = cluster
        .gpuctl()
        .args(["--endpoint", cluster.addr(1), "-o", "json", "job", "submit"])
        .args(["--gpus", "1", "--name", "array-bench", "--array", &indexes])
        .args(["--", "true"])
        .output()
        .context("running gpuctl")?;
    let submit = start.elapsed();
    ensure!(
        out.status.success(),
        "gpuctl job submit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut client = JobServiceClient::new(cluster.channel(1).await?);
    let (drain, succeeded) = loop {
        let req = pb::ListJobsRequest {
            fold_arrays: true,
            stale: true,
            ..Default::default()
        };
        let lines = client.list_jobs(req).await?.into_inner().jobs;
        let counts = lines
            .iter()
            .find(|j| j.spec.as_ref().is_some_and(|s| s.name == "array-bench"))
            .map(|j| j.array_task_states.clone())
            .unwrap_or_default();
        let ended: u64 = ["succeeded", "failed", "cancelled"]
            .iter()
            .filter_map(|s| counts.get(*s))
            .sum();
        if ended == tasks {
            break (
                start.elapsed(),
                counts.get("succeeded").copied().unwrap_or(0),
            );
        }
        ensure!(
            start.elapsed() < Duration::from_secs(1800),
            "the array did not drain in 30 minutes: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    Ok(ArrayRun {
        tasks,
        agents,
        gpus_per_agent,
        submit,
        drain,
        succeeded,
    })
}
