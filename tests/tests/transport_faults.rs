//! Injected Raft transport faults (`NodeService.InjectNetworkFault`, chaos C11), against real
//! agents: refused unless the agent's config enables them, admin only, only for the contacted
//! agent, bad rules refused; losing every message a leader sends moves the leadership
//! elsewhere, and healing lets writes through the old leader succeed again; both are audited.

use gpu_proto::v1 as pb;
use gpu_proto::v1::audit_service_client::AuditServiceClient;
use gpu_proto::v1::node_service_client::NodeServiceClient;
use gpu_proto::v1::token_service_client::TokenServiceClient;
use gpu_tests::{Cluster, shell_job};
use std::time::Duration;

async fn inject(
    c: &Cluster,
    via: u64,
    bearer: &str,
    req: pb::InjectNetworkFaultRequest,
) -> Result<(), tonic::Status> {
    let mut client = NodeServiceClient::new(c.channel_as(via, Some(bearer)).await?);
    client.inject_network_fault(req).await.map(|_| ())
}

fn lose_all(node_id: u64) -> pb::InjectNetworkFaultRequest {
    pb::InjectNetworkFaultRequest {
        node_id,
        drop_per_mille: 1000,
        seed: 1,
        ..Default::default()
    }
}

async fn audit_outcomes(c: &Cluster, via: u64) -> Vec<String> {
    let mut client = AuditServiceClient::new(c.channel(via).await.expect("channel"));
    client
        .list_audit(pb::ListAuditRequest { after: 0, limit: 0 })
        .await
        .expect("audit")
        .into_inner()
        .entries
        .into_iter()
        .filter(|e| e.verb == "node.inject-network-fault")
        .map(|e| e.outcome)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_unless_the_config_enables_it() {
    let c = Cluster::start(1, 1, "").await;
    let err = inject(&c, 1, &c.admin_token(), lose_all(1))
        .await
        .expect_err("disabled by default");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("raft.fault_injection"), "{err:?}");
    let outcomes = audit_outcomes(&c, 1).await;
    assert!(
        outcomes.len() == 1 && outcomes[0].contains("disabled"),
        "{outcomes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_loses_every_message_is_replaced_and_healing_restores_writes() {
    let c = Cluster::start(3, 3, "fault_injection = true").await;
    let admin = c.admin_token();
    let leader = c.leader().await;

    // Admin only; the contacted agent only; sane rules only.
    let mut tokens = TokenServiceClient::new(c.channel(leader).await.expect("channel"));
    let operator = tokens
        .create_token(pb::CreateTokenRequest {
            role: pb::Role::Operator as i32,
            tenant: String::new(),
            description: "test".into(),
            account: None,
            ..Default::default()
        })
        .await
        .expect("mint")
        .into_inner()
        .bearer;
    let err = inject(&c, leader, &operator, lose_all(leader)).await;
    assert_eq!(
        err.map_err(|s| s.code()),
        Err(tonic::Code::PermissionDenied)
    );
    let other = if leader == 1 { 2 } else { 1 };
    let err = inject(&c, leader, &admin, lose_all(other)).await;
    assert_eq!(err.map_err(|s| s.code()), Err(tonic::Code::InvalidArgument));
    let bad = pb::InjectNetworkFaultRequest {
        delay_min_ms: 50,
        delay_max_ms: 10,
        ..lose_all(leader)
    };
    let err = inject(&c, leader, &admin, bad).await;
    assert_eq!(err.map_err(|s| s.code()), Err(tonic::Code::InvalidArgument));
    let bad = pb::InjectNetworkFaultRequest {
        drop_per_mille: 1001,
        ..lose_all(leader)
    };
    let err = inject(&c, leader, &admin, bad).await;
    assert_eq!(err.map_err(|s| s.code()), Err(tonic::Code::InvalidArgument));

    // Every heartbeat and vote it sends is lost: the others elect one of themselves.
    inject(&c, leader, &admin, lose_all(leader))
        .await
        .expect("inject");
    c.wait_for(
        "another agent to lead",
        Duration::from_secs(30),
        |c| async move {
            c.status(other, true)
                .await
                .is_ok_and(|s| s.leader_id.is_some_and(|l| l != leader))
        },
    )
    .await;

    // Healed, a write through the old leader is acknowledged again.
    inject(
        &c,
        leader,
        &admin,
        pb::InjectNetworkFaultRequest {
            node_id: leader,
            ..Default::default()
        },
    )
    .await
    .expect("heal");
    let id = c
        .submit(leader, shell_job("after-heal", 0, "true"), "after-heal")
        .await
        .expect("submit through the old leader after the heal")
        .job_id;
    c.wait_job(id, Duration::from_secs(30), gpu_tests::is_terminal)
        .await;
    let outcomes = audit_outcomes(&c, leader).await;
    assert!(
        outcomes
            .iter()
            .any(|o| o.starts_with("raft transport faults"))
            && outcomes.iter().any(|o| o == "raft transport healed"),
        "{outcomes:?}"
    );
}
