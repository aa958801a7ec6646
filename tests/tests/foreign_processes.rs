//! Foreign processes on a job's GPU, on a real agent whose simulated GPUs have real device
//! nodes: a process outside the job holding the job's GPU node (an `O_PATH` descriptor, the
//! only kind a node without a driver allows) raises the `foreign-process` alert on that GPU,
//! and with `jobs.foreign_processes = "kill"` is killed, while the job's own process holding
//! the same node is left alone; the alert resolves once the GPU is clear.
//!
//! Device nodes and job cgroups need root: without it these tests say why and return, unless
//! `GPUMESH_REQUIRE_ROOT=1` (CI), which makes them fail instead.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpu_proto::v1 as pb;
use gpu_proto::v1::alert_service_client::AlertServiceClient;
use gpu_tests::{Cluster, is_terminal, records, shell_job};

const RULE: &str = "foreign-process";

fn root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("GPUMESH_REQUIRE_ROOT").is_none(),
        "GPUMESH_REQUIRE_ROOT is set, but this test is not root"
    );
    eprintln!(
        "SKIPPED: simulated device nodes and job cgroups need root, and this test is not root"
    );
    false
}

/// The job cgroup roots one agent's `cgroup_root` makes (v1: one per hierarchy), removed when
/// dropped.
struct CgroupRoots(String);

impl CgroupRoots {
    fn new() -> CgroupRoots {
        CgroupRoots(format!("gpumesh-test-{}", std::process::id()))
    }
}

