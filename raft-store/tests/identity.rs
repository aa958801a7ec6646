//! Job identity in `apply`: who may map a token or a tenant to a Unix account (admins only,
//! re-checked here whatever the API edge decided), which accounts are refused (root, bad
//! names), the account a submission resolves to, and bad submissions (time limit, memory,
//! CPU, workdir, account): every refused command changes nothing but the audit log.

use std::collections::BTreeMap;

use gpu_raft_store::testing::{at, spec};
use gpu_raft_store::{
    Account, ApplyResult, ClusterState, Command, JobSpec, LogEntry, Rejection, RequestMeta, Role,
    TenantRecord, TokenRecord,
};

fn token(id: &str, role: Role, tenant: Option<&str>) -> TokenRecord {
    TokenRecord {
        id: id.into(),
        secret_sha256: "ab".repeat(32),
        role,
        tenant: tenant.map(Into::into),
        description: String::new(),
        created_at_ms: 1,
        created_by: "system:test".into(),
        revoked: false,
        account: None,
        limits: Default::default(),
    }
}

fn tenant(name: &str, account: Option<Account>) -> TenantRecord {
    TenantRecord {
        name: name.into(),
        quotas: BTreeMap::new(),
        weight: 1,
        default_priority: 0,
        created_at_ms: 0,
        updated_at_ms: 0,
        account,
        allowed_mounts: Vec::new(),
        max_priority: None,
        max_pending_jobs: None,
        webhook: None,
    }
}

fn account(s: &str) -> Account {
    s.parse().expect("a valid account")
}

/// `cmd` as an API request of token `actor`.
fn by(actor: &str, cmd: Command) -> LogEntry {
    LogEntry {
        proposed_at_ms: 9,
        cmd,
        meta: Some(RequestMeta {
            actor: actor.into(),
            verb: "test".into(),
            object: "x".into(),
            request_id: "r".into(),
            source: "127.0.0.1:1".into(),
        }),
        request: None,
    }
}

/// An admin, a tenant admin and a user of tenant `a`, and an operator.
fn cluster() -> ClusterState {
    let mut s = ClusterState::new();
    for t in [
        token("root", Role::Admin, None),
        token("ta", Role::TenantAdmin, Some("a")),
        token("u", Role::User, Some("a")),
        token("op", Role::Operator, None),
    ] {
        assert_eq!(
            s.apply(&at(1, Command::CreateToken { token: t })),
            ApplyResult::Ok
        );
    }
    s
}

