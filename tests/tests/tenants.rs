//! Tenants against real agents: an admin creates a tenant with an A100 quota through a
//! follower, the leader holds that tenant at its quota while another tenant's jobs run, the
//! waiting job says why, raising the quota lets it start, GPU time is accounted per tenant and
//! per job by type, and bad input (negative, NaN, huge, duplicate, unknown, weaker roles) is
//! refused with every record unchanged.

use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_proto::v1::tenant_service_client::TenantServiceClient;
use gpu_proto::v1::token_service_client::TokenServiceClient;
use gpu_tests::{Cluster, shell_job};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

fn gpuctl(c: &Cluster, via: u64, args: &[&str]) -> (Option<i32>, Value, String) {
    let out = c
        .gpuctl()
        .args(["--endpoint", c.addr(via), "-o", "json"])
        .args(args)
        .output()
        .expect("run gpuctl");
    let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (
        out.status.code(),
        json,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn tenants(
    c: &Cluster,
    via: u64,
    bearer: Option<&str>,
) -> TenantServiceClient<gpu_tests::Conn> {
    TenantServiceClient::new(c.channel_as(via, bearer).await.expect("channel"))
}

fn a100_job(name: &str, tenant: &str) -> pb::JobSpec {
    pb::JobSpec {
        tenant: tenant.into(),
        runtime_estimate_s: Some(600),
        gpu_types: vec!["A100".into()],
        ..shell_job(name, 1, "sleep 600")
    }
}

async fn state(c: &Cluster, id: u64) -> pb::Job {
    c.job(1, id).await.expect("job")
}

/// The records (not the usage, which grows with time) of every tenant.
fn records(list: &Value) -> Vec<Value> {
    list.as_array()
        .expect("array")
        .iter()
        .map(|t| {
            serde_json::json!([
                t["name"],
                t["has_record"],
                t["quotas"],
                t["weight"],
                t["default_priority"],
                t["updated_at_ms"]
            ])
        })
        .collect()
}

async fn mint(c: &Cluster, role: pb::Role, tenant: &str) -> String {
    let mut client = TokenServiceClient::new(c.channel(1).await.expect("channel"));
    let req = pb::CreateTokenRequest {
        role: role as i32,
        tenant: tenant.into(),
        description: "test".into(),
        account: None,
        ..Default::default()
    };
    client
        .create_token(req)
        .await
        .expect("mint")
        .into_inner()
        .bearer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_is_held_at_its_quota_and_bad_input_changes_nothing() {
    // n1 has 4 A100s (the harness's node kinds); n2 and n3 have none.
    let c = Cluster::start(3, 3, "").await;

    // Phase 1: an admin creates tenant a, limited to 1 guaranteed + 1 borrowed A100, through n2.
    let (code, a, err) = gpuctl(
        &c,
        2,
        &[
            "tenant", "create", "a", "--quota", "A100=1:1", "--weight", "2",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(a["quotas"][0]["guaranteed"], 1);
    assert_eq!(a["weight"], 2);
    assert_eq!(a["warnings"], serde_json::json!([]));

    // Phase 2: three A100 jobs of a, one of b (no record, unlimited): one A100 stays idle,
    // and still a's third job waits, at its limit.
    let mut a_jobs = Vec::new();
    for i in 0..3 {
        let r = c
            .submit(2, a100_job(&format!("a{i}"), "a"), "")
            .await
            .expect("submit");
        a_jobs.push(r.job_id);
    }
    let mut b_jobs = Vec::new();
    for i in 0..1 {
        let r = c
            .submit(3, a100_job(&format!("b{i}"), "b"), "")
            .await
            .expect("submit");
        b_jobs.push(r.job_id);
    }
    let running = |j: &pb::Job| j.state == pb::JobState::Running as i32;
    for id in a_jobs.iter().take(2).chain(&b_jobs) {
        c.wait_job(*id, WAIT, running).await;
    }
    let held = a_jobs[2];
    let j = c
        .wait_job(held, WAIT, |j| j.reason.starts_with("over quota"))
        .await;
    assert_eq!(j.state, pb::JobState::Pending as i32);
    assert_eq!(
        j.reason,
        "over quota: tenant a holds 2 of its 2 A100 GPUs (1 guaranteed + 1 borrowed) and needs 1 more"
    );

    // `job why` gives the reason plan recorded, the position, and the start the timeline
    // expects: when the first of a's two running jobs ends at its 600 s estimate.
    let (code, why, err) = gpuctl(&c, 3, &["job", "why", &format!("j-{held}")]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(why["reason"], j.reason.as_str());
    assert_eq!(why["queue_position"], 1, "the only pending job");
    let mut first_end = u64::MAX;
    for id in &a_jobs[..2] {
        let r = state(&c, *id).await;
        let start = r.started_at_ms.or(r.bound_at_ms).expect("running");
        first_end = first_end.min(start + 600_000);
    }
    assert_eq!(why["estimated_start_ms"].as_u64(), Some(first_end), "{why}");

    // Phase 3: bad input is refused and changes nothing.
    let (_, before, _) = gpuctl(&c, 1, &["tenant", "list"]);
    for bad in [
        vec!["tenant", "create", "x", "--quota", "A100=-1"],
        vec!["tenant", "create", "x", "--quota", "A100=NaN"],
        vec!["tenant", "create", "x", "--quota", "A100=1.5"],
        vec!["tenant", "update", "a", "--weight", "-3"],
    ] {
        let (code, _, _) = gpuctl(&c, 1, &bad);
        assert_eq!(code, Some(2), "{bad:?} is a usage error");
    }
    let admin = c.admin_token();
    let mut api = tenants(&c, 3, Some(&admin)).await;
    let huge = pb::CreateTenantRequest {
        name: "x".into(),
        quotas: vec![pb::GpuQuota {
            gpu_type: "A100".into(),
            guaranteed: u32::MAX,
            borrow: 0,
        }],
        weight: None,
        default_priority: None,
        account: None,
        allowed_mounts: Vec::new(),
        max_priority: None,
        max_pending_jobs: None,
        webhook: None,
    };
    let refusals = [
        api.create_tenant(huge.clone()).await.map(drop),
        api.create_tenant(pb::CreateTenantRequest {
            weight: Some(0),
            quotas: vec![],
            ..huge.clone()
        })
        .await
        .map(drop),
        api.create_tenant(pb::CreateTenantRequest {
            name: "../etc".into(),
            quotas: vec![],
            ..huge.clone()
        })
        .await
        .map(drop),
        api.create_tenant(pb::CreateTenantRequest {
            name: "a".into(),
            quotas: vec![],
            ..huge.clone()
        })
        .await
        .map(drop),
        api.update_tenant(pb::UpdateTenantRequest {
            name: "a".into(),
            remove_quotas: vec!["H100".into()],
            ..Default::default()
        })
        .await
        .map(drop),
        api.update_tenant(pb::UpdateTenantRequest {
            name: "a".into(),
            quotas: vec![
                pb::GpuQuota {
                    gpu_type: "T4".into(),
                    guaranteed: 1,
                    borrow: 0,
                };
                2
            ],
            ..Default::default()
        })
        .await
        .map(drop),
    ];
    for (i, r) in refusals.into_iter().enumerate() {
        let e = r.expect_err("refused");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "refusal {i}: {e}");
    }
    let e = api
        .update_tenant(pb::UpdateTenantRequest {
            name: "ghost".into(),
            ..Default::default()
        })
        .await
        .expect_err("unknown");
    assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
    let b_user = mint(&c, pb::Role::User, "b").await;
    let a_admin = mint(&c, pb::Role::TenantAdmin, "a").await;
    let e = tenants(&c, 2, Some(&a_admin))
        .await
        .create_tenant(pb::CreateTenantRequest {
            name: "mine".into(),
            ..Default::default()
        })
        .await
        .expect_err("tenant-admins do not manage tenants");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
    let e = tenants(&c, 2, Some(&b_user))
        .await
        .get_tenant(pb::GetTenantRequest {
            name: "a".into(),
            stale: false,
        })
        .await
        .expect_err("b may not read a");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
    let own = tenants(&c, 2, Some(&a_admin))
        .await
        .get_tenant(pb::GetTenantRequest {
            name: "a".into(),
            stale: false,
        })
        .await
        .expect("a tenant-admin reads its own tenant")
        .into_inner();
    assert_eq!(own.quotas.len(), 1);
    let (_, after, _) = gpuctl(&c, 1, &["tenant", "list"]);
    assert_eq!(
        records(&after),
        records(&before),
        "refusals changed nothing"
    );
    assert_eq!(state(&c, held).await.state, pb::JobState::Pending as i32);

    // Phase 4: a quota above the cluster and one for a GPU type no node has are allowed and
    // reported; raising a's borrowing lets its third job start.
    let (code, a, err) = gpuctl(
        &c,
        3,
        &[
            "tenant", "update", "a", "--quota", "A100=1:2", "--quota", "B200=8",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        a["warnings"],
        serde_json::json!(["no registered node has a B200 GPU"])
    );
    let (code, _, err) = gpuctl(&c, 1, &["tenant", "create", "big", "--quota", "A100=100"]);
    assert_eq!(code, Some(0), "{err}");
    let (_, big, _) = gpuctl(&c, 2, &["tenant", "get", "big"]);
    assert_eq!(
        big["warnings"],
        serde_json::json!(["guaranteed 100 A100 GPUs, the cluster has 4"])
    );
    c.wait_job(held, WAIT, running).await;

    // Phase 5: GPU time per tenant and per job, by type, from the replicated records.
    c.wait_for("a's A100 time to be counted", WAIT, |c| async move {
        let (_, a, _) = gpuctl(c, 1, &["tenant", "get", "a"]);
        let usage = a["usage"].as_array().cloned().unwrap_or_default();
        let a100 = usage.iter().find(|u| u["gpu_type"] == "A100");
        a100.is_some_and(|u| u["gpus_held"] == 3 && u["gpu_seconds"].as_f64() > Some(0.0))
            && a["jobs"].as_array().is_some_and(|j| j.len() == 3)
    })
    .await;
    let (_, list, _) = gpuctl(&c, 1, &["tenant", "list"]);
    let b = list
        .as_array()
        .expect("array")
        .iter()
        .find(|t| t["name"] == "b")
        .cloned()
        .expect("b, known from its jobs, is listed");
    assert_eq!(b["has_record"], false);
    assert_eq!(b["usage"][0]["gpus_held"], 1);
}
