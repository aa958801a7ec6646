//! The CA key lives on the signers, the voters: a voter that does not hold it (promoted from
//! learner, or a joiner given a seat) fetches it from a voter that does (`FetchSigningKey`,
//! served only to a caller whose certificate names a current voter), checks it against the
//! CA certificate, and keeps it. Learners and edge agents never receive it, and a voter
//! demoted to learner deletes it.

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

    /// Fetch the key when this agent is a voter without it; delete it when it holds it as a
    /// learner.
    async fn keep(&self) -> anyhow::Result<()> {
        let view = self.cluster.view();
        match key_step(&view, self.identity.is_signer()) {
            KeyStep::Keep => return Ok(()),
            KeyStep::Drop => {
                self.identity.drop_ca_key()?;
                info!("this agent is no longer a voter: it deleted the CA key");
                return Ok(());
            }
            KeyStep::Fetch => {}
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

/// What a member does about the CA key.
#[derive(Debug, PartialEq, Eq)]
enum KeyStep {
    Keep,
    Fetch,
    Drop,
}

/// A voter without the key fetches it; a learner that holds it drops it, but only once a
/// leader is known, so that the configuration it reads is the cluster's (a restarting voter
/// whose membership is not loaded yet keeps its key).
fn key_step(view: &crate::raft::RaftView, holds_key: bool) -> KeyStep {
    let me = view.node_id;
    let voter = view.voters.contains(&me);
    let learner = !voter && view.leader.is_some() && view.members.contains_key(&me);
    match (voter, learner, holds_key) {
        (true, _, false) => KeyStep::Fetch,
        (false, true, true) => KeyStep::Drop,
        _ => KeyStep::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::RaftView;

    fn view(voters: &[u64], members: &[u64], leader: Option<u64>) -> RaftView {
        RaftView {
            node_id: 2,
            leader,
            voters: voters.iter().copied().collect(),
            members: members.iter().map(|id| (*id, format!("h:{id}"))).collect(),
            ..RaftView::default()
        }
    }

    #[test]
    fn voters_hold_the_key_and_learners_let_it_go() {
        let cases = [
            (view(&[1, 2, 3], &[1, 2, 3], Some(1)), false, KeyStep::Fetch),
            (view(&[1, 2, 3], &[1, 2, 3], Some(1)), true, KeyStep::Keep),
            (
                view(&[1, 3, 4], &[1, 2, 3, 4], Some(1)),
                true,
                KeyStep::Drop,
            ),
            (
                view(&[1, 3, 4], &[1, 2, 3, 4], Some(1)),
                false,
                KeyStep::Keep,
            ),
            // Membership not known yet (no leader, or not listed): keep what we have.
            (view(&[], &[], None), true, KeyStep::Keep),
            (view(&[1, 3, 4], &[1, 2, 3, 4], None), true, KeyStep::Keep),
            (view(&[1, 3, 4], &[1, 3, 4], Some(1)), true, KeyStep::Keep),
        ];
        for (v, holds, want) in cases {
            assert_eq!(key_step(&v, holds), want, "{v:?} holds={holds}");
        }
    }
}
