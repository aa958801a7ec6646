//! Process faults against a running cluster, timed from the scenario's seeded RNG and recorded
//! in the history: C1 leader kill loop, C3 kill every node at once, and healing.

use std::time::Duration;

use gpu_tests::Cluster;
use rand::Rng;
use rand::rngs::StdRng;

use crate::history::{Event, OpKind, Phase, Recorder};

const PROCESS: &str = "nemesis";

/// How the heal's history event starts (`check::recovery` measures from it).
pub const HEALED: &str = "healed";

fn note(rec: &Recorder, phase: Phase, what: String) -> anyhow::Result<()> {
    rec.record(Event {
        value: Some(what),
        ..Event::new(PROCESS, phase, OpKind::Nemesis)
    })
}

async fn sleep_ms(rng: &mut StdRng, lo: u64, hi: u64) {
    tokio::time::sleep(Duration::from_millis(rng.random_range(lo..hi))).await;
}

/// `kill -9` the current leader and restart it after a short random delay.
pub async fn kill_leader_once(
    c: &mut Cluster,
    rec: &Recorder,
    rng: &mut StdRng,
) -> anyhow::Result<()> {
    let leader = c.leader().await;
    note(rec, Phase::Invoke, format!("kill -9 leader n{leader}"))?;
    c.kill(leader);
    note(rec, Phase::Info, format!("killed n{leader}"))?;
    sleep_ms(rng, 300, 1500).await;
    c.start_agent(leader);
    note(rec, Phase::Info, format!("restarted n{leader}"))?;
    Ok(())
}

/// C1: `rounds` times, let the load run a moment, then kill the leader and restart it.
pub async fn leader_kill_loop(
    c: &mut Cluster,
    rec: &Recorder,
    rng: &mut StdRng,
    rounds: u32,
) -> anyhow::Result<()> {
    for _ in 0..rounds {
        sleep_ms(rng, 1000, 2500).await;
        kill_leader_once(c, rec, rng).await?;
    }
    Ok(())
}

/// C3: after a moment of load, `kill -9` every agent at once, then restart them all.
pub async fn kill_all(c: &mut Cluster, rec: &Recorder, rng: &mut StdRng) -> anyhow::Result<()> {
    sleep_ms(rng, 2000, 3500).await;
    let all = c.running();
    note(rec, Phase::Invoke, format!("kill -9 every agent {all:?}"))?;
    for id in &all {
        c.kill(*id);
    }
    note(rec, Phase::Info, "killed every agent".into())?;
    sleep_ms(rng, 500, 2000).await;
    for id in &all {
        c.start_agent(*id);
    }
    note(rec, Phase::Info, format!("restarted {all:?}"))?;
    sleep_ms(rng, 2000, 3000).await;
    Ok(())
}

/// Restart every stopped agent and wait until all serve and a leader is known.
pub async fn heal(c: &mut Cluster, rec: &Recorder) -> anyhow::Result<()> {
    let stopped: Vec<u64> = c
        .agents
        .keys()
        .copied()
        .filter(|id| !c.is_running(*id))
        .collect();
    for id in &stopped {
        c.start_agent(*id);
    }
    c.wait_serving().await;
    let leader = c.leader().await;
    note(
        rec,
        Phase::Ok,
        format!("{HEALED} (restarted {stopped:?}); leader n{leader}"),
    )
}
