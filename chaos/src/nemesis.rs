//! Process faults against a running cluster, timed from the scenario's seeded RNG and recorded
//! in the history: C1 leader kill loop, C2 random minority kill loop, C3 kill every node at
//! once, C4 rolling restart, and healing.

use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_tests::Cluster;
use rand::Rng;
use rand::rngs::StdRng;

use crate::history::{Phase, Recorder};
use crate::seed::sleep_ms;

/// How the heal's history event starts (`check::recovery` measures from it).
pub const HEALED: &str = "healed";

/// `kill -9` the current leader and restart it after a short random delay.
pub async fn kill_leader_once(
    c: &mut Cluster,
    rec: &Recorder,
    rng: &mut StdRng,
) -> anyhow::Result<()> {
    let leader = c.leader().await;
    kill_and_restart(c, rec, rng, leader, "leader ", 1500).await
}

/// `kill -9` agent `victim` (`role` says what it was, e.g. `"leader "`) and restart it after
/// 300 ms to `restart_within_ms`.
async fn kill_and_restart(
    c: &mut Cluster,
    rec: &Recorder,
    rng: &mut StdRng,
    victim: u64,
    role: &str,
    restart_within_ms: u64,
) -> anyhow::Result<()> {
    rec.nemesis(Phase::Invoke, format!("kill -9 {role}n{victim}"))?;
    c.kill(victim);
    rec.nemesis(Phase::Info, format!("killed n{victim}"))?;
    sleep_ms(rng, 300, restart_within_ms).await;
    c.start_agent(victim);
    rec.nemesis(Phase::Info, format!("restarted n{victim}"))
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
    rec.nemesis(Phase::Invoke, format!("kill -9 every agent {all:?}"))?;
    for id in &all {
        c.kill(*id);
    }
    rec.nemesis(Phase::Info, "killed every agent".into())?;
    sleep_ms(rng, 500, 2000).await;
    for id in &all {
        c.start_agent(*id);
    }
    rec.nemesis(Phase::Info, format!("restarted {all:?}"))?;
    sleep_ms(rng, 2000, 3000).await;
    Ok(())
}

/// C2: `rounds` times, after a moment of load, `kill -9` one agent drawn at random (leader or
/// not: a minority of three) and restart it after a random delay.
pub async fn minority_kill_loop(
    c: &mut Cluster,
    rec: &Recorder,
    rng: &mut StdRng,
    rounds: u32,
) -> anyhow::Result<()> {
    for _ in 0..rounds {
        sleep_ms(rng, 800, 2000).await;
        let all = c.running();
        let victim = all[rng.random_range(0..all.len())];
        kill_and_restart(c, rec, rng, victim, "", 2500).await?;
    }
    Ok(())
}

/// How long a graceful stop may take before C4 calls it a failure.
const STOP_GRACE: Duration = Duration::from_secs(30);

/// C4: restart every agent in a seeded order, one at a time, each by `SIGTERM` (the graceful
/// path an operator's upgrade takes); the next goes only once the restarted one serves and
/// has applied what the cluster had committed when it stopped.
pub async fn rolling_restart(
    c: &mut Cluster,
    rec: &Recorder,
    rng: &mut StdRng,
) -> anyhow::Result<()> {
    let mut order = c.running();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.random_range(0..=i));
    }
    for id in order {
        sleep_ms(rng, 800, 1800).await;
        let committed = committed_index(c, id).await;
        rec.nemesis(Phase::Invoke, format!("SIGTERM n{id} (rolling restart)"))?;
        c.terminate(id);
        let start = std::time::Instant::now();
        while c.exited(id).is_none() {
            anyhow::ensure!(
                start.elapsed() < STOP_GRACE,
                "n{id} still running {STOP_GRACE:?} after SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        rec.nemesis(Phase::Info, format!("n{id} stopped"))?;
        sleep_ms(rng, 200, 1000).await;
        c.start_agent(id);
        rec.nemesis(Phase::Info, format!("restarted n{id}"))?;
        c.wait_for(
            &format!("n{id} to serve and apply index {committed}"),
            Duration::from_secs(60),
            |c| async move {
                c.status(id, true)
                    .await
                    .is_ok_and(|s| s.leader_id.is_some() && s.applied_index >= committed)
            },
        )
        .await;
        rec.nemesis(Phase::Info, format!("n{id} caught up to {committed}"))?;
    }
    Ok(())
}

/// The commit index the cluster's leader reports (through `via`, falling back to any agent).
async fn committed_index(c: &Cluster, via: u64) -> u64 {
    any_status(c, Some(via)).await.map_or(0, |s| s.commit_index)
}

/// The cluster's status from the first agent that answers: `via` when given, then every
/// running agent.
pub(crate) async fn any_status(c: &Cluster, via: Option<u64>) -> Option<pb::ClusterStatus> {
    for id in via.into_iter().chain(c.running()) {
        if let Ok(s) = c.status(id, false).await {
            return Some(s);
        }
    }
    None
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
    rec.nemesis(
        Phase::Ok,
        format!("{HEALED} (restarted {stopped:?}); leader n{leader}"),
    )
}
