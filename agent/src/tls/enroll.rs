//! How an agent comes to hold a certificate, and keeps one:
//! - bootstrap: the first agent creates the cluster CA and signs its own certificate;
//! - join: a new agent makes a key and a request, and a signer signs it for a join token
//!   (`IssueCertificate`; the answer carries the CA's certificate, never its key);
//! - renewal: before a third of its lifetime is left, an agent asks a peer to sign a new key;
//! - signing: the CA key lives only on the signers, the voters: a voter without it fetches it
//!   from one that has it (`signing_key.rs`), and an agent without it passes enrolments on to
//!   the leader.
//!
//! `TlsIdentity` is the live material: installing new material writes it to disk, and swaps it
//! into the listener and the outgoing connections at once.

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};
use gpu_proto::internal::v1::{
    IssueCertificateRequest, IssueCertificateResponse, RenewCertificateRequest,
};
use gpu_raft_store::{CertRecord, Command, NodeId};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::client::Revoked;
use super::files::{NodeTls, TlsDir};
use super::pki::{self, KeyedCert, Subject};
use super::server::CertSlot;
use super::signature;
use crate::raft::peer_client::{PeerClients, with_deadline};
use crate::raft::{Cluster, ClusterError, OnBehalf};

/// The cluster CA lives this long.
pub(crate) const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 86_400);
/// Client certificates (people and tools) live this long; agents renew their own far sooner.
pub(crate) const CLIENT_VALIDITY: Duration = Duration::from_secs(365 * 86_400);
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the renewer looks whether its certificate is due.
const LOOK_AGAIN: Duration = Duration::from_secs(2);

/// Why a certificate was not issued.
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    /// The request itself: an unreadable CSR.
    #[error("{0}")]
    Refused(String),
    /// This agent does not hold the CA key (it is not a signer, or not yet).
    #[error("this agent does not sign certificates (only voters hold the CA key)")]
    NotASigner,
    /// The cluster switched to a new CA, whose key this agent has not taken up yet.
    #[error("this agent has not taken up the cluster's new CA yet: ask again in a few seconds")]
    NotTakenUp,
    /// Signed, but not recorded (so not handed out).
    #[error(transparent)]
    NotRecorded(#[from] ClusterError),
}

/// This agent's TLS identity: its current material (swapped in place on renewal) and what it
/// needs to sign for others and to renew.
#[derive(Clone)]
pub struct TlsIdentity {
    pub dir: TlsDir,
    pub slot: Arc<CertSlot>,
    pub peers: PeerClients,
    /// Lifetime of the certificates this agent signs (its own and its peers').
    pub validity: Duration,
    /// The cluster's revocation list, which the peers we dial are checked against.
    revoked: Revoked,
    current: Arc<RwLock<Option<NodeTls>>>,
}

impl TlsIdentity {
    pub fn new(dir: TlsDir, peers: PeerClients, validity: Duration, revoked: Revoked) -> Self {
        Self {
            dir,
            slot: Arc::default(),
            peers,
            validity,
            revoked,
            current: Arc::default(),
        }
    }

    /// Store `tls` durably, then present it on every new connection in and out.
    pub fn install(&self, tls: NodeTls) -> anyhow::Result<()> {
        self.dir.store(&tls)?;
        self.slot.set(&tls.node, &tls.ca_cert_pem)?;
        self.peers.use_tls(super::client::peer_config(
            &tls.ca_cert_pem,
            Some(&tls.node),
            self.revoked.clone(),
        )?);
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some(tls);
        Ok(())
    }

