//! Domain → wire conversions for the public API. Generated types are always written `pb::…`.

use std::time::Instant;

use gpu_proto::v1 as pb;
use gpu_raft_store::NodeRecord;

use crate::cluster::RaftView;
use crate::contact::ContactBook;

pub fn node(n: &NodeRecord) -> pb::Node {
    pb::Node {
        id: n.id,
        addr: n.addr.clone(),
        labels: n.effective_labels().into_iter().collect(),
        registered_at_ms: n.registered_at_ms,
        updated_at_ms: n.updated_at_ms,
    }
}

/// Liveness as the leader sees it; `None` when this view is not the leader's.
pub struct Liveness<'a> {
    pub contacts: &'a ContactBook,
    pub reachable_within: std::time::Duration,
}

pub fn cluster_status(
    view: &RaftView,
    voter_target: usize,
    liveness: Option<Liveness<'_>>,
) -> pb::ClusterStatus {
    let now = Instant::now();
    let members = view
        .members
        .iter()
        .map(|(&id, addr)| {
            let is_self = id == view.node_id;
            let ago = liveness.as_ref().and_then(|l| {
                if is_self {
                    Some(0)
                } else {
                    l.contacts.last_heard(id).map(|t| millis(now - t))
                }
            });
            let reachable = liveness
                .as_ref()
                .map(|l| ago.is_some_and(|ms| u128::from(ms) <= l.reachable_within.as_millis()));
            pb::Member {
                node_id: id,
                addr: addr.clone(),
                role: if view.voters.contains(&id) {
                    pb::MemberRole::Voter
                } else {
                    pb::MemberRole::Learner
                } as i32,
                is_leader: view.leader == Some(id),
                reachable,
                last_contact_ms_ago: ago,
                matched_index: view.matched.get(&id).copied(),
            }
        })
        .collect();
    pb::ClusterStatus {
        node_id: view.node_id,
        leader_id: view.leader,
        leader_addr: view
            .leader
            .and_then(|l| view.members.get(&l).cloned())
            .unwrap_or_default(),
        term: view.term,
        commit_index: view.commit_index,
        applied_index: view.applied_index,
        last_log_index: view.last_log_index,
        members,
        voter_target: u32::try_from(voter_target).unwrap_or(u32::MAX),
    }
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
