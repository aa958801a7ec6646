//! This agent's part in the Raft group: the `Cluster` handle (writes, forwarding, reads,
//! membership), the leader's group commit, openraft's network over the peer API, outgoing peer
//! connections, protocol negotiation, fast failover, and the chaos transport faults.

pub mod cluster;
pub mod contact;
pub mod error;
pub mod failover;
pub mod network;
pub mod peer_client;
pub mod proposal;
pub mod proposer;
pub mod protocol;
pub mod transport_faults;

pub use cluster::{Cluster, RaftView, retry_until};
pub use error::{Attempt, ClusterError};
pub use proposal::{Proposal, Written};
