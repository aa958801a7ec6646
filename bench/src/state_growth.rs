//! How the agent grows with its history: a 3-agent mesh takes jobs that are submitted and at
//! once cancelled, so each one ends terminal in the replicated state (and leaves it for the
//! archive under the agents' `[retention]`). At each checkpoint, every agent's resident memory;
//! at the last, the size of the cluster backup (the state machine's snapshot) and one
//! follower's restart: `kill -9`, start, until it answers with the leader's commit applied.
//!
//! Submissions carry no idempotency key (a raw API request is still applied once, by its
//! request id): a key is kept for 7 days by design, so a million keyed jobs in minutes would
//! hold a million keys, which a real million-job lifetime (a hundred days at 10,000 a day) never
//! does.

use std::time::{Duration, Instant};

use anyhow::Context;
use futures::future::try_join_all;
use gpu_proto::v1 as pb;
use gpu_proto::v1::cluster_service_client::ClusterServiceClient;
use gpu_proto::v1::job_service_client::JobServiceClient;
use serde::Serialize;

use crate::mesh::{Mesh, submission};
use crate::target::{Crashable, Target};

#[derive(Clone, Debug, Serialize)]
pub struct Checkpoint {
    /// Jobs submitted and finished so far (the state keeps those retention keeps).
    pub jobs: usize,
    /// Resident memory of each agent, in MiB, by member.
    pub rss_mib: Vec<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct StateGrowth {
    /// The first checkpoint is the mesh before any job.
    pub checkpoints: Vec<Checkpoint>,
    /// Submit-and-cancel pairs per second while filling.
    pub pairs_per_s: f64,
    /// The backup's size at the last checkpoint.
    pub snapshot_bytes: usize,
    /// From starting a killed follower until it has applied the leader's commit.
    pub restart_ms: f64,
}

/// The run number of the fill's sequence numbers (closed-loop runs count from 0).
const FILL_RUN: u64 = 0x7fff;

/// Fill `mesh` up to each of `checkpoints` (increasing) finished jobs with `clients` clients.
pub async fn measure(
    mesh: &mut Mesh,
    checkpoints: &[usize],
    clients: usize,
) -> anyhow::Result<StateGrowth> {
    let mut seen = vec![Checkpoint {
        jobs: 0,
        rss_mib: rss_mib(mesh)?,
    }];
    let mut filling = Duration::ZERO;
    let mut done = 0;
    for &target in checkpoints {
        let start = Instant::now();
        fill(mesh, done, target, clients).await?;
        filling += start.elapsed();
        done = target;
        seen.push(Checkpoint {
            jobs: done,
            rss_mib: rss_mib(mesh)?,
        });
    }
    let snapshot_bytes = backup_bytes(mesh).await?;
    let leader = mesh.leader().await?;
    let follower = (leader + 1) % mesh.members();
    mesh.kill(follower);
    let start = Instant::now();
    mesh.restart(follower).await?;
    let restart_ms = start.elapsed().as_secs_f64() * 1e3;
    Ok(StateGrowth {
        checkpoints: seen,
        pairs_per_s: done as f64 / filling.as_secs_f64().max(1e-9),
        snapshot_bytes,
        restart_ms,
    })
}

/// Jobs `from..to`, each submitted and then cancelled, spread over `clients` clients.
async fn fill(mesh: &Mesh, from: usize, to: usize, clients: usize) -> anyhow::Result<()> {
    let mut conns = Vec::with_capacity(clients);
    for c in 0..clients {
        conns.push(JobServiceClient::new(
            mesh.cluster
                .channel((c % mesh.members()) as u64 + 1)
                .await?,
        ));
    }
    let workers = conns
        .into_iter()
        .enumerate()
        .map(|(c, mut conn)| async move {
            for seq in (from + c..to).step_by(clients) {
                let job = conn
                    .submit_job(pb::SubmitJobRequest {
                        idempotency_key: String::new(),
                        ..submission((FILL_RUN << 48) | seq as u64)
                    })
                    .await
                    .context("submitting")?
                    .into_inner();
                conn.cancel_job(pb::CancelJobRequest {
                    id: job.job_id,
                    array_index: None,
                })
                .await
                .context("cancelling")?;
            }
            anyhow::Ok(())
        });
    try_join_all(workers).await?;
    Ok(())
}

fn rss_mib(mesh: &Mesh) -> anyhow::Result<Vec<f64>> {
    mesh.cluster
        .agents
        .keys()
        .map(|&id| {
            let pid = mesh
                .cluster
                .pid(id)
                .with_context(|| format!("agent n{id} is not running"))?;
            let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
            let kib = gpu_agent::tools::footprint::rss_kib(&status).context("no VmRSS line")?;
            Ok(kib as f64 / 1024.0)
        })
        .collect()
}

async fn backup_bytes(mesh: &Mesh) -> anyhow::Result<usize> {
    let mut pieces = ClusterServiceClient::new(mesh.cluster.channel(1).await?)
        .max_decoding_message_size(gpu_proto::MAX_MESSAGE_BYTES)
        .stream_snapshot(pb::SaveSnapshotRequest {})
        .await
        .context("saving a backup")?
        .into_inner();
    let mut bytes = 0;
    while let Some(piece) = pieces.message().await.context("receiving the backup")? {
        bytes += piece.data.len();
    }
    Ok(bytes)
}
