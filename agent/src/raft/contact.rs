//! When this agent last heard from each peer: recorded by the Raft transport on every successful
//! reply, read by cluster status and the autopilot.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use gpu_raft_store::NodeId;

#[derive(Clone, Debug, Default)]
pub struct ContactBook {
    last: Arc<Mutex<HashMap<NodeId, Instant>>>,
    /// When this agent last accepted replication from a leader.
    leader: Arc<Mutex<Option<Instant>>>,
}

impl ContactBook {
    pub fn heard_from_leader(&self) {
        *self.leader.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }

    /// When this agent last accepted replication from a leader.
    pub fn leader_heard_at(&self) -> Option<Instant> {
        *self.leader.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn leader_heard_within(&self, d: std::time::Duration) -> bool {
        self.leader
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|t| t.elapsed() < d)
    }

    pub fn heard_from(&self, node: NodeId) {
        self.lock().insert(node, Instant::now());
    }

    pub fn heard_within(&self, node: NodeId, d: std::time::Duration) -> bool {
        self.last_heard(node).is_some_and(|t| t.elapsed() < d)
    }

    /// How long `node` has been silent, counting no earlier than `since` (when this agent
    /// became leader: before that nobody was reporting to it).
    pub fn silent_for(&self, node: NodeId, since: Instant) -> std::time::Duration {
        self.last_heard(node)
            .map_or(since, |t| t.max(since))
            .elapsed()
    }

    pub fn last_heard(&self, node: NodeId) -> Option<Instant> {
        self.lock().get(&node).copied()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<NodeId, Instant>> {
        self.last.lock().unwrap_or_else(|p| p.into_inner())
    }
}
