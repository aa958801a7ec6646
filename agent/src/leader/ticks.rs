//! The clock of a leader-only task: a tick every `interval` while this agent leads, with the
//! moment it became leader (silences are judged from then, not from before it led).

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::raft::{Cluster, RaftView};

pub(crate) struct LeaderTicks {
    cluster: Cluster,
    interval: Duration,
    /// When this agent became leader, while it still is.
    since: Option<Instant>,
}

impl LeaderTicks {
    pub(crate) fn new(cluster: Cluster, interval: Duration) -> Self {
        Self {
            cluster,
            interval,
            since: None,
        }
    }

    /// The next tick at which this agent leads: its view of the group and since when it has
    /// led without a break. `None` once `cancel` fires.
    pub(crate) async fn next(&mut self, cancel: &CancellationToken) -> Option<(RaftView, Instant)> {
        loop {
            tokio::select! {
                () = cancel.cancelled() => return None,
                () = tokio::time::sleep(self.interval) => {}
            }
            let view = self.cluster.view();
            if !view.is_leader {
                self.since = None;
                continue;
            }
            let since = *self.since.get_or_insert_with(Instant::now);
            return Some((view, since));
        }
    }
}
