//! Submit → bound and submit → running: placeable one-GPU jobs submitted at a steady pace,
//! timed from the client's clock at submission to the bind and start times the mesh records
//! (one machine, one clock).

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use gpu_proto::v1 as pb;
use gpu_proto::v1::job_service_client::JobServiceClient;
use serde::Serialize;

use crate::mesh::Mesh;
use crate::stats::Summary;

#[derive(Clone, Debug, Serialize)]
pub struct PlacementLatency {
    pub jobs: usize,
    pub to_bound: Summary,
    pub to_running: Summary,
}

/// Submit `jobs` jobs through member `via` (from 0), one every `pace`, then collect their times.
pub async fn measure(
    mesh: &Mesh,
    via: usize,
    jobs: usize,
    pace: Duration,
    run: u64,
) -> anyhow::Result<PlacementLatency> {
    let id = via as u64 + 1;
    let mut client = JobServiceClient::new(mesh.cluster.channel(id).await?);
    let mut submitted = HashMap::new();
    for i in 0..jobs {
        let at_ms = now_ms();
        let req = pb::SubmitJobRequest {
            spec: Some(gpu_tests::shell_job("bench-placed", 1, "exit 0")),
            idempotency_key: format!("bench-placed-{run}-{i}"),
            hold: false,
        };
        let job = client.submit_job(req).await?.into_inner().job_id;
        submitted.insert(job, at_ms);
        tokio::time::sleep(pace).await;
    }
    let mut to_bound = Vec::new();
    let mut to_running = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    for (job, at_ms) in submitted {
        let started = loop {
            let j = client
                .get_job(pb::GetJobRequest {
                    id: job,
                    stale: true,
                    array_index: None,
                })
                .await?
                .into_inner();
            if let (Some(bound), Some(started)) = (j.bound_at_ms, j.started_at_ms) {
                break (bound, started);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "job j-{job} had not started after 60 s: {j:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        to_bound.push(since(at_ms, started.0).context("bind time before submission")?);
        to_running.push(since(at_ms, started.1).context("start time before submission")?);
    }
    Ok(PlacementLatency {
        jobs,
        to_bound: Summary::of(&to_bound),
        to_running: Summary::of(&to_running),
    })
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `to - from` in milliseconds; a recorded time up to 1 ms before the client's (the two clocks
/// round differently) counts as 0.
fn since(from_ms: u64, to_ms: u64) -> Option<Duration> {
    match to_ms.checked_sub(from_ms) {
        Some(d) => Some(Duration::from_millis(d)),
        None if from_ms - to_ms <= 1 => Some(Duration::ZERO),
        None => None,
    }
}
