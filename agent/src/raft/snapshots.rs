//! When this agent snapshots its state: once `raft.snapshot_every` commands were applied since
//! the last snapshot. openraft's own policy counts log entries, and the leader's group commit
//! puts up to 256 writes in one entry (`proposer.rs`): counted in entries, a loaded cluster
//! went millions of writes without a snapshot, its log grew to gigabytes, and a restarted agent
//! replayed all of it. Runs on every agent: each snapshots its own copy, then purges its log.

use std::time::Duration;

use gpu_raft_store::{Raft, StateReader};
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// After asking for a snapshot, how long before the count is looked at again: the build resets
/// it, and openraft ignores a request while a build runs.
const SETTLE: Duration = Duration::from_millis(200);

pub(crate) struct SnapshotTrigger {
    pub raft: Raft,
    pub state: StateReader,
    /// `raft.snapshot_every`.
    pub every: u64,
}

impl SnapshotTrigger {
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let mut applied = self.state.subscribe();
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                changed = applied.changed() => if changed.is_err() { return },
            }
            if self.state.commands_since_snapshot() < self.every {
                continue;
            }
            if let Err(e) = self.raft.trigger().snapshot().await {
                warn!(error = %e, "could not ask Raft for a snapshot: it has stopped");
                return;
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(SETTLE) => {}
            }
        }
    }
}