fn refusal(result: &ApplyResult) -> String {
    match result {
        ApplyResult::Rejected { reason } => reason.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Apply `entry` and check it was refused saying `why`, with nothing changed but one audit
/// entry recording the refusal.
fn refused(s: &mut ClusterState, entry: &LogEntry, why: &str) {
    let before = s.clone();
    let result = s.apply(entry);
    let reason = refusal(&result);
    assert!(reason.contains(why), "{}: {reason}", entry.cmd);
    assert_eq!(s.audit.len(), before.audit.len() + 1);
    let last = s.audit.last().expect("audited");
    assert!(last.outcome.starts_with("rejected: "), "{}", last.outcome);
    let mut unaudited = s.clone();
    unaudited.audit = before.audit.clone();
    assert_eq!(unaudited, before, "{} changed the state", entry.cmd);
}

#[test]
fn only_admins_map_tokens_to_accounts() {
    let mut s = cluster();
    let set = |id: &str, a: Option<&str>| Command::SetTokenAccount {
        id: id.into(),
        account: a.map(account),
    };
    // Weaker roles are refused, even for their own token or their own tenant's.
    for actor in ["ta", "u", "op"] {
        refused(
            &mut s,
            &by(actor, set("u", Some("alice"))),
            "may not set a token's account: admins only",
        );
        refused(
            &mut s,
            &by(actor, set(actor, None)),
            "may not set a token's account",
        );
    }
    // Unknown and revoked actors are refused before anything else.
    refused(
        &mut s,
        &by("ghost", set("u", Some("alice"))),
        "token ghost is not valid",
    );

    // An admin maps, remaps and clears; the system (agents) may too.
    assert_eq!(
        s.apply(&by("root", set("u", Some("alice:research")))),
        ApplyResult::Ok
    );
    assert_eq!(s.tokens["u"].account, Some(account("alice:research")));
    assert_eq!(
        s.apply(&at(2, set("u", Some("1001:1001")))),
        ApplyResult::Ok
    );
    assert_eq!(
        s.tokens["u"].account.as_ref().and_then(Account::uid),
        Some(1001)
    );
    assert_eq!(s.apply(&by("root", set("u", None))), ApplyResult::Ok);
    assert_eq!(s.tokens["u"].account, None);

    // Unknown or revoked tokens, root and bad names: refused, unchanged.
    refused(
        &mut s,
        &by("root", set("nope", Some("alice"))),
        "token nope does not exist",
    );
    for (bad, why) in [
        (Account::user("root"), "never run as root"),
        (Account::user("0"), "never run as root"),
        (Account::user("al ice"), "not a valid user or group name"),
        (
            Account {
                groups: vec!["video".into(), "video".into()],
                ..Account::user("alice")
            },
            "listed twice",
        ),
    ] {
        let cmd = Command::SetTokenAccount {
            id: "u".into(),
            account: Some(bad),
        };
        refused(&mut s, &by("root", cmd), why);
    }
    s.apply(&by("root", Command::RevokeToken { id: "ta".into() }));
    refused(
        &mut s,
        &by("root", set("ta", Some("alice"))),
        "token ta is revoked",
    );
}

#[test]
fn only_admins_mint_tokens_with_accounts() {
    let mut s = cluster();
    let with = |id: &str, a: &str| Command::CreateToken {
        token: TokenRecord {
            account: Some(account(a)),
            ..token(id, Role::User, Some("a"))
        },
    };
    // A tenant admin may mint a user token of its tenant, but not one with an account.
    refused(
        &mut s,
        &by("ta", with("u2", "alice")),
        "a tenant-admin token may not set a token's account",
    );
    assert_eq!(
        s.apply(&by(
            "ta",
            Command::CreateToken {
                token: token("u3", Role::User, Some("a"))
            }
        )),
        ApplyResult::Ok
    );
    assert_eq!(s.apply(&by("root", with("u2", "alice"))), ApplyResult::Ok);
    assert_eq!(s.tokens["u2"].account, Some(account("alice")));
    let root = Command::CreateToken {
        token: TokenRecord {
            account: Some(Account::user("root")),
            ..token("u4", Role::User, Some("a"))
        },
    };
    refused(&mut s, &by("root", root), "never run as root");
}

#[test]
fn only_admins_give_tenants_accounts() {
    let mut s = cluster();
    let create = |a: Option<Account>| Command::CreateTenant {
        tenant: tenant("b", a),
    };
    refused(
        &mut s,
        &by("ta", create(Some(account("bob:research")))),
        "may not set a tenant's account",
    );
    refused(
        &mut s,
        &by(
            "root",
            create(Some(Account {
                group: Some("0".into()),
                ..Account::user("0")
            })),
        ),
        "tenant b: account 0:0: jobs never run as root",
    );
    assert_eq!(
        s.apply(&by("root", create(Some(account("bob:research"))))),
        ApplyResult::Ok
    );
    assert_eq!(s.tenants["b"].account, Some(account("bob:research")));
    // Replacing the record with the same account is not a change of account; changing or
    // clearing it is, and only an admin (or the system) may.
    let update = |a: Option<Account>, weight: u32| Command::UpdateTenant {
        tenant: TenantRecord {
            weight,
            ..tenant("b", a)
        },
    };
    refused(
        &mut s,
        &by("op", update(None, 1)),
        "may not set a tenant's account",
    );
    assert_eq!(
        s.apply(&at(3, update(Some(account("bob:research")), 2))),
        ApplyResult::Ok
    );
    assert_eq!(
        s.apply(&by("root", update(Some(account("carol")), 2))),
        ApplyResult::Ok
    );
    refused(
        &mut s,
        &by("root", update(Some(Account::user("root")), 2)),
        "never run as root",
    );
    assert_eq!(s.apply(&by("root", update(None, 2))), ApplyResult::Ok);
    assert_eq!(s.tenants["b"].account, None);
}

#[test]
fn a_submission_resolves_to_its_token_then_its_tenant() {
    let mut s = cluster();
    s.apply(&at(
        2,
        Command::CreateTenant {
            tenant: tenant("a", Some(account("bob:research"))),
        },
    ));
    s.apply(&at(
        2,
        Command::SetTokenAccount {
            id: "ta".into(),
            account: Some(account("alice")),
        },
    ));
    assert_eq!(s.account_for("ta", "a"), Some(account("alice")));
    assert_eq!(s.account_for("u", "a"), Some(account("bob:research")));
    assert_eq!(s.account_for("u", "plain"), None);
    assert_eq!(s.account_for("unknown", "plain"), None);
}

#[test]
fn bad_submissions_are_refused_and_change_nothing() {
    let mut s = cluster();
    let submit = |spec: JobSpec| {
        by(
            "u",
            Command::SubmitJob {
                spec: Box::new(JobSpec {
                    tenant: "a".into(),
                    ..spec
                }),
                idempotency_key: Some("k".into()),
                hold: false,
                owner: None,
            },
        )
    };
    for (bad, why) in [
        (
            JobSpec {
                wall_time_limit_s: Some(0),
                ..spec(1)
            },
            "time limit must be more than zero",
        ),
        (
            JobSpec {
                wall_time_limit_s: Some(367 * 86_400),
                ..spec(1)
            },
            "is more than 366 days",
        ),
        (
            JobSpec {
                memory_mib: Some(8),
                ..spec(1)
            },
            "memory limit of 8 MiB is below the minimum of 16 MiB",
        ),
        (
            JobSpec {
                memory_mib: Some(u64::MAX),
                ..spec(1)
            },
            "is more than 64 TiB",
        ),
        (
            JobSpec {
                cpu_millis: Some(0),
                ..spec(1)
            },
            "CPU limit must be more than zero",
        ),
        (
            JobSpec {
                workdir: Some("data/run".into()),
                ..spec(1)
            },
            "is a relative path",
        ),
        (
            JobSpec {
                account: Some(Account::user("root")),
                ..spec(1)
            },
            "never run as root",
        ),
        (
            JobSpec {
                account: Some(Account::user("-x")),
                ..spec(1)
            },
            "not a valid user or group name",
        ),
    ] {
        refused(&mut s, &submit(bad), why);
        assert!(s.jobs.is_empty() && s.idempotency.is_empty());
    }
    // The same key with a sound spec then creates the job, carrying its token's account.
    s.apply(&at(
        2,
        Command::SetTokenAccount {
            id: "u".into(),
            account: Some(account("alice:research")),
        },
    ));
    let good = JobSpec {
        account: Some(account("alice:research")),
        wall_time_limit_s: Some(3600),
        memory_mib: Some(16),
        ..spec(1)
    };
    match s.apply(&submit(good)) {
        ApplyResult::JobSubmitted { job, existing } => {
            assert!(!existing);
            assert_eq!(s.jobs[&job].spec.account, Some(account("alice:research")));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_stale_stamp_is_refused_and_a_retry_finds_its_job() {
    let mut s = cluster();
    s.apply(&at(
        2,
        Command::CreateTenant {
            tenant: tenant("a", Some(account("bob:research"))),
        },
    ));
    let submit = |actor: &str, a: Option<&str>, key: &str| {
        by(
            actor,
            Command::SubmitJob {
                spec: Box::new(JobSpec {
                    tenant: "a".into(),
                    account: a.map(account),
                    ..spec(1)
                }),
                idempotency_key: Some(key.into()),
                hold: false,
                owner: None,
            },
        )
    };
    // Stamped from a replica that had not seen the tenant's default yet: refused, typed, with
    // the account the state names now; nothing but the audit entry changes.
    refused(
        &mut s,
        &submit("u", None, "k1"),
        "the Unix account for this submission changed while it was submitted (now bob:research)",
    );
    let before = s.clone();
    let stale = s.apply(&submit("u", Some("mallory"), "k1"));
    assert_eq!(
        stale,
        ApplyResult::Rejected {
            reason: Rejection::AccountChanged {
                now: Some(account("bob:research"))
            }
        }
    );
    assert_eq!((s.jobs.len(), s.idempotency.len()), (0, 0));
    assert_eq!(s.tokens, before.tokens);
    // Stamped right, it is queued.
    let ApplyResult::JobSubmitted { job, .. } = s.apply(&submit("u", Some("bob:research"), "k1"))
    else {
        panic!("submitted");
    };
    // The admin maps the token to alice; a retry of the same request (same key), stamped
    // with the new mapping, is still that request: it finds its job, which keeps its account.
    s.apply(&by(
        "root",
        Command::SetTokenAccount {
            id: "u".into(),
            account: Some(account("alice")),
        },
    ));
    assert_eq!(
        s.apply(&submit("u", Some("alice"), "k1")),
        ApplyResult::JobSubmitted {
            job,
            existing: true
        }
    );
    assert_eq!(s.jobs[&job].spec.account, Some(account("bob:research")));
    // Submissions of the system carry what they carry.
    assert!(matches!(
        s.apply(&at(5, Command::submit(spec(1)))),
        ApplyResult::JobSubmitted { .. }
    ));
}
