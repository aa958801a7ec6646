//! The permission table: which role may do what, pure and in one place.

use gpu_raft_store::Role;

/// The caller's rights, from its token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub token_id: String,
    pub role: Role,
    pub tenant: Option<String>,
}

/// What a request wants to do.
#[derive(Clone, Copy, Debug)]
pub enum Action<'a> {
    /// Cluster status, nodes, GPUs.
    ReadCluster,
    /// Label, cordon, drain nodes; inject simulated faults.
    ManageNodes,
    /// Submit or cancel a job of this tenant.
    WriteJob(&'a str),
    /// Read a job (state, logs) of this tenant.
    ReadJob(&'a str),
    /// Create, list or revoke tokens (what exactly is granted is checked by the grant rule).
    ManageTokens,
    ReadAudit,
    /// Enrol a new agent: sign its first certificate.
    JoinNode,
    /// Get a client certificate for one's own token.
    ClientCertificate,
    /// Change the scheduler policy.
    ManageScheduler,
    /// Inject faults into an agent's Raft transport (chaos testing): admins only.
    InjectNetworkFaults,
    /// Set and delete replicated alert rules.
    ManageAlerts,
    /// Create or update tenant records.
    ManageTenants,
    /// Read a tenant's record, quotas and GPU time.
    ReadTenant(&'a str),
    /// Take a backup of the whole replicated state (token hashes, audit log included): admins only.
    Backup,
    /// Map tokens and tenants to the Unix accounts jobs run as: admins only.
    MapAccounts,
    /// Rotate the cluster CA: admins only.
    RotateCa,
}

impl Identity {
    /// `Ok` when allowed, else why not.
    pub fn may(&self, action: Action<'_>) -> Result<(), String> {
        let own = |t: &str| self.tenant.as_deref() == Some(t);
        let allowed = match (self.role, action) {
            (Role::Admin, _) => true,
            (Role::Node, a) => matches!(a, Action::JoinNode),
            (_, Action::ClientCertificate) => true,
            (_, Action::ReadCluster) => true,
            (
                Role::Operator,
                Action::ManageNodes
                | Action::ManageScheduler
                | Action::ManageAlerts
                | Action::JoinNode
                | Action::ReadJob(_)
                | Action::ReadTenant(_)
                | Action::ReadAudit,
            ) => true,
            (Role::TenantAdmin, Action::ManageTokens) => true,
            (Role::TenantAdmin | Role::User, Action::WriteJob(t) | Action::ReadJob(t)) => own(t),
            (Role::TenantAdmin | Role::User, Action::ReadTenant(t)) => own(t),
            (Role::Viewer, Action::ReadJob(t) | Action::ReadTenant(t)) => {
                self.tenant.is_none() || own(t)
            }
            _ => false,
        };
        if allowed {
            Ok(())
        } else {
            let scope = self
                .tenant
                .as_deref()
                .map(|t| format!(" of tenant {t}"))
                .unwrap_or_default();
            Err(format!(
                "a {} token{scope} may not {}",
                self.role,
                describe(action)
            ))
        }
    }
}

fn describe(action: Action<'_>) -> String {
    match action {
        Action::ReadCluster => "read the cluster".into(),
        Action::ManageNodes => "manage nodes".into(),
        Action::InjectNetworkFaults => "inject network faults".into(),
        Action::WriteJob(t) => format!("submit or cancel jobs of tenant {t}"),
        Action::ReadJob(t) => format!("read jobs of tenant {t}"),
        Action::ManageTokens => "manage tokens".into(),
        Action::ReadAudit => "read the audit log".into(),
        Action::JoinNode => "enrol an agent".into(),
        Action::ClientCertificate => "get a client certificate".into(),
        Action::ManageScheduler => "change the scheduler policy".into(),
        Action::ManageAlerts => "change alert rules".into(),
        Action::ManageTenants => "create or update tenants".into(),
        Action::ReadTenant(t) => format!("read tenant {t}"),
        Action::Backup => "back up the cluster state".into(),
        Action::MapAccounts => "map tokens or tenants to Unix accounts".into(),
        Action::RotateCa => "rotate the cluster CA".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(role: Role, tenant: Option<&str>) -> Identity {
        Identity {
            token_id: "t".into(),
            role,
            tenant: tenant.map(str::to_owned),
        }
    }

    #[test]
    fn the_permission_table() {
        let admin = id(Role::Admin, None);
        let op = id(Role::Operator, None);
        let ta = id(Role::TenantAdmin, Some("a"));
        let user = id(Role::User, Some("a"));
        let viewer = id(Role::Viewer, None);
        let tviewer = id(Role::Viewer, Some("a"));
        let cases = [
            (&admin, Action::ManageNodes, true),
            (&op, Action::ManageNodes, true),
            (&admin, Action::InjectNetworkFaults, true),
            (&op, Action::InjectNetworkFaults, false),
            (&admin, Action::RotateCa, true),
            (&op, Action::RotateCa, false),
            (&op, Action::ManageScheduler, true),
            (&admin, Action::ManageScheduler, true),
            (&ta, Action::ManageScheduler, false),
            (&user, Action::ManageScheduler, false),
            (&viewer, Action::ManageScheduler, false),
            (&op, Action::ManageAlerts, true),
            (&ta, Action::ManageAlerts, false),
            (&user, Action::ManageAlerts, false),
            (&viewer, Action::ManageAlerts, false),
            (&op, Action::WriteJob("a"), false),
            (&op, Action::ReadJob("a"), true),
            (&ta, Action::WriteJob("a"), true),
            (&ta, Action::WriteJob("b"), false),
            (&ta, Action::ManageNodes, false),
            (&ta, Action::ManageTokens, true),
            (&user, Action::WriteJob("a"), true),
            (&user, Action::ReadJob("b"), false),
            (&user, Action::ManageTokens, false),
            (&user, Action::ReadAudit, false),
            (&viewer, Action::ReadCluster, true),
            (&viewer, Action::ReadJob("b"), true),
            (&viewer, Action::WriteJob("a"), false),
            (&viewer, Action::ManageNodes, false),
            (&tviewer, Action::ReadJob("b"), false),
            (&id(Role::Node, None), Action::JoinNode, true),
            (&id(Role::Node, None), Action::ReadCluster, false),
            (&id(Role::Node, None), Action::ManageNodes, false),
            (&id(Role::Node, None), Action::ClientCertificate, false),
            (&viewer, Action::ClientCertificate, true),
            (&viewer, Action::JoinNode, false),
            (&admin, Action::ManageTenants, true),
            (&op, Action::ManageTenants, false),
            (&ta, Action::ManageTenants, false),
            (&user, Action::ManageTenants, false),
            (&op, Action::ReadTenant("a"), true),
            (&ta, Action::ReadTenant("a"), true),
            (&ta, Action::ReadTenant("b"), false),
            (&user, Action::ReadTenant("a"), true),
            (&user, Action::ReadTenant("b"), false),
            (&viewer, Action::ReadTenant("b"), true),
            (&tviewer, Action::ReadTenant("b"), false),
            (&id(Role::Node, None), Action::ReadTenant("a"), false),
            (&user, Action::JoinNode, false),
            (&admin, Action::MapAccounts, true),
            (&op, Action::MapAccounts, false),
            (&ta, Action::MapAccounts, false),
            (&user, Action::MapAccounts, false),
            (&viewer, Action::MapAccounts, false),
        ];
        for (who, action, want) in cases {
            assert_eq!(who.may(action).is_ok(), want, "{:?} {:?}", who.role, action);
        }
        assert_eq!(
            viewer.may(Action::WriteJob("a")).expect_err("denied"),
            "a viewer token may not submit or cancel jobs of tenant a"
        );
    }
}
