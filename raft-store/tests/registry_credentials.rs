//! Tenants' sealed registry logins through `ClusterState::apply`: an admin sets and removes
//! them; a weaker token, an unknown tenant, a bad registry or credential, a removal of a login
//! that is not there, and one registry too many are refused and change nothing; neither
//! `Debug` nor the command's `Display` (what the logs print) nor the audit entry shows the
//! sealed password or the username.

use gpu_raft_store::registry::{MAX_REGISTRY_CREDENTIALS, SealedCredential};
use gpu_raft_store::testing::at;
use gpu_raft_store::{
    ApplyResult, ClusterState, Command, LogEntry, PROTOCOL_7, Rejection, RequestMeta, Role,
    TokenRecord,
};

const SEALED: &str = "5ea1edc0ffee5ea1edc0ffee";

fn credential() -> SealedCredential {
    SealedCredential {
        username: "robot$vision".into(),
        sealed: SEALED.into(),
        key_id: "ab".repeat(32),
        set_at_ms: 0,
    }
}

fn set(tenant: &str, registry: &str, c: Option<SealedCredential>) -> Command {
    Command::SetRegistryCredential {
        tenant: tenant.into(),
        registry: registry.into(),
        credential: c,
    }
}

fn as_token(id: &str, cmd: Command) -> LogEntry {
    LogEntry {
        meta: Some(RequestMeta {
            actor: id.into(),
            verb: "tenant.set_registry_credential".into(),
            object: "tenant/vision".into(),
            request_id: "r".into(),
            source: "127.0.0.1:1".into(),
        }),
        ..at(5, cmd)
    }
}

fn cluster() -> ClusterState {
    let mut s = ClusterState::new();
    let tenant = gpu_raft_store::tenant::TenantRecord::named("vision");
    s.apply(&at(1, Command::CreateTenant { tenant }));
    for (id, role) in [("tadmin", Role::Admin), ("toper", Role::Operator)] {
        let token = TokenRecord {
            id: id.into(),
            secret_sha256: "00".repeat(32),
            role,
            tenant: None,
            description: String::new(),
            created_at_ms: 1,
            created_by: "system:test".into(),
            revoked: false,
            account: None,
            limits: Default::default(),
        };
        s.apply(&at(1, Command::CreateToken { token }));
    }
    s
}

#[test]
fn an_admin_sets_and_removes_a_tenants_login() {
    let mut s = cluster();
    let r = s.apply(&as_token(
        "tadmin",
        set("vision", "nvcr.io", Some(credential())),
    ));
    assert_eq!(r, ApplyResult::Ok);
    let kept = &s.registry_credentials["vision"]["nvcr.io"];
    assert_eq!(
        (kept.username.as_str(), kept.set_at_ms),
        ("robot$vision", 5)
    );
    let r = s.apply(&as_token("tadmin", set("vision", "nvcr.io", None)));
    assert_eq!(r, ApplyResult::Ok);
    assert!(s.registry_credentials.is_empty());
}

#[test]
fn bad_requests_change_nothing() {
    let mut s = cluster();
    s.apply(&as_token(
        "tadmin",
        set("vision", "nvcr.io", Some(credential())),
    ));
    for i in 1..MAX_REGISTRY_CREDENTIALS {
        let r = s.apply(&at(
            2,
            set("vision", &format!("r{i}.example"), Some(credential())),
        ));
        assert_eq!(r, ApplyResult::Ok);
    }
    let before = s.registry_credentials.clone();
    let plain = SealedCredential {
        sealed: "not hex".into(),
        ..credential()
    };
    let colon = SealedCredential {
        username: "a:b".into(),
        ..credential()
    };
    for (entry, says) in [
        (
            as_token("toper", set("vision", "quay.io", Some(credential()))),
            "admins only",
        ),
        (
            at(3, set("nobody", "quay.io", Some(credential()))),
            "nobody",
        ),
        (
            at(3, set("vision", "bad host!", Some(credential()))),
            "registry",
        ),
        (at(3, set("vision", "quay.io", Some(plain))), "hex"),
        (at(3, set("vision", "quay.io", Some(colon))), "without ':'"),
        (at(3, set("vision", "quay.io", None)), "no login at quay.io"),
        (
            at(3, set("vision", "one-too-many.example", Some(credential()))),
            "the most kept",
        ),
    ] {
        match s.apply(&entry) {
            ApplyResult::Rejected { reason } => {
                let text = reason.to_string();
                assert!(text.contains(says), "{says}: {text}");
                assert!(
                    matches!(
                        reason,
                        Rejection::Invalid { .. }
                            | Rejection::PermissionDenied { .. }
                            | Rejection::UnknownTenant { .. }
                    ),
                    "{reason:?}"
                );
            }
            other => panic!("{says}: {other:?}"),
        }
        assert_eq!(s.registry_credentials, before, "{says}: untouched");
    }
}

#[test]
fn no_listing_shows_the_sealed_password() {
    let mut s = cluster();
    let cmd = set("vision", "nvcr.io", Some(credential()));
    assert_eq!(cmd.protocol(), PROTOCOL_7);
    assert_eq!(cmd.to_string(), "registry credential vision@nvcr.io set");
    s.apply(&as_token("tadmin", cmd));
    let debug = format!("{s:?}");
    assert!(!debug.contains(SEALED), "Debug of the state");
    let audit = serde_json::to_string(&s.audit).expect("json");
    assert!(
        !audit.contains(SEALED) && !audit.contains("robot"),
        "{audit}"
    );
}
