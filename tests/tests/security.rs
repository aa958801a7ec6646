//! Security at the API edge, against real agents: no token → no access; roles and tenants are
//! enforced on every RPC; nobody mints more rights than they hold; revocation takes effect at
//! once; every mutation and every refusal is audited in a verifiable hash chain; no raw secret
//! ever reaches a data directory, a snapshot or a log.

use std::path::Path;
use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_proto::v1::audit_service_client::AuditServiceClient;
use gpu_proto::v1::job_service_client::JobServiceClient;
use gpu_proto::v1::node_service_client::NodeServiceClient;
use gpu_proto::v1::token_service_client::TokenServiceClient;
use gpu_tests::{ADMIN_TOKEN, Cluster, shell_job};

async fn mint(
    c: &Cluster,
    via: u64,
    as_bearer: &str,
    role: pb::Role,
    tenant: &str,
) -> Result<String, tonic::Status> {
    let mut client = TokenServiceClient::new(c.channel_as(via, Some(as_bearer)).await?);
    let req = pb::CreateTokenRequest {
        role: role as i32,
        tenant: tenant.into(),
        description: "test".into(),
        account: None,
        ..Default::default()
    };
    Ok(client.create_token(req).await?.into_inner().bearer)
}

async fn submit_as(
    c: &Cluster,
    via: u64,
    bearer: Option<&str>,
    tenant: &str,
) -> Result<u64, tonic::Status> {
    let mut client = JobServiceClient::new(c.channel_as(via, bearer).await?);
    let spec = pb::JobSpec {
        tenant: tenant.into(),
        ..shell_job("probe", 0, "true")
    };
    let req = pb::SubmitJobRequest {
        spec: Some(spec),
        idempotency_key: String::new(),
        hold: false,
    };
    Ok(client.submit_job(req).await?.into_inner().job_id)
}

async fn audit(c: &Cluster, via: u64) -> Vec<pb::AuditEntry> {
    let mut client = AuditServiceClient::new(c.channel(via).await.expect("channel"));
    client
        .list_audit(pb::ListAuditRequest { after: 0, limit: 0 })
        .await
        .expect("audit")
        .into_inner()
        .entries
}

