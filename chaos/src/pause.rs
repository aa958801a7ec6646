//! Process pauses (`SIGSTOP` … `SIGCONT`), timed from the scenario's seeded RNG and recorded in
//! the history: C9 the leader paused past the election timeout, C10 an agent holding GPUs
//! paused past its lease (it must fence its runs; the leader must re-place them elsewhere).

use std::path::Path;
use std::time::Duration;

use gpu_tests::Cluster;
use rand::Rng;
use rand::rngs::StdRng;

use crate::client::Client;
use crate::history::{Event, OpKind, Phase, Recorder};
use crate::holder;

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
    let (victim, runs) = holder::long_jobs_holder(c, client, prefix, records).await?;
    note(
        rec,
        Phase::Invoke,
        format!("SIGSTOP n{victim} holding runs (job, generation) {runs:?}"),
    )?;
    c.pause(victim);
    let replaced = holder::wait_replaced(c, victim, &runs).await;
    c.resume(victim);
    note(rec, Phase::Info, format!("SIGCONT n{victim}"))?;
    replaced
}
