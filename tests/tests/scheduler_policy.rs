//! The replicated scheduler policy against real agents: an operator changes it through any
//! agent, every replica sees it, bad values and weaker roles are refused with the policy
//! untouched, and jobs are still placed under the new policy.

use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_proto::v1::scheduler_service_client::SchedulerServiceClient;
use gpu_proto::v1::token_service_client::TokenServiceClient;
use gpu_tests::{Cluster, is_terminal, shell_job};

async fn set(
    c: &Cluster,
    via: u64,
    bearer: &str,
    policy: &str,
    half_life_s: Option<u64>,
) -> Result<pb::SchedulerStatus, tonic::Status> {
    let mut client = SchedulerServiceClient::new(c.channel_as(via, Some(bearer)).await?);
    let req = pb::SetSchedulerPolicyRequest {
        policy: policy.into(),
        aging_per_hour: Some(2),
        fairshare_weight: None,
        usage_half_life_s: half_life_s,
        preemption: None,
    };
    Ok(client.set_scheduler_policy(req).await?.into_inner())
}

async fn spec(c: &Cluster, via: u64, stale: bool) -> String {
    let mut client = SchedulerServiceClient::new(c.channel(via).await.expect("channel"));
    client
        .get_scheduler_status(pb::GetSchedulerStatusRequest { stale })
        .await
        .expect("status")
        .into_inner()
        .policy
        .expect("policy")
        .spec
}

async fn mint(c: &Cluster, role: pb::Role) -> String {
    let mut client = TokenServiceClient::new(c.channel(1).await.expect("channel"));
    let req = pb::CreateTokenRequest {
        role: role as i32,
        tenant: String::new(),
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
async fn operators_change_the_replicated_policy_and_bad_values_change_nothing() {
    let c = Cluster::start(3, 3, "").await;
    assert_eq!(spec(&c, 1, false).await, "priority+greedy", "v1's default");

    let operator = mint(&c, pb::Role::Operator).await;
    let viewer = mint(&c, pb::Role::Viewer).await;
    let status = set(&c, 2, &operator, "sjf+easy", Some(3600))
        .await
        .expect("an operator may set the policy");
    let policy = status.policy.expect("policy");
    assert_eq!(
        (
            policy.spec.as_str(),
            policy.aging_per_hour,
            policy.usage_half_life_s
        ),
        ("sjf+easy", 2, 3600)
    );
    for via in 1..=3 {
        assert_eq!(
            spec(&c, via, false).await,
            "sjf+easy",
            "read through n{via}"
        );
    }

    let err = set(&c, 3, &viewer, "fcfs", None).await.expect_err("viewer");
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
    let admin = c.admin_token();
    for (policy, half_life) in [("lifo", None), ("sjf+later", None), ("fcfs", Some(0))] {
        let err = set(&c, 1, &admin, policy, half_life)
            .await
            .expect_err(policy);
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{policy}: {err}");
    }
    assert_eq!(
        spec(&c, 3, false).await,
        "sjf+easy",
        "refusals changed nothing"
    );

    // The leader schedules under the new policy: jobs are still placed and run.
    set(&c, 1, &admin, "fcfs", None).await.expect("admin");
    let id = c
        .submit(2, shell_job("under-fcfs", 1, "true"), "")
        .await
        .expect("submit")
        .job_id;
    let done = c.wait_job(id, Duration::from_secs(60), is_terminal).await;
    assert_eq!(done.state, pb::JobState::Succeeded as i32, "{done:?}");
}
