//! Backup and restore with real processes: `gpuctl cluster snapshot save` from a 3-node mesh,
//! the mesh lost for good, `gpu-agent restore` into a fresh 3-node mesh with every job intact;
//! a truncated or foreign backup refused with the reason and nothing written; a backup whose
//! audit chain was rewritten and recomputed caught by the leader's signed heads, at restore and
//! by `gpuctl audit verify` on the restored cluster.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_proto::v1::audit_service_client::AuditServiceClient;
use gpu_proto::v1::cert_service_client::CertServiceClient;
use gpu_tests::{ADMIN_TOKEN, AgentCommand, Cluster, Placement, bin, shell_job};

/// Every job as (name, state, command): what "intact" means here.
fn jobs_summary(jobs: &[pb::Job]) -> BTreeMap<u64, (String, i32, Vec<String>)> {
    jobs.iter()
        .map(|j| {
            let spec = j.spec.clone().unwrap_or_default();
            (j.id, (spec.name, j.state, spec.command))
        })
        .collect()
}

fn restore(from: &Path, data_dir: &Path, addr: &str, creds: &Path) -> std::process::Output {
    restore_trusting(from, data_dir, addr, creds, None)
}

/// `restore`, with the old cluster's CA given to check the backup's audit chain.
fn restore_trusting(
    from: &Path,
    data_dir: &Path,
    addr: &str,
    creds: &Path,
    old_ca: Option<&Path>,
) -> std::process::Output {
    let trust = old_ca.map(|ca| [std::ffi::OsStr::new("--trust-audit-ca"), ca.as_os_str()]);
    Command::new(bin("gpu-agent"))
        .arg("restore")
        .args(trust.iter().flatten())
        .arg("--from")
        .arg(from)
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--node-id", "1", "--advertise", addr])
        .arg("--credentials-dir")
        .arg(creds)
        .output()
        .expect("run gpu-agent restore")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_of_a_mesh_restores_into_a_fresh_mesh_with_every_job() {
    let keep = tempfile::tempdir().expect("tempdir");
    let backup = keep.path().join("cluster.backup");
    let before = {
        let c = Cluster::start(3, 3, "").await;
        let mut ids = Vec::new();
        for (i, script) in ["true", "exit 3", "true"].iter().enumerate() {
            let r = c
                .submit(
                    1 + i as u64 % 3,
                    shell_job(&format!("done-{i}"), 1, script),
                    &format!("k{i}"),
                )
                .await
                .unwrap_or_else(|e| panic!("submit: {e}\n{}", c.logs()));
            ids.push(r.job_id);
        }
        for id in &ids {
            c.wait_job(*id, Duration::from_secs(60), gpu_tests::is_terminal)
                .await;
        }
        // Never placeable (no host has 64 GPUs): pending before and after.
        let pending = c
            .submit(2, shell_job("waits", 64, "true"), "k-pending")
            .await
            .expect("submit pending");
        let cancelled = c
            .submit(3, shell_job("cancelled", 64, "true"), "k-cancel")
            .await
            .expect("submit");
        c.cancel(1, cancelled.job_id).await.expect("cancel");
        let out = c
            .gpuctl()
            .args(["--endpoint", c.addr(2), "cluster", "snapshot", "save"])
            .arg(&backup)
            .output()
            .expect("gpuctl");
        assert!(
            out.status.success(),
            "snapshot save: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            c.logs()
        );
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(said.contains("saved the cluster state at index"), "{said}");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&backup)
            .expect("saved")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "the backup holds token hashes");
        std::fs::copy(
            c.root.path().join(ADMIN_TOKEN),
            keep.path().join(ADMIN_TOKEN),
        )
        .expect("keep the admin token");
        let jobs = c.list_jobs(1).await.expect("list");
        assert_eq!(jobs.len(), 5);
        assert!(
            jobs.iter()
                .any(|j| j.id == pending.job_id && j.state == pb::JobState::Pending as i32)
        );
        jobs_summary(&jobs)
        // The whole mesh is killed here, data and all: quorum lost for good.
    };

    // Bad input: nothing is written, and the reason is given.
    let bytes = std::fs::read(&backup).expect("read backup");
    let cases = [
        (
            "truncated",
            bytes[..bytes.len() - 100].to_vec(),
            "truncated",
        ),
        (
            "foreign",
            b"node_id = 1\nlisten = \"x\"\n".to_vec(),
            "not a gpumesh backup",
        ),
    ];
    for (name, content, reason) in cases {
        let file = keep.path().join(name);
        std::fs::write(&file, content).expect("write");
        let data = keep.path().join(format!("data-{name}"));
        let creds = keep.path().join(format!("creds-{name}"));
        let out = restore(&file, &data, "127.0.0.1:1", &creds);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(reason), "{name}: {err}");
        assert!(
            !data.exists() && !creds.exists(),
            "{name}: restore wrote something"
        );
    }

    let placements: Vec<Placement> = (0..3).map(|_| Placement::loopback()).collect();
    let first = placements[0].addr.clone();
    let restored_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    let c = Cluster::start_prepared(3, "", placements, AgentCommand::default(), |c| {
        let root = c.root.path();
        let out = restore(&backup, &root.join("node-1"), &first, root);
        assert!(
            out.status.success(),
            "restore: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The restored state holds the old admin token's hash: the old token still works.
        std::fs::copy(keep.path().join(ADMIN_TOKEN), root.join(ADMIN_TOKEN)).expect("token");
    })
    .await;
    let after = jobs_summary(&c.list_jobs(2).await.expect("list on the new mesh"));
    assert_eq!(after, before, "jobs differ after the restore");
    // The restore is in the audit log, and the old cluster's certificates are listed as
    // revoked (the new CA trusts none of them).
    let mut audit = AuditServiceClient::new(c.channel(1).await.expect("channel"));
    let entries = audit
        .list_audit(pb::ListAuditRequest::default())
        .await
        .expect("audit")
        .into_inner()
        .entries;
    assert!(
        entries.iter().any(|e| e.verb == "cluster.restore"),
        "{entries:#?}"
    );
    let mut certs = CertServiceClient::new(c.channel(1).await.expect("channel"));
    let listed = certs
        .list_certificates(pb::ListCertificatesRequest::default())
        .await
        .expect("cert list")
        .into_inner()
        .certificates;
    assert!(
        listed.iter().any(|r| r.subject == "node 2"),
        "the old records are kept: {listed:?}"
    );
    for old in listed
        .iter()
        .filter(|r| r.subject == "node 2" || r.subject == "node 3")
    {
        if old.issued_at_ms < restored_at {
            assert!(old.revoked, "{old:?}");
        }
    }
    // The new mesh carries on: ids continue after the restored ones, and jobs run.
    let next = c
        .submit(3, shell_job("after", 1, "true"), "k-after")
        .await
        .unwrap_or_else(|e| panic!("submit on the new mesh: {e}\n{}", c.logs()));
    assert!(
        next.job_id > *before.keys().max().expect("jobs"),
        "{next:?}"
    );
    let done = c
        .wait_job(next.job_id, Duration::from_secs(60), gpu_tests::is_terminal)
        .await;
    assert_eq!(done.state, pb::JobState::Succeeded as i32, "{done:?}");
    // The same idempotency key still names the same job (the keys came back too).
    let again = c
        .submit(1, shell_job("waits", 64, "true"), "k-pending")
        .await
        .expect("resubmit");
    assert!(
        before.contains_key(&again.job_id),
        "key k-pending made a new job: {again:?}"
    );
}

