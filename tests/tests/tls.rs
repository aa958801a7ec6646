//! Mutual TLS against real agents (the certificate checks of TESTING.md): only certificates of
//! the cluster's CA get in, each speaks only for itself, internal RPCs are for agents only,
//! revocation reaches every agent, enrolment needs a valid join token, and certificates rotate
//! before they expire without the mesh noticing.

use std::io::{Read, Write};
use std::time::{Duration, SystemTime};

use gpu_agent::tls::pki::{self, KeyedCert, Subject};
use gpu_proto::internal::v1::raft_peer_client::RaftPeerClient;
use gpu_proto::internal::v1::{RaftMessage, ReadIndexRequest};
use gpu_proto::v1 as pb;
use gpu_proto::v1::cluster_service_client::ClusterServiceClient;
use gpu_tests::{Bearer, Cluster, free_addr};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

const DAY: Duration = Duration::from_secs(86_400);

fn read(path: std::path::PathBuf) -> String {
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The cluster CA with its key (n1, the bootstrap voter, holds it).
fn cluster_ca(c: &Cluster) -> KeyedCert {
    let tls = c.root.path().join("node-1/tls");
    KeyedCert {
        cert_pem: read(tls.join("ca.crt")),
        key_pem: read(tls.join("ca.key")),
    }
}

async fn connect(
    c: &Cluster,
    id: u64,
    identity: Option<(String, String)>,
) -> Result<Channel, String> {
    c.endpoint(id, identity)
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))
}

/// `GetStatus` through agent `id` with the admin token, presenting `identity`.
async fn status_as(
    c: &Cluster,
    id: u64,
    identity: Option<(String, String)>,
) -> Result<pb::ClusterStatus, String> {
    let channel = connect(c, id, identity).await?;
    let bearer = Bearer::new(Some(&c.admin_token()));
    let mut client = ClusterServiceClient::new(InterceptedService::new(channel, bearer));
    client
        .get_status(pb::GetStatusRequest { stale: true })
        .await
        .map(tonic::Response::into_inner)
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
}

