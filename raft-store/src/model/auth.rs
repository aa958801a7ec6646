//! Who may do what: roles, bearer-token records (only a SHA-256 of each secret is ever stored),
//! and the grant rule that stops anyone from minting more rights than they hold.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::NodeId;

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
    /// When it stops working, and for a join token how often and for which nodes it works.
    #[serde(default, skip_serializing_if = "TokenLimits::is_none")]
    pub limits: TokenLimits,
}

/// The terms a token works under beyond its role.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenLimits {
    /// When it stops working (ms since the epoch); none: until revoked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    /// A join token's enrolments left; none: unlimited. `apply` counts it down as it records
    /// each certificate the token enrolled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uses_left: Option<u32>,
    /// The node ids a join token may enrol, `first..=last`; none: any id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_ids: Option<(NodeId, NodeId)>,
    /// Where a join token's nodes may sit in the Raft group; none: anywhere (voter-eligible).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seat: Option<Seat>,
}

/// Where a node may sit in the Raft group, as the join token that enrolled it says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Seat {
    /// A voter, or a learner until the autopilot needs a voter (a join token's default).
    Voter,
    /// A learner only: it replicates and runs jobs, never votes.
    Learner,
    /// An edge agent: a learner only, whose agent must register with its edge site's terms.
    Edge,
}

impl Seat {
    pub fn parse(s: &str) -> Result<Seat, String> {
        match s {
            "voter" => Ok(Seat::Voter),
            "learner" => Ok(Seat::Learner),
            "edge" => Ok(Seat::Edge),
            other => Err(format!("unknown seat {other:?}: voter, learner or edge")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Seat::Voter => "voter",
            Seat::Learner => "learner",
            Seat::Edge => "edge",
        }
    }
}

impl TokenLimits {
    pub fn is_none(&self) -> bool {
        *self == TokenLimits::default()
    }
}

impl TokenRecord {
    /// Whether it works at `now_ms`: not revoked, not expired, not used up. `Err` says why.
    pub fn usable_at(&self, now_ms: u64) -> Result<(), String> {
        if self.revoked {
            return Err("token revoked".into());
        }
        if self.limits.expires_at_ms.is_some_and(|t| now_ms >= t) {
            return Err(format!("token {} expired", self.id));
        }
        if self.limits.uses_left == Some(0) {
            return Err(format!("join token {} is used up", self.id));
        }
        Ok(())
    }

    /// Whether this join token may enrol node `node`: one of its node ids.
    pub fn may_enrol(&self, node: NodeId) -> Result<(), String> {
        match self.limits.node_ids {
            Some((first, last)) if !(first..=last).contains(&node) => Err(format!(
                "join token {} enrols nodes {first}..={last}, not node {node}",
                self.id
            )),
            _ => Ok(()),
        }
    }

    /// Whether this join token may enrol node `node` that is already a member of the cluster:
    /// only when it is bound to exactly that id (an operator re-enrolling a host that lost its
    /// data), so that no token for "any new node" mints a member's identity.
    pub fn may_re_enrol(&self, node: NodeId) -> Result<(), String> {
        if self.limits.node_ids == Some((node, node)) {
            Ok(())
        } else {
            Err(format!(
                "node {node} is already a member: enrolling it again needs a join token bound \
                 to exactly that id (gpuctl token create --role node --node-ids {node})"
            ))
        }
    }
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

/// A token's limits are sound at `now_ms`: an expiry still ahead; uses (at least one) and node
/// ids (`first..=last`, from 1) only on join tokens.
pub fn check_limits(token: &TokenRecord, now_ms: u64) -> Result<(), String> {
    let l = &token.limits;
    if l.expires_at_ms.is_some_and(|t| t <= now_ms) {
        return Err("a token's expiry must lie ahead".into());
    }
    if token.role != Role::Node && (l.uses_left.is_some() || l.node_ids.is_some()) {
        return Err("only join tokens (role node) have uses and node ids".into());
    }
    if l.uses_left == Some(0) {
        return Err("a join token needs at least one use".into());
    }
    if let Some((first, last)) = l.node_ids
        && (first == 0 || first > last)
    {
        return Err(format!(
            "node ids {first}..={last} are not a range of ids from 1"
        ));
    }
    Ok(())
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

    fn join_token(limits: TokenLimits) -> TokenRecord {
        TokenRecord {
            id: "j".into(),
            secret_sha256: String::new(),
            role: Role::Node,
            tenant: None,
            description: String::new(),
            created_at_ms: 0,
            created_by: "t".into(),
            revoked: false,
            account: None,
            limits,
        }
    }

    #[test]
    fn join_token_terms() {
        let t = join_token(TokenLimits {
            expires_at_ms: Some(100),
            uses_left: Some(2),
            node_ids: Some((4, 8)),
            seat: None,
        });
        assert_eq!(check_limits(&t, 50), Ok(()));
        assert!(check_limits(&t, 100).is_err(), "already expired");
        assert_eq!(t.usable_at(99), Ok(()));
        assert!(t.usable_at(100).expect_err("expired").contains("expired"));
        assert_eq!(t.may_enrol(4), Ok(()));
        assert!(t.may_enrol(9).expect_err("outside").contains("4..=8"));
        assert!(
            t.may_re_enrol(5)
                .expect_err("member")
                .contains("already a member")
        );
        let bound = join_token(TokenLimits {
            node_ids: Some((5, 5)),
            ..TokenLimits::default()
        });
        assert_eq!(bound.may_re_enrol(5), Ok(()), "re-enrolling a lost host");
        let used = join_token(TokenLimits {
            uses_left: Some(0),
            ..TokenLimits::default()
        });
        assert!(used.usable_at(0).expect_err("used").contains("used up"));
        assert!(check_limits(&used, 0).is_err());
        let user = TokenRecord {
            role: Role::User,
            ..join_token(TokenLimits {
                uses_left: Some(1),
                ..TokenLimits::default()
            })
        };
        assert!(check_limits(&user, 0).is_err(), "uses are for join tokens");
        let backwards = join_token(TokenLimits {
            node_ids: Some((8, 4)),
            ..TokenLimits::default()
        });
        assert!(check_limits(&backwards, 0).is_err());
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