    /// Whether this agent holds the CA key (it signs certificates).
    pub fn is_signer(&self) -> bool {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|t| t.ca_key_pem.is_some())
    }

    pub fn current(&self) -> Option<NodeTls> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Issue a certificate: sign `csr_pem` for `subject` and record it through Raft (for the
    /// caller `by`; for an enrolment, against its join token `enrolled_with`), so every agent
    /// knows it and can revoke it. The one path for joins, renewals, client certificates and
    /// the bootstrap admin's.
    pub async fn issue(
        &self,
        cluster: &Cluster,
        csr_pem: &str,
        subject: &Subject,
        by: Option<OnBehalf>,
        enrolled_with: Option<String>,
    ) -> Result<String, IssueError> {
        let signing = cluster
            .state
            .read(|s| s.ca.as_ref().map(|ca| ca.signing.clone()));
        let (cert_pem, mut record) = self.sign(csr_pem, subject, signing.as_deref())?;
        // Older agents would drop the issuer (`PROTOCOL_8`); once a rotation began, every
        // member reads it.
        if signing.is_none() && cluster.lowest_protocol() < gpu_raft_store::PROTOCOL_8 {
            record.issuer.clear();
        }
        let cmd = Command::RecordCertificate {
            cert: record,
            enrolled_with,
        };
        cluster.write_as(cmd, by).await?;
        Ok(cert_pem)
    }

    /// Sign `csr_pem` for `subject` with the signing CA (key id `signing`, when the cluster
    /// names one: a CA rotation began); also returns the record to replicate. Agents get
    /// `validity`, clients a year.
    fn sign(
        &self,
        csr_pem: &str,
        subject: &Subject,
        signing: Option<&str>,
    ) -> Result<(String, CertRecord), IssueError> {
        let ca = self
            .current()
            .and_then(|tls| tls.signing_ca())
            .ok_or(IssueError::NotASigner)?;
        let issuer =
            signature::key_id(&ca.cert_pem).map_err(|e| IssueError::Refused(e.to_string()))?;
        if signing.is_some_and(|want| want != issuer) {
            return Err(IssueError::NotTakenUp);
        }
        let now = SystemTime::now();
        let validity = match subject {
            Subject::Node(_) => self.validity,
            Subject::Client(_) => CLIENT_VALIDITY,
        };
        let refused = |e: pki::PkiError| IssueError::Refused(e.to_string());
        let cert = pki::sign(&ca, csr_pem, subject, now, validity).map_err(refused)?;
        let info = pki::inspect_pem(&cert).map_err(refused)?;
        let record = CertRecord {
            serial: info.serial,
            subject: subject.to_string(),
            not_after_ms: ms(info.not_after),
            issued_at_ms: ms(now),
            revoked: false,
            revoked_reason: String::new(),
            issuer,
        };
        Ok((cert, record))
    }

    /// The answer to an enrolment or renewal: the certificate and the CA's certificate, never
    /// the CA's key.
    pub fn answer(&self, cert_pem: String) -> Result<IssueCertificateResponse, String> {
        let tls = self
            .current()
            .ok_or("this agent has no certificate authority yet")?;
        Ok(IssueCertificateResponse {
            cert_pem,
            ca_cert_pem: tls.ca_cert_pem,
            ca_key_pem: String::new(),
        })
    }

    /// Forget the CA key (this agent is no longer a voter): the material is stored again
    /// without it, so the key file is gone from disk too.
    pub fn drop_ca_key(&self) -> anyhow::Result<()> {
        let tls = self.current().context("no TLS material yet")?;
        self.install(NodeTls::keyless(tls.ca_cert_pem, tls.node))
    }

    /// Keep the CA key a signer handed us (this agent became a voter, or the CA it holds the
    /// key of no longer signs), once checked: it must be the key of the CA `signing` names
    /// (its key id), or without a rotation, of one our trust bundle holds.
    pub fn adopt_ca_key(&self, key_pem: String, signing: Option<&str>) -> anyhow::Result<()> {
        let tls = self.current().context("no TLS material yet")?;
        let adopted = NodeTls {
            ca_key_pem: Some(key_pem),
            ..tls
        };
        let id = adopted
            .signing_key_id()?
            .context("the key we were handed is not the key of a CA we trust")?;
        if let Some(want) = signing
            && id != want
        {
            bail!("the key we were handed is not the signing CA's ({want})");
        }
        self.install(adopted)
    }
}

/// Material for the first agent of a new cluster: a fresh CA and this agent's certificate.
pub(crate) fn bootstrap(node_id: NodeId, validity: Duration) -> anyhow::Result<NodeTls> {
    let now = SystemTime::now();
    let ca = pki::new_ca(now, CA_VALIDITY)?;
    let node = pki::issue(&ca, &Subject::Node(node_id), now, validity)?;
    Ok(NodeTls {
        ca_key_pem: Some(ca.key_pem),
        ..NodeTls::keyless(ca.cert_pem, node)
    })
}