async fn verify(c: &Cluster, via: u64) -> pb::VerifyAuditResponse {
    let mut client = AuditServiceClient::new(c.channel(via).await.expect("channel"));
    client
        .verify_audit(pb::VerifyAuditRequest::default())
        .await
        .expect("verify")
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_roles_and_tenants_are_enforced_and_audited() {
    let c = Cluster::start(3, 3, "").await;
    let admin = c.admin_token();
    assert!(!admin.is_empty(), "the bootstrap admin token was written");

    // No token, a malformed one, a wrong secret: unauthenticated, logged by the agent that
    // refused them and not replicated (anyone who reaches the port could fill the log).
    let before = audit(&c, 1).await.len();
    let id = admin.split('.').next().expect("id");
    for bad in [
        None,
        Some("garbage"),
        Some(&*format!("{id}.{}", "0".repeat(64))),
    ] {
        let err = submit_as(&c, 2, bad, "default")
            .await
            .expect_err("must be refused");
        assert_eq!(err.code(), tonic::Code::Unauthenticated, "{bad:?}: {err}");
    }
    let entries = audit(&c, 1).await;
    assert!(
        entries[before..]
            .iter()
            .all(|e| !e.outcome.starts_with("denied")),
        "no audit entry for a caller without credentials: {:#?}",
        &entries[before..]
    );
    let logged = c
        .log_of(2)
        .lines()
        .filter(|l| l.contains("refused an unauthenticated request") && l.contains("job.submit"))
        .count();
    assert_eq!(logged, 3, "one local log line per refused request");

    // A viewer reads but cannot submit, cancel or drain.
    let viewer = mint(&c, 1, &admin, pb::Role::Viewer, "")
        .await
        .expect("viewer");
    let mut nodes = NodeServiceClient::new(c.channel_as(3, Some(&viewer)).await.expect("channel"));
    nodes
        .list_nodes(pb::ListNodesRequest { stale: false })
        .await
        .expect("a viewer may read");
    let err = submit_as(&c, 3, Some(&viewer), "default")
        .await
        .expect_err("viewer submit");
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
    let err = nodes
        .drain_node(pb::DrainNodeRequest { id: 1, evict: true })
        .await
        .expect_err("viewer drain");
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    let job = submit_as(&c, 1, Some(&admin), "default")
        .await
        .expect("admin submits");
    let mut jobs = JobServiceClient::new(c.channel_as(2, Some(&viewer)).await.expect("channel"));
    let err = jobs
        .cancel_job(pb::CancelJobRequest {
            id: job,
            array_index: None,
        })
        .await
        .expect_err("viewer cancel");
    assert_eq!(err.code(), tonic::Code::PermissionDenied);

    // Tenants: a tenant admin mints users of its own tenant only; a user sees only its tenant.
    let ta = mint(&c, 1, &admin, pb::Role::TenantAdmin, "vision")
        .await
        .expect("tenant admin");
    for (role, tenant) in [
        (pb::Role::Admin, ""),
        (pb::Role::Operator, ""),
        (pb::Role::User, "nlp"),
        (pb::Role::Viewer, ""),
    ] {
        let err = mint(&c, 2, &ta, role, tenant)
            .await
            .expect_err("more than it holds");
        assert_eq!(
            err.code(),
            tonic::Code::PermissionDenied,
            "{role:?}/{tenant}: {err}"
        );
    }
    let user = mint(&c, 2, &ta, pb::Role::User, "vision")
        .await
        .expect("user of own tenant");
    let err = mint(&c, 3, &user, pb::Role::Viewer, "vision")
        .await
        .expect_err("users mint nothing");
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    let mine = submit_as(&c, 3, Some(&user), "vision")
        .await
        .expect("own tenant");
    let err = submit_as(&c, 3, Some(&user), "nlp")
        .await
        .expect_err("other tenant");
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    let mut user_jobs = JobServiceClient::new(c.channel_as(1, Some(&user)).await.expect("channel"));
    let listed = user_jobs
        .list_jobs(pb::ListJobsRequest::default())
        .await
        .expect("list")
        .into_inner()
        .jobs;
    assert_eq!(
        listed.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![mine],
        "only its tenant's jobs"
    );
    let err = user_jobs
        .get_job(pb::GetJobRequest {
            id: job,
            stale: false,
            array_index: None,
        })
        .await
        .expect_err("other tenant's job");
    assert_eq!(err.code(), tonic::Code::PermissionDenied);

    // Revocation takes effect on every agent as soon as it applies it.
    let mut tokens = TokenServiceClient::new(c.channel(1).await.expect("channel"));
    let user_id = user.split('.').next().expect("id").to_owned();
    tokens
        .revoke_token(pb::RevokeTokenRequest { id: user_id })
        .await
        .expect("revoke");
    for via in [1, 2, 3] {
        c.wait_for(
            "the revocation to reach every agent",
            Duration::from_secs(5),
            |c| {
                let user = user.clone();
                async move {
                    submit_as(c, via, Some(&user), "vision")
                        .await
                        .is_err_and(|e| e.code() == tonic::Code::Unauthenticated)
                }
            },
        )
        .await;
    }

    let v = verify(&c, 2).await;
    assert!(v.ok, "{}", v.problem);
    assert!(v.entries > 10);

    // Membership changes are mutations too: the leader audits every join and promotion.
    let entries = audit(&c, 3).await;
    for (verb, node) in [("member.add", "node/2@"), ("member.add", "node/3@")] {
        assert!(
            entries.iter().any(|e| e.verb == verb
                && e.object.starts_with(node)
                && e.actor.starts_with("node/")),
            "no {verb} {node} in {entries:#?}"
        );
    }
    assert!(
        entries
            .iter()
            .any(|e| e.verb == "member.promote" || e.verb == "member.voters"),
        "no promotion in {entries:#?}"
    );
}

/// Every file under `dir` (recursively) that contains `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if std::fs::read(&path)
                .is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle))
            {
                hits.push(path.display().to_string());
            }
        }
    }
    hits
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_raw_secret_is_ever_stored_and_an_edited_audit_log_is_detected() {
    let mut c = Cluster::start(3, 3, "snapshot_every = 5\n").await;
    let admin = c.admin_token();
    let minted = mint(&c, 2, &admin, pb::Role::User, "vision")
        .await
        .expect("mint");
    for _ in 0..8 {
        submit_as(&c, 3, Some(&minted), "vision")
            .await
            .expect("use the token");
    }
    let secret = minted.split_once('.').expect("id.secret").1.to_owned();
    let admin_secret = admin.split_once('.').expect("id.secret").1.to_owned();
    for s in [&secret, &admin_secret] {
        let mut hits = files_containing(c.root.path(), s.as_bytes());
        hits.retain(|h| !h.ends_with(ADMIN_TOKEN));
        assert!(hits.is_empty(), "a raw secret was found in {hits:?}");
    }
    assert!(verify(&c, 1).await.ok);

    // Someone edits n1's snapshot: changes who did something, and even fixes the checksum.
    for id in [1, 2, 3] {
        c.kill(id);
    }
    let path = c.root.path().join("node-1/snapshot");
    let bytes = std::fs::read(&path).expect("snapshot");
    let split = bytes.iter().position(|b| *b == b'\n').expect("header line");
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[..split]).expect("header");
    let mut snapshot: Snapshot =
        gpu_raft_store::codec::from_either(&bytes[split + 1..]).expect("payload");
    let first = &mut std::sync::Arc::make_mut(&mut snapshot.state.audit[0]).actor;
    *first = format!("not-{first}");
    let payload = gpu_raft_store::codec::to_vec(&snapshot).expect("payload");
    header["len"] = payload.len().into();
    header["sha256"] = sha256_hex(&payload).into();
    let mut edited = serde_json::to_vec(&header).expect("header");
    edited.push(b'\n');
    edited.extend_from_slice(&payload);
    std::fs::write(&path, edited).expect("write the edit");
    for id in [1, 2, 3] {
        c.start_agent(id);
    }
    c.leader().await;
    c.wait_serving().await;
    let out = c
        .gpuctl()
        .args(["--endpoint", c.addr(1), "audit", "verify"])
        .output()
        .expect("gpuctl audit verify");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "verify must fail on n1: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("entry 1 was modified"), "{stdout}");
    // The untouched replicas still verify.
    assert!(verify(&c, 2).await.ok);
}

