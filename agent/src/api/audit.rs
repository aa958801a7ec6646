//! Public `AuditService`: read the audit log and verify its hash chain.

use gpu_proto::v1 as pb;
use gpu_proto::v1::audit_service_server::AuditService;
use gpu_raft_store::audit;
use tonic::{Request, Response, Status};

use crate::api::auth::Auth;
use crate::api::auth::rbac::Action;
use crate::raft::Cluster;

pub(crate) struct AuditApi {
    pub cluster: Cluster,
    pub auth: Auth,
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
        let (result, head) = self.cluster.state.read(|s| {
            (
                audit::verify(&s.audit),
                s.audit.last().map(|e| e.hash.clone()).unwrap_or_default(),
            )
        });
        let reply = match result {
            Ok(n) => pb::VerifyAuditResponse {
                ok: true,
                entries: n as u64,
                problem: String::new(),
                head_hash: head,
            },
            Err(problem) => pb::VerifyAuditResponse {
                ok: false,
                entries: 0,
                problem,
                head_hash: head,
            },
        };
        Ok(Response::new(reply))
    }
}
