//! Faults from inside the agent, through the failpoints build (`failpoints.rs`): C14 crashes
//! at named failpoints around vote, append, apply and snapshot, and C15 an fsync that fails.
//! Each round restarts one agent with `FAIL_POINTS` set, waits until the point has ended the
//! process (a point that never fires is an error: the scenario would prove nothing), then
//! restarts it without failpoints.

use std::process::ExitStatus;
use std::time::{Duration, Instant};

use gpu_raft_store::failpoint::CRASH_EXIT;
use gpu_tests::Cluster;
use rand::Rng;
use rand::rngs::StdRng;

use crate::history::{Phase, Recorder};
use crate::seed::sleep_ms;

/// How long a switched-on point may take to fire.
pub(crate) const FIRE_WITHIN: Duration = Duration::from_secs(40);
/// How long an agent whose storage failed may take to stop on its own.
const STOP_WITHIN: Duration = Duration::from_secs(30);

/// Kill agent `victim`, restart it with `FAIL_POINTS=<point>=<skip>*off->return` (the point
/// fires on its `skip + 1`-th pass), and wait up to `within` for it to exit on its own. With
/// `new_leader`, the restart waits until the others have elected a leader: a killed leader
/// back within its lease resumes its old vote and would never save a new one.
pub(crate) async fn restart_armed(
    c: &mut Cluster,
    rec: &Recorder,
    victim: u64,
    point: &str,
    skip: u32,
    within: Duration,
    new_leader: bool,
) -> anyhow::Result<ExitStatus> {
    rec.nemesis(
        Phase::Invoke,
        format!("kill -9 n{victim}; restart it with failpoint {point} after {skip} passes"),
    )?;
    c.kill(victim);
    if new_leader {
        let leader = c.leader().await;
        rec.nemesis(Phase::Info, format!("n{leader} leads without n{victim}"))?;
    }
    let agent = c.agents.get_mut(&victim).expect("known agent");
    agent
        .env
        .insert("FAIL_POINTS".into(), format!("{point}={skip}*off->return"));
    c.start_agent(victim);
    let start = Instant::now();
    let status = loop {
        if let Some(status) = c.exited(victim) {
            break status;
        }
        anyhow::ensure!(
            start.elapsed() < within,
            "failpoint {point} did not end n{victim} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    c.agents
        .get_mut(&victim)
        .expect("known agent")
        .env
        .remove("FAIL_POINTS");
    Ok(status)
}

/// C14: for each point, after a moment of load, restart one agent (the leader for vote
/// points, whose vote changes when the others elect a successor; otherwise one drawn at
/// random) with the point armed, wait until it crashes there, restart it clean.
pub async fn crash_at(
    c: &mut Cluster,
    rec: &Recorder,
    rng: &mut StdRng,
    points: &[&str],
) -> anyhow::Result<()> {
    for point in points {
        sleep_ms(rng, 800, 1500).await;
        let vote = point.starts_with("vote");
        let victim = if vote {
            c.leader().await
        } else {
            let all = c.running();
            all[rng.random_range(0..all.len())]
        };
        // A restarted agent saves its vote once or twice (the new leader's term), so vote
        // points fire on their first pass; snapshot points (a pass a second or so) after at
        // most two; the others after a few.
        let skip = if vote {
            0
        } else if point.starts_with("snapshot") {
            rng.random_range(0..3)
        } else {
            rng.random_range(0..8)
        };
        let status = restart_armed(c, rec, victim, point, skip, FIRE_WITHIN, vote).await?;
        anyhow::ensure!(
            status.code() == Some(CRASH_EXIT),
            "n{victim} ended with {status}, not at failpoint {point}"
        );
        rec.nemesis(Phase::Info, format!("n{victim} crashed at {point}"))?;
        sleep_ms(rng, 200, 1000).await;
        c.start_agent(victim);
        rec.nemesis(
            Phase::Info,
            format!("restarted n{victim} without failpoints"),
        )?;
    }
    sleep_ms(rng, 1000, 2000).await;
    Ok(())
}

/// C15, twice: first the leader, then a follower drawn at random, is restarted with every
/// fsync failing after a few (a leader restarted at once usually resumes leading); each must
/// stop on its own (exit status 2, its last log line naming the fatal error, having
/// acknowledged nothing it could not make durable) rather than run on, and is then restarted
/// with a healthy disk.
pub async fn fsync_error(c: &mut Cluster, rec: &Recorder, rng: &mut StdRng) -> anyhow::Result<()> {
    for round in 0..2 {
        sleep_ms(rng, 1000, 2000).await;
        let leader = c.leader().await;
        let victim = if round == 0 {
            leader
        } else {
            let followers: Vec<u64> = c.running().into_iter().filter(|&id| id != leader).collect();
            followers[rng.random_range(0..followers.len())]
        };
        let skip = rng.random_range(5..30);
        let status = restart_armed(c, rec, victim, "fsync-error", skip, STOP_WITHIN, false).await?;
        anyhow::ensure!(
            status.code() == Some(2),
            "n{victim} ended with {status} after fsync failed (want exit status 2)"
        );
        let log = std::fs::read_to_string(&c.agents[&victim].log)?;
        let last = log.lines().last().unwrap_or_default();
        anyhow::ensure!(
            last.contains("raft stopped on a fatal error")
                && last.contains("failpoint fsync-error"),
            "n{victim}'s last words do not say why it stopped: {last:?}"
        );
        rec.nemesis(
            Phase::Info,
            format!("n{victim} stopped after fsync failed ({status})"),
        )?;
        sleep_ms(rng, 500, 1500).await;
        c.start_agent(victim);
        rec.nemesis(
            Phase::Info,
            format!("restarted n{victim} with a healthy disk"),
        )?;
    }
    sleep_ms(rng, 1000, 2000).await;
    Ok(())
}
