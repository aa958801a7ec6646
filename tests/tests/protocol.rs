//! The internal protocol version on real agent connections: a peer speaking an incompatible
//! version is refused with both versions named and changes nothing; a build from before the
//! header (no header) and the current version are served; the mesh keeps working. Once every
//! member speaks protocol 16, an older agent asking to join is refused too.

use std::time::Duration;

use gpu_proto::internal::v1::raft_peer_client::RaftPeerClient;
use gpu_proto::internal::v1::{JoinRequest, LeaderStatusRequest};
use gpu_tests::Cluster;
use tonic::metadata::MetadataValue;

fn with_version<T>(msg: T, version: Option<&str>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    if let Some(v) = version {
        req.metadata_mut().insert(
            gpu_agent::raft::protocol::HEADER,
            MetadataValue::try_from(v).expect("ascii"),
        );
    }
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incompatible_peers_are_refused_and_the_mesh_keeps_working() {
    let c = Cluster::start(3, 3, "").await;
    // Speak as agent n3 (its own certificate), the way an upgraded n3 would.
    let tls = c.root.path().join("node-3/tls");
    let read = |n: &str| std::fs::read_to_string(tls.join(n)).expect("n3's tls material");
    let endpoint = c
        .endpoint(1, Some((read("node.crt"), read("node.key"))))
        .expect("endpoint");
    let mut peer = RaftPeerClient::new(endpoint.connect().await.expect("connect to n1"));

    let ours = gpu_agent::raft::protocol::PROTOCOL_VERSION;
    let newer = (ours + 1).to_string();
    let refused = peer
        .leader_status(with_version(LeaderStatusRequest {}, Some(&newer)))
        .await
        .expect_err("a newer protocol must be refused");
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    let msg = refused.message();
    assert!(
        msg.contains(&format!("caller speaks versions {newer}"))
            && msg.contains(&format!("this agent speaks 1..={ours}")),
        "the refusal must name both versions: {msg}"
    );

    // An incompatible agent asking to join is refused before anything is proposed.
    let join = peer
        .join(with_version(
            JoinRequest {
                node_id: 4,
                addr: "127.0.0.1:9".into(),
                edge: false,
            },
            Some("99"),
        ))
        .await
        .expect_err("join refused");
    assert_eq!(join.code(), tonic::Code::FailedPrecondition, "{join:?}");
    assert!(join.message().contains("versions 99"), "{}", join.message());

    // Once every member speaks this version, an agent of 15 or older asking to join (n3, as an
    // older build of itself) is refused: it could not read the snapshots it would be sent.
    c.wait_for(
        "every member registered with this version",
        Duration::from_secs(20),
        |c| async move {
            let (_, members, _) = c.gpuctl_json(1, &["cluster", "members"]);
            (members.as_array()).is_some_and(|m| {
                m.len() == 3
                    && m.iter()
                        .all(|n| n["protocol"].as_u64() == Some(u64::from(ours)))
            })
        },
    )
    .await;
    let older = peer
        .join(with_version(
            JoinRequest {
                node_id: 3,
                addr: c.addr(3).to_owned(),
                edge: false,
            },
            Some("15"),
        ))
        .await
        .expect_err("an older joiner is refused");
    assert_eq!(older.code(), tonic::Code::FailedPrecondition, "{older:?}");
    assert!(older.message().contains("speaks 15"), "{}", older.message());
    let status = c.status(1, false).await.expect("status");
    assert_eq!(
        status.members.len(),
        3,
        "the refused join changed membership"
    );

    // Served: the current version, and no header at all (a build from before it).
    for version in [Some(ours.to_string()), None] {
        peer.leader_status(with_version(LeaderStatusRequest {}, version.as_deref()))
            .await
            .unwrap_or_else(|e| panic!("version {version:?} refused: {e}"));
    }
    // The mesh keeps working: writes through every agent.
    for via in 1..=3 {
        c.label(via, 1, "after", &via.to_string())
            .await
            .unwrap_or_else(|e| panic!("write via n{via}: {e}\n{}", c.logs()));
    }
}

/// Every service the agent serves is registered through one router that also marks it serving
/// in gRPC health: each of them answers SERVING, Token, Audit and Cert included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_health_lists_every_service() {
    use gpu_proto::{internal::v1 as internal, v1};
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

    let c = Cluster::start(1, 1, "").await;
    let channel = c
        .endpoint(1, Some(c.admin_identity()))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect to n1");
    let mut health = HealthClient::new(channel);
    for service in [
        v1::cluster_service_server::SERVICE_NAME,
        v1::node_service_server::SERVICE_NAME,
        v1::gpu_service_server::SERVICE_NAME,
        v1::job_service_server::SERVICE_NAME,
        v1::scheduler_service_server::SERVICE_NAME,
        v1::alert_service_server::SERVICE_NAME,
        v1::tenant_service_server::SERVICE_NAME,
        v1::token_service_server::SERVICE_NAME,
        v1::audit_service_server::SERVICE_NAME,
        v1::cert_service_server::SERVICE_NAME,
        internal::raft_peer_server::SERVICE_NAME,
    ] {
        let answer = health
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .unwrap_or_else(|e| panic!("health of {service}: {e}"))
            .into_inner();
        assert_eq!(answer.status(), ServingStatus::Serving, "{service}");
    }
}
