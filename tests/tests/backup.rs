//! Backup and restore with real processes: `gpuctl cluster snapshot save` from a 3-node mesh,
//! the mesh lost for good, `gpu-agent restore` into a fresh 3-node mesh with every job intact;
//! a truncated or foreign backup refused with the reason and nothing written.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_tests::{ADMIN_TOKEN, AgentCommand, Cluster, Placement, bin, free_addr, shell_job};

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
    Command::new(bin("gpu-agent"))
        .arg("restore")
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

    let placements: Vec<Placement> = (0..3)
        .map(|_| Placement {
            addr: free_addr(),
            prefix: Vec::new(),
        })
        .collect();
    let first = placements[0].addr.clone();
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