/// Enrol through one of `seeds` with a join token, trusting only `ca_cert_pem`.
pub(crate) async fn join(
    seeds: &[String],
    node_id: NodeId,
    join_token: &str,
    ca_cert_pem: &str,
    deadline: Duration,
) -> anyhow::Result<NodeTls> {
    let (key_pem, csr_pem) = pki::new_request()?;
    let peers = PeerClients::default();
    // A joiner has no revocation list yet: it trusts the CA it was given.
    peers.use_tls(super::client::peer_config(
        ca_cert_pem,
        None,
        Arc::new(|_: &str| false),
    )?);
    let bearer: tonic::metadata::MetadataValue<_> = format!("Bearer {}", join_token.trim())
        .parse()
        .context("the join token has characters a header cannot carry")?;
    let started = tokio::time::Instant::now();
    let mut last = String::new();
    for seed in seeds.iter().cycle() {
        if started.elapsed() > deadline {
            bail!("no agent signed our certificate within {deadline:?}; last answer: {last}");
        }
        let mut req = with_deadline(
            IssueCertificateRequest {
                node_id,
                csr_pem: csr_pem.clone(),
            },
            CALL_TIMEOUT,
        );
        req.metadata_mut().insert("authorization", bearer.clone());
        let answer = match peers.get(seed) {
            Ok(mut client) => client.issue_certificate(req).await,
            Err(e) => Err(e),
        };
        match answer {
            Ok(reply) => {
                return accept(reply.into_inner(), key_pem, Subject::Node(node_id), None);
            }
            Err(s)
                if matches!(
                    s.code(),
                    tonic::Code::Unauthenticated
                        | tonic::Code::PermissionDenied
                        | tonic::Code::InvalidArgument
                ) =>
            {
                bail!("{seed} refused to enrol this agent: {}", s.message())
            }
            Err(s) => {
                last = format!("{seed}: {}", s.message());
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }
    bail!("no seed addresses to enrol through")
}

/// Check that an answer is a certificate for `want`. On renewal (`ours`), only the
/// certificate changes: the CAs we trust and hold keys of stay ours.
fn accept(
    reply: IssueCertificateResponse,
    key_pem: String,
    want: Subject,
    ours: Option<NodeTls>,
) -> anyhow::Result<NodeTls> {
    let info = pki::inspect_pem(&reply.cert_pem).context("the certificate we were given")?;
    if info.subject != want {
        bail!(
            "we asked for a certificate for {want} and got one for {}",
            info.subject
        );
    }
    let node = KeyedCert {
        cert_pem: reply.cert_pem,
        key_pem,
    };
    // A renewal keeps what we trust: the replicated CA set decides that (`ca_keeper.rs`), not
    // the peer that answered, which may not have caught up with it.
    Ok(match ours {
        Some(ours) => NodeTls { node, ..ours },
        None => NodeTls::keyless(reply.ca_cert_pem, node),
    })
}

/// Renew this agent's certificate through a peer once a third of its lifetime is left.
pub(crate) struct Renewer {
    pub identity: TlsIdentity,
    pub node_id: NodeId,
    /// Where to ask: the members' addresses, read fresh each time.
    pub peers_of: Arc<dyn Fn() -> Vec<String> + Send + Sync>,
    /// Whether a certificate (PEM) is from a CA that no longer signs (after a CA rotation's
    /// switch): then it is renewed at once.
    pub from_old_ca: Arc<dyn Fn(&str) -> bool + Send + Sync>,
}

impl Renewer {
    pub(crate) async fn run(self, cancel: CancellationToken) {
        // After a failed attempt, wait longer before the next (peers may all be down).
        let mut floor = Duration::from_secs(1);
        loop {
            // Look again within `LOOK_AGAIN` at most: a CA switch makes the renewal due at once.
            let wait = self.time_until_due().unwrap_or(LOOK_AGAIN).min(LOOK_AGAIN);
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(wait.max(floor)) => {}
            }
            if self.time_until_due().is_some_and(|d| !d.is_zero()) {
                continue;
            }
            match self.renew().await {
                Ok(serial) => {
                    floor = Duration::from_secs(1);
                    info!(node_id = self.node_id, serial, "renewed our certificate");
                }
                Err(e) => {
                    floor = (floor * 2).min(Duration::from_secs(30));
                    warn!(node_id = self.node_id, error = %e, retry_in = ?floor, "certificate renewal failed");
                }
            }
        }
    }

    /// Zero when due; `None` when there is nothing to renew.
    fn time_until_due(&self) -> Option<Duration> {
        let tls = self.identity.current()?;
        let info = pki::inspect_pem(&tls.node.cert_pem).ok()?;
        if (self.from_old_ca)(&tls.node.cert_pem) {
            return Some(Duration::ZERO);
        }
        let renew_at = info.not_after.checked_sub(self.identity.validity / 3)?;
        Some(
            renew_at
                .duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO),
        )
    }

    async fn renew(&self) -> anyhow::Result<String> {
        let (key_pem, csr_pem) = pki::new_request()?;
        let mut last = String::from("no peer to ask");
        for addr in (self.peers_of)() {
            let req = with_deadline(
                RenewCertificateRequest {
                    csr_pem: csr_pem.clone(),
                },
                CALL_TIMEOUT,
            );
            let answer = match self.identity.peers.get(&addr) {
                Ok(mut client) => client.renew_certificate(req).await,
                Err(e) => Err(e),
            };
            match answer {
                Ok(reply) => {
                    let ours = self.identity.current();
                    let tls = accept(
                        reply.into_inner(),
                        key_pem,
                        Subject::Node(self.node_id),
                        ours,
                    )?;
                    let serial = pki::inspect_pem(&tls.node.cert_pem)?.serial;
                    self.identity.install(tls)?;
                    return Ok(serial);
                }
                Err(s) => last = format!("{addr}: {}", s.message()),
            }
        }
        bail!("{last}")
    }
}

pub(crate) fn ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