impl Drop for CgroupRoots {
    fn drop(&mut self) {
        let hierarchies = std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path());
        let roots: Vec<PathBuf> = std::iter::once(PathBuf::from("/sys/fs/cgroup"))
            .chain(hierarchies)
            .map(|h| h.join(&self.0))
            .filter(|r| r.exists())
            .collect();
        // A supervisor may still be removing its run's cgroup (it outlives its agent).
        let deadline = Instant::now() + Duration::from_secs(10);
        while roots
            .iter()
            .any(|r| std::fs::remove_dir(r).is_err() && r.exists())
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A process holding `node` until killed (perl: `O_PATH` is 0x200000 on Linux).
fn hold(node: &Path) -> Child {
    Command::new("perl")
        .args([
            "-e",
            "sysopen(my $f, $ARGV[0], 0x200000) or die \"open: $!\"; sleep 120",
        ])
        .arg(node)
        .stdin(Stdio::null())
        .spawn()
        .expect("perl (Debian's perl-base) holds the node")
}

struct Holder(Child);

impl Drop for Holder {
    fn drop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

async fn alerts_on(c: &Cluster, gpu: u32) -> Vec<pb::Alert> {
    let Ok(ch) = c.channel(1).await else {
        return Vec::new();
    };
    AlertServiceClient::new(ch)
        .list_alerts(pb::ListAlertsRequest {
            include_resolved: true,
            stale: false,
        })
        .await
        .map(|r| r.into_inner().alerts)
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a.rule == RULE && a.gpu_index == gpu)
        .collect()
}

/// A one-agent cluster with `policy`, a running job on one GPU that holds its own GPU's node,
/// that GPU's index and node.
async fn cluster_with_a_job(policy: &str, roots: &CgroupRoots) -> (Cluster, u64, u32, PathBuf) {
    let c = Cluster::start(
        1,
        1,
        &format!(
            "[jobs]\nlease = \"2s\"\ndown_after = \"4s\"\nstop_grace = \"2s\"\n\
             foreign_processes = {policy:?}\ncgroup_root = \"/sys/fs/cgroup/{}\"\n",
            roots.0
        ),
    )
    .await;
    // Jobs run as nobody: let them pass through the cluster's directory.
    records::prepare_dir(c.root.path()).expect("open the root for jobs");
    let dev = c.root.path().join("node-1").join("dev");
    let script = format!(
        "exec perl -e 'sysopen(my $f, $ARGV[0], 0x200000) or die \"open: $!\"; sleep 120' \
         {}/nvidia$GPUMESH_GPUS",
        dev.display()
    );
    let job = c
        .submit(1, shell_job("holder", 1, &script), "foreign-1")
        .await
        .expect("submit")
        .job_id;
    let running = c
        .wait_job(job, Duration::from_secs(30), |j| {
            j.state == pb::JobState::Running as i32
        })
        .await;
    let node = c.node(1, 1, false).await.expect("node");
    let gpu = node
        .gpus
        .iter()
        .find(|g| running.gpu_uuids.contains(&g.uuid))
        .map(|g| g.index)
        .expect("the job's GPU");
    (c, job, gpu, dev.join(format!("nvidia{gpu}")))
}

async fn wait_until<F, Fut>(what: &str, c: &Cluster, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_foreign_process_is_reported_and_killed() {
    if !root() {
        return;
    }
    let roots = CgroupRoots::new();
    let (c, job, gpu, node) = cluster_with_a_job("kill", &roots).await;
    let mut stranger = Holder(hold(&node));
    let pid = stranger.0.id();
    wait_until("the stranger's death", &c, || {
        let exited = stranger.0.try_wait().ok().flatten();
        async move { exited.is_some() }
    })
    .await;
    let status = stranger.0.wait().expect("reap");
    assert_eq!(status.signal(), Some(9), "killed: {status:?}");
    let raised = alerts_on(&c, gpu).await;
    let alert = raised.first().expect("the foreign-process alert");
    assert!(
        alert.message.contains(&format!("pid {pid} (perl, uid 0)"))
            && alert.message.contains(&format!("held by j-{job}: killed")),
        "{}",
        alert.message
    );
    // The agent is shielded from the OOM killer, or (root without CAP_SYS_RESOURCE, in some
    // sandboxes) says why not.
    let agent = c.pid(1).expect("agent 1 runs");
    let score = std::fs::read_to_string(format!("/proc/{agent}/oom_score_adj")).expect("score");
    assert!(
        score.trim() == "-1000"
            || c.log_of(1)
                .contains("cannot shield the agent from the OOM killer"),
        "oom_score_adj {score}"
    );
    // The job's own process, holding the same node, is untouched.
    let j = c.job(1, job).await.expect("job");
    assert_eq!(j.state, pb::JobState::Running as i32, "{j:?}");
    wait_until("the alert's resolution", &c, || async {
        alerts_on(&c, gpu)
            .await
            .iter()
            .all(|a| a.resolved_at_ms.is_some())
    })
    .await;
    c.cancel(1, job).await.expect("cancel");
    // Ended (and its cgroups removed) before the agent goes.
    c.wait_job(job, Duration::from_secs(20), is_terminal).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn by_default_a_foreign_process_is_only_reported() {
    if !root() {
        return;
    }
    let roots = CgroupRoots::new();
    let (c, job, gpu, node) = cluster_with_a_job("report", &roots).await;
    let mut stranger = Holder(hold(&node));
    let pid = stranger.0.id();
    wait_until("the foreign-process alert", &c, || async {
        alerts_on(&c, gpu)
            .await
            .iter()
            .any(|a| a.resolved_at_ms.is_none())
    })
    .await;
    let message = &alerts_on(&c, gpu).await[0].message;
    assert!(
        message.contains(&format!("pid {pid} (perl")) && !message.contains("killed"),
        "{message}"
    );
    assert!(
        stranger.0.try_wait().expect("try_wait").is_none(),
        "left alive"
    );
    stranger.0.kill().expect("kill the stranger");
    stranger.0.wait().expect("reap");
    wait_until("the alert's resolution", &c, || async {
        alerts_on(&c, gpu)
            .await
            .iter()
            .all(|a| a.resolved_at_ms.is_some())
    })
    .await;
    c.cancel(1, job).await.expect("cancel");
    // Ended (and its cgroups removed) before the agent goes.
    c.wait_job(job, Duration::from_secs(20), is_terminal).await;
}
