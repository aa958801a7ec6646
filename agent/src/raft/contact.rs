//! When this agent last heard from each peer, and which build the peer said it runs: recorded
//! by the Raft transport on every successful reply, read by cluster status and the autopilot.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use gpu_raft_store::NodeId;

/// How much of a peer's build string is kept.
const MAX_BUILD_LEN: usize = 64;

#[derive(Clone, Debug, Default)]
pub struct ContactBook {
    last: Arc<Mutex<HashMap<NodeId, Instant>>>,
    /// Each peer's build (`protocol::BUILD_HEADER` of its latest reply). Never replicated: a
    /// peer restarted on a new build says so in its next reply.
    builds: Arc<Mutex<HashMap<NodeId, String>>>,
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

    /// Record the build `node` said it runs (at most `MAX_BUILD_LEN` characters of it).
    pub fn heard_build(&self, node: NodeId, build: &str) {
        let build: String = build.chars().take(MAX_BUILD_LEN).collect();
        self.builds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(node, build);
    }

    /// The build `node` last said it runs; `None` before its first reply that said (a build
    /// older than the header says nothing).
    pub fn build_of(&self, node: NodeId) -> Option<String> {
        self.builds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&node)
            .cloned()
    }

    pub fn last_heard(&self, node: NodeId) -> Option<Instant> {
        self.lock().get(&node).copied()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<NodeId, Instant>> {
        self.last.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_build_a_peer_reported_is_kept() {
        let book = ContactBook::default();
        assert_eq!(book.build_of(2), None, "nothing heard yet");
        book.heard_build(2, "0.1.0+aaaaaaa");
        book.heard_build(3, "0.1.0+bbbbbbb");
        book.heard_build(2, "0.2.0+ccccccc");
        assert_eq!(book.build_of(2).as_deref(), Some("0.2.0+ccccccc"));
        assert_eq!(book.build_of(3).as_deref(), Some("0.1.0+bbbbbbb"));
        book.heard_build(4, &"x".repeat(1000));
        assert_eq!(book.build_of(4).map(|b| b.len()), Some(MAX_BUILD_LEN));
    }
}
