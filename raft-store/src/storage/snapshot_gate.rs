//! What the log store must know about snapshots before it purges: openraft 0.9 issues the log
//! purge of a snapshot install without waiting for the state machine to make that snapshot
//! durable, so a crash in between left the log purged past the snapshot on disk, and openraft
//! then panicked on every start (`purge_upto <= snapshot_last_log_id`). The state machine
//! reports here when it starts receiving a snapshot and which snapshot is on disk; a purge
//! past the durable snapshot while one is being received waits until it is durable.

use std::time::Duration;

use tokio::sync::watch;

/// How long a purge waits for the snapshot being installed before failing (then Raft stops
/// with the error and nothing past the durable snapshot has been purged).
const WAIT: Duration = Duration::from_secs(30);

/// The snapshot side of the gate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Gate {
    /// A snapshot is being received from the leader (set when it starts, cleared once
    /// installed; left set if the install fails, so purges past it keep waiting).
    pub receiving: bool,
    /// Last log index of the snapshot on disk.
    pub durable: Option<u64>,
}

/// Shared by the state machine (writer) and the log store (reader).
#[derive(Clone, Debug)]
pub(crate) struct SnapshotGate(std::sync::Arc<watch::Sender<Gate>>);

impl SnapshotGate {
    pub(crate) fn new(durable: Option<u64>) -> Self {
        Self(std::sync::Arc::new(watch::Sender::new(Gate {
            receiving: false,
            durable,
        })))
    }

    pub(crate) fn receiving(&self) {
        self.0.send_modify(|g| g.receiving = true);
    }

    /// A snapshot up to `index` is on disk (`installed`: the one being received).
    pub(crate) fn durable(&self, index: Option<u64>, installed: bool) {
        self.0.send_modify(|g| {
            g.durable = index;
            if installed {
                g.receiving = false;
            }
        });
    }

    pub(crate) fn get(&self) -> Gate {
        *self.0.borrow()
    }

    /// Wait until purging the log up to `index` cannot outrun the snapshot on disk. `Err`
    /// describes why the purge must not happen.
    pub(crate) async fn purge_allowed(&self, index: u64) -> Result<(), String> {
        let allowed = |g: &Gate| !g.receiving || g.durable.is_some_and(|d| d >= index);
        let mut rx = self.0.subscribe();
        match tokio::time::timeout(WAIT, rx.wait_for(allowed)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) | Err(_) => Err(format!(
                "refusing to purge the log up to {index}: the snapshot being installed is not \
                 durable after {WAIT:?}"
            )),
        }
    }
}
