//! Applying API tokens: minting and revoking, each re-checked against what the actor may grant;
//! mapping a token to the Unix account its holder's jobs run as (admins only).

use crate::model::account::Account;
use crate::model::audit::RequestMeta;
use crate::model::auth::{self, Grant, Role, TokenRecord};
use crate::model::outcome::{ApplyResult, Rejection, invalid};
use crate::model::state::ClusterState;
use crate::model::validate;

impl ClusterState {
    /// The rights of the actor behind `meta`: `None` for the system (agents themselves).
    fn actor_grant(&self, meta: Option<&RequestMeta>) -> Result<Option<Grant>, Rejection> {
        let Some(meta) = meta else { return Ok(None) };
        if meta.actor.starts_with("system:") {
            return Ok(None);
        }
        match self.tokens.get(&meta.actor) {
            Some(t) if !t.revoked => Ok(Some(Grant {
                role: t.role,
                tenant: t.tenant.clone(),
            })),
            _ => Err(Rejection::PermissionDenied {
                message: format!("token {} is not valid", meta.actor),
            }),
        }
    }

    /// Refused unless the actor behind `meta` is an admin (or the system): mapping users to
    /// Unix accounts decides who jobs run as on every node, so no weaker role may do it.
    pub(crate) fn require_admin(
        &self,
        meta: Option<&RequestMeta>,
        what: &str,
    ) -> Result<(), Rejection> {
        match self.actor_grant(meta)? {
            Some(holder) if holder.role != Role::Admin => Err(Rejection::PermissionDenied {
                message: format!("a {} token may not {what}: admins only", holder.role),
            }),
            _ => Ok(()),
        }
    }

    /// The account a job submitted with token `token_id` to `tenant` runs as: the token's
    /// mapping, else the tenant record's default, else none (the executing node's own
    /// `jobs.run_as`). The API stamps it on the spec, so the log carries what the job runs as.
    pub fn account_for(&self, token_id: &str, tenant: &str) -> Option<Account> {
        self.tokens
            .get(token_id)
            .and_then(|t| t.account.clone())
            .or_else(|| self.tenants.get(tenant).and_then(|t| t.account.clone()))
    }

    pub(crate) fn set_token_account(
        &mut self,
        id: &str,
        account: Option<&Account>,
        meta: Option<&RequestMeta>,
    ) -> Result<ApplyResult, Rejection> {
        self.require_admin(meta, "set a token's account")?;
        if let Some(a) = account {
            validate::account(a).map_err(invalid)?;
        }
        let token = self
            .tokens
            .get_mut(id)
            .ok_or_else(|| Rejection::UnknownToken { id: id.to_owned() })?;
        if token.revoked {
            return Err(invalid(format!("token {id} is revoked")));
        }
        token.account = account.cloned();
        Ok(ApplyResult::Ok)
    }

    pub(crate) fn create_token(
        &mut self,
        token: &TokenRecord,
        meta: Option<&RequestMeta>,
        now: u64,
    ) -> Result<ApplyResult, Rejection> {
        let wanted = Grant {
            role: token.role,
            tenant: token.tenant.clone(),
        };
        auth::check_grant_shape(&wanted).map_err(invalid)?;
        if let Some(holder) = self.actor_grant(meta)?
            && !auth::can_grant(&holder, &wanted)
        {
            return Err(Rejection::PermissionDenied {
                message: format!("a {} token cannot grant {}", holder.role, token.role),
            });
        }
        let well_formed = token.secret_sha256.len() == 64
            && token.secret_sha256.chars().all(|c| c.is_ascii_hexdigit());
        if !well_formed {
            return Err(invalid("token secret hash must be 64 hex digits".into()));
        }
        validate::name("token id", &token.id).map_err(invalid)?;
        auth::check_limits(token, now).map_err(invalid)?;
        if let Some(a) = &token.account {
            self.require_admin(meta, "set a token's account")?;
            validate::account(a).map_err(invalid)?;
        }
        if self.tokens.contains_key(&token.id) {
            return Err(invalid(format!("token {} already exists", token.id)));
        }
        self.tokens.insert(token.id.clone(), token.clone());
        Ok(ApplyResult::Ok)
    }

    pub(crate) fn revoke_token(
        &mut self,
        id: &str,
        meta: Option<&RequestMeta>,
    ) -> Result<ApplyResult, Rejection> {
        let holder = self.actor_grant(meta)?;
        let token = self
            .tokens
            .get_mut(id)
            .ok_or_else(|| Rejection::UnknownToken { id: id.to_owned() })?;
        if let Some(holder) = holder {
            let target = Grant {
                role: token.role,
                tenant: token.tenant.clone(),
            };
            if !auth::can_grant(&holder, &target) {
                return Err(Rejection::PermissionDenied {
                    message: format!(
                        "a {} token cannot revoke a {} token",
                        holder.role, token.role
                    ),
                });
            }
        }
        token.revoked = true;
        Ok(ApplyResult::Ok)
    }
}
