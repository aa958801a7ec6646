//! Rotating the cluster CA with real agents, by the steps docs/operations.md gives: introduce a
//! new CA (every agent trusts both, voters open its sealed key, learners never hold it), switch
//! (agents renew at once, registry logins are sealed again), retire the old one once nothing in
//! use chains to it. A job runs through all of it, the old admin certificate is refused at the
//! end, a restarted agent and a new one join under the new CA, and the audit chain still
//! verifies across both CAs' signed heads.

use std::path::Path;
use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_proto::v1::cert_service_client::CertServiceClient;
use gpu_tests::{Cluster, shell_job};
use serde_json::Value;

fn gpuctl(c: &Cluster, via: u64, args: &[&str]) -> (Option<i32>, Value, String) {
    c.gpuctl_json(via, args)
}

fn ok(c: &Cluster, via: u64, args: &[&str]) -> Value {
    let (code, v, err) = gpuctl(c, via, args);
    assert_eq!(code, Some(0), "gpuctl {args:?}: {err}\n{}", c.logs());
    v
}

fn refused(c: &Cluster, via: u64, args: &[&str]) -> String {
    let (code, _, err) = gpuctl(c, via, args);
    assert_eq!(code, Some(2), "gpuctl {args:?} should be refused: {err}");
    err
}

async fn ca_status(c: &Cluster, via: u64) -> Option<pb::CaStatus> {
    let mut certs = CertServiceClient::new(c.channel(via).await.ok()?);
    let reply = certs.get_ca_status(pb::GetCaStatusRequest {}).await.ok()?;
    Some(reply.into_inner())
}

/// What the guide's step 2 and 6 do: the trust bundle into the CA file the tools use.
fn export_bundle(c: &Cluster) {
    let file = c.root.path().join("ca.crt");
    ok(
        c,
        1,
        &["cert", "ca", "bundle", "--out", &file.to_string_lossy()],
    );
}

fn certs_in(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .matches("BEGIN CERTIFICATE")
        .count()
}

