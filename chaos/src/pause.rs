//! Process pauses (`SIGSTOP` … `SIGCONT`), timed from the scenario's seeded RNG and recorded in
//! the history: C9 the leader paused past the election timeout, C10 an agent holding GPUs
//! paused past its lease (it must fence its runs; the leader must re-place them elsewhere).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use gpu_proto::v1 as pb;
use gpu_tests::Cluster;
use rand::Rng;
use rand::rngs::StdRng;

use crate::client::{Client, Outcome};
use crate::history::{Event, OpKind, Phase, Recorder};

const PROCESS: &str = "nemesis";

fn note(rec: &Recorder, phase: Phase, what: String) -> anyhow::Result<()> {
    rec.record(Event {
        value: Some(what),
        ..Event::new(PROCESS, phase, OpKind::Nemesis)
    })
}

async fn sleep_ms(rng: &mut StdRng, lo: u64, hi: u64) {
    tokio::time::sleep(Duration::from_millis(rng.random_range(lo..hi))).await;
}

/// C9: `rounds` times, let the load run, then `SIGSTOP` the leader for 1.5–3 s (well past the
/// election timeout and the leader lease, so the others elect a new leader) and `SIGCONT` it.
pub async fn leader_pause(
    c: &mut Cluster,
    rec: &Recorder,
    rng: &mut StdRng,
    rounds: u32,
) -> anyhow::Result<()> {
    for _ in 0..rounds {
        sleep_ms(rng, 1000, 2000).await;
        let leader = c.leader().await;
        let pause = Duration::from_millis(rng.random_range(1500..3000));
        note(
            rec,
            Phase::Invoke,
            format!("SIGSTOP leader n{leader} for {pause:?}"),
        )?;
        c.pause(leader);
        tokio::time::sleep(pause).await;
        c.resume(leader);
        note(rec, Phase::Info, format!("SIGCONT n{leader}"))?;
    }
    Ok(())
}

/// How long the C10 jobs run: long enough to be caught running by the pause.
const HOLDER_JOB_SECS: &str = "6";
/// The C10 jobs submitted before choosing whom to pause.
const HOLDER_JOBS: usize = 4;
/// How long the paused agent's runs get to be re-placed before the scenario gives up.
const REPLACE_WITHIN: Duration = Duration::from_secs(20);

/// C10: submit a few long recording jobs, wait until one runs, `SIGSTOP` the agent running it
/// for longer than `jobs.down_after`, and keep it stopped until every run it held has been
/// placed again elsewhere (the job's generation moved on); then `SIGCONT` it. The run records
/// show whether the stopped node fenced its runs before they were re-placed.
pub async fn holder_pause(
    c: &mut Cluster,
    rec: &Recorder,
    rng: &mut StdRng,
    client: &Client,
    prefix: &str,
    records: &Path,
) -> anyhow::Result<()> {
    sleep_ms(rng, 500, 1500).await;
    let mut ids = Vec::new();
    for k in 0..HOLDER_JOBS {
        let key = format!("{prefix}-long-{k}");
        let spec = pb::JobSpec {
            max_attempts: 10,
            ..gpu_tests::shell_job(
                &key,
                1,
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
    // The node with the most running long jobs (ties: the lowest id).
    let mut per_node: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    for (id, node, generation) in held {
        per_node.entry(node).or_default().push((id, generation));
    }
    let (victim, runs) = per_node
        .into_iter()
        .max_by_key(|(node, runs)| (runs.len(), std::cmp::Reverse(*node)))
        .ok_or_else(|| anyhow::anyhow!("no long job is running"))?;
    note(
        rec,
        Phase::Invoke,
        format!("SIGSTOP n{victim} holding runs (job, generation) {runs:?}"),
    )?;
    c.pause(victim);
    let replaced = wait_replaced(c, victim, &runs).await;
    c.resume(victim);
    note(rec, Phase::Info, format!("SIGCONT n{victim}"))?;
    replaced
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

/// Wait while `victim` is stopped until every one of its `runs` has moved on (a newer
/// generation, or finished), asking the other agents.
async fn wait_replaced(c: &Cluster, victim: u64, runs: &[(u64, u64)]) -> anyhow::Result<()> {
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
