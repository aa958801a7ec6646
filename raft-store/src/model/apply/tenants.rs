//! Applying tenant records: created and replaced, re-validated here, times stamped here; and
//! their sealed registry logins.

use std::collections::BTreeMap;

use crate::model::audit::RequestMeta;
use crate::model::outcome::{ApplyResult, Rejection, invalid};
use crate::model::registry::{self, SealedCredential};
use crate::model::state::ClusterState;
use crate::model::tenant::{self, TenantRecord};

impl ClusterState {
    /// Create (`exists` false) or replace (`exists` true) a tenant record, re-validated here.
    /// Only an admin (or the system) may set or change its default account.
    pub(crate) fn put_tenant(
        &mut self,
        t: &TenantRecord,
        exists: bool,
        now: u64,
        meta: Option<&RequestMeta>,
    ) -> Result<ApplyResult, Rejection> {
        tenant::validate(t).map_err(invalid)?;
        let old_account = self.tenants.get(&t.name).and_then(|r| r.account.as_ref());
        if t.account.as_ref() != old_account {
            self.require_admin(meta, "set a tenant's account")?;
        }
        let created_at_ms = match (self.tenants.get(&t.name), exists) {
            (Some(_), false) => {
                return Err(invalid(format!("tenant {} already exists", t.name)));
            }
            (None, true) => {
                return Err(Rejection::UnknownTenant {
                    name: t.name.clone(),
                });
            }
            (Some(old), true) => old.created_at_ms,
            (None, false) => now,
        };
        let record = TenantRecord {
            created_at_ms,
            updated_at_ms: now,
            ..t.clone()
        };
        self.tenants.insert(t.name.clone(), record);
        Ok(ApplyResult::Ok)
    }

    /// Set or remove a tenant's sealed login at a registry. Admins only; the tenant must exist;
    /// at most `MAX_REGISTRY_CREDENTIALS` registries per tenant.
    pub(crate) fn set_registry_credential(
        &mut self,
        tenant: &str,
        registry_name: &str,
        credential: Option<&SealedCredential>,
        now: u64,
        meta: Option<&RequestMeta>,
    ) -> Result<ApplyResult, Rejection> {
        self.require_admin(meta, "set a tenant's registry credentials")?;
        if !self.tenants.contains_key(tenant) {
            return Err(Rejection::UnknownTenant {
                name: tenant.to_owned(),
            });
        }
        registry::registry(registry_name).map_err(invalid)?;
        let held = self.registry_credentials.get(tenant);
        match credential {
            Some(c) => {
                registry::validate(registry_name, c).map_err(invalid)?;
                let count = held.map_or(0, BTreeMap::len);
                let new = held.is_none_or(|h| !h.contains_key(registry_name));
                if new && count >= registry::MAX_REGISTRY_CREDENTIALS {
                    return Err(invalid(format!(
                        "tenant {tenant} already has logins at {} registries, the most kept",
                        registry::MAX_REGISTRY_CREDENTIALS
                    )));
                }
                let kept = SealedCredential {
                    set_at_ms: now,
                    ..c.clone()
                };
                self.registry_credentials
                    .entry(tenant.to_owned())
                    .or_default()
                    .insert(registry_name.to_owned(), kept);
            }
            None => {
                if held.is_none_or(|h| !h.contains_key(registry_name)) {
                    return Err(invalid(format!(
                        "tenant {tenant} has no login at {registry_name}"
                    )));
                }
                if let Some(h) = self.registry_credentials.get_mut(tenant) {
                    h.remove(registry_name);
                    if h.is_empty() {
                        self.registry_credentials.remove(tenant);
                    }
                }
            }
        }
        Ok(ApplyResult::Ok)
    }
}
