//! Signing the audit chain's head (leader only, and only with the CA key): every `interval`, if
//! entries were added since the last signed head, the leader signs the newest entry's hash and
//! records it (`Command::SignAuditHead`). A chain later rewritten and recomputed up to a signed
//! head no longer matches it, and the rewriter cannot sign a new one without the CA key, which
//! only the voters hold. Proposed only as this leader, never forwarded.

use std::sync::Arc;
use std::time::Duration;

use gpu_raft_store::archive::Archive;
use gpu_raft_store::audit::{self, ChainBase, Coverage};
use gpu_raft_store::{AuditEntry, ClusterState, Command, SignedHead};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::ticks::LeaderTicks;
use crate::raft::{Attempt, Cluster, Proposal};
use crate::tls::TlsIdentity;
use crate::tls::signature::{TrustedSigners, sign_head};

/// How often the leader signs the head while the chain grows.
pub(crate) const SIGN_INTERVAL: Duration = Duration::from_secs(5);
/// How old an entry may be, against the chain's newest, before a verifier expects a signed
/// head to cover it: well above `SIGN_INTERVAL`, to ride out a change of leader.
const UNSIGNED_GRACE: Duration = Duration::from_secs(120);

/// Check the part of `state`'s audit chain it still holds (from its base: the older entries
/// are archived) and its signed heads against the CA certificates `trusted`, with the grace this
/// signer's cadence allows: what `restore` asks of a backup.
pub(crate) fn verify_chain(
    state: &ClusterState,
    trusted: &TrustedSigners,
) -> Result<Coverage, String> {
    audit::verify_signed(
        state.audit_base.as_ref(),
        state.audit.iter().map(Arc::as_ref),
        &state.audit_heads,
        |h| trusted.check(h),
        UNSIGNED_GRACE.as_millis() as u64,
    )
}

/// The whole chain, as `gpuctl audit verify` asks: `archive`'s entries and heads up to the base
/// of `kept` (the part the state holds, copied), then `kept`'s. It starts at the oldest entry
/// this agent holds, trusting that entry's link: the chain's first entry, except in a cluster
/// restored from a backup, whose archive starts empty (`restore` checked the backup's chain).
pub(crate) fn verify_whole_chain(
    archive: &Archive,
    kept: &KeptChain,
    trusted: &TrustedSigners,
) -> Result<Coverage, String> {
    let through = kept.base.as_ref().map_or(0, |b| b.seq);
    let oldest = (archive.audit(0, through).next().transpose())
        .map_err(|e| format!("reading the archived audit log: {e}"))?;
    let start = match oldest {
        Some(e) if e.seq > 1 => Some(ChainBase {
            seq: e.seq - 1,
            hash: e.prev_hash,
        }),
        Some(_) => None,
        None => kept.base.clone(),
    };
    let after = start.as_ref().map_or(0, |b| b.seq);
    let failed = std::cell::RefCell::new(None);
    let entries = (archive
        .audit(after, through)
        .map_while(until_error(&failed))
        .map(Arc::new))
    .chain(kept.entries.iter().cloned());
    let heads = (archive
        .heads(after, through)
        .map_while(until_error(&failed)))
    .chain(kept.heads.iter().cloned());
    let verified = audit::verify_signed(
        start.as_ref(),
        entries,
        heads,
        |h| trusted.check(h),
        UNSIGNED_GRACE.as_millis() as u64,
    );
    match failed.into_inner() {
        Some(e) => Err(format!("reading the archived audit log: {e}")),
        None => verified,
    }
}

/// The records of a read, up to its first error, which is kept in `failed`.
fn until_error<T>(
    failed: &std::cell::RefCell<Option<String>>,
) -> impl FnMut(std::io::Result<T>) -> Option<T> + '_ {
    |r| {
        r.map_err(|e| *failed.borrow_mut() = Some(e.to_string()))
            .ok()
    }
}

/// The part of the audit chain the replicated state holds, copied out of it.
pub(crate) struct KeptChain {
    pub base: Option<ChainBase>,
    pub entries: Vec<Arc<AuditEntry>>,
    pub heads: Vec<SignedHead>,
}

impl KeptChain {
    pub(crate) fn of(state: &ClusterState) -> Self {
        Self {
            base: state.audit_base.clone(),
            entries: state.audit.clone(),
            heads: state.audit_heads.clone(),
        }
    }
}

pub(crate) struct AuditSigner {
    pub cluster: Cluster,
    pub identity: TlsIdentity,
    pub interval: Duration,
}

impl AuditSigner {
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let mut ticks = LeaderTicks::new(self.cluster.clone(), self.interval);
        while ticks.next(&cancel).await.is_some() {
            // During a rolling upgrade an older member could not read the head: wait for it.
            if self.cluster.lowest_protocol() < gpu_raft_store::PROTOCOL_6 {
                continue;
            }
            let Some(head) = self.unsigned_head() else {
                continue;
            };
            let head = match self.sign(&head) {
                Ok(head) => head,
                Err(e) => {
                    warn!(error = %e, "could not sign the audit head");
                    continue;
                }
            };
            let proposal = Proposal {
                cmd: Command::SignAuditHead { head },
                meta: None,
                credential: None,
            };
            if let Err(Attempt::Retry(e) | Attempt::Fail(e)) =
                self.cluster.write_as_leader(proposal).await
            {
                warn!(error = %e, "could not record the signed audit head");
            }
        }
    }

    /// The newest entry and its hash, if no signed head covers it yet.
    fn unsigned_head(&self) -> Option<(u64, String)> {
        self.cluster.state.read(|s| {
            let newest = s.audit.last()?;
            let signed = s.audit_heads.last().map_or(0, |h| h.seq);
            (newest.seq > signed).then(|| (newest.seq, newest.hash.clone()))
        })
    }

    fn sign(&self, (seq, hash): &(u64, String)) -> anyhow::Result<SignedHead> {
        let ca = self
            .identity
            .current()
            .and_then(|tls| tls.signing_ca())
            .ok_or_else(|| anyhow::anyhow!("this leader does not hold the CA key yet"))?;
        Ok(sign_head(&ca, *seq, hash)?)
    }
}