/// What a snapshot file holds after its header line (the state machine's `MachineData`).
#[derive(serde::Serialize, serde::Deserialize)]
struct Snapshot {
    last_applied: Option<gpu_raft_store::LogId>,
    last_membership: openraft::StoredMembership<u64, openraft::BasicNode>,
    state: gpu_raft_store::ClusterState,
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(bytes))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_over_its_rate_is_refused_and_others_are_not() {
    let c = Cluster::start(1, 1, "[api]\nrequests_per_second = 20\nburst = 20").await;
    let admin = c.admin_token();
    let viewer = mint(&c, 1, &admin, pb::Role::Viewer, "")
        .await
        .expect("viewer");
    let nodes = NodeServiceClient::new(c.channel_as(1, Some(&viewer)).await.expect("channel"));
    let calls = (0..80).map(|_| {
        let mut nodes = nodes.clone();
        async move { nodes.list_nodes(pb::ListNodesRequest { stale: true }).await }
    });
    let results = futures::future::join_all(calls).await;
    let limited = results
        .iter()
        .filter(|r| {
            r.as_ref()
                .is_err_and(|e| e.code() == tonic::Code::ResourceExhausted)
        })
        .count();
    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(ok + limited, 80, "only answers or rate refusals");
    assert!(ok >= 20 && limited >= 20, "ok={ok} limited={limited}");

    // Another token is not slowed down by it, and the flood is audited once.
    let entries = audit(&c, 1).await;
    let flood: Vec<_> = entries
        .iter()
        .filter(|e| e.outcome.contains("rate limit"))
        .collect();
    assert_eq!(flood.len(), 1, "{flood:#?}");
    // The viewer's bucket refills.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut nodes = nodes;
    nodes
        .list_nodes(pb::ListNodesRequest { stale: true })
        .await
        .expect("within the rate again");
}
