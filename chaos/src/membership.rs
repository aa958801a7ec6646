//! C12: a membership change under faults. Four agents (three voters, one learner); a voter is
//! killed for good while the workload runs, the leader's autopilot must replace it with the
//! learner (`autopilot.dead_voter_after` is short here), and the load goes on in the new
//! configuration. The heal then brings the removed agent back (it stays a member, as a
//! learner: it replicates and serves again, without a vote).

use std::time::Duration;

use gpu_tests::{Cluster, voters};
use rand::Rng;
use rand::rngs::StdRng;

use crate::history::{Phase, Recorder};
use crate::nemesis::any_status;
use crate::seed::sleep_ms;

/// Agents in the C12 cluster: `voter_target` (3) voters and one learner.
pub const AGENTS: u64 = 4;
/// The agents' configuration for C12: the autopilot acts after 3 s of silence.
pub const CONFIG: &str = "[autopilot]\ndead_voter_after = \"3s\"";

/// The voters as the leader reports them (through the first running agent that answers).
async fn current_voters(c: &Cluster) -> Option<Vec<u64>> {
    any_status(c, None).await.map(|s| voters(&s))
}

/// C12: kill a voter drawn at random (the leader too) for good; wait until the voters are
/// three running agents without it, i.e. the learner was promoted and the dead voter removed.
pub async fn voter_lost(c: &mut Cluster, rec: &Recorder, rng: &mut StdRng) -> anyhow::Result<()> {
    sleep_ms(rng, 1000, 2000).await;
    let before = current_voters(c)
        .await
        .ok_or_else(|| anyhow::anyhow!("no agent reported the voters"))?;
    let victim = before[rng.random_range(0..before.len())];
    rec.nemesis(
        Phase::Invoke,
        format!("kill -9 voter n{victim} for good (voters {before:?})"),
    )?;
    c.kill(victim);
    let want = before.len();
    c.wait_for(
        &format!("the autopilot to replace voter n{victim}"),
        Duration::from_secs(60),
        |c| async move {
            current_voters(c).await.is_some_and(|v| {
                v.len() == want && !v.contains(&victim) && v.iter().all(|id| c.is_running(*id))
            })
        },
    )
    .await;
    let after = current_voters(c).await.unwrap_or_default();
    rec.nemesis(Phase::Info, format!("voters {after:?}: n{victim} replaced"))?;
    sleep_ms(rng, 1500, 3000).await;
    Ok(())
}
