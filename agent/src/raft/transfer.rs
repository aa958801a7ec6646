//! Leadership transfer (`gpuctl cluster transfer-leader`), so that a leader's host can be
//! restarted without an election timeout's worth of unavailability and without its agent
//! logging a lost leadership. openraft 0.9 has no transfer of its own; this leader stops its
//! heartbeats, and the target campaigns as soon as the voters' lease on this leader has run out
//! (`Campaign`): before any other follower, which waits the lease plus an election timeout
//! (`failover.rs`). The leader takes its heartbeats up again whatever happened, and answers who
//! leads then. Raft's votes decide, as always: this only picks who asks first.

use std::time::{Duration, Instant};

use gpu_proto::internal::v1::CampaignRequest;
use gpu_raft_store::NodeId;
use tracing::{info, warn};

use super::cluster::{Cluster, RaftView};
use super::peer_client::with_deadline;

/// Past the voters' lease before the target campaigns.
const MARGIN: Duration = Duration::from_millis(20);
/// How long the target keeps campaigning (a write replicated meanwhile renews the lease).
pub(crate) const CAMPAIGN_FOR: Duration = Duration::from_secs(3);

/// The voter to hand leadership to: `to`, or the most caught-up other voter that answered
/// within `fresh`. `Err`: why none can take it (nothing is changed).
pub(crate) fn choose(
    view: &RaftView,
    to: Option<NodeId>,
    answered: impl Fn(NodeId) -> bool,
) -> Result<NodeId, String> {
    let me = view.node_id;
    let caught_up = |id: &NodeId| view.matched.get(id).copied().unwrap_or(0) >= view.commit_index;
    let Some(to) = to else {
        return view
            .voters
            .iter()
            .filter(|id| **id != me && answered(**id) && caught_up(id))
            .max_by_key(|id| {
                (
                    view.matched.get(id).copied().unwrap_or(0),
                    std::cmp::Reverse(**id),
                )
            })
            .copied()
            .ok_or_else(|| "no other voter answers and is caught up: nothing was changed".into());
    };
    if to == me {
        return Err(format!("n{me} leads already"));
    }
    if !view.members.contains_key(&to) {
        return Err(format!("n{to} is not a member of the cluster"));
    }
    if !view.voters.contains(&to) {
        return Err(format!("n{to} is a learner: only a voter can lead"));
    }
    if !answered(to) {
        return Err(format!(
            "n{to} has not answered the leader lately (down, or cut off): nothing was changed"
        ));
    }
    if !caught_up(&to) {
        return Err(format!(
            "n{to} lags behind the log (it holds {} of {} committed entries): try again in a moment",
            view.matched.get(&to).copied().unwrap_or(0),
            view.commit_index
        ));
    }
    Ok(to)
}

/// Hand leadership to `to` (this agent leads): who leads afterwards.
pub(crate) async fn hand_over(cluster: &Cluster, to: NodeId) -> Result<NodeId, String> {
    let addr = cluster
        .view()
        .members
        .get(&to)
        .cloned()
        .ok_or_else(|| format!("n{to} is not a member"))?;
    let runtime = cluster.raft.runtime_config();
    info!(to, "handing leadership over");
    runtime.heartbeat(false);
    let outcome = async {
        tokio::time::sleep(cluster.lease + MARGIN).await;
        let mut client = cluster
            .peers
            .get(&addr)
            .map_err(|s| s.message().to_owned())?;
        client
            .campaign(with_deadline(CampaignRequest {}, Duration::from_secs(2)))
            .await
            .map_err(|s| format!("n{to} did not campaign: {}", s.message()))?;
        let until = Instant::now() + CAMPAIGN_FOR + cluster.lease;
        loop {
            let view = cluster.view();
            match view.leader {
                Some(leader) if leader != cluster.id => return Ok(leader),
                _ if Instant::now() > until => {
                    return Err(format!(
                        "n{to} did not take over: n{} still leads",
                        cluster.id
                    ));
                }
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }
    .await;
    runtime.heartbeat(true);
    match &outcome {
        Ok(leader) => info!(leader, "leadership handed over"),
        Err(why) => warn!(%why, "leadership was not handed over"),
    }
    outcome
}

/// The target's side: campaign until this agent leads, another agent leads that is not the
/// one that asked (`from`), or `CAMPAIGN_FOR` has passed.
pub(crate) async fn campaign(cluster: Cluster, from: NodeId) {
    let until = Instant::now() + CAMPAIGN_FOR;
    while Instant::now() < until {
        let leader = cluster.view().leader;
        if leader.is_some_and(|l| l != from) {
            return;
        }
        if let Err(e) = cluster.raft.trigger().elect().await {
            warn!(error = %e, "could not campaign for leadership");
            return;
        }
        tokio::time::sleep(cluster.lease / 4).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(voters: &[u64], learners: &[u64], matched: &[(u64, u64)]) -> RaftView {
        RaftView {
            node_id: 1,
            leader: Some(1),
            is_leader: true,
            commit_index: 10,
            voters: voters.iter().copied().collect(),
            members: voters
                .iter()
                .chain(learners)
                .map(|id| (*id, format!("h:{id}")))
                .collect(),
            matched: matched.iter().copied().collect(),
            ..RaftView::default()
        }
    }

    #[test]
    fn only_a_caught_up_voter_that_answers_takes_over() {
        let v = view(&[1, 2, 3], &[4], &[(2, 10), (3, 9), (4, 10)]);
        let all = |_| true;
        assert_eq!(choose(&v, Some(2), all), Ok(2));
        assert_eq!(choose(&v, None, all), Ok(2), "the most caught-up voter");
        for (to, why) in [
            (1, "leads already"),
            (4, "is a learner"),
            (9, "not a member"),
            (3, "lags behind"),
        ] {
            let err = choose(&v, Some(to), all).expect_err("refused");
            assert!(err.contains(why), "n{to}: {err}");
        }
        let err = choose(&v, Some(2), |id| id != 2).expect_err("silent");
        assert!(err.contains("has not answered"), "{err}");
        assert!(
            choose(&v, None, |id| id != 2).is_err(),
            "n3 lags, n2 is silent"
        );
    }
}
