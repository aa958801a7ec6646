//! Hostile peers and clients against real agents ([trust]): what a stolen credential or a
//! compromised host must not be able to do.
//! - A learner's certificate forwarding a write to the leader (`RaftPeer.Propose`) cannot mint
//!   a token without a caller, under a forged actor, or with a caller's credential that lacks
//!   the right; nor speak for another node. Its own reports still go through.
//! - A member's certificate cannot re-point another member's address through `Join`.
//! - A flood of requests without credentials writes nothing to the replicated log, and the
//!   refusing agent logs it at a bounded rate.
//! - A user token's job without a tenant is the token's tenant's, and its priority stays under
//!   its tenant's ceiling (no job anywhere above the priority range). A tenant's pending jobs
//!   stop at its cap, and its tokens together share one request rate (minting more buys none).
//! - An oversized submission (each field within its own limit, the whole above what one
//!   request may put in the log) and names with control characters are refused with the
//!   reason, and replication carries on.
//! - Idle connections from one address cannot take the handshake permits everyone else needs.
//! - Revoking the certificate a voter uses now (with nothing newer to replace it) is refused:
//!   two such revocations would lock a three-voter cluster out.
//! - A revoked host stops receiving the replicated state: agents check the certificates of the
//!   peers they dial against the revocation list, and dial every peer again after one.
//! - The CA key never goes over the wire to a joining agent: only voters hold it (a new voter
//!   fetches it from another), a learner's certificate cannot fetch it, and enrolment through
//!   a learner is passed on to the leader.
//! - A join token works once by default, until it expires, and only for the node ids it
//!   names; no token mints a certificate for a node that is already a member unless it is
//!   bound to exactly that id. A node a token bound to a learner seat enrolled never becomes
//!   a voter, not even for a free seat.

use std::collections::BTreeMap;

use std::time::Duration;

use gpu_proto::internal::v1::raft_peer_client::RaftPeerClient;
use gpu_proto::internal::v1::{
    FetchSigningKeyRequest, IssueCertificateRequest, JoinRequest, RaftMessage,
};
use gpu_proto::v1 as pb;
use gpu_proto::v1::token_service_client::TokenServiceClient;
use gpu_raft_store::{Command, Inventory, RequestMeta, Role, TokenRecord};
use gpu_tests::Cluster;
use serde_json::json;
use tonic::transport::Channel;

/// The internal API of agent `to`, as agent `from` (its certificate).
async fn as_node(c: &Cluster, from: u64, to: u64) -> RaftPeerClient<Channel> {
    let channel = c
        .endpoint(to, Some(c.node_identity(from)))
        .expect("endpoint")
        .connect()
        .await
        .expect("node tls");
    RaftPeerClient::new(channel)
}

/// An admin token record the attacker would like to exist.
fn forged_admin() -> Command {
    Command::CreateToken {
        token: TokenRecord {
            id: "forged".into(),
            secret_sha256: "ab".repeat(32),
            role: Role::Admin,
            tenant: None,
            description: String::new(),
            created_at_ms: 1,
            created_by: "system:bootstrap".into(),
            revoked: false,
            account: None,
            limits: Default::default(),
        },
    }
}

fn meta(actor: &str) -> RequestMeta {
    RequestMeta {
        actor: actor.into(),
        verb: "token.create".into(),
        object: "token/forged".into(),
        request_id: "r".into(),
        source: "127.0.0.1:1".into(),
    }
}

/// `Propose` of `proposal` at the leader n1, as n2, in JSON and in MessagePack: the refusal's
/// message, the same in both.
async fn propose_refused(c: &Cluster, proposal: serde_json::Value) -> String {
    let mut n2 = as_node(c, 2, 1).await;
    let json = RaftMessage {
        json: serde_json::to_vec(&proposal).expect("json"),
        ..RaftMessage::default()
    };
    let packed = RaftMessage {
        packed: gpu_raft_store::codec::to_vec(&proposal).expect("MessagePack"),
        ..RaftMessage::default()
    };
    let mut why = Vec::new();
    for msg in [json, packed] {
        let err = (n2.propose(msg).await).expect_err("the leader refuses the forwarded write");
        assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
        why.push(err.message().to_owned());
    }
    assert_eq!(why[0], why[1], "refused alike in both encodings");
    why.swap_remove(0)
}