fn tls_file(c: &Cluster, id: u64, name: &str) -> std::path::PathBuf {
    c.root.path().join(format!("node-{id}/tls/{name}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_ca_is_rotated_without_losing_a_job_or_a_member() {
    // Three voters and a learner.
    let mut c = Cluster::start(4, 3, "").await;
    let root = c.root.path().to_owned();
    ok(&c, 1, &["tenant", "create", "ct"]);
    let password = root.join("password");
    std::fs::write(&password, "s3cret\n").expect("password file");
    let password = password.to_string_lossy().into_owned();
    ok(
        &c,
        1,
        &[
            "tenant",
            "set-registry-credential",
            "ct",
            "registry.example:5000",
            "--username",
            "robot",
            "--password-file",
            &password,
        ],
    );
    let long = c
        .submit(2, shell_job("through-the-rotation", 1, "sleep 25"), "long")
        .await
        .expect("submit")
        .job_id;

    let voters = gpu_tests::voters(&c.status(1, false).await.expect("status"));
    let learner = (1..=4).find(|id| !voters.contains(id)).expect("a learner");
    let err = refused(&c, 1, &["cert", "ca", "switch"]);
    assert!(err.contains("no CA is introduced"), "{err}");
    let err = refused(&c, learner, &["cert", "ca", "introduce"]);
    assert!(err.contains("holds no CA key"), "a learner cannot: {err}");

    // 1. Introduce: everyone trusts both CAs; voters, and only voters, hold the new key.
    let introduced = ok(&c, 1, &["cert", "ca", "introduce"]);
    let roles: Vec<&str> = introduced["cas"]
        .as_array()
        .expect("cas")
        .iter()
        .filter_map(|ca| ca["role"].as_str())
        .collect();
    assert_eq!(roles.len(), 2, "{introduced}");
    assert!(roles.contains(&"signing") && roles.contains(&"introduced"));
    c.wait_for(
        "every member to install the new CA",
        Duration::from_secs(30),
        |c| async move {
            ca_status(c, 1)
                .await
                .is_some_and(|s| s.not_installed.is_empty())
        },
    )
    .await;
    c.wait_for(
        "the voters to open the new CA's key",
        Duration::from_secs(30),
        |c| {
            let voters = voters.clone();
            async move {
                voters
                    .iter()
                    .all(|id| tls_file(c, *id, "ca.next.key").exists())
            }
        },
    )
    .await;
    for id in 1..=4 {
        assert_eq!(
            certs_in(&tls_file(&c, id, "ca.crt")),
            2,
            "n{id} trusts both"
        );
    }
    assert!(
        !tls_file(&c, learner, "ca.key").exists() && !tls_file(&c, learner, "ca.next.key").exists(),
        "a learner holds no CA key"
    );
    export_bundle(&c);
    assert_eq!(certs_in(&root.join("ca.crt")), 2);

    // 2. Switch: every agent renews under the new CA; only the admin's certificate is old.
    // Through a follower voter: the leader checks the caller's credential again.
    let follower = *voters.iter().find(|id| **id != 1).expect("a follower");
    ok(&c, follower, &["cert", "ca", "switch"]);
    c.wait_for(
        "every agent to renew under the new CA",
        Duration::from_secs(60),
        |c| async move {
            ca_status(c, 1).await.is_some_and(|s| {
                s.old_certificates.len() == 1 && s.old_certificates[0].starts_with("client admin")
            })
        },
    )
    .await;
    let err = refused(&c, 1, &["cert", "ca", "retire"]);
    assert!(err.contains("client admin ("), "{err}");

    // The admin gets a certificate of the new CA...
    let old_admin = c.admin_identity();
    let fresh = root.join("fresh-admin");
    ok(
        &c,
        1,
        &["cert", "request", "--out-dir", &fresh.to_string_lossy()],
    );
    std::fs::copy(fresh.join("client.crt"), root.join("admin.crt")).expect("cp crt");
    std::fs::copy(fresh.join("client.key"), root.join("admin.key")).expect("cp key");
    // ...and revokes the old one, which the retire would otherwise wait for.
    let status = ok(&c, 1, &["cert", "ca", "status"]);
    let old = status["old_certificates"][0]
        .as_str()
        .expect("the old admin certificate");
    let serial = old
        .split_once('(')
        .and_then(|(_, rest)| rest.strip_suffix(')'))
        .expect("subject (serial)");
    ok(
        &c,
        1,
        &[
            "cert",
            "revoke",
            serial,
            "--reason",
            "replaced in the CA rotation",
        ],
    );
    // 3. Retire.
    let retired = ok(&c, 3, &["cert", "ca", "retire"]);
    assert_eq!(
        retired["cas"].as_array().map(Vec::len),
        Some(1),
        "{retired}"
    );
    assert_eq!(retired["cas"][0]["role"], "signing");
    c.wait_for(
        "every agent to trust only the new CA",
        Duration::from_secs(30),
        |c| async move { (1..=4).all(|id| certs_in(&tls_file(c, id, "ca.crt")) == 1) },
    )
    .await;
    export_bundle(&c);
    assert!(
        voters
            .iter()
            .all(|id| !tls_file(&c, *id, "ca.next.key").exists())
    );

    // The old admin certificate chains to a CA nobody trusts any more.
    let stale = c
        .endpoint(1, Some(old_admin))
        .expect("endpoint")
        .connect()
        .await;
    let reached = match stale {
        Err(_) => false,
        Ok(channel) => CertServiceClient::new(channel)
            .get_ca_status(pb::GetCaStatusRequest {})
            .await
            .is_ok(),
    };
    assert!(!reached, "a certificate of the retired CA must be refused");

    // Nothing was lost: the long job ran through it on its first attempt, a new one runs.
    let done = c
        .wait_job(long, Duration::from_secs(60), gpu_tests::is_terminal)
        .await;
    assert_eq!(done.state, pb::JobState::Succeeded as i32, "{done:?}");
    assert_eq!(done.runs.len(), 1, "{done:?}");
    let after = c
        .submit(3, shell_job("after", 1, "true"), "after")
        .await
        .expect("submit after")
        .job_id;
    let after = c
        .wait_job(after, Duration::from_secs(60), gpu_tests::is_terminal)
        .await;
    assert_eq!(after.state, pb::JobState::Succeeded as i32, "{after:?}");

    // A restarted voter and a new agent come up under the new CA.
    c.kill(follower);
    c.start_agent(follower);
    c.add_agent(5, &root.join(gpu_tests::JOIN_TOKEN));
    c.wait_for(
        "the restarted voter back and n5 a member",
        Duration::from_secs(60),
        |c| async move {
            c.status(follower, true).await.is_ok()
                && c.status(1, false).await.is_ok_and(|s| s.members.len() == 5)
        },
    )
    .await;

    // The registry login was sealed again under the new CA, and the audit chain verifies
    // across the heads both CAs signed.
    let backup = root.join("after.backup");
    ok(
        &c,
        1,
        &["cluster", "snapshot", "save", &backup.to_string_lossy()],
    );
    let bytes = std::fs::read(&backup).expect("backup");
    let (_, state) = gpu_raft_store::backup::decode(&bytes).expect("backup decodes");
    let signing = state
        .ca
        .as_ref()
        .map(|s| s.signing.clone())
        .expect("a CA set");
    assert_eq!(
        state.registry_credentials["ct"]["registry.example:5000"].key_id,
        signing
    );
    let heads_by: std::collections::BTreeSet<&str> = state
        .audit_heads
        .iter()
        .map(|h| h.key_id.as_str())
        .collect();
    assert!(
        heads_by.len() >= 2,
        "heads signed by both CAs: {heads_by:?}"
    );
    let verified = ok(&c, 1, &["audit", "verify"]);
    assert_eq!(verified["ok"], true, "{verified}");
}
