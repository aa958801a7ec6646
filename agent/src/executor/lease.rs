//! The node lease: while this agent is in contact with the cluster (it leads with a recent
//! quorum acknowledgement, or it recently heard from the leader), it touches a lease file.
//! Every job supervisor on the node stops its job when the file grows older than the lease —
//! the node fences itself before the leader (waiting longer) declares it down and re-places
//! its jobs.

use std::path::PathBuf;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::cluster::Cluster;

/// How long ago the lease file was last renewed; `None` when it is missing or unreadable.
pub fn lease_age(path: &std::path::Path) -> Option<Duration> {
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok()?;
    Some(modified.elapsed().unwrap_or_default())
}

pub struct LeaseKeeper {
    pub cluster: Cluster,
    pub path: PathBuf,
    pub lease: Duration,
}

impl LeaseKeeper {
    pub async fn run(self, cancel: CancellationToken) {
        let every = (self.lease / 4).max(Duration::from_millis(100));
        let mut held = true;
        loop {
            let in_contact = self.in_contact();
            if in_contact
                && let Err(e) = std::fs::write(&self.path, crate::cluster::now_ms().to_string())
            {
                warn!(error = %e, path = %self.path.display(), "cannot renew the node lease");
            }
            if in_contact != held {
                info!(
                    in_contact,
                    "node lease {}",
                    if in_contact {
                        "renewed again"
                    } else {
                        "no longer renewed"
                    }
                );
                held = in_contact;
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
        }
    }

    /// The leader is in contact while a majority of voters (itself included) answered it
    /// within the lease; a follower while it accepted replication from a leader within it.
    fn in_contact(&self) -> bool {
        let view = self.cluster.view();
        if !view.is_leader {
            return self.cluster.contacts.leader_heard_within(self.lease);
        }
        let answered = view
            .voters
            .iter()
            .filter(|v| **v == view.node_id || self.cluster.contacts.heard_within(**v, self.lease))
            .count();
        answered > view.voters.len() / 2
    }
}
