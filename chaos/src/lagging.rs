//! C13: a follower so far behind that the leader has purged the log it needs catches up by
//! installing a snapshot. Agents snapshot every `SNAPSHOT_EVERY` entries and keep `KEEP_LOGS`
//! behind it (the scenario's config); the follower is down while the workload writes well
//! past that, and must log an installed snapshot once restarted. The C14 variant restarts it
//! first with a crash point on the install path armed (it must crash there), then clean.

use std::time::{Duration, Instant};

use gpu_tests::Cluster;
use rand::Rng;
use rand::rngs::StdRng;

use crate::history::{Phase, Recorder};
use crate::nemesis::any_status;
use crate::seed::sleep_ms;

/// Snapshot interval of the scenario's agents (`raft.snapshot_every`).
pub const SNAPSHOT_EVERY: u64 = 20;
/// Entries kept behind a snapshot (`raft.keep_logs`).
pub const KEEP_LOGS: u64 = 5;
/// The agents' configuration for C13 (inside `[raft]`).
pub const CONFIG: &str = "snapshot_every = 20\nkeep_logs = 5";
/// What `state_machine.rs` logs when it installs a snapshot sent by the leader.
const INSTALLED: &str = "installed a snapshot from the leader";
/// How long the workload gets to write past the purge point.
const WRITE_WITHIN: Duration = Duration::from_secs(60);

fn installs(c: &Cluster, id: u64) -> anyhow::Result<usize> {
    let log = std::fs::read_to_string(&c.agents[&id].log)?;
    Ok(log.matches(INSTALLED).count())
}

/// C13: kill a follower, wait until the cluster has committed three snapshot intervals past
/// where it stopped, restart it, wait until it has applied that far, and require that it got
/// there by installing a snapshot. With `crash_at` (a `snapshot-install-*` point), the first
/// restart must crash there, and the clean one after it must still catch up.
pub async fn follower_behind_purged_log(
    c: &mut Cluster,
    rec: &Recorder,
    rng: &mut StdRng,
    crash_at: Option<&'static str>,
) -> anyhow::Result<()> {
    sleep_ms(rng, 1000, 2000).await;
    let leader = c.leader().await;
    let followers: Vec<u64> = c.running().into_iter().filter(|&id| id != leader).collect();
    let victim = followers[rng.random_range(0..followers.len())];
    let stopped_at = c.status(victim, true).await?.last_log_index;
    rec.nemesis(
        Phase::Invoke,
        format!("kill -9 follower n{victim} at log index {stopped_at}"),
    )?;
    c.kill(victim);
    let past = stopped_at + 3 * (SNAPSHOT_EVERY + KEEP_LOGS);
    let start = Instant::now();
    let committed = loop {
        if let Some(i) = any_status(c, None).await.map(|s| s.commit_index)
            && i >= past
        {
            break i;
        }
        anyhow::ensure!(
            start.elapsed() < WRITE_WITHIN,
            "the cluster did not commit up to index {past} within {WRITE_WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    rec.nemesis(
        Phase::Info,
        format!("committed {committed} while n{victim} was down"),
    )?;
    let before = installs(c, victim)?;
    if let Some(point) = crash_at {
        let status =
            crate::crash::restart_armed(c, rec, victim, point, 0, crate::crash::FIRE_WITHIN, false)
                .await?;
        anyhow::ensure!(
            status.code() == Some(gpu_raft_store::failpoint::CRASH_EXIT),
            "n{victim} ended with {status}, not at failpoint {point}"
        );
        rec.nemesis(Phase::Info, format!("n{victim} crashed at {point}"))?;
    }
    c.start_agent(victim);
    rec.nemesis(Phase::Info, format!("restarted n{victim}"))?;
    c.wait_applied(victim, committed, Duration::from_secs(60))
        .await;
    // A crash after the snapshot file was written leaves the follower restarting from it,
    // with no second install needed; the crash at the install point is the proof then.
    let after = installs(c, victim)?;
    anyhow::ensure!(
        after > before || crash_at.is_some_and(|p| p.ends_with("after-write")),
        "n{victim} caught up to {committed} without installing a snapshot"
    );
    rec.nemesis(
        Phase::Info,
        format!("n{victim} caught up by installing a snapshot"),
    )?;
    sleep_ms(rng, 500, 1500).await;
    Ok(())
}
