//! Applying API tokens: minting and revoking, each re-checked against what the actor may grant.

use crate::model::audit::RequestMeta;
use crate::model::auth::{self, Grant, TokenRecord};
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

    pub(crate) fn create_token(
        &mut self,
        token: &TokenRecord,
        meta: Option<&RequestMeta>,
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
