//! Applying tenant records: created and replaced, re-validated here, times stamped here.

use crate::model::audit::RequestMeta;
use crate::model::outcome::{ApplyResult, Rejection, invalid};
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
}
