//! C10's shared steps, whatever cuts the node off (a pause or a partition): long recording
//! jobs, choosing the node that holds the most of them, and waiting until every run it held
//! has been placed again elsewhere.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gpu_proto::v1 as pb;
use gpu_tests::Cluster;

use crate::client::Outcome;
use crate::workload::Load;

/// How long the C10 jobs run: long enough to be caught running by the fault.
const HOLDER_JOB_SECS: &str = "6";
/// The C10 jobs submitted before choosing whom to cut off.
const HOLDER_JOBS: usize = 3;
/// GPUs per C10 job: three of every node's four, so the jobs spread over the nodes.
const HOLDER_GPUS: u32 = 3;
/// How long the cut-off agent's runs get to be re-placed before the scenario gives up.
const REPLACE_WITHIN: Duration = Duration::from_secs(20);

/// Submit `HOLDER_JOBS` long recording jobs, wait until some run, and pick a node running
/// them: a follower when one does (so the leader stays), then the one running the most, then
/// the lowest id. Returns it with its runs as (job, generation).
pub async fn long_jobs_holder(
    c: &Cluster,
    Load {
        client,
        prefix,
        records,
    }: Load<'_>,
) -> anyhow::Result<(u64, Vec<(u64, u64)>)> {
    let mut ids = Vec::new();
    for k in 0..HOLDER_JOBS {
        let key = format!("{prefix}-long-{k}");
        let spec = pb::JobSpec {
            max_attempts: 10,
            ..gpu_tests::shell_job(
                &key,
                HOLDER_GPUS,
                &gpu_tests::records::script(records, HOLDER_JOB_SECS),
            )
        };
        for t in 0..3 {
            let via = client.nodes()[(k + t) % client.nodes().len()];
            if let Outcome::Ok(id) = client
                .submit("long", via, spec.clone(), &key, Duration::from_secs(5))
                .await?
            {
                ids.push(id);
                break;
            }
        }
    }
    anyhow::ensure!(!ids.is_empty(), "no long job was acknowledged");
    let held = wait_running(c, &ids).await?;
    let leader = c.leader().await;
    let mut per_node: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    for (id, node, generation) in held {
        per_node.entry(node).or_default().push((id, generation));
    }
    per_node
        .into_iter()
        .max_by_key(|(node, runs)| (*node != leader, runs.len(), std::cmp::Reverse(*node)))
        .ok_or_else(|| anyhow::anyhow!("no long job is running"))
}

/// Wait (up to 30 s) until at least one of `ids` runs; returns every running one as
/// (job, node, generation).
async fn wait_running(c: &Cluster, ids: &[u64]) -> anyhow::Result<Vec<(u64, u64, u64)>> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        let mut running = Vec::new();
        for id in ids {
            if let Ok(j) = c.job(c.leader().await, *id).await
                && j.state == pb::JobState::Running as i32
                && let Some(node) = j.node_id
            {
                running.push((j.id, node, j.generation));
            }
        }
        if !running.is_empty() {
            return Ok(running);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    anyhow::bail!("none of the long jobs {ids:?} started running within 30s")
}

/// Wait while `victim` is cut off until every one of its `runs` has moved on (a newer
/// generation, or finished), asking the other agents.
pub async fn wait_replaced(c: &Cluster, victim: u64, runs: &[(u64, u64)]) -> anyhow::Result<()> {
    let start = Instant::now();
    let others: Vec<u64> = c.running().into_iter().filter(|n| *n != victim).collect();
    let mut pending: Vec<(u64, u64)> = runs.to_vec();
    while start.elapsed() < REPLACE_WITHIN {
        let mut still = Vec::new();
        for (id, generation) in pending {
            let mut moved = false;
            for via in &others {
                if let Ok(j) = c.job(*via, id).await {
                    moved = j.generation > generation || gpu_tests::is_terminal(&j);
                    break;
                }
            }
            if !moved {
                still.push((id, generation));
            }
        }
        if still.is_empty() {
            return Ok(());
        }
        pending = still;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    anyhow::bail!(
        "runs {pending:?} of the stopped n{victim} were not re-placed within {REPLACE_WITHIN:?}"
    )
}
