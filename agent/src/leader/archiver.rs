//! Retention (leader only): every `interval`, while the replicated state holds finished jobs or
//! audit entries that `retention` no longer keeps, the leader proposes `Command::Archive` with
//! its retention, which every replica applies at the same index, moving the same records into
//! its archive. A backlog leaves over several entries (each moves a bounded number). Proposed
//! only as this leader, never forwarded, and only once every member reads it.

use std::time::Duration;

use gpu_raft_store::retention::Retention;
use gpu_raft_store::{Command, PROTOCOL_10};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::ticks::LeaderTicks;
use crate::clock::now_ms;
use crate::raft::{Attempt, Cluster, Proposal};

/// The most `Archive` entries proposed in one look: a backlog beyond it waits for the next.
const MAX_ENTRIES_PER_LOOK: usize = 16;

pub(crate) struct Archiver {
    pub cluster: Cluster,
    pub retention: Retention,
    pub interval: Duration,
}

impl Archiver {
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let mut ticks = LeaderTicks::new(self.cluster.clone(), self.interval);
        while ticks.next(&cancel).await.is_some() {
            if self.cluster.lowest_protocol() < PROTOCOL_10 {
                continue;
            }
            for _ in 0..MAX_ENTRIES_PER_LOOK {
                let due = self
                    .cluster
                    .state
                    .read(|s| s.has_archivable(&self.retention, now_ms()));
                if !due || cancel.is_cancelled() {
                    break;
                }
                let proposal = Proposal {
                    cmd: Command::Archive {
                        retention: self.retention,
                    },
                    meta: None,
                    credential: None,
                };
                match self.cluster.write_as_leader(proposal).await {
                    Ok(_) => debug!("archived finished jobs and old audit entries"),
                    Err(Attempt::Retry(e) | Attempt::Fail(e)) => {
                        warn!(error = %e, "could not archive");
                        break;
                    }
                }
            }
        }
    }
}
