//! Public `AuditService`: read the audit log and verify its hash chain and signed heads.

use gpu_proto::v1 as pb;
use gpu_proto::v1::audit_service_server::AuditService;
use gpu_raft_store::AuditEntry;
use tonic::{Request, Response, Status};

use crate::api::auth::Auth;
use crate::api::auth::rbac::Action;
use crate::leader::audit_signer::{KeptChain, verify_whole_chain};
use crate::raft::Cluster;
use crate::raft::archive_fill::{archive_complete, archive_failed};
use crate::tls::TlsIdentity;
use crate::tls::signature::TrustedSigners;

pub(crate) struct AuditApi {
    pub cluster: Cluster,
    pub auth: Auth,
    /// This agent's TLS identity: the cluster CA whose signed heads are trusted.
    pub tls: Option<TlsIdentity>,
}

const DEFAULT_LIMIT: usize = 1000;

#[tonic::async_trait]
impl AuditService for AuditApi {
    async fn list_audit(
        &self,
        req: Request<pb::ListAuditRequest>,
    ) -> Result<Response<pb::ListAuditResponse>, Status> {
        self.auth
            .check(&req, "audit.list", "audit", Action::ReadAudit)
            .await?;
        let r = req.into_inner();
        let limit = if r.limit == 0 {
            DEFAULT_LIMIT
        } else {
            r.limit as usize
        };
        self.cluster.linearizable_read().await?;
        // The state's part first (the archive only ever grows by what leaves it), then the
        // archive's entries before it, when the page starts there.
        let (base, kept) = self.cluster.state.read(|s| {
            let base = s.audit_base.as_ref().map_or(0, |b| b.seq);
            let kept: Vec<AuditEntry> = (s.audit.iter())
                .filter(|e| e.seq > r.after)
                .take(limit)
                .map(|e| AuditEntry::clone(e))
                .collect();
            (base, kept)
        });
        let mut entries = Vec::new();
        if r.after < base {
            archive_complete(&self.cluster.state)?;
            for e in self
                .cluster
                .state
                .archive()
                .audit(r.after, base)
                .take(limit)
            {
                entries.push(e.map_err(archive_failed)?);
            }
        }
        let room = limit - entries.len();
        let entries: Vec<pb::AuditEntry> = (entries.into_iter())
            .chain(kept.into_iter().take(room))
            .map(entry_view)
            .collect();
        Ok(Response::new(pb::ListAuditResponse { entries }))
    }

    async fn verify_audit(
        &self,
        req: Request<pb::VerifyAuditRequest>,
    ) -> Result<Response<pb::VerifyAuditResponse>, Status> {
        self.auth
            .check(&req, "audit.verify", "audit", Action::ReadAudit)
            .await?;
        let also_trusted = req.into_inner().trust_ca_pem;
        let own_ca = self
            .tls
            .as_ref()
            .and_then(|t| t.current())
            .map(|t| t.ca_cert_pem);
        archive_complete(&self.cluster.state)?;
        let (signers, kept) = self
            .cluster
            .state
            .read(|s| (s.audit_signers.clone(), KeptChain::of(s)));
        let head = (kept.entries.last().map(|e| e.hash.clone()))
            .or_else(|| kept.base.as_ref().map(|b| b.hash.clone()))
            .unwrap_or_default();
        let archive = self.cluster.state.archive().clone();
        // Outside the lock and off the async workers: the archive may hold millions of entries.
        let result = tokio::task::spawn_blocking(move || {
            let pems = own_ca.iter().chain(&signers).chain(&also_trusted);
            TrustedSigners::of(pems.map(String::as_str))
                .map_err(|e| format!("a CA certificate to trust does not parse: {e}"))
                .and_then(|trusted| verify_whole_chain(&archive, &kept, &trusted))
        })
        .await
        .map_err(|e| Status::internal(format!("verifying the audit log: {e}")))?;
        let reply = match result {
            Ok(coverage) => pb::VerifyAuditResponse {
                ok: true,
                entries: coverage.entries as u64,
                problem: String::new(),
                head_hash: head,
                signed_through: coverage.signed_through,
            },
            Err(problem) => pb::VerifyAuditResponse {
                ok: false,
                entries: 0,
                problem,
                head_hash: head,
                signed_through: 0,
            },
        };
        Ok(Response::new(reply))
    }
}

fn entry_view(e: AuditEntry) -> pb::AuditEntry {
    pb::AuditEntry {
        seq: e.seq,
        time_ms: e.time_ms,
        actor: e.actor,
        verb: e.verb,
        object: e.object,
        outcome: e.outcome,
        request_id: e.request_id,
        source: e.source,
        prev_hash: e.prev_hash,
        hash: e.hash,
    }
}
