//! Each agent keeps its CA material in line with the cluster's:
//! - keys: the signing CA's key lives on the signers, the voters. A voter without it (promoted
//!   from learner, or a joiner given a seat) fetches it from a voter that has it
//!   (`FetchSigningKey`, served only to a caller whose certificate names a current voter),
//!   checks it, and keeps it. Learners and edge agents never receive it, and a voter demoted to
//!   learner deletes it.
//! - a CA rotation (`gpu_raft_store::ca`): every agent installs the CAs the cluster trusts and
//!   reports them (`ReportTrust`); voters open the introduced CA's sealed key, take it up as
//!   the signing key at the switch, and forget a key the cluster no longer names.
//! - revocations: after one, every peer is dialled again, its certificate checked anew.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Context;
use gpu_proto::internal::v1::FetchSigningKeyRequest;
use gpu_raft_store::ca::CaSet;
use gpu_raft_store::{Command, NodeId};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::files::NodeTls;
use super::{TlsIdentity, sealing, signature};
use crate::raft::peer_client::with_deadline;
use crate::raft::{Cluster, RaftView};

pub(crate) struct CaKeeper {
    pub identity: TlsIdentity,
    pub cluster: Cluster,
    /// How often to look (a promotion or a rotation step shows within this).
    pub interval: Duration,
}

impl CaKeeper {
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let mut revocations = 0;
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(self.interval) => {}
            }
            self.redial_on_revocation(&mut revocations);
            if let Err(e) = self.keep().await {
                warn!(error = %format!("{e:#}"), "could not bring this agent's CA material in line with the cluster's; trying again");
            }
        }
    }

    /// Connections are checked against the revocation list when they are made: after a
    /// revocation, every peer is dialled again, so that a revoked peer is dropped at once.
    fn redial_on_revocation(&self, seen: &mut usize) {
        let revoked = self
            .cluster
            .state
            .read(|s| s.certificates.values().filter(|c| c.revoked).count());
        if revoked != *seen {
            *seen = revoked;
            self.identity.peers.redial();
        }
    }

    async fn keep(&self) -> anyhow::Result<()> {
        let view = self.cluster.view();
        let ca = self.cluster.state.read(|s| s.ca.clone());
        let tls = self.identity.current().context("no TLS material yet")?;
        for step in steps(&view, &held(&tls)?, ca.as_ref()) {
            self.take(step, ca.as_ref()).await?;
        }
        if let Some(ca) = &ca {
            self.report_trust(ca).await?;
        }
        Ok(())
    }

    async fn take(&self, step: Step, ca: Option<&CaSet>) -> anyhow::Result<()> {
        let tls = self.identity.current().context("no TLS material yet")?;
        match step {
            Step::Trust(bundle) => {
                self.identity.install(NodeTls {
                    ca_cert_pem: bundle,
                    ..tls
                })?;
                info!("this agent now trusts the cluster's CAs as of the last rotation step");
            }
            Step::DropKeys => {
                self.identity.drop_ca_key()?;
                info!("this agent is no longer a voter: it deleted the CA key");
            }
            Step::Fetch => self.fetch(ca.map(|c| c.signing.as_str())).await?,
            Step::Promote => {
                self.identity.install(NodeTls {
                    ca_key_pem: tls.next_ca_key_pem.clone(),
                    next_ca_key_pem: None,
                    ..tls
                })?;
                info!("this voter now signs certificates with the cluster's new CA");
            }
            Step::OpenNext => {
                let (ca, next) = ca
                    .and_then(|c| c.next.as_ref().map(|n| (c, n)))
                    .context("no CA is introduced")?;
                let key = sealing::open_ca_key(&tls, &ca.signing, &next.key_id, &next.sealed_key)?;
                let with_next = NodeTls {
                    next_ca_key_pem: Some(key),
                    ..tls
                };
                let opened = with_next
                    .next_ca()
                    .context("the introduced CA's key belongs to no CA we trust")?;
                if signature::key_id(&opened.cert_pem)? != next.key_id {
                    anyhow::bail!("the sealed key is not the introduced CA's");
                }
                self.identity.install(with_next)?;
                info!(ca = %next.key_id, "this voter holds the introduced CA's key");
            }
            Step::DropNext => {
                self.identity.install(NodeTls {
                    next_ca_key_pem: None,
                    ..tls
                })?;
                info!("this voter deleted the key of a CA the cluster called off");
            }
        }
        Ok(())
    }

    /// Ask the other voters for the signing CA's key (`signing`: its key id, when a rotation
    /// named it).
    async fn fetch(&self, signing: Option<&str>) -> anyhow::Result<()> {
        let view = self.cluster.view();
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
            let adopted = answer
                .map_err(|s| anyhow::anyhow!("n{id}: {}", s.message()))
                .and_then(|reply| {
                    let key = reply.into_inner().ca_key_pem;
                    self.identity
                        .adopt_ca_key(key, signing)
                        .with_context(|| format!("n{id}"))
                });
            match adopted {
                Ok(()) => {
                    info!(
                        from = id,
                        "this voter now holds the CA key and signs certificates"
                    );
                    return Ok(());
                }
                Err(e) => last = e,
            }
        }
        Err(last).context("could not fetch the CA key as a voter")
    }

    /// Tell the cluster which CAs this agent trusts, when it does not know yet.
    async fn report_trust(&self, ca: &CaSet) -> anyhow::Result<()> {
        let tls = self.identity.current().context("no TLS material yet")?;
        let key_ids = tls.trusted_key_ids();
        if ca.installed.get(&self.cluster.id) == Some(&key_ids) {
            return Ok(());
        }
        let node = self.cluster.id;
        self.cluster
            .write(Command::ReportTrust { node, key_ids })
            .await?;
        Ok(())
    }
}

