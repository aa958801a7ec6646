//! Autopilot (leader only): keep `voter_target` voters. A voter unreachable for longer than
//! `dead_voter_after` is replaced by the most caught-up healthy learner and removed; missing
//! voter seats are filled from healthy learners. Members at an edge site are learners only:
//! never promoted, and replaced like a dead voter should one hold a seat (a voter whose agent
//! was reconfigured as edge). A learner that has not registered yet is not promoted either
//! (its registration says whether it is at an edge site). The decision is the pure
//! `plan_voters`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use gpu_raft_store::NodeId;
use openraft::ChangeMembers;
use tokio_util::sync::CancellationToken;

use super::ticks::LeaderTicks;
use crate::raft::{Attempt, Cluster};

/// How a member looks from the leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Health {
    /// Heard from recently and (for learners) close to the leader's log.
    Healthy,
    /// Silent, but not yet long enough to act on.
    Suspect,
    /// Silent longer than the dead-voter grace.
    Dead,
    /// At an edge site (or not registered yet, so not known not to be): never a candidate for
    /// a voter seat, and a voter seat it holds is given to a healthy learner.
    LearnerOnly,
}

/// The voter set to move to, or `None` to stay. Never removes a voter without a replacement,
/// never touches the leader, prefers learners with the highest matched index.
pub(crate) fn plan_voters(
    leader: NodeId,
    voters: &BTreeSet<NodeId>,
    learners: &BTreeMap<NodeId, (Health, u64)>,
    health_of_voter: impl Fn(NodeId) -> Health,
    target: usize,
) -> Option<BTreeSet<NodeId>> {
    let mut candidates: Vec<(NodeId, u64)> = learners
        .iter()
        .filter(|(_, (h, _))| *h == Health::Healthy)
        .map(|(id, (_, matched))| (*id, *matched))
        .collect();
    candidates.sort_by_key(|(id, matched)| (std::cmp::Reverse(*matched), *id));
    let mut candidates = candidates.into_iter().map(|(id, _)| id);
    let mut next = voters.clone();
    for dead in voters.iter().filter(|v| {
        **v != leader && matches!(health_of_voter(**v), Health::Dead | Health::LearnerOnly)
    }) {
        match candidates.next() {
            Some(replacement) => {
                next.remove(dead);
                next.insert(replacement);
            }
            None => break,
        }
    }
    while next.len() < target {
        match candidates.next() {
            Some(l) => {
                next.insert(l);
            }
            None => break,
        }
    }
    (next != *voters).then_some(next)
}

pub(crate) struct Autopilot {
    pub cluster: Cluster,
    pub dead_voter_after: Duration,
    pub reachable_within: Duration,
    pub interval: Duration,
}

/// A learner this far behind the leader's log is not promoted yet.
const MAX_PROMOTION_LAG: u64 = 100;

