//! Public `TokenService`: mint, list and revoke bearer tokens, and map them to the Unix
//! accounts their holders' jobs run as (admins only). The secret exists only in the reply to
//! `CreateToken`; the cluster stores its SHA-256.

use gpu_proto::v1 as pb;
use gpu_proto::v1::token_service_server::TokenService;
use gpu_raft_store::{Command, Grant, Rejection, TokenRecord, auth::can_grant, validate};
use tonic::{Request, Response, Status};

use crate::api::auth::rbac::Action;
use crate::api::auth::{Auth, token};
use crate::api::from_proto;
use crate::api::status::{invalid, rejected};
use crate::api::to_proto;
use crate::clock::now_ms;
use crate::raft::Cluster;

pub(crate) struct TokenApi {
    pub cluster: Cluster,
    pub auth: Auth,
}

#[tonic::async_trait]
impl TokenService for TokenApi {
    async fn create_token(
        &self,
        req: Request<pb::CreateTokenRequest>,
    ) -> Result<Response<pb::CreateTokenResponse>, Status> {
        let caller = self
            .auth
            .check(&req, "token.create", "token/new", Action::ManageTokens)
            .await?;
        let r = req.into_inner();
        let role = from_proto::role(r.role).ok_or_else(|| invalid("role is required"))?;
        let now = now_ms();
        let limits = from_proto::token_limits(&r, role, now).map_err(invalid)?;
        let tenant = (!r.tenant.is_empty()).then_some(r.tenant);
        validate::free_text("description", &r.description).map_err(invalid)?;
        let account = r.account.as_ref().map(from_proto::account);
        if let Some(a) = &account {
            self.auth.require(&caller, Action::MapAccounts).await?;
            validate::account(a).map_err(invalid)?;
        }
        let wanted = Grant {
            role,
            tenant: tenant.clone(),
        };
        let holder = Grant {
            role: caller.identity.role,
            tenant: caller.identity.tenant.clone(),
        };
        if !can_grant(&holder, &wanted) {
            let reason = format!("a {} token cannot grant {role}", holder.role);
            self.auth.record_denial(&caller, &reason).await;
            return Err(Status::permission_denied(reason));
        }
        let minted = token::mint();
        let record = TokenRecord {
            account,
            id: minted.id.clone(),
            secret_sha256: minted.secret_sha256,
            role,
            tenant,
            description: r.description,
            created_at_ms: now,
            created_by: caller.identity.token_id.clone(),
            revoked: false,
            limits,
        };
        let mut meta = caller.meta.clone();
        meta.object = format!("token/{}", minted.id);
        self.cluster
            .write_as(
                Command::CreateToken {
                    token: record.clone(),
                },
                caller.on_behalf_as(meta),
            )
            .await?;
        Ok(Response::new(pb::CreateTokenResponse {
            token: Some(to_proto::token(&record)),
            bearer: minted.bearer,
        }))
    }

    async fn list_tokens(
        &self,
        req: Request<pb::ListTokensRequest>,
    ) -> Result<Response<pb::ListTokensResponse>, Status> {
        let caller = self
            .auth
            .check(&req, "token.list", "token/*", Action::ManageTokens)
            .await?;
        let holder = Grant {
            role: caller.identity.role,
            tenant: caller.identity.tenant,
        };
        let tokens = self.cluster.state.read(|s| {
            s.tokens
                .values()
                .filter(|t| {
                    can_grant(
                        &holder,
                        &Grant {
                            role: t.role,
                            tenant: t.tenant.clone(),
                        },
                    )
                })
                .map(to_proto::token)
                .collect()
        });
        Ok(Response::new(pb::ListTokensResponse { tokens }))
    }

    async fn revoke_token(
        &self,
        req: Request<pb::RevokeTokenRequest>,
    ) -> Result<Response<pb::Token>, Status> {
        let id = req.get_ref().id.clone();
        let caller = self
            .auth
            .check(
                &req,
                "token.revoke",
                &format!("token/{id}"),
                Action::ManageTokens,
            )
            .await?;
        self.cluster
            .write_as(Command::RevokeToken { id: id.clone() }, caller.on_behalf())
            .await?;
        self.cluster
            .state
            .read(|s| s.tokens.get(&id).map(to_proto::token))
            .map(Response::new)
            .ok_or_else(|| rejected(Rejection::UnknownToken { id: id.to_owned() }))
    }

    async fn set_token_account(
        &self,
        req: Request<pb::SetTokenAccountRequest>,
    ) -> Result<Response<pb::Token>, Status> {
        let id = req.get_ref().id.clone();
        let caller = self
            .auth
            .check(
                &req,
                "token.set-account",
                &format!("token/{id}"),
                Action::MapAccounts,
            )
            .await?;
        let account = from_proto::token_account(req.get_ref()).map_err(invalid)?;
        if let Some(a) = &account {
            validate::account(a).map_err(invalid)?;
        }
        self.cluster
            .write_as(
                Command::SetTokenAccount {
                    id: id.clone(),
                    account,
                },
                caller.on_behalf(),
            )
            .await?;
        self.cluster
            .state
            .read(|s| s.tokens.get(&id).map(to_proto::token))
            .map(Response::new)
            .ok_or_else(|| rejected(Rejection::UnknownToken { id: id.to_owned() }))
    }

    async fn who_am_i(
        &self,
        req: Request<pb::WhoAmIRequest>,
    ) -> Result<Response<pb::Token>, Status> {
        let caller = self
            .auth
            .authenticate(&req, "token.whoami", "token/self")
            .await?;
        let id = caller.identity.token_id;
        self.cluster
            .state
            .read(|s| s.tokens.get(&id).map(to_proto::token))
            .map(Response::new)
            .ok_or_else(|| Status::unauthenticated("invalid token"))
    }
}
