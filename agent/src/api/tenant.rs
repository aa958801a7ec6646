//! Public `TenantService`: create and update tenant records (admins), read them with their GPU
//! use and GPU time (each token the tenants it may see).

use gpu_proto::v1 as pb;
use gpu_proto::v1::tenant_service_server::TenantService;
use gpu_raft_store::{Command, Rejection, tenant};
use tonic::{Request, Response, Status};

use crate::api::auth::Auth;
use crate::api::auth::rbac::Action;
use crate::api::from_proto;
use crate::api::status::{invalid, rejected, sealing_failed};
use crate::api::to_proto;
use crate::clock::now_ms;
use crate::raft::Cluster;
use crate::tls::TlsIdentity;
use crate::tls::sealing;

pub(crate) struct TenantApi {
    pub cluster: Cluster,
    pub auth: Auth,
    /// This agent's TLS material: a voter's holds the CA key that seals registry passwords.
    pub tls: Option<TlsIdentity>,
}

impl TenantApi {
    fn view(&self, name: &str) -> Result<pb::Tenant, Status> {
        self.cluster
            .state
            .read(|s| to_proto::tenant(s, name, now_ms(), true))
            .ok_or_else(|| {
                rejected(Rejection::UnknownTenant {
                    name: name.to_owned(),
                })
            })
    }
}

#[tonic::async_trait]
impl TenantService for TenantApi {
    async fn set_registry_credential(
        &self,
        req: Request<pb::SetRegistryCredentialRequest>,
    ) -> Result<Response<pb::Tenant>, Status> {
        let object = format!("tenant/{}", req.get_ref().tenant);
        let caller = self
            .auth
            .check(
                &req,
                "tenant.set_registry_credential",
                &object,
                Action::ManageTenants,
            )
            .await?;
        let r = req.into_inner();
        let name = r.tenant.trim().to_owned();
        gpu_raft_store::registry::registry(&r.registry).map_err(invalid)?;
        // The tenant as the leader knows it (this replica may lag a creation just made).
        self.cluster.linearizable_read().await?;
        self.view(&name)?;
        let credential = if r.remove {
            if !r.username.is_empty() || !r.password.is_empty() {
                return Err(invalid(
                    "removing a registry login takes no username or password",
                ));
            }
            None
        } else {
            if r.password.is_empty() || r.password.len() > 4096 {
                return Err(invalid("a registry password must be 1..=4096 bytes"));
            }
            let tls = self
                .tls
                .as_ref()
                .and_then(TlsIdentity::current)
                .ok_or_else(|| sealing_failed(sealing::SealError::NoKey))?;
            let sealed = sealing::seal(&tls, &name, &r.registry, &r.username, &r.password)
                .map_err(sealing_failed)?;
            // Early, friendly errors (the username's rules); apply re-checks.
            gpu_raft_store::registry::validate(&r.registry, &sealed).map_err(invalid)?;
            Some(sealed)
        };
        let cmd = Command::SetRegistryCredential {
            tenant: name.clone(),
            registry: r.registry,
            credential,
        };
        self.cluster.write_as(cmd, caller.on_behalf()).await?;
        Ok(Response::new(self.view(&name)?))
    }

    async fn create_tenant(
        &self,
        req: Request<pb::CreateTenantRequest>,
    ) -> Result<Response<pb::Tenant>, Status> {
        let object = format!("tenant/{}", req.get_ref().name);
        let caller = self
            .auth
            .check(&req, "tenant.create", &object, Action::ManageTenants)
            .await?;
        if req.get_ref().account.is_some() {
            self.auth.require(&caller, Action::MapAccounts).await?;
        }
        let record = from_proto::tenant_created(req.get_ref()).map_err(invalid)?;
        // Early, friendly errors; apply re-checks.
        tenant::validate(&record).map_err(invalid)?;
        let name = record.name.clone();
        self.cluster
            .write_as(Command::CreateTenant { tenant: record }, caller.on_behalf())
            .await?;
        Ok(Response::new(self.view(&name)?))
    }

    async fn update_tenant(
        &self,
        req: Request<pb::UpdateTenantRequest>,
    ) -> Result<Response<pb::Tenant>, Status> {
        let object = format!("tenant/{}", req.get_ref().name);
        let caller = self
            .auth
            .check(&req, "tenant.update", &object, Action::ManageTenants)
            .await?;
        if req.get_ref().account.is_some() || req.get_ref().clear_account {
            self.auth.require(&caller, Action::MapAccounts).await?;
        }
        // Start from the leader's latest record, so an update is not built on a stale one.
        self.cluster.linearizable_read().await?;
        let name = req.get_ref().name.trim().to_owned();
        let current = self
            .cluster
            .state
            .read(|s| s.tenants.get(&name).cloned())
            .ok_or_else(|| {
                rejected(Rejection::UnknownTenant {
                    name: name.to_owned(),
                })
            })?;
        let record = from_proto::tenant_updated(req.get_ref(), &current).map_err(invalid)?;
        tenant::validate(&record).map_err(invalid)?;
        self.cluster
            .write_as(Command::UpdateTenant { tenant: record }, caller.on_behalf())
            .await?;
        Ok(Response::new(self.view(&name)?))
    }

    async fn get_tenant(
        &self,
        req: Request<pb::GetTenantRequest>,
    ) -> Result<Response<pb::Tenant>, Status> {
        let name = req.get_ref().name.trim().to_owned();
        let object = format!("tenant/{name}");
        self.auth
            .check(&req, "tenant.get", &object, Action::ReadTenant(&name))
            .await?;
        if !req.get_ref().stale {
            self.cluster.linearizable_read().await?;
        }
        Ok(Response::new(self.view(&name)?))
    }

    async fn list_tenants(
        &self,
        req: Request<pb::ListTenantsRequest>,
    ) -> Result<Response<pb::ListTenantsResponse>, Status> {
        let caller = self
            .auth
            .authenticate(&req, "tenant.list", "tenant/*")
            .await?;
        if !req.get_ref().stale {
            self.cluster.linearizable_read().await?;
        }
        let visible = |t: &str| caller.identity.may(Action::ReadTenant(t)).is_ok();
        let now = now_ms();
        let tenants = self.cluster.state.read(|s| {
            to_proto::tenant_names(s)
                .iter()
                .filter(|t| visible(t))
                .filter_map(|t| to_proto::tenant(s, t, now, false))
                .collect()
        });
        Ok(Response::new(pb::ListTenantsResponse { tenants }))
    }

    async fn get_webhook_secret(
        &self,
        req: Request<pb::GetWebhookSecretRequest>,
    ) -> Result<Response<pb::WebhookSecret>, Status> {
        let name = req.get_ref().tenant.clone();
        let object = format!("tenant/{name}");
        self.auth
            .check(
                &req,
                "tenant.webhook_secret",
                &object,
                Action::ManageTenants,
            )
            .await?;
        self.view(&name)?;
        let ca = (self.tls.as_ref())
            .and_then(TlsIdentity::current)
            .and_then(|t| t.signing_ca())
            .ok_or_else(|| sealing_failed(sealing::SealError::NoKey))?;
        Ok(Response::new(pb::WebhookSecret {
            secret: hex::encode(crate::notify::signing::secret(&ca.key_pem, &name)),
            key_id: crate::tls::signature::key_id(&ca.cert_pem).unwrap_or_default(),
        }))
    }
}