fn vote_from(node: u64) -> RaftMessage {
    // Term 0 is below every real vote: a message that gets through changes nothing.
    let json = format!(
        r#"{{"vote":{{"leader_id":{{"term":0,"node_id":{node}}},"committed":false}},"last_log_id":null}}"#
    );
    RaftMessage {
        json: json.into_bytes(),
        ..RaftMessage::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_cluster_certificates_get_in_and_each_speaks_only_for_itself() {
    let c = Cluster::start(3, 3, "").await;

    // A handshake that never starts is dropped after a deadline (checked at the end), and
    // does not hold anyone else up meanwhile.
    let silent = std::net::TcpStream::connect(c.addr(1)).expect("tcp");
    let silent = std::thread::spawn(move || {
        let started = std::time::Instant::now();
        let mut silent = silent;
        silent
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        let mut buf = Vec::new();
        let closed = silent.read_to_end(&mut buf).is_ok();
        (closed, started.elapsed())
    });

    // No client certificate: the handshake completes (enrolment needs that), every call is
    // refused.
    let err = status_as(&c, 1, None).await.expect_err("anonymous");
    assert!(err.starts_with("Unauthenticated"), "{err}");
    assert!(err.contains("client certificate is required"), "{err}");
    let mut raft = RaftPeerClient::new(connect(&c, 2, None).await.expect("anonymous tls"));
    let err = raft
        .read_index(ReadIndexRequest {})
        .await
        .expect_err("anonymous internal call");
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err}");

    // A client certificate works for the API but not for internal RPCs.
    status_as(&c, 1, Some(c.admin_identity()))
        .await
        .expect("the admin's client certificate");
    let mut raft = RaftPeerClient::new(
        connect(&c, 2, Some(c.admin_identity()))
            .await
            .expect("admin tls"),
    );
    let err = raft
        .read_index(ReadIndexRequest {})
        .await
        .expect_err("a client calling an internal RPC");
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
    assert!(
        err.message().contains("may not call internal RPCs"),
        "{err}"
    );

    // Node 2's certificate cannot send Raft messages as node 3; as itself, it reaches Raft.
    let mut as_n2 = RaftPeerClient::new(
        connect(&c, 1, Some(c.node_identity(2)))
            .await
            .expect("n2 tls"),
    );
    let err = as_n2
        .vote(vote_from(3))
        .await
        .expect_err("n2 speaking as n3");
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
    assert!(
        err.message().contains("node 2 may not speak as node 3"),
        "{err}"
    );
    as_n2
        .vote(vote_from(2))
        .await
        .expect("n2 speaking as itself is heard (and its stale vote refused by Raft)");

    // A certificate from another CA, and an expired one from ours: no handshake.
    let now = SystemTime::now();
    let foreign_ca = pki::new_ca(now, DAY).expect("foreign ca");
    let foreign =
        pki::issue(&foreign_ca, &Subject::Client("admin".into()), now, DAY).expect("cert");
    let err = status_as(&c, 1, Some((foreign.cert_pem, foreign.key_pem)))
        .await
        .expect_err("another CA");
    assert!(
        !err.starts_with("Unauthenticated: a client"),
        "refused at the handshake: {err}"
    );
    let expired = pki::issue(
        &cluster_ca(&c),
        &Subject::Client("old".into()),
        now - 3 * DAY,
        DAY,
    )
    .expect("expired cert");
    status_as(&c, 1, Some((expired.cert_pem, expired.key_pem)))
        .await
        .expect_err("expired certificate");

    // Plaintext gRPC and HTTP/1.1 to the TLS port get no answer.
    let plaintext = tonic::transport::Endpoint::from_shared(format!("http://{}", c.addr(1)))
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5));
    if let Ok(channel) = plaintext.connect().await {
        ClusterServiceClient::new(channel)
            .get_status(pb::GetStatusRequest { stale: true })
            .await
            .expect_err("plaintext gRPC to the TLS port");
    }
    let mut tcp = std::net::TcpStream::connect(c.addr(1)).expect("tcp");
    tcp.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: gpumesh\r\n\r\n")
        .expect("write");
    let mut answer = Vec::new();
    let _ = tcp.read_to_end(&mut answer);
    assert!(
        !String::from_utf8_lossy(&answer).contains("HTTP/1.1 200"),
        "HTTP/1.1 must not be served"
    );

    // Revocation: a certificate of the cluster works until revoked, then nowhere.
    let mallory = pki::issue(
        &cluster_ca(&c),
        &Subject::Client("mallory".into()),
        now,
        DAY,
    )
    .expect("cert");
    let serial = pki::inspect_pem(&mallory.cert_pem).expect("inspect").serial;
    let identity = (mallory.cert_pem.clone(), mallory.key_pem.clone());
    status_as(&c, 3, Some(identity.clone()))
        .await
        .expect("a valid certificate");
    let out = c
        .gpuctl()
        .args(["--endpoint", c.addr(2), "cert", "revoke", &serial])
        .args(["--reason", "laptop stolen", "-o", "json"])
        .output()
        .expect("gpuctl cert revoke");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for id in [1, 2, 3] {
        let identity = identity.clone();
        c.wait_for(
            "the revocation to reach every agent",
            Duration::from_secs(5),
            |c| {
                let identity = identity.clone();
                async move {
                    status_as(c, id, Some(identity))
                        .await
                        .is_err_and(|e| e.contains("is revoked"))
                }
            },
        )
        .await;
    }
    // gpuctl without a CA speaks plaintext: the error says what to set up.
    let out = c
        .gpuctl()
        .env_remove("GPUCTL_CA_FILE")
        .env_remove("GPUCTL_CERT_FILE")
        .env_remove("GPUCTL_KEY_FILE")
        .args(["--endpoint", c.addr(3), "cluster", "status"])
        .output()
        .expect("gpuctl without a CA");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("no CA configured") && err.contains("GPUCTL_CA_FILE"),
        "{err}"
    );
    assert!(!err.contains("error: error"), "{err}");
    let out = c
        .gpuctl()
        .args(["--endpoint", c.addr(3), "cert", "list", "-o", "json"])
        .output()
        .expect("gpuctl cert list");
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let listed = listed.as_array().expect("array");
    assert!(
        listed
            .iter()
            .any(|r| r["serial"] == serial && r["revoked"] == true),
        "{listed:?}"
    );
    for subject in ["node 2", "node 3", "client admin"] {
        assert!(
            listed.iter().any(|r| r["subject"] == subject),
            "{subject} issued and recorded: {listed:?}"
        );
    }

    let (closed, after) = silent.join().expect("silent client");
    assert!(
        closed && after < Duration::from_secs(20),
        "a silent connection is closed by the agent (after {after:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enrolment_needs_a_valid_join_token_and_the_ca() {
    let c = Cluster::start(1, 1, "").await;
    let root = c.root.path();
    let bad_token = root.join("bad.token");
    std::fs::write(&bad_token, format!("{}.{}", "x".repeat(8), "0".repeat(64))).expect("write");
    let viewer_token = root.join("viewer.token");
    let mut tokens = gpu_proto::v1::token_service_client::TokenServiceClient::new(
        c.channel(1).await.expect("channel"),
    );
    let viewer = tokens
        .create_token(pb::CreateTokenRequest {
            role: pb::Role::Viewer as i32,
            tenant: String::new(),
            description: "not a join token".into(),
            account: None,
            ..Default::default()
        })
        .await
        .expect("viewer")
        .into_inner()
        .bearer;
    std::fs::write(&viewer_token, viewer).expect("write");
    let readable_token = root.join("readable.token");
    std::fs::copy(root.join(gpu_tests::JOIN_TOKEN), &readable_token).expect("copy");
    for (path, mode) in [
        (&bad_token, 0o600),
        (&viewer_token, 0o600),
        (&readable_token, 0o644),
    ] {
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .expect("chmod");
    }
    let ca = root.join("ca.crt");
    let cases: [(&[&std::path::Path], &str); 4] = [
        (&[&ca, &bad_token], "invalid token"),
        (&[&ca, &viewer_token], "may not enrol an agent"),
        (&[&ca, &readable_token], "chmod 600"),
        (&[&ca], "joining needs a join token"),
    ];
    for (i, (files, why)) in cases.iter().enumerate() {
        let mut cmd = std::process::Command::new(gpu_tests::bin("gpu-agent"));
        cmd.args(["run", "--node-id", "9", "--gpu-backend", "sim", "--listen"])
            .arg(free_addr())
            .arg("--data-dir")
            .arg(root.join(format!("joiner-{i}")))
            .args(["--join", c.addr(1)])
            .arg("--ca-file")
            .arg(files[0]);
        if let Some(token) = files.get(1) {
            cmd.arg("--join-token-file").arg(token);
        }
        let out = cmd.output().expect("run a joiner");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{why}: {stderr}");
        assert!(stderr.contains(why), "expected {why:?} in: {stderr}");
    }
    let status = c.status(1, false).await.expect("status");
    assert_eq!(status.members.len(), 1, "nobody got in");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_refuses_key_files_others_can_read_or_that_do_not_match() {
    let mut c = Cluster::start(1, 1, "").await;
    c.kill(1);
    let tls = c.root.path().join("node-1/tls");
    let config = c.agents[&1].config.clone();
    let start = || {
        std::process::Command::new(gpu_tests::bin("gpu-agent"))
            .args(["run", "--config"])
            .arg(&config)
            .output()
            .expect("run the agent")
    };
    let chmod = |mode| {
        std::fs::set_permissions(
            tls.join("node.key"),
            std::os::unix::fs::PermissionsExt::from_mode(mode),
        )
        .expect("chmod")
    };
    chmod(0o644);
    let out = start();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("node.key") && stderr.contains("chmod 600"),
        "{stderr}"
    );

    chmod(0o600);
    let (other_key, _) = pki::new_request().expect("a key");
    std::fs::write(tls.join("node.key"), other_key).expect("replace the key");
    let out = start();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("does not belong to the node certificate"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_rotate_before_they_expire() {
    // Certificates live 12 s; agents renew with 4 s left.
    let mut c = Cluster::start(3, 3, "[tls]\ncert_validity = \"12s\"").await;
    let serial = |c: &Cluster, id: u64| {
        pki::inspect_pem(&c.node_identity(id).0)
            .expect("node cert")
            .serial
    };
    let first: Vec<String> = (1..=3).map(|id| serial(&c, id)).collect();
    tokio::time::sleep(Duration::from_secs(14)).await;
    let now: Vec<String> = (1..=3).map(|id| serial(&c, id)).collect();
    for (id, (a, b)) in (1..=3).zip(first.iter().zip(&now)) {
        assert_ne!(a, b, "n{id} renewed its certificate");
    }
    // Each renewal is in the audit log, in the renewing node's name.
    let audit = c
        .gpuctl()
        .args(["--endpoint", c.addr(1), "-o", "json", "audit", "list"])
        .output()
        .expect("gpuctl audit list");
    let entries: serde_json::Value =
        serde_json::from_slice(&audit.stdout).unwrap_or(serde_json::Value::Null);
    let renewed: std::collections::BTreeSet<&str> = entries
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["verb"] == "cert.renew" && e["outcome"] == "ok")
        .filter_map(|e| e["actor"].as_str())
        .collect();
    assert_eq!(
        renewed,
        ["node 1", "node 2", "node 3"].into_iter().collect(),
        "{entries}"
    );
    // Every first certificate has expired: a restarted agent must get back in on new
    // connections with its renewed one, and writes must flow.
    c.kill(3);
    c.start_agent(3);
    c.wait_serving().await;
    c.wait_for(
        "n3 to be a reachable voter again",
        Duration::from_secs(20),
        |c| async move {
            c.status(1, false).await.is_ok_and(|s| {
                s.members
                    .iter()
                    .any(|m| m.node_id == 3 && m.reachable == Some(true))
            })
        },
    )
    .await;
    c.submit(3, gpu_tests::shell_job("after-rotation", 0, "true"), "k")
        .await
        .expect("a write through the restarted agent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_holder_gets_a_client_certificate_of_their_own() {
    let c = Cluster::start(1, 1, "").await;
    let root = c.root.path();
    let mut tokens = gpu_proto::v1::token_service_client::TokenServiceClient::new(
        c.channel(1).await.expect("channel"),
    );
    let alice = tokens
        .create_token(pb::CreateTokenRequest {
            role: pb::Role::User as i32,
            tenant: "vision".into(),
            description: "alice".into(),
            account: None,
            ..Default::default()
        })
        .await
        .expect("user token")
        .into_inner();
    let token_file = root.join("alice.token");
    gpu_agent::tls::files::write_file(&token_file, &alice.bearer, 0o600).expect("token file");
    let alice_dir = root.join("alice");
    // gpuctl as a newcomer holding only the CA and a token (and, later, the certificate).
    let gpuctl = |token: &std::path::Path, cert: bool, args: &[&str]| {
        let mut cmd = std::process::Command::new(gpu_tests::bin("gpuctl"));
        cmd.env("GPUCTL_CONFIG", "/nonexistent/gpuctl.toml")
            .env("GPUCTL_CA_FILE", root.join("ca.crt"))
            .env("GPUCTL_TOKEN_FILE", token)
            .env_remove("GPUCTL_TOKEN")
            .env_remove("GPUCTL_CERT_FILE")
            .env_remove("GPUCTL_KEY_FILE")
            .args(["--endpoint", c.addr(1)]);
        if cert {
            cmd.env("GPUCTL_CERT_FILE", alice_dir.join("client.crt"))
                .env("GPUCTL_KEY_FILE", alice_dir.join("client.key"));
        }
        cmd.args(args).output().expect("run gpuctl")
    };
    let text = |out: &std::process::Output| String::from_utf8_lossy(&out.stderr).into_owned();

    let out = gpuctl(&token_file, false, &["job", "list"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "no certificate yet: {}",
        text(&out)
    );
    assert!(
        text(&out).contains("client certificate is required"),
        "{}",
        text(&out)
    );

    let out = gpuctl(
        &token_file,
        false,
        &[
            "cert",
            "request",
            "--out-dir",
            alice_dir.to_str().expect("utf-8"),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let key_mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(alice_dir.join("client.key"))
            .expect("key")
            .permissions(),
    );
    assert_eq!(key_mode & 0o777, 0o600);
    let subject = pki::inspect_pem(&read(alice_dir.join("client.crt")))
        .expect("certificate")
        .subject;
    assert_eq!(subject, Subject::Client(alice.token.expect("token").id));

    let out = gpuctl(&token_file, true, &["job", "list", "-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // A join token enrols agents and nothing else.
    let out = gpuctl(
        &root.join(gpu_tests::JOIN_TOKEN),
        false,
        &[
            "cert",
            "request",
            "--out-dir",
            root.join("x").to_str().expect("utf-8"),
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("may not get a client certificate"),
        "{}",
        text(&out)
    );
}
