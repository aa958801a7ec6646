//! Forgetting expired records (leader only): every `interval`, if the replicated state holds
//! certificate records or idempotency keys past their use (`ClusterState::expired`), the
//! leader proposes `Command::ForgetExpired`, which every replica applies at the entry's time.
//! Proposed only as this leader, never forwarded, and only once every member reads it.

use std::time::Duration;

use gpu_raft_store::{Command, PROTOCOL_9};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::ticks::LeaderTicks;
use crate::clock::now_ms;
use crate::raft::{Attempt, Cluster, Proposal};

/// How often the leader looks.
pub(crate) const EXPIRY_INTERVAL: Duration = Duration::from_secs(60);

pub(crate) struct Expiry {
    pub cluster: Cluster,
    pub interval: Duration,
}

impl Expiry {
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let mut ticks = LeaderTicks::new(self.cluster.clone(), self.interval);
        while ticks.next(&cancel).await.is_some() {
            if self.cluster.lowest_protocol() < PROTOCOL_9 {
                continue;
            }
            let expired = self.cluster.state.read(|s| s.expired(now_ms()));
            if expired.is_empty() {
                continue;
            }
            let proposal = Proposal {
                cmd: Command::ForgetExpired,
                meta: None,
                credential: None,
            };
            match self.cluster.write_as_leader(proposal).await {
                Ok(_) => info!(
                    certificates = expired.certificates.len(),
                    idempotency_keys = expired.idempotency_keys.len(),
                    "forgot expired records"
                ),
                Err(Attempt::Retry(e) | Attempt::Fail(e)) => {
                    warn!(error = %e, "could not forget expired records");
                }
            }
        }
    }
}
