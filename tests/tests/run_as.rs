//! The whole identity path against real agents: an admin maps two tenants to two Unix users this
//! test creates (`gpuctl tenant create --account`), each tenant's user token submits a job, and
//! the node runs each job as its tenant's user: `id -u` prints that user's uid, the job writes
//! into that user's home directory (the file is theirs), and no job process is root.
//!
//! Creating users needs root: without it the test says so and returns, unless
//! `GPUMESH_REQUIRE_ROOT=1` (CI), where it fails.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use gpu_tests::Cluster;
use serde_json::Value;

fn is_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("GPUMESH_REQUIRE_ROOT").is_none_or(|v| v != "1"),
        "GPUMESH_REQUIRE_ROOT=1 but this test is not root"
    );
    eprintln!("SKIPPED: creating users and running jobs as them needs root");
    false
}

/// A user made with `useradd -m`, removed with its home directory when dropped.
struct TestUser {
    name: String,
    uid: u32,
    home: PathBuf,
}

impl TestUser {
    fn new(tag: &str) -> Self {
        let name = format!("gm{}{tag}", std::process::id());
        user_tool("useradd", &["-m", "-s", "/bin/sh", &name]);
        let user = nix::unistd::User::from_name(&name)
            .expect("user database")
            .expect("the new user");
        Self {
            name,
            uid: user.uid.as_raw(),
            home: user.dir,
        }
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        user_tool("userdel", &["-r", &self.name]);
    }
}

/// Run a user-database tool, retrying while another test holds the database's lock.
fn user_tool(tool: &str, args: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = Command::new(tool).args(args).output().expect(tool);
        let err = String::from_utf8_lossy(&out.stderr);
        if out.status.success() || !err.contains("lock") || Instant::now() > deadline {
            assert!(
                out.status.success() || tool == "userdel",
                "{tool} {args:?}: {err}"
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `gpuctl -o json ARGS` through n1 (as `bearer`, else the admin); it must succeed.
fn gpuctl(c: &Cluster, bearer: Option<&str>, args: &[&str]) -> Value {
    let mut cmd = c.gpuctl();
    if let Some(b) = bearer {
        cmd.env("GPUCTL_TOKEN", b);
    }
    let out = cmd
        .args(["--endpoint", c.addr(1), "-o", "json"])
        .args(args)
        .output()
        .expect("run gpuctl");
    assert!(
        out.status.success(),
        "gpuctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tenants_job_runs_as_the_user_its_tenant_maps_to() {
    if !is_root() {
        return;
    }
    let (ada, bob) = (TestUser::new("ada"), TestUser::new("bob"));
    let c = Cluster::start(1, 1, "").await;
    let mut jobs = Vec::new();
    for (tenant, user) in [("ta", &ada), ("tb", &bob)] {
        gpuctl(
            &c,
            None,
            &["tenant", "create", tenant, "--account", &user.name],
        );
        let token = gpuctl(
            &c,
            None,
            &["token", "create", "--role", "user", "--tenant", tenant],
        );
        let bearer = token["bearer"].as_str().expect("bearer").to_owned();
        let script = "id -u; echo mine > \"$HOME/written-by-job\"; \
                      grep '^Uid:' /proc/self/status";
        let submitted = gpuctl(
            &c,
            Some(&bearer),
            &[
                "job", "submit", "--tenant", tenant, "--", "sh", "-c", script,
            ],
        );
        jobs.push((submitted["job_id"].as_u64().expect("job id"), user));
    }
    for (id, user) in jobs {
        let job = c
            .wait_job(id, Duration::from_secs(60), |j| j.finished_at_ms.is_some())
            .await;
        assert_eq!(job.outcome, "exited with code 0", "j-{id}: {job:?}");
        let logs = c
            .gpuctl()
            .args(["--endpoint", c.addr(1), "job", "logs", &id.to_string()])
            .output()
            .expect("gpuctl job logs");
        let out = String::from_utf8_lossy(&logs.stdout).into_owned();
        let mut lines = out.lines();
        assert_eq!(lines.next(), Some(user.uid.to_string().as_str()), "{out}");
        // Real, effective, saved and filesystem uid: all the user's, none root.
        let ids: Vec<&str> = lines
            .next()
            .and_then(|l| l.strip_prefix("Uid:"))
            .expect("the Uid line")
            .split_whitespace()
            .collect();
        assert_eq!(ids, [user.uid.to_string().as_str(); 4], "{out}");
        let written = user.home.join("written-by-job");
        let meta = std::fs::metadata(&written).expect("the job wrote into its user's home");
        assert_eq!(meta.uid(), user.uid, "{}", written.display());
    }
}
