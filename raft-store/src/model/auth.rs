//! Who may do what: roles, bearer-token records (only a SHA-256 of each secret is ever stored),
//! and the grant rule that stops anyone from minting more rights than they hold.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Roles from most to least powerful.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Everything.
    Admin,
    /// Nodes, drains, fault injection, reading everything; no jobs, no tokens.
    Operator,
    /// Jobs and tokens of one tenant.
    TenantAdmin,
    /// Submit, cancel and read one tenant's jobs.
    User,
    /// Read-only (cluster-wide, or one tenant's jobs when the token names a tenant).
    Viewer,
    /// A join token: may only enrol a new agent (get its first certificate), nothing else.
    Node,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Operator => "operator",
            Role::TenantAdmin => "tenant-admin",
            Role::User => "user",
            Role::Viewer => "viewer",
            Role::Node => "node",
        }
    }

    /// Roles that only ever act inside one tenant.
    pub fn is_tenant_scoped(self) -> bool {
        matches!(self, Role::TenantAdmin | Role::User)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A bearer token as the cluster stores it. The secret itself is never stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    pub id: String,
    /// Hex SHA-256 of the secret half of `id.secret`.
    pub secret_sha256: String,
    pub role: Role,
    /// The tenant a tenant-scoped (or tenant-limited viewer) token acts in.
    #[serde(default)]
    pub tenant: Option<String>,
    #[serde(default)]
    pub description: String,
    pub created_at_ms: u64,
    /// The actor that created it (a token id, or `system:…`).
    pub created_by: String,
    #[serde(default)]
    pub revoked: bool,
    /// The Unix account the holder's jobs run as (else the tenant's default account).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<crate::model::account::Account>,
}

/// The rights a token holder has, for the grant rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub role: Role,
    pub tenant: Option<String>,
}

/// Whether `holder` may create (or revoke) a token with `wanted`. Admins may grant anything;
/// tenant admins may grant tenant-admin, user and viewer inside their own tenant; nobody else
/// may grant at all.
pub fn can_grant(holder: &Grant, wanted: &Grant) -> bool {
    match holder.role {
        Role::Admin => true,
        Role::TenantAdmin => {
            matches!(wanted.role, Role::TenantAdmin | Role::User | Role::Viewer)
                && wanted.tenant.is_some()
                && wanted.tenant == holder.tenant
        }
        _ => false,
    }
}

/// A token's shape is sound: tenant-scoped roles name a tenant, cluster roles other than viewer
/// do not.
pub fn check_grant_shape(g: &Grant) -> Result<(), String> {
    match (g.role, &g.tenant) {
        (r, None) if r.is_tenant_scoped() => Err(format!("a {r} token must name a tenant")),
        (Role::Admin | Role::Operator | Role::Node, Some(_)) => {
            Err(format!("a {} token cannot be limited to a tenant", g.role))
        }
        (_, Some(t)) => crate::model::validate::name("tenant", t),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(role: Role, tenant: Option<&str>) -> Grant {
        Grant {
            role,
            tenant: tenant.map(str::to_owned),
        }
    }

    #[test]
    fn nobody_grants_more_than_they_hold() {
        let admin = g(Role::Admin, None);
        let ta = g(Role::TenantAdmin, Some("a"));
        assert!(can_grant(&admin, &g(Role::Admin, None)));
        assert!(can_grant(&ta, &g(Role::User, Some("a"))));
        assert!(can_grant(&ta, &g(Role::Viewer, Some("a"))));
        assert!(!can_grant(&ta, &g(Role::User, Some("b"))), "other tenant");
        assert!(
            !can_grant(&ta, &g(Role::Viewer, None)),
            "cluster-wide viewer"
        );
        assert!(!can_grant(&ta, &g(Role::Admin, None)));
        assert!(!can_grant(&ta, &g(Role::Operator, None)));
        assert!(!can_grant(&ta, &g(Role::Node, Some("a"))), "join tokens");
        assert!(can_grant(&admin, &g(Role::Node, None)));
        for weak in [Role::Operator, Role::User, Role::Viewer] {
            assert!(
                !can_grant(&g(weak, Some("a")), &g(Role::Viewer, Some("a"))),
                "{weak}"
            );
        }
    }

    #[test]
    fn grant_shapes() {
        assert!(check_grant_shape(&g(Role::User, None)).is_err());
        assert!(check_grant_shape(&g(Role::Admin, Some("a"))).is_err());
        assert!(check_grant_shape(&g(Role::User, Some("../x"))).is_err());
        assert!(check_grant_shape(&g(Role::Viewer, None)).is_ok());
        assert!(check_grant_shape(&g(Role::Viewer, Some("a"))).is_ok());
    }
}