impl Autopilot {
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let mut ticks = LeaderTicks::new(self.cluster.clone(), self.interval);
        while let Some((view, since)) = ticks.next(&cancel).await {
            let health = |id: NodeId| {
                if self.cluster.learner_only(id).is_some() {
                    return Health::LearnerOnly;
                }
                let silent = self.cluster.contacts.silent_for(id, since);
                if silent <= self.reachable_within {
                    Health::Healthy
                } else if silent > self.dead_voter_after {
                    Health::Dead
                } else {
                    Health::Suspect
                }
            };
            let learners = view
                .members
                .keys()
                .filter(|id| !view.voters.contains(id))
                .map(|&id| {
                    let matched = view.matched.get(&id).copied().unwrap_or(0);
                    let registered = self.cluster.state.read(|s| s.nodes.contains_key(&id));
                    let h = match health(id) {
                        _ if !registered => Health::LearnerOnly,
                        Health::Healthy if matched + MAX_PROMOTION_LAG < view.last_log_index => {
                            Health::Suspect
                        }
                        h => h,
                    };
                    (id, (h, matched))
                })
                .collect();
            let Some(next) = plan_voters(
                self.id(),
                &view.voters,
                &learners,
                health,
                self.cluster.voter_target(),
            ) else {
                continue;
            };
            // An edge voter leaving its seat is alive: it stays a member, as a learner. (A dead
            // voter replaced in the same change then stays listed as a learner too.)
            let retain = view
                .voters
                .iter()
                .any(|v| !next.contains(v) && health(*v) == Health::LearnerOnly);
            tracing::info!(from = ?view.voters, to = ?next, retain, "autopilot: changing voters");
            match self
                .cluster
                .change_membership(ChangeMembers::ReplaceAllVoters(next), retain)
                .await
            {
                Ok(()) => {}
                Err(Attempt::Retry(e) | Attempt::Fail(e)) => {
                    tracing::warn!(error = %e, "autopilot: membership change failed; will retry");
                }
            }
        }
    }

    fn id(&self) -> NodeId {
        self.cluster.id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[NodeId]) -> BTreeSet<NodeId> {
        ids.iter().copied().collect()
    }

    #[test]
    fn dead_voter_is_replaced_by_most_caught_up_learner() {
        let learners = BTreeMap::from([(4, (Health::Healthy, 10)), (5, (Health::Healthy, 12))]);
        let health = |id| {
            if id == 2 {
                Health::Dead
            } else {
                Health::Healthy
            }
        };
        assert_eq!(
            plan_voters(1, &set(&[1, 2, 3]), &learners, health, 3),
            Some(set(&[1, 3, 5]))
        );
    }

    #[test]
    fn suspect_voters_and_unhealthy_learners_are_left_alone() {
        let learners = BTreeMap::from([(4, (Health::Suspect, 10)), (5, (Health::Dead, 12))]);
        let dead2 = |id| {
            if id == 2 {
                Health::Dead
            } else {
                Health::Healthy
            }
        };
        assert_eq!(
            plan_voters(1, &set(&[1, 2, 3]), &learners, dead2, 3),
            None,
            "no healthy replacement"
        );
        let healthy = BTreeMap::from([(4, (Health::Healthy, 10))]);
        let suspect2 = |id| {
            if id == 2 {
                Health::Suspect
            } else {
                Health::Healthy
            }
        };
        assert_eq!(
            plan_voters(1, &set(&[1, 2, 3]), &healthy, suspect2, 3),
            None,
            "not dead yet"
        );
    }

    #[test]
    fn seats_are_filled_up_to_the_target_only() {
        let learners = BTreeMap::from([
            (2, (Health::Healthy, 5)),
            (3, (Health::Healthy, 5)),
            (4, (Health::Healthy, 5)),
        ]);
        assert_eq!(
            plan_voters(1, &set(&[1]), &learners, |_| Health::Healthy, 3),
            Some(set(&[1, 2, 3]))
        );
        assert_eq!(
            plan_voters(1, &set(&[1, 2, 3]), &learners, |_| Health::Healthy, 3),
            None
        );
    }

    #[test]
    fn edge_members_never_take_a_seat() {
        let learners = BTreeMap::from([(4, (Health::LearnerOnly, 50)), (5, (Health::Healthy, 5))]);
        assert_eq!(
            plan_voters(1, &set(&[1]), &learners, |_| Health::Healthy, 3),
            Some(set(&[1, 5])),
            "the free seat goes to the plain learner, the edge one stays a learner"
        );
        let only_edge = BTreeMap::from([(4, (Health::LearnerOnly, 50))]);
        assert_eq!(
            plan_voters(1, &set(&[1]), &only_edge, |_| Health::Healthy, 3),
            None
        );
        // A voter that turned out to be at an edge site gives its seat to a healthy learner.
        let edge3 = |id| {
            if id == 3 {
                Health::LearnerOnly
            } else {
                Health::Healthy
            }
        };
        assert_eq!(
            plan_voters(1, &set(&[1, 2, 3]), &learners, edge3, 3),
            Some(set(&[1, 2, 5]))
        );
    }

    #[test]
    fn the_leader_is_never_removed() {
        let learners = BTreeMap::from([(4, (Health::Healthy, 5))]);
        assert_eq!(
            plan_voters(1, &set(&[1, 2, 3]), &learners, |_| Health::Dead, 3),
            Some(set(&[1, 3, 4]))
        );
    }
}
