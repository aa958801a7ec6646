//! Job identity against real agents, through `gpuctl` as an admin and users would type it: an
//! admin maps token A to the Unix account `alice` and tenant b's default to `bob:research`;
//! jobs submitted with those tokens carry those accounts (`job get -o json`), a token without a
//! mapping in a tenant without a default carries none, and clearing a mapping takes effect for
//! the next job. Root (by name or uid 0), weaker roles and bad submissions (time limit, memory,
//! CPU, workdir) are refused with the reason, and leave every record as it was.

use gpu_tests::Cluster;
use serde_json::{Value, json};

struct Out {
    code: Option<i32>,
    json: Value,
    stdout: String,
    stderr: String,
}

/// `gpuctl ARGS` through agent `via`, as the admin (`bearer` None) or with `bearer`.
fn gpuctl(c: &Cluster, via: u64, bearer: Option<&str>, args: &[&str]) -> Out {
    let mut cmd = c.gpuctl();
    if let Some(b) = bearer {
        cmd.env("GPUCTL_TOKEN", b);
    }
    let out = cmd
        .args(["--endpoint", c.addr(via)])
        .args(args)
        .output()
        .expect("run gpuctl");
    Out {
        code: out.status.code(),
        json: serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `gpuctl -o json ARGS` as the admin, which must succeed.
fn admin(c: &Cluster, via: u64, args: &[&str]) -> Value {
    let out = gpuctl(c, via, None, &[&["-o", "json"], args].concat());
    assert_eq!(out.code, Some(0), "{args:?}: {}", out.stderr);
    out.json
}

/// A new token (`--role ROLE --tenant TENANT` plus `extra`): its bearer and id.
fn mint(c: &Cluster, role: &str, tenant: &str, extra: &[&str]) -> (String, String) {
    let args = [
        &["token", "create", "--role", role, "--tenant", tenant],
        extra,
    ]
    .concat();
    let reply = admin(c, 2, &args);
    let bearer = reply["bearer"].as_str().expect("bearer").to_owned();
    let id = reply["token"]["id"].as_str().expect("id").to_owned();
    (bearer, id)
}

/// Submit `true` to `tenant` with `bearer` through agent `via`; the job as `job get` shows it.
fn submit(c: &Cluster, via: u64, bearer: &str, tenant: &str) -> Value {
    let out = gpuctl(
        c,
        via,
        Some(bearer),
        &[
            "-o", "json", "job", "submit", "--tenant", tenant, "--", "true",
        ],
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let id = out.json["job_id"].as_u64().expect("job id").to_string();
    let got = gpuctl(c, via, Some(bearer), &["-o", "json", "job", "get", &id]);
    assert_eq!(got.code, Some(0), "{}", got.stderr);
    got.json
}

/// A refused command: exit 2, nothing on stdout, `why` on stderr.
fn refused(out: &Out, why: &str) {
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stdout.is_empty(), "{}", out.stdout);
    assert!(out.stderr.contains(why), "want {why:?} in: {}", out.stderr);
}

/// What an admin sees of the tokens and tenants, their accounts included (not the tenants'
/// usage, which moves as jobs run).
fn records(c: &Cluster) -> (Value, Value) {
    let tenants = admin(c, 1, &["tenant", "list"])
        .as_array()
        .expect("tenants")
        .iter()
        .map(|t| json!([t["name"], t["account"], t["weight"], t["updated_at_ms"]]))
        .collect();
    (admin(c, 1, &["token", "list"]), tenants)
}

/// The ids of every job.
fn job_ids(c: &Cluster) -> Vec<Value> {
    admin(c, 1, &["job", "list"])
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| j["id"].clone())
        .collect()
}

/// The line of `text` that starts with `key:`, its value trimmed.
fn field<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map_or("", str::trim)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_carry_the_account_the_cluster_maps_and_bad_input_changes_nothing() {
    // n2 is a learner: every write through it is forwarded to the leader n1, with its caller.
    let c = Cluster::start(2, 1, "").await;

    // Phase 1: tenant b's default account, tenant c without one; tokens A (tenant a, no
    // record), B (tenant b) and C (tenant c); A mapped to alice afterwards with set-account.
    let b = admin(
        &c,
        2,
        &["tenant", "create", "b", "--account", "bob:research"],
    );
    assert_eq!(
        b["account"],
        json!({"user": "bob", "group": "research", "groups": []})
    );
    let none = admin(&c, 2, &["tenant", "create", "c"]);
    assert_eq!(none["account"], Value::Null);
    let (a_bearer, a_id) = mint(&c, "user", "a", &[]);
    let (b_bearer, _) = mint(&c, "user", "b", &[]);
    let (c_bearer, _) = mint(&c, "user", "c", &[]);
    let set = admin(&c, 2, &["token", "set-account", &a_id, "alice"]);
    assert_eq!(set[0]["account"]["user"], "alice");
    assert_eq!(set[0]["account"]["group"], Value::Null);
    // Minted with an account and supplementary groups in one step.
    let (d_bearer, d_id) = mint(
        &c,
        "user",
        "c",
        &["--account", "1001:1001", "--groups", "video,44"],
    );

    // Phase 2: each job carries its token's account, else its tenant's, else none; through
    // the learner (forwarded) and the leader alike.
    let job_a = submit(&c, 2, &a_bearer, "a");
    assert_eq!(
        job_a["account"],
        json!({"user": "alice", "group": null, "groups": []})
    );
    let job_b = submit(&c, 1, &b_bearer, "b");
    assert_eq!(
        job_b["account"],
        json!({"user": "bob", "group": "research", "groups": []})
    );
    let job_c = submit(&c, 2, &c_bearer, "c");
    assert_eq!(job_c["account"], Value::Null);
    let job_d = submit(&c, 2, &d_bearer, "c");
    assert_eq!(
        job_d["account"],
        json!({"user": "1001", "group": "1001", "groups": ["video", "44"]})
    );
    let text = gpuctl(
        &c,
        1,
        Some(&a_bearer),
        &["job", "get", &job_a["id"].to_string()],
    );
    assert_eq!(field(&text.stdout, "Account"), "alice", "{}", text.stdout);
    let text = gpuctl(
        &c,
        1,
        Some(&c_bearer),
        &["job", "get", &job_c["id"].to_string()],
    );
    assert_eq!(
        field(&text.stdout, "Account"),
        "- (the node's jobs.run_as)",
        "{}",
        text.stdout
    );
    // The mappings show where admins look for them.
    let tokens = admin(&c, 1, &["token", "list"]);
    let tenants = admin(&c, 1, &["tenant", "list"]);
    let token = |id: &str| {
        tokens
            .as_array()
            .and_then(|t| t.iter().find(|t| t["id"] == id).cloned())
            .expect("listed")
    };
    assert_eq!(token(&a_id)["account"]["user"], "alice");
    assert_eq!(token(&d_id)["account"]["groups"], json!(["video", "44"]));
    let listed = gpuctl(&c, 1, None, &["token", "list"]).stdout;
    assert!(listed.contains("ACCOUNT") && listed.contains("1001:1001 (+video,44)"));
    let tenant_b = tenants
        .as_array()
        .and_then(|t| t.iter().find(|t| t["name"] == "b").cloned())
        .expect("b listed");
    assert_eq!(tenant_b["account"]["group"], "research");
    let got = gpuctl(&c, 2, None, &["tenant", "get", "b"]).stdout;
    assert_eq!(field(&got, "Default account"), "bob:research", "{got}");

    // Phase 3: root by name or uid, a bad name, a weaker role: refused with the reason, and
    // no record changes.
    let ta = mint(&c, "tenant-admin", "b", &[]).0;
    let before = records(&c);
    for (args, why) in [
        (
            vec!["token", "set-account", a_id.as_str(), "root"],
            "account root: jobs never run as root through the cluster",
        ),
        (
            vec!["token", "set-account", a_id.as_str(), "0"],
            "account 0: jobs never run as root",
        ),
        (
            vec!["token", "set-account", a_id.as_str(), "0:0"],
            "never run as root",
        ),
        (
            vec!["tenant", "update", "b", "--account", "0"],
            "tenant b: account 0: jobs never run as root",
        ),
        (
            vec!["tenant", "create", "d", "--account", "root:wheel"],
            "never run as root",
        ),
        (
            vec![
                "token",
                "create",
                "--role",
                "user",
                "--tenant",
                "b",
                "--account",
                "root",
            ],
            "never run as root",
        ),
        (
            vec!["token", "set-account", a_id.as_str(), "al ice"],
            "is not a valid user or group name",
        ),
        (
            vec![
                "token",
                "set-account",
                a_id.as_str(),
                "alice",
                "--groups",
                "video,video",
            ],
            "video is listed twice",
        ),
        (
            vec!["token", "set-account", "t-nope", "alice"],
            "does not exist",
        ),
    ] {
        refused(&gpuctl(&c, 2, None, &args), why);
    }
    let weaker = gpuctl(
        &c,
        2,
        Some(&ta),
        &["token", "set-account", &a_id, "mallory"],
    );
    refused(&weaker, "may not map tokens or tenants to Unix accounts");
    // A tenant admin mints user tokens of its tenant, but not with an account.
    let weaker = gpuctl(
        &c,
        2,
        Some(&ta),
        &[
            "token",
            "create",
            "--role",
            "user",
            "--tenant",
            "b",
            "--account",
            "eve",
        ],
    );
    refused(&weaker, "may not map tokens or tenants to Unix accounts");
    let weaker = gpuctl(
        &c,
        1,
        Some(&ta),
        &["tenant", "update", "b", "--clear-account"],
    );
    refused(&weaker, "may not");
    assert_eq!(records(&c), before, "refusals changed a record");

    // Phase 4: bad submissions are refused at submit, with why, and queue nothing.
    let jobs_before = job_ids(&c);
    for (flags, why) in [
        (
            &["--time-limit", "0s"][..],
            "time limit must be more than zero",
        ),
        (
            &["--time-limit", "400d"],
            "time limit of 34560000 s is more than 366 days",
        ),
        (&["--wall-time", "0s"], "time limit must be more than zero"),
        (
            &["--mem", "8M"],
            "memory limit of 8 MiB is below the minimum of 16 MiB",
        ),
        (&["--memory", "100TiB"], "is more than 64 TiB"),
        (
            &["--workdir", "data/run"],
            "workdir \"data/run\" is a relative path",
        ),
    ] {
        let args = [&["job", "submit", "--tenant", "a"], flags, &["--", "true"]].concat();
        refused(&gpuctl(&c, 2, Some(&a_bearer), &args), why);
    }
    for (flags, why) in [
        (
            &["--time-limit", "-5m"][..],
            "a time limit cannot be negative",
        ),
        (&["--time-limit", "soon"], "expected a duration"),
        (&["--cpus", "0"], "must be more than zero"),
        (&["--mem", "lots"], "expected a size"),
    ] {
        let args = [&["job", "submit", "--tenant", "a"], flags, &["--", "true"]].concat();
        refused(&gpuctl(&c, 2, Some(&a_bearer), &args), why);
    }
    assert_eq!(job_ids(&c), jobs_before, "a refusal queued a job");

    // Phase 5: clearing takes effect for the next job; jobs already queued keep theirs.
    admin(&c, 2, &["token", "set-account", &a_id, "--clear"]);
    assert_eq!(submit(&c, 2, &a_bearer, "a")["account"], Value::Null);
    admin(&c, 1, &["tenant", "update", "b", "--clear-account"]);
    assert_eq!(submit(&c, 2, &b_bearer, "b")["account"], Value::Null);
    let again = admin(&c, 1, &["job", "get", &job_a["id"].to_string()]);
    assert_eq!(again["account"]["user"], "alice");

    // Every mapping change, and every refusal, is in the audit log.
    let audit = admin(&c, 1, &["audit", "list"]);
    let entries = audit.as_array().expect("entries");
    let verbs = |verb: &str, outcome: &str| {
        entries
            .iter()
            .filter(|e| {
                e["verb"] == verb
                    && e["outcome"]
                        .as_str()
                        .is_some_and(|o| o.starts_with(outcome))
            })
            .count()
    };
    assert_eq!(verbs("token.set-account", "ok"), 2, "{audit}");
    // The edge refuses bad accounts before writing; an unknown token is `apply`'s to refuse,
    // a weaker role the permission check's: both are audited.
    assert_eq!(
        verbs("token.set-account", "rejected: token t-nope"),
        1,
        "{audit}"
    );
    assert_eq!(verbs("token.set-account", "denied: "), 1, "{audit}");
}