/// `gpuctl audit verify` (JSON) against agent 1, with more CAs to trust.
fn audit_verify(c: &Cluster, trust: &[&Path]) -> (bool, serde_json::Value) {
    let mut cmd = c.gpuctl();
    cmd.args([
        "--endpoint",
        c.addr(1),
        "--output",
        "json",
        "audit",
        "verify",
    ]);
    for ca in trust {
        cmd.arg("--trust").arg(ca);
    }
    let out = cmd.output().expect("gpuctl audit verify");
    let answer = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "audit verify printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.success(), answer)
}

/// The attacker's edit: entry 1 now names someone else, and every hash after it is recomputed,
/// so the chain is consistent again; the backup's checksum is recomputed too. With `strip`, the
/// signed heads are removed as well.
fn rewrite_audit(backup: &[u8], strip: bool) -> Vec<u8> {
    let (header, mut state) = gpu_raft_store::backup::decode(backup).expect("a good backup");
    if strip {
        state.audit_heads.clear();
    }
    let mut prev_hash = None;
    for (i, shared) in state.audit.iter_mut().enumerate() {
        let entry = std::sync::Arc::make_mut(shared);
        if i == 0 {
            entry.actor = "someone-else".into();
        }
        if let Some(prev) = prev_hash.take() {
            entry.prev_hash = prev;
        }
        entry.hash = entry.compute_hash();
        prev_hash = Some(entry.hash.clone());
    }
    // What `gpuctl audit verify` checked before signed heads: the rewrite passes it.
    assert_eq!(
        gpu_raft_store::audit::verify(&state.audit),
        Ok(state.audit.len())
    );
    gpu_raft_store::backup::encode(
        &state,
        &header.cluster_id,
        header.index,
        header.term,
        header.created_at_ms,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_with_a_rewritten_audit_chain_is_caught_by_its_signed_heads() {
    let keep = tempfile::tempdir().expect("tempdir");
    // The backup's folder does not exist yet: `snapshot save` makes it.
    let backup = keep.path().join("backups/pristine");
    let old_ca = keep.path().join("old-ca.crt");
    {
        let c = Cluster::start(1, 1, "").await;
        for i in 0..3 {
            c.submit(1, shell_job(&format!("j{i}"), 64, "true"), &format!("k{i}"))
                .await
                .unwrap_or_else(|e| panic!("submit: {e}\n{}", c.logs()));
        }
        // The leader signs the head within its interval.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let (ok, v) = audit_verify(&c, &[]);
            assert!(ok, "a fresh cluster's chain verifies: {v}\n{}", c.logs());
            if v["signed_through"].as_u64() >= Some(3) && v["signed_through"] == v["entries"] {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "never signed: {v}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let out = c
            .gpuctl()
            .args(["--endpoint", c.addr(1), "cluster", "snapshot", "save"])
            .arg(&backup)
            .output()
            .expect("gpuctl");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::copy(c.root.path().join("ca.crt"), &old_ca).expect("keep the CA");
        std::fs::copy(
            c.root.path().join(ADMIN_TOKEN),
            keep.path().join(ADMIN_TOKEN),
        )
        .expect("keep the admin token");
    }
    let (rewritten, stripped) = (keep.path().join("rewritten"), keep.path().join("stripped"));
    let pristine = std::fs::read(&backup).expect("read");
    std::fs::write(&rewritten, rewrite_audit(&pristine, false)).expect("write");
    std::fs::write(&stripped, rewrite_audit(&pristine, true)).expect("write");

    // Restore with the old CA vouching: the rewrite is refused, with its heads or without,
    // nothing written; the pristine backup is accepted.
    let refusals = [
        (&rewritten, "the chain up to it was rewritten"),
        (&stripped, "no head signed by the given CA"),
    ];
    for (i, (file, reason)) in refusals.into_iter().enumerate() {
        let data = keep.path().join(format!("data-r{i}"));
        let creds = keep.path().join(format!("creds-r{i}"));
        let out = restore_trusting(file, &data, "127.0.0.1:1", &creds, Some(&old_ca));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(reason), "{err}");
        assert!(!data.exists() && !creds.exists(), "restore wrote something");
    }
    let (data, creds) = (keep.path().join("data-p"), keep.path().join("creds-p"));
    let out = restore_trusting(&backup, &data, "127.0.0.1:1", &creds, Some(&old_ca));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Restored without the check, the rewritten chain still fails `gpuctl audit verify` on
    // the new cluster, whatever CA it is told to trust.
    let placements = vec![Placement::loopback()];
    let first = placements[0].addr.clone();
    let c = Cluster::start_prepared(1, "", placements, AgentCommand::default(), |c| {
        let root = c.root.path();
        let out = restore(&rewritten, &root.join("node-1"), &first, root);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::copy(keep.path().join(ADMIN_TOKEN), root.join(ADMIN_TOKEN)).expect("token");
    })
    .await;
    for trust in [vec![], vec![old_ca.as_path()]] {
        let (ok, v) = audit_verify(&c, &trust);
        assert!(!ok, "a rewritten chain verified: {v}");
        let problem = v["problem"].as_str().unwrap_or_default();
        assert!(problem.contains("the chain up to it was rewritten"), "{v}");
    }
}
