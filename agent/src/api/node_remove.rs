//! `NodeService.RemoveNode` on the leader: a learner leaves the Raft membership for good and
//! its certificates are revoked, so a host that comes back must join anew. The checks are
//! pure (`refusal`); a voter is the autopilot's to demote, and a node running jobs is drained
//! first.

use std::collections::BTreeSet;
use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_raft_store::{ClusterState, Command, NodeId};
use openraft::ChangeMembers;
use tonic::Status;

use crate::raft::{Cluster, RaftView, retry_until};

/// Why node `id` may not be removed now, if it may not.
pub(crate) fn refusal(view: &RaftView, state: &ClusterState, id: NodeId) -> Option<String> {
    if !view.members.contains_key(&id) {
        return Some(format!("n{id} is not a member of the cluster"));
    }
    if view.voters.contains(&id) {
        return Some(format!(
            "n{id} is a voter: stop its agent, and the autopilot makes it a learner after \
             autopilot.dead_voter_after (while it answers, it keeps its seat); then remove it"
        ));
    }
    let live = state
        .jobs
        .values()
        .filter(|j| j.state.is_live() && j.on_node(id))
        .count();
    (live > 0).then(|| {
        format!(
            "n{id} runs {live} job(s): drain it first (`gpuctl node drain {id} --evict --wait`)"
        )
    })
}

/// Remove learner `id` (this agent leads): the serials revoked.
pub(crate) async fn remove_here(
    cluster: &Cluster,
    id: NodeId,
) -> Result<pb::RemoveNodeResponse, Status> {
    let view = cluster.view();
    if !view.is_leader {
        return Err(Status::unavailable("this agent is not the leader"));
    }
    if let Some(why) = cluster.state.read(|s| refusal(&view, s, id)) {
        return Err(Status::failed_precondition(why));
    }
    retry_until(Duration::from_secs(10), || {
        cluster.change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false)
    })
    .await?;
    let subject = format!("node {id}");
    let serials: Vec<String> = cluster.state.read(|s| {
        s.certificates
            .values()
            .filter(|c| c.subject == subject && !c.revoked)
            .map(|c| c.serial.clone())
            .collect()
    });
    for serial in &serials {
        let revoke = Command::RevokeCertificate {
            serial: serial.clone(),
            reason: format!("n{id} was removed from the cluster"),
        };
        cluster.write(revoke).await?;
    }
    Ok(pb::RemoveNodeResponse { revoked: serials })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> RaftView {
        RaftView {
            node_id: 1,
            voters: [1, 2, 3].into(),
            members: (1..=4).map(|id| (id, format!("h:{id}"))).collect(),
            ..RaftView::default()
        }
    }

    #[test]
    fn only_an_idle_learner_is_removed() {
        let s = ClusterState::new();
        assert_eq!(refusal(&view(), &s, 4), None);
        let not = refusal(&view(), &s, 9).expect("not a member");
        assert!(not.contains("not a member"), "{not}");
        let voter = refusal(&view(), &s, 2).expect("a voter");
        assert!(voter.contains("is a voter"), "{voter}");
    }
}