async fn token_ids(c: &Cluster) -> Vec<String> {
    let mut tokens = TokenServiceClient::new(c.channel(1).await.expect("channel"));
    let list = tokens
        .list_tokens(pb::ListTokensRequest {})
        .await
        .expect("token list")
        .into_inner();
    list.tokens.into_iter().map(|t| t.id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_cannot_forge_a_caller_through_propose() {
    // One voter (n1, the leader); n2 and n3 are learners, whose own reports (registration)
    // reached the leader through Propose for the cluster to form at all.
    let c = Cluster::start(3, 1, "").await;
    c.wait_for(
        "every learner to register itself",
        Duration::from_secs(20),
        |c| async move { c.node(1, 2, false).await.is_ok() && c.node(1, 3, false).await.is_ok() },
    )
    .await;
    let admin = c.admin_token();
    let admin_id = admin.split_once('.').expect("id.secret").0;
    let mut tokens = TokenServiceClient::new(c.channel(1).await.expect("channel"));
    let user = tokens
        .create_token(pb::CreateTokenRequest {
            role: pb::Role::User as i32,
            tenant: "default".into(),
            description: "a user".into(),
            account: None,
            ..Default::default()
        })
        .await
        .expect("a user token")
        .into_inner()
        .bearer;

    // No caller: only the node's own reports.
    let why = propose_refused(&c, json!({ "cmd": forged_admin() })).await;
    assert!(why.contains("only its own reports"), "{why}");
    // The admin's name as actor, without the admin's credential.
    let why = propose_refused(&c, json!({ "cmd": forged_admin(), "meta": meta(admin_id) })).await;
    assert!(why.contains("must carry the caller's credential"), "{why}");
    // A real caller's credential that lacks the right: the leader checks it again.
    let why = propose_refused(
        &c,
        json!({ "cmd": forged_admin(), "meta": meta(admin_id), "credential": user }),
    )
    .await;
    assert!(why.contains("may not manage tokens"), "{why}");
    // Speaking for another node.
    let register_n3 = Command::RegisterNode {
        node: 3,
        addr: "203.0.113.9:1".into(),
        labels: BTreeMap::new(),
        inventory: Inventory::default(),
        edge: None,
        protocol: 1,
    };
    let why = propose_refused(&c, json!({ "cmd": register_n3 })).await;
    assert!(why.contains("only its own reports"), "{why}");

    assert!(
        !token_ids(&c).await.iter().any(|id| id == "forged"),
        "no forged token was minted"
    );
    let n3 = c.node(1, 3, false).await.expect("n3");
    assert_eq!(n3.addr, c.addr(3), "n3's record is its own");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cannot_re_point_another_members_address() {
    let c = Cluster::start(3, 3, "").await;
    let mut n2 = as_node(&c, 2, 1).await;
    let err = n2
        .join(JoinRequest {
            node_id: 3,
            addr: "203.0.113.9:7000".into(),
            edge: false,
        })
        .await
        .expect_err("n2 re-pointing n3");
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
    assert!(err.message().contains("only node 3"), "{err}");
    let status = c.status(1, false).await.expect("status");
    let n3 = status
        .members
        .iter()
        .find(|m| m.node_id == 3)
        .expect("n3 is a member");
    assert_eq!(n3.addr, c.addr(3), "n3's address is unchanged");
}

/// A join token minted by the admin with these terms.
async fn join_token(c: &Cluster, ttl_s: Option<u64>, uses: Option<u32>, ids: (u64, u64)) -> String {
    let mut tokens = TokenServiceClient::new(c.channel(1).await.expect("channel"));
    tokens
        .create_token(pb::CreateTokenRequest {
            role: pb::Role::Node as i32,
            description: "hostile test".into(),
            ttl_s,
            uses,
            node_id_first: ids.0,
            node_id_last: ids.1,
            ..Default::default()
        })
        .await
        .expect("a join token")
        .into_inner()
        .bearer
}

/// Enrol as `node` through n1 with `bearer`, the way a joining agent does (no client
/// certificate; its own key): the certificate, or the refusal's message.
async fn enrol(c: &Cluster, node: u64, bearer: &str) -> Result<String, String> {
    enrol_via(c, 1, node, bearer).await.map(|r| r.cert_pem)
}

/// `enrol` through agent `via`: the whole answer.
async fn enrol_via(
    c: &Cluster,
    via: u64,
    node: u64,
    bearer: &str,
) -> Result<gpu_proto::internal::v1::IssueCertificateResponse, String> {
    let channel = c
        .endpoint(via, None)
        .expect("endpoint")
        .connect()
        .await
        .expect("tls");
    let mut peer = RaftPeerClient::new(channel);
    let (_key, csr_pem) = gpu_agent::tls::pki::new_request().expect("csr");
    let mut req = tonic::Request::new(IssueCertificateRequest {
        node_id: node,
        csr_pem,
    });
    let header = format!("Bearer {bearer}").parse().expect("header");
    req.metadata_mut().insert("authorization", header);
    peer.issue_certificate(req)
        .await
        .map(tonic::Response::into_inner)
        .map_err(|s| s.message().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_tokens_expire_are_used_once_and_enrol_only_their_nodes() {
    let c = Cluster::start(2, 1, "").await;

    // Once by default: the second enrolment with the same token is refused.
    let once = join_token(&c, None, None, (0, 0)).await;
    enrol(&c, 7, &once).await.expect("the first use");
    let why = enrol(&c, 8, &once).await.expect_err("a second use");
    assert!(why.contains("used up"), "{why}");

    // Until it expires.
    let short = join_token(&c, Some(1), Some(5), (0, 0)).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let why = enrol(&c, 9, &short).await.expect_err("expired");
    assert!(why.contains("expired"), "{why}");

    // Only the node ids it names.
    let ranged = join_token(&c, None, Some(5), (10, 12)).await;
    let why = enrol(&c, 13, &ranged).await.expect_err("outside its ids");
    assert!(why.contains("10..=12"), "{why}");
    enrol(&c, 11, &ranged).await.expect("inside its ids");

    // An existing member's id: not with a token for any id, only with one bound
    // to exactly that id (an operator re-enrolling a host that lost its data).
    let any = join_token(&c, None, Some(5), (0, 0)).await;
    let why = enrol(&c, 2, &any).await.expect_err("a member's id");
    assert!(why.contains("already a member"), "{why}");
    let bound = join_token(&c, None, None, (2, 2)).await;
    enrol(&c, 2, &bound).await.expect("bound to exactly n2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ca_key_stays_with_the_voters() {
    // Three voters (n1 and two of the joiners) and a learner.
    let c = Cluster::start(4, 3, "").await;
    let voters = gpu_tests::voters(&c.status(1, false).await.expect("status"));
    let learner = (1..=4)
        .find(|id| !voters.contains(id))
        .expect("one learner");
    let has_key = |id: u64| c.root.path().join(format!("node-{id}/tls/ca.key")).exists();
    // The joined voters fetch the key from n1 (within the keeper's interval).
    c.wait_for(
        "every voter to hold the CA key",
        Duration::from_secs(20),
        |_| {
            let all = voters.iter().all(|v| has_key(*v));
            async move { all }
        },
    )
    .await;
    assert!(!has_key(learner), "a learner never holds the CA key");

    // Enrolment answers never carry it, also through a learner (passed on to the leader).
    let token = join_token(&c, None, Some(2), (0, 0)).await;
    for (via, node) in [(1, 20), (learner, 21)] {
        let answer = enrol_via(&c, via, node, &token)
            .await
            .unwrap_or_else(|e| panic!("enrolling n{node} through n{via}: {e}"));
        assert!(answer.cert_pem.contains("BEGIN CERTIFICATE"));
        assert!(
            answer.ca_key_pem.is_empty(),
            "via n{via}: the CA key went over the wire"
        );
    }

    // A learner's certificate cannot fetch it; a voter's can.
    let err = as_node(&c, learner, 1)
        .await
        .fetch_signing_key(FetchSigningKeyRequest {})
        .await
        .expect_err("a learner fetching the key");
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
    let voter = voters
        .iter()
        .copied()
        .find(|v| *v != 1)
        .expect("a joined voter");
    as_node(&c, voter, 1)
        .await
        .fetch_signing_key(FetchSigningKeyRequest {})
        .await
        .expect("a voter fetching the key");
}

async fn audit_len(c: &Cluster) -> usize {
    let mut audit = gpu_proto::v1::audit_service_client::AuditServiceClient::new(
        c.channel(1).await.expect("channel"),
    );
    audit
        .list_audit(pb::ListAuditRequest { after: 0, limit: 0 })
        .await
        .expect("audit")
        .into_inner()
        .entries
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unauthenticated_flood_reaches_neither_the_replicated_log_nor_floods_the_agents() {
    let c = Cluster::start(1, 1, "[api]\nrequests_per_second = 20\nburst = 20").await;
    let before = audit_len(&c).await;
    let index_before = c.state_digest(1).await.expect("digest").applied_index;
    let nodes = gpu_proto::v1::node_service_client::NodeServiceClient::new(
        c.channel_as(1, None).await.expect("an anonymous channel"),
    );
    let calls = (0..300).map(|_| {
        let mut nodes = nodes.clone();
        async move { nodes.list_nodes(pb::ListNodesRequest { stale: true }).await }
    });
    let refused = futures::future::join_all(calls)
        .await
        .into_iter()
        .filter(|r| {
            r.as_ref()
                .is_err_and(|e| e.code() == tonic::Code::Unauthenticated)
        })
        .count();
    assert_eq!(refused, 300);
    assert_eq!(
        audit_len(&c).await,
        before,
        "no audit entry for anonymous refusals"
    );
    let index_after = c.state_digest(1).await.expect("digest").applied_index;
    assert!(
        index_after < index_before + 20,
        "the flood wrote to the replicated log: {index_before} -> {index_after}"
    );
    let log = c.log_of(1);
    let lines = log.matches("refused an unauthenticated request").count();
    assert!(
        (1..=40).contains(&lines),
        "{lines} log lines for 300 refusals"
    );
    assert!(log.contains("not logged until its rate drops"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_tokens_job_without_a_tenant_is_its_tenants() {
    let c = Cluster::start(1, 1, "").await;
    let mut tokens = TokenServiceClient::new(c.channel(1).await.expect("channel"));
    let user = tokens
        .create_token(pb::CreateTokenRequest {
            role: pb::Role::User as i32,
            tenant: "vision".into(),
            ..Default::default()
        })
        .await
        .expect("a user of vision")
        .into_inner()
        .bearer;
    let mut jobs = gpu_proto::v1::job_service_client::JobServiceClient::new(
        c.channel_as(1, Some(&user)).await.expect("channel"),
    );
    let spec = gpu_tests::shell_job("mine", 0, "true");
    assert!(spec.tenant.is_empty() || spec.tenant == "default");
    let job = jobs
        .submit_job(pb::SubmitJobRequest {
            spec: Some(pb::JobSpec {
                tenant: String::new(),
                ..spec
            }),
            ..Default::default()
        })
        .await
        .expect("submitted without naming a tenant")
        .into_inner();
    let got = c.job(1, job.job_id).await.expect("job get");
    assert_eq!(got.spec.expect("spec").tenant, "vision");

    // Its priority stays under its tenant's ceiling (the default priority, 0, until an admin
    // raises it), and nobody's goes past the range.
    let at = |priority| pb::SubmitJobRequest {
        spec: Some(pb::JobSpec {
            priority: Some(priority),
            ..gpu_tests::shell_job("urgent", 0, "true")
        }),
        ..Default::default()
    };
    let err = jobs
        .submit_job(at(i32::MAX))
        .await
        .expect_err("above everyone");
    assert!(err.message().contains("priority must be"), "{err}");
    let err = jobs
        .submit_job(at(50))
        .await
        .expect_err("above its ceiling");
    assert!(err.message().contains("ceiling 0"), "{err}");
    let mut tenants = gpu_proto::v1::tenant_service_client::TenantServiceClient::new(
        c.channel(1).await.expect("channel"),
    );
    tenants
        .create_tenant(pb::CreateTenantRequest {
            name: "vision".into(),
            max_priority: Some(50),
            ..Default::default()
        })
        .await
        .expect("an admin raises the ceiling");
    jobs.submit_job(at(50)).await.expect("at its ceiling");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_and_control_character_submissions_are_refused_and_replication_carries_on() {
    let c = Cluster::start(3, 3, "").await;
    let mut jobs = gpu_proto::v1::job_service_client::JobServiceClient::new(
        c.channel(2).await.expect("channel"),
    );
    let big = "x".repeat(200 * 1024);
    let oversized = pb::JobSpec {
        command: vec!["echo".into(), big.clone()],
        env: [("BIG".to_owned(), big)].into_iter().collect(),
        ..gpu_tests::shell_job("big", 0, "true")
    };
    let err = jobs
        .submit_job(pb::SubmitJobRequest {
            spec: Some(oversized),
            ..Default::default()
        })
        .await
        .expect_err("above one request's share of the log");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
    assert!(err.message().contains("bytes encoded"), "{err}");
    let err = jobs
        .submit_job(pb::SubmitJobRequest {
            spec: Some(gpu_tests::shell_job("\u{1b}[2Jclear", 0, "true")),
            ..Default::default()
        })
        .await
        .expect_err("a control character in a name");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
    // Replication carries on: a normal submission commits and every replica applies it.
    let job = jobs
        .submit_job(pb::SubmitJobRequest {
            spec: Some(gpu_tests::shell_job("small", 0, "true")),
            ..Default::default()
        })
        .await
        .expect("a normal submission")
        .into_inner();
    for id in 1..=3 {
        c.wait_for(
            "every replica to apply it",
            Duration::from_secs(20),
            |c| async move { c.job(id, job.job_id).await.is_ok() },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_from_one_address_do_not_lock_others_out() {
    let c = Cluster::start(1, 1, "").await;
    let target: std::net::SocketAddr = c.addr(1).parse().expect("an address");
    // 300 connections from 127.0.0.2 that never start a handshake (more than every permit).
    let mut idle = Vec::new();
    for _ in 0..300 {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind("127.0.0.2:0".parse().expect("address"))
            .expect("bind 127.0.0.2");
        if let Ok(s) = socket.connect(target).await {
            idle.push(s);
        }
    }
    assert!(idle.len() >= 256, "{} idle connections", idle.len());
    // A client from another address gets in without waiting for the idle ones to time out
    // (locked out, it is served only once they do: after the handshake timeout, 10 s before).
    let started = std::time::Instant::now();
    c.status(1, true)
        .await
        .expect("a client from 127.0.0.1 is served");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "served only after {:?}: locked out until the idle handshakes timed out",
        started.elapsed()
    );
    drop(idle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_a_voters_current_certificate_is_refused() {
    let c = Cluster::start(3, 3, "").await;
    let (cert_pem, _) = c.node_identity(2);
    let serial = gpu_agent::tls::pki::inspect_pem(&cert_pem)
        .expect("n2's certificate")
        .serial;
    let out = c
        .gpuctl()
        .args(["--endpoint", c.addr(1), "cert", "revoke", &serial])
        .output()
        .expect("gpuctl cert revoke");
    assert!(!out.status.success(), "revoking n2's current certificate");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("renew first"), "{err}");
    // n2 still speaks for itself.
    as_node(&c, 2, 1)
        .await
        .read_index(gpu_proto::internal::v1::ReadIndexRequest {})
        .await
        .expect("n2 is not locked out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_host_stops_receiving_the_replicated_state() {
    // Three voters and a learner: the learner's certificate may be revoked (no lock-out).
    let c = Cluster::start(4, 3, "").await;
    let voters = gpu_tests::voters(&c.status(1, false).await.expect("status"));
    let learner = (1..=4).find(|id| !voters.contains(id)).expect("a learner");
    let (cert_pem, _) = c.node_identity(learner);
    let serial = gpu_agent::tls::pki::inspect_pem(&cert_pem)
        .expect("the learner's certificate")
        .serial;
    let out = c
        .gpuctl()
        .args(["--endpoint", c.addr(1), "cert", "revoke", &serial])
        .output()
        .expect("gpuctl cert revoke");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Once every agent has seen the revocation and dialled its peers again (keeper: 2 s).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let applied = |s: pb::ClusterStatus| s.applied_index;
    let before = applied(c.status(learner, true).await.expect("the learner answers"));
    for i in 0..5 {
        c.label(1, 1, &format!("after-revocation-{i}"), "x")
            .await
            .expect("the cluster writes on");
    }
    let leader_at = applied(c.status(1, false).await.expect("status"));
    assert!(leader_at > before + 4, "{leader_at} vs {before}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let learner_at = applied(c.status(learner, true).await.expect("the learner answers"));
    assert!(
        learner_at < leader_at,
        "the revoked learner still received the log: it applied {learner_at}, the leader {leader_at}"
    );
    assert!(
        c.logs().contains("Revoked"),
        "the leader says why it no longer reaches the learner"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_token_for_a_learner_seat_never_makes_a_voter() {
    let mut c = Cluster::start(1, 3, "").await;
    let mut tokens = TokenServiceClient::new(c.channel(1).await.expect("channel"));
    let bearer = tokens
        .create_token(pb::CreateTokenRequest {
            role: pb::Role::Node as i32,
            description: "learners".into(),
            seat: "learner".into(),
            ..Default::default()
        })
        .await
        .expect("a learner join token")
        .into_inner()
        .bearer;
    let file = c.root.path().join("learner.token");
    gpu_agent::tls::files::write_file(&file, &bearer, 0o600).expect("token file");
    // n2 enrols with it while two voter seats are free; n3 with an unbound token.
    c.add_agent(2, &file);
    c.wait_for("n2 to join", Duration::from_secs(60), |c| async move {
        c.status(1, false)
            .await
            .is_ok_and(|s| s.members.iter().any(|m| m.node_id == 2))
    })
    .await;
    let unbound = c.root.path().join(gpu_tests::JOIN_TOKEN);
    c.add_agent(3, &unbound);
    c.wait_for(
        "n3 to become a voter",
        Duration::from_secs(60),
        |c| async move {
            c.status(1, false)
                .await
                .is_ok_and(|s| gpu_tests::voters(&s).contains(&3))
        },
    )
    .await;
    // Autopilot rounds come and go (every 0.5 s): the free seat stays free.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let status = c.status(1, false).await.expect("status");
    assert_eq!(gpu_tests::voters(&status), [1, 3], "{status:?}");
    assert!(
        status.members.iter().any(|m| m.node_id == 2),
        "n2 is still a member"
    );
    let listed = tokens
        .list_tokens(pb::ListTokensRequest {})
        .await
        .expect("list")
        .into_inner()
        .tokens;
    assert!(
        listed
            .iter()
            .any(|t| t.description == "learners" && t.seat == "learner"),
        "{listed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_is_capped_in_pending_jobs_and_in_rate_across_its_tokens() {
    let c = Cluster::start(
        1,
        1,
        "[api]\nrequests_per_second = 1000\nburst = 1000\ntenant_requests_per_second = 5",
    )
    .await;
    let mut tenants = gpu_proto::v1::tenant_service_client::TenantServiceClient::new(
        c.channel(1).await.expect("channel"),
    );
    tenants
        .create_tenant(pb::CreateTenantRequest {
            name: "vision".into(),
            max_pending_jobs: Some(2),
            ..Default::default()
        })
        .await
        .expect("a tenant with a cap");
    let mut tokens = TokenServiceClient::new(c.channel(1).await.expect("channel"));
    let mut users = Vec::new();
    for _ in 0..3 {
        let bearer = tokens
            .create_token(pb::CreateTokenRequest {
                role: pb::Role::User as i32,
                tenant: "vision".into(),
                ..Default::default()
            })
            .await
            .expect("a user of vision")
            .into_inner()
            .bearer;
        users.push(gpu_proto::v1::job_service_client::JobServiceClient::new(
            c.channel_as(1, Some(&bearer)).await.expect("channel"),
        ));
    }
    // Never placeable (no node has 64 GPUs): they stay pending.
    let waiting = || pb::SubmitJobRequest {
        spec: Some(gpu_tests::shell_job("waits", 64, "true")),
        ..Default::default()
    };
    for user in &mut users[..2] {
        user.submit_job(waiting()).await.expect("under the cap");
    }
    let err = users[2]
        .submit_job(waiting())
        .await
        .expect_err("at the cap");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
    assert!(
        err.message().contains("already has 2 jobs pending"),
        "{err}"
    );

    // Five requests a second for the whole tenant (bursts of ten), whichever token sends them.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (mut refused, start) = (Vec::new(), std::time::Instant::now());
    for i in 0..30 {
        let list = users[i % 3].list_jobs(pb::ListJobsRequest::default()).await;
        if let Err(e) = list {
            refused.push(e);
        }
    }
    // At most the burst plus what refilled meanwhile got through (whatever this machine's pace).
    let allowed = (30 - refused.len()) as f64;
    let bound = 10.0 + 5.0 * start.elapsed().as_secs_f64() + 1.0;
    assert!(
        !refused.is_empty() && allowed <= bound,
        "{allowed} of 30 allowed, at most {bound} may be"
    );
    for e in &refused {
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
        assert!(e.message().contains("tenant vision"), "{e}");
    }
    // Another caller is not held back by vision's flood.
    c.list_jobs(1).await.expect("the admin is served");
}
