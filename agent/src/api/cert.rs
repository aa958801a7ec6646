//! Public `CertService`: the certificates the cluster CA issued, revocation by serial, and the
//! CA rotation (`cert_ca.rs`).

use gpu_proto::v1 as pb;
use gpu_proto::v1::cert_service_server::CertService;
use gpu_raft_store::{CertRecord, Command, cert};
use tonic::{Request, Response, Status};

use crate::api::auth::Auth;
use crate::api::auth::rbac::Action;
use crate::api::status::invalid;
use crate::raft::Cluster;
use crate::tls::{Subject, TlsIdentity};

pub(crate) struct CertApi {
    pub cluster: Cluster,
    pub auth: Auth,
    /// `None` without TLS.
    pub tls: Option<TlsIdentity>,
}

fn view(c: &CertRecord) -> pb::CertificateRecord {
    pb::CertificateRecord {
        serial: c.serial.clone(),
        subject: c.subject.clone(),
        not_after_ms: c.not_after_ms,
        issued_at_ms: c.issued_at_ms,
        revoked: c.revoked,
        revoked_reason: c.revoked_reason.clone(),
        issuer: c.issuer.clone(),
    }
}

#[tonic::async_trait]
impl CertService for CertApi {
    async fn list_certificates(
        &self,
        req: Request<pb::ListCertificatesRequest>,
    ) -> Result<Response<pb::ListCertificatesResponse>, Status> {
        self.auth
            .check(&req, "cert.list", "cert/*", Action::ManageNodes)
            .await?;
        self.cluster.linearizable_read().await?;
        let certificates = self
            .cluster
            .state
            .read(|s| s.certificates.values().map(view).collect());
        Ok(Response::new(pb::ListCertificatesResponse { certificates }))
    }

    async fn issue_client_certificate(
        &self,
        req: Request<pb::IssueClientCertificateRequest>,
    ) -> Result<Response<pb::IssueClientCertificateResponse>, Status> {
        let caller = self
            .auth
            .check_enrolment(&req, "cert.issue", "cert/client", Action::ClientCertificate)
            .await?;
        let tls = self
            .tls
            .as_ref()
            .ok_or_else(|| Status::failed_precondition("this agent runs without TLS"))?;
        let subject = Subject::Client(caller.identity.token_id.clone());
        let cert_pem = tls
            .issue(
                &self.cluster,
                &req.get_ref().csr_pem,
                &subject,
                caller.on_behalf(),
                None,
            )
            .await?;
        let ca_cert_pem = tls.current().map(|t| t.ca_cert_pem).unwrap_or_default();
        Ok(Response::new(pb::IssueClientCertificateResponse {
            cert_pem,
            ca_cert_pem,
        }))
    }

    async fn get_ca_status(
        &self,
        req: Request<pb::GetCaStatusRequest>,
    ) -> Result<Response<pb::CaStatus>, Status> {
        self.auth
            .check(&req, "cert.ca.status", "cert/ca", Action::ManageNodes)
            .await?;
        self.cluster.linearizable_read().await?;
        Ok(Response::new(self.ca_status()?))
    }

    async fn rotate_ca(
        &self,
        req: Request<pb::RotateCaRequest>,
    ) -> Result<Response<pb::CaStatus>, Status> {
        let step = req.get_ref().step();
        let caller = self
            .auth
            .check(
                &req,
                "cert.ca.rotate",
                &format!("cert/ca/{}", step.as_str_name()),
                Action::RotateCa,
            )
            .await?;
        Ok(Response::new(self.rotate(req.get_ref(), &caller).await?))
    }

    async fn revoke_certificate(
        &self,
        req: Request<pb::RevokeCertificateRequest>,
    ) -> Result<Response<pb::CertificateRecord>, Status> {
        let serial = req.get_ref().serial.to_ascii_lowercase();
        let caller = self
            .auth
            .check(
                &req,
                "cert.revoke",
                &format!("cert/{serial}"),
                Action::ManageNodes,
            )
            .await?;
        cert::check_serial(&serial).map_err(invalid)?;
        let reason = req.into_inner().reason;
        gpu_raft_store::validate::free_text("reason", &reason).map_err(invalid)?;
        let voters = self.cluster.view().voters;
        let now = crate::clock::now_ms();
        if let Some(why) = self
            .cluster
            .state
            .read(|s| s.revocation_locks_out(&serial, &voters, now))
        {
            return Err(Status::failed_precondition(why));
        }
        self.cluster
            .write_as(
                Command::RevokeCertificate {
                    serial: serial.clone(),
                    reason,
                },
                caller.on_behalf(),
            )
            .await?;
        let record = self
            .cluster
            .state
            .read(|s| s.certificates.get(&serial).map(view))
            .ok_or_else(|| Status::internal("the revocation was applied but is not visible"))?;
        Ok(Response::new(record))
    }
}