/// The CA material an agent holds, by key id.
#[derive(Debug, Default)]
struct Held {
    signing: Option<String>,
    next: Option<String>,
    trusted: BTreeSet<String>,
}

fn held(tls: &NodeTls) -> anyhow::Result<Held> {
    Ok(Held {
        signing: tls.signing_key_id()?,
        next: tls.next_key_id()?,
        trusted: tls.trusted_key_ids(),
    })
}

/// What an agent does about its CA material, in order.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// Trust exactly these CAs (a bundle).
    Trust(String),
    /// Fetch the signing CA's key from another voter.
    Fetch,
    /// Sign with the introduced CA's key from now on (the switch).
    Promote,
    /// Open the introduced CA's sealed key.
    OpenNext,
    /// Forget the key of an introduced CA the cluster no longer names.
    DropNext,
    /// Forget every CA key (no longer a voter).
    DropKeys,
}

/// The steps for this agent (`view`), holding `held`, in a cluster whose CA set is `ca`.
/// A learner drops its keys only once a leader is known, so that the configuration it reads
/// is the cluster's (a restarting voter whose membership is not loaded yet keeps its key).
fn steps(view: &RaftView, held: &Held, ca: Option<&CaSet>) -> Vec<Step> {
    let me: NodeId = view.node_id;
    let voter = view.voters.contains(&me);
    let learner = !voter && view.leader.is_some() && view.members.contains_key(&me);
    let mut steps = Vec::new();
    if let Some(ca) = ca
        && held.trusted.iter().ne(ca.trusted.keys())
    {
        steps.push(Step::Trust(ca.bundle_pem()));
    }
    if learner && (held.signing.is_some() || held.next.is_some()) {
        steps.push(Step::DropKeys);
    }
    if !voter {
        return steps;
    }
    let Some(ca) = ca else {
        if held.signing.is_none() {
            steps.push(Step::Fetch);
        }
        return steps;
    };
    if held.signing.as_ref() != Some(&ca.signing) {
        steps.push(if held.next.as_ref() == Some(&ca.signing) {
            Step::Promote
        } else {
            Step::Fetch
        });
        // The next key, if any, is opened with the signing key on a later round.
        return steps;
    }
    match (&ca.next, &held.next) {
        (Some(next), held_next) if held_next.as_ref() != Some(&next.key_id) => {
            steps.push(Step::OpenNext)
        }
        (None, Some(_)) => steps.push(Step::DropNext),
        _ => {}
    }
    steps
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use gpu_raft_store::ca::{CaCert, CaSet, NextCa};

    use super::*;

    fn view(voters: &[u64], members: &[u64], leader: Option<u64>) -> RaftView {
        RaftView {
            node_id: 2,
            leader,
            voters: voters.iter().copied().collect(),
            members: members.iter().map(|id| (*id, format!("h:{id}"))).collect(),
            ..RaftView::default()
        }
    }

    fn id(c: char) -> String {
        c.to_string().repeat(64)
    }

    fn held(signing: Option<char>, next: Option<char>, trusted: &[char]) -> Held {
        Held {
            signing: signing.map(id),
            next: next.map(id),
            trusted: trusted.iter().map(|c| id(*c)).collect(),
        }
    }

    /// A rotation whose trusted CAs are `trusted`, signing with `signing`, introducing `next`.
    fn rotation(trusted: &[char], signing: char, next: Option<char>) -> CaSet {
        CaSet {
            trusted: trusted
                .iter()
                .map(|c| {
                    let cert = CaCert {
                        key_id: id(*c),
                        cert_pem: format!(
                            "-----BEGIN CERTIFICATE-----\n{c}\n-----END CERTIFICATE-----\n"
                        ),
                    };
                    (id(*c), cert)
                })
                .collect::<BTreeMap<_, _>>(),
            signing: id(signing),
            next: next.map(|c| NextCa {
                key_id: id(c),
                sealed_key: "ab".into(),
            }),
            ..CaSet::default()
        }
    }

    #[test]
    fn voters_hold_the_key_and_learners_let_it_go() {
        let voter = view(&[1, 2, 3], &[1, 2, 3], Some(1));
        let demoted = view(&[1, 3, 4], &[1, 2, 3, 4], Some(1));
        let cases = [
            (&voter, held(None, None, &['a']), vec![Step::Fetch]),
            (&voter, held(Some('a'), None, &['a']), vec![]),
            (
                &demoted,
                held(Some('a'), None, &['a']),
                vec![Step::DropKeys],
            ),
            (&demoted, held(None, None, &['a']), vec![]),
        ];
        for (v, h, want) in cases {
            assert_eq!(steps(v, &h, None), want, "{v:?} {h:?}");
        }
        // Membership not known yet (no leader, or not listed): keep what we have.
        for v in [
            view(&[], &[], None),
            view(&[1, 3, 4], &[1, 2, 3, 4], None),
            view(&[1, 3, 4], &[1, 3, 4], Some(1)),
        ] {
            assert_eq!(steps(&v, &held(Some('a'), None, &['a']), None), vec![]);
        }
    }

    #[test]
    fn a_rotation_is_followed_step_by_step() {
        let voter = view(&[1, 2, 3], &[1, 2, 3], Some(1));
        let learner = view(&[1, 3, 4], &[1, 2, 3, 4], Some(1));
        let introduced = rotation(&['a', 'b'], 'a', Some('b'));
        let both = introduced.bundle_pem();

        // Introduced: trust both, then open the sealed key (a learner only trusts).
        assert_eq!(
            steps(&voter, &held(Some('a'), None, &['a']), Some(&introduced)),
            vec![Step::Trust(both.clone()), Step::OpenNext]
        );
        assert_eq!(
            steps(
                &voter,
                &held(Some('a'), Some('b'), &['a', 'b']),
                Some(&introduced)
            ),
            vec![]
        );
        assert_eq!(
            steps(&learner, &held(None, None, &['a']), Some(&introduced)),
            vec![Step::Trust(both)]
        );

        // Switched: the next key signs; a voter that never opened it fetches the new one.
        let switched = rotation(&['a', 'b'], 'b', None);
        assert_eq!(
            steps(
                &voter,
                &held(Some('a'), Some('b'), &['a', 'b']),
                Some(&switched)
            ),
            vec![Step::Promote]
        );
        assert_eq!(
            steps(&voter, &held(Some('a'), None, &['a', 'b']), Some(&switched)),
            vec![Step::Fetch]
        );
        assert_eq!(
            steps(&voter, &held(Some('b'), None, &['a', 'b']), Some(&switched)),
            vec![]
        );

        // Retired: trust only the new CA.
        let retired = rotation(&['b'], 'b', None);
        assert_eq!(
            steps(&voter, &held(Some('b'), None, &['a', 'b']), Some(&retired)),
            vec![Step::Trust(retired.bundle_pem())]
        );

        // Called off: the introduced key is forgotten.
        let called_off = rotation(&['a'], 'a', None);
        assert_eq!(
            steps(
                &voter,
                &held(Some('a'), Some('b'), &['a']),
                Some(&called_off)
            ),
            vec![Step::DropNext]
        );
    }
}
