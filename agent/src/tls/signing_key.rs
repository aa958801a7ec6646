//! The CA key lives on the signers, the voters: a voter that does not hold it (promoted from
//! learner, or a joiner given a seat) fetches it from a voter that does (`FetchSigningKey`,
//! served only to a caller whose certificate names a current voter), checks it against the
//! CA certificate, and keeps it. Learners and edge agents never receive it.

use std::time::Duration;

use gpu_proto::internal::v1::FetchSigningKeyRequest;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::TlsIdentity;
use crate::raft::Cluster;
use crate::raft::peer_client::with_deadline;

pub(crate) struct SigningKeyKeeper {
    pub identity: TlsIdentity,
    pub cluster: Cluster,
    /// How often to look (a promotion shows within this).
    pub interval: Duration,
}

impl SigningKeyKeeper {
    pub(crate) async fn run(self, cancel: CancellationToken) {
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(self.interval) => {}
            }
            if let Err(e) = self.keep().await {
                warn!(error = %e, "could not fetch the CA key as a new voter; trying again");
            }
        }
    }

    /// Fetch the key when this agent is a voter without it.
    async fn keep(&self) -> anyhow::Result<()> {
        let view = self.cluster.view();
        if !view.voters.contains(&self.cluster.id) || self.identity.is_signer() {
            return Ok(());
        }
        let mut last = anyhow::anyhow!("no other voter to ask");
        let signers = view
            .members
            .iter()
            .filter(|(id, _)| **id != self.cluster.id && view.voters.contains(id));
        for (id, addr) in signers {
            let req = with_deadline(FetchSigningKeyRequest {}, Duration::from_secs(10));
            let answer = match self.identity.peers.get(addr) {
                Ok(mut client) => client.fetch_signing_key(req).await,
                Err(e) => Err(e),
            };
            match answer {
                Ok(reply) => {
                    self.identity.adopt_ca_key(reply.into_inner().ca_key_pem)?;
                    info!(
                        from = id,
                        "this voter now holds the CA key and signs certificates"
                    );
                    return Ok(());
                }
                Err(s) => last = anyhow::anyhow!("n{id}: {}", s.message()),
            }
        }
        Err(last)
    }
}
