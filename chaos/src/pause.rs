//! Process pauses (`SIGSTOP` … `SIGCONT`), timed from the scenario's seeded RNG and recorded in
//! the history: C9 the leader paused past the election timeout, C10 an agent holding GPUs
//! paused past its lease (it must fence its runs; the leader must re-place them elsewhere).

use std::time::Duration;

use gpu_tests::Cluster;
use rand::Rng;
use rand::rngs::StdRng;

use crate::history::{Phase, Recorder};
use crate::holder;
use crate::seed::sleep_ms;
use crate::workload::Load;

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
        rec.nemesis(
            Phase::Invoke,
            format!("SIGSTOP leader n{leader} for {pause:?}"),
        )?;
        c.pause(leader);
        tokio::time::sleep(pause).await;
        c.resume(leader);
        rec.nemesis(Phase::Info, format!("SIGCONT n{leader}"))?;
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
    load: Load<'_>,
) -> anyhow::Result<()> {
    sleep_ms(rng, 500, 1500).await;
    let (victim, runs) = holder::long_jobs_holder(c, load).await?;
    rec.nemesis(
        Phase::Invoke,
        format!("SIGSTOP n{victim} holding runs (job, generation) {runs:?}"),
    )?;
    c.pause(victim);
    let replaced = holder::wait_replaced(c, victim, &runs).await;
    c.resume(victim);
    rec.nemesis(Phase::Info, format!("SIGCONT n{victim}"))?;
    replaced
}
