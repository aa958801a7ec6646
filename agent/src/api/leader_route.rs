//! Where an operation only the leader can do runs (moving leadership, removing a member): here
//! when this agent leads; else on the leader, asked by this agent over the peer API, but only
//! when this agent is a voter (voters are the cluster's root of trust: the leader takes their
//! word for a caller this agent already authorized); a learner refuses.

use gpu_proto::internal::v1::raft_peer_client::RaftPeerClient;
use tonic::Status;
use tonic::transport::Channel;

use crate::raft::Cluster;

pub(crate) enum Route {
    Here,
    Leader(RaftPeerClient<Channel>),
}

pub(crate) fn route(cluster: &Cluster) -> Result<Route, Status> {
    match cluster.leader() {
        None => Err(Status::unavailable("no leader is known: try again")),
        Some((id, _)) if id == cluster.id => Ok(Route::Here),
        Some(_) if !cluster.view().voters.contains(&cluster.id) => {
            Err(Status::failed_precondition(format!(
                "n{} is a learner: send this to a voter",
                cluster.id
            )))
        }
        Some((_, addr)) => Ok(Route::Leader(cluster.peers.get(&addr)?)),
    }
}

/// On the leader: refuse a forwarded request unless its certificate names a voter (`node`:
/// `None` without TLS).
pub(crate) fn from_a_voter(cluster: &Cluster, node: Option<u64>) -> Result<(), Status> {
    match node {
        Some(n) if !cluster.view().voters.contains(&n) => Err(Status::permission_denied(
            "only a voter may ask the leader for this",
        )),
        _ => Ok(()),
    }
}
