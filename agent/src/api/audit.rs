//! Public `AuditService`: read the audit log and verify its hash chain and signed heads.

use gpu_proto::v1 as pb;
use gpu_proto::v1::audit_service_server::AuditService;
use tonic::{Request, Response, Status};

use crate::api::auth::Auth;
use crate::api::auth::rbac::Action;
use crate::leader::audit_signer::verify_chain;
use crate::raft::Cluster;
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
        let entries = self.cluster.state.read(|s| {
            s.audit
                .iter()
                .filter(|e| e.seq > r.after)
                .take(limit)
                .map(|e| pb::AuditEntry {
                    seq: e.seq,
                    time_ms: e.time_ms,
                    actor: e.actor.clone(),
                    verb: e.verb.clone(),
                    object: e.object.clone(),
                    outcome: e.outcome.clone(),
                    request_id: e.request_id.clone(),
                    source: e.source.clone(),
                    prev_hash: e.prev_hash.clone(),
                    hash: e.hash.clone(),
                })
                .collect()
        });
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
        let (result, head) = self.cluster.state.read(|s| {
            let pems = own_ca.iter().chain(&s.audit_signers).chain(&also_trusted);
            let result = TrustedSigners::of(pems.map(String::as_str))
                .map_err(|e| format!("a CA certificate to trust does not parse: {e}"))
                .and_then(|trusted| verify_chain(s, &trusted));
            let head = s.audit.last().map(|e| e.hash.clone()).unwrap_or_default();
            (result, head)
        });
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
