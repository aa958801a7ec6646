//! This agent's part in the Raft group: the `Cluster` handle (writes, forwarding, reads,
//! membership), the leader's group commit, openraft's network over the peer API, outgoing peer
//! connections, protocol negotiation, fast failover, and the chaos transport faults.

pub(crate) mod archive_fill;
pub(crate) mod cluster;
pub(crate) mod contact;
pub(crate) mod error;
pub(crate) mod failover;
pub(crate) mod membership_audit;
pub(crate) mod network;
pub(crate) mod peer_client;
pub(crate) mod peer_message;
pub(crate) mod proposal;
pub(crate) mod proposer;
pub mod protocol;
pub(crate) mod snapshot_wire;
pub(crate) mod snapshots;
pub(crate) mod transfer;
pub(crate) mod transport_faults;

pub use cluster::{Cluster, RaftView, retry_until};
pub use error::{Attempt, ClusterError};
pub use proposal::{Credential, OnBehalf, Proposal, Written};
