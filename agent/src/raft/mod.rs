//! This agent's part in the Raft group: the `Cluster` handle (writes, forwarding, reads,
//! membership), the leader's group commit, openraft's network over the peer API, outgoing peer
//! connections, protocol negotiation, fast failover, and the chaos transport faults.

pub mod cluster;
pub mod contact;
pub mod failover;
pub mod network;
pub mod peer_client;
pub mod proposer;
pub mod protocol;
pub mod transport_faults;
