//! The rules of `ClusterState::apply`, one file per domain, each an `impl ClusterState` block;
//! `state.rs` dispatches every command to its method here. Every rule re-checks its command
//! (whatever the proposer believed) and changes nothing when it rejects.

mod alerts;
pub(crate) mod archive;
mod arrays;
mod audit_heads;
mod binds;
mod ca;
#[cfg(test)]
mod ca_tests;
mod certificates;
mod dependencies;
mod energy;
pub(crate) mod expiry;
mod gangs;
mod jobs;
mod nodes;
mod partitions;
mod preemption;
mod scheduler;
mod tenants;
mod tokens;
mod updates;
