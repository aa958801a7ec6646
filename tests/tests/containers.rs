//! Container jobs through real agents, real podman and runc, and an image the test builds from
//! a busybox rootfs (`podman import`; no registry):
//! - the job runs as its user (never uid 0), sees its GPU's UUID in `CUDA_VISIBLE_DEVICES` and
//!   only its own GPU's device node (which passes the fence: ENXIO, no driver behind it), and
//!   a mount its tenant allows;
//! - a mount outside the tenant's allow-list, and bad images and mounts, are refused at submit
//!   with the reason, and nothing is queued;
//! - cancel stops the container within the grace and leaves no container behind;
//! - kill -9 of the agent running a container job: the job is requeued elsewhere, and its two
//!   containers never run at once;
//! - a missing image, and a command the image lacks, fail the job with the reason in `job get`
//!   and `job why`;
//! - each node lists the images it holds (`node get`), pulls through its agent (`image pull`),
//!   refuses bad input, answers a failed pull with the registry's reason, and audits each;
//! - a tenant's registry login is sealed by a voter (a learner refuses), reaches only its job's
//!   pull (a 0600 auth file, opened for a learner by the voter, gone when the pull ends), and
//!   is nowhere in job get, tenant get, the audit log, the agents' logs or their Raft data;
//! - `gpuctl run` tells the pull's phase on stderr, and Ctrl-C cancels the pulling job;
//! - a pull that hangs (a registry that accepts and never answers) shows in `job get` as the
//!   run's phase, with podman's retries, and cancel ends it at once, leaving no pull and no
//!   container.
//!
//! Podman runs containers as root: without root or podman the tests say so and return, unless
//! `GPUMESH_REQUIRE_PODMAN=1` (CI), where they fail.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_tests::{Cluster, is_terminal, records};
use serde_json::Value;

fn podman_here() -> bool {
    let root = nix::unistd::geteuid().is_root();
    let podman = Command::new("podman")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let busybox = Path::new(BUSYBOX).exists();
    if root && podman && busybox {
        return true;
    }
    assert!(
        std::env::var_os("GPUMESH_REQUIRE_PODMAN").is_none_or(|v| v != "1"),
        "GPUMESH_REQUIRE_PODMAN=1 but root {root}, podman {podman}, {BUSYBOX} {busybox}"
    );
    eprintln!("SKIPPED: container jobs need root, podman and {BUSYBOX}");
    false
}

/// Debian's busybox-static: one binary, every tool the test images need.
const BUSYBOX: &str = "/bin/busybox";

/// A busybox image in podman's store, removed when dropped.
struct Image(String);

impl Image {
    fn build(root: &Path) -> Image {
        Image::build_tagged(root, "1")
    }

    /// The image as `localhost/gpumesh-test-<pid>:<tag>` (tests that remove it use a tag of
    /// their own).
    fn build_tagged(root: &Path, tag: &str) -> Image {
        let rootfs = root.join(format!("rootfs-{tag}"));
        let bin = rootfs.join("bin");
        std::fs::create_dir_all(&bin).expect("rootfs");
        for dir in ["dev", "proc", "sys", "tmp", "etc"] {
            std::fs::create_dir_all(rootfs.join(dir)).expect("rootfs dir");
        }
        std::fs::set_permissions(rootfs.join("tmp"), std::fs::Permissions::from_mode(0o1777))
            .expect("tmp mode");
        std::fs::copy(BUSYBOX, bin.join("busybox")).expect("copy busybox");
        for tool in [
            "sh", "id", "ls", "cat", "echo", "sleep", "date", "env", "touch", "grep", "wc",
        ] {
            std::os::unix::fs::symlink("busybox", bin.join(tool)).expect("link");
        }
        let tar = root.join(format!("rootfs-{tag}.tar"));
        run(
            "tar",
            &[
                "-C",
                &rootfs.to_string_lossy(),
                "-cf",
                &tar.to_string_lossy(),
                ".",
            ],
        );
        let name = format!("localhost/gpumesh-test-{}:{tag}", std::process::id());
        run("podman", &["import", &tar.to_string_lossy(), &name]);
        Image(name)
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        Command::new("podman")
            .args(["rmi", "--force", &self.0])
            .output()
            .ok();
    }
}

fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().expect(program);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The names of the containers (running or not) of job `id`.
fn containers_of(id: u64) -> Vec<String> {
    run(
        "podman",
        &[
            "ps",
            "--all",
            "--format",
            "{{.Names}}",
            "--filter",
            &format!("name=^gpumesh-j{id}-"),
        ],
    )
    .lines()
    .map(str::to_owned)
    .collect()
}

/// `gpuctl -o json ARGS` through n1 as the admin: its exit code, its stdout as JSON, its
/// stderr.
fn gpuctl(c: &Cluster, args: &[&str]) -> (Option<i32>, Value, String) {
    let out = c
        .gpuctl()
        .args(["--endpoint", c.addr(1), "-o", "json"])
        .args(args)
        .output()
        .expect("run gpuctl");
    (
        out.status.code(),
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn submit(c: &Cluster, args: &[&str]) -> u64 {
    let mut all = vec!["job", "submit", "--tenant", "ct"];
    all.extend_from_slice(args);
    let (code, v, err) = gpuctl(c, &all);
    assert_eq!(code, Some(0), "submit {args:?}: {err}");
    v["job_id"].as_u64().expect("job id")
}

/// A directory the job's user (nobody) may write, allowed to tenant `ct` for mounts.
fn shared_dir(c: &Cluster) -> PathBuf {
    let dir = records::prepare_dir(c.root.path()).expect("shared dir");
    let (code, _, err) = gpuctl(
        c,
        &[
            "tenant",
            "create",
            "ct",
            "--allow-mount",
            &dir.to_string_lossy(),
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    dir
}

const FAST_STOP: &str = "[jobs]\nstop_grace = \"2s\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_job_runs_as_its_user_with_only_its_gpu_and_its_mount() {
    if !podman_here() {
        return;
    }
    let c = Cluster::start(1, 1, FAST_STOP).await;
    let image = Image::build(c.root.path());
    let shared = shared_dir(&c);
    let mount = format!("{}:/shared", shared.display());
    let script = "id -u; echo \"gpus=$CUDA_VISIBLE_DEVICES nv=$NVIDIA_VISIBLE_DEVICES\"; \
                  ls /dev | grep nvidia; \
                  for d in /dev/nvidia*; do cat $d 2>&1; done; \
                  echo hello > /shared/from-container";
    let id = submit(
        &c,
        &[
            "--gpus", "1", "--image", &image.0, "--mount", &mount, "--", "sh", "-c", script,
        ],
    );
    let job = c
        .wait_job(id, Duration::from_secs(120), |j| j.finished_at_ms.is_some())
        .await;
    let stderr = c
        .gpuctl()
        .args([
            "--endpoint",
            c.addr(1),
            "job",
            "logs",
            "--stderr",
            &id.to_string(),
        ])
        .output()
        .expect("gpuctl job logs --stderr");
    let stderr = String::from_utf8_lossy(&stderr.stdout).into_owned();
    assert_eq!(job.outcome, "exited with code 0", "j-{id}: {stderr}");
    let out = c
        .gpuctl()
        .args(["--endpoint", c.addr(1), "job", "logs", &id.to_string()])
        .output()
        .expect("gpuctl job logs");
    let out = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = out.lines();
    let uid = lines.next().expect("uid line");
    let nobody = nix::unistd::User::from_name("nobody")
        .expect("passwd")
        .expect("nobody")
        .uid
        .as_raw();
    assert_eq!(uid, nobody.to_string(), "the job's user, never root: {out}");
    let gpus = lines.next().expect("gpus line");
    let uuid = &job.gpu_uuids[0];
    assert_eq!(gpus, format!("gpus={uuid} nv={uuid}"), "{out}");
    // Exactly one GPU node (a 1-GPU job on a node with more), and it passes the device fence:
    // no driver behind it answers ENXIO, never EPERM.
    let nodes: Vec<&str> = lines
        .clone()
        .take_while(|l| l.starts_with("nvidia"))
        .collect();
    assert_eq!(
        nodes.len(),
        1,
        "only the job's own GPU is in the container: {out}"
    );
    assert!(
        out.contains("No such device or address"),
        "its own GPU passes the fence: {out}"
    );
    assert!(!out.contains("Operation not permitted"), "{out}");
    let written = shared.join("from-container");
    assert_eq!(
        std::fs::read_to_string(&written).expect("the mount"),
        "hello\n"
    );
    let meta = std::fs::metadata(&written).expect("written");
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), nobody);
    assert!(
        containers_of(id).is_empty(),
        "the ended job's container is removed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mounts_outside_the_allow_list_and_bad_images_are_refused_at_submit() {
    if !podman_here() {
        return;
    }
    let c = Cluster::start(1, 1, "").await;
    let shared = shared_dir(&c);
    let allowed = format!("{}:/shared", shared.display());
    let outside = format!("{}:/x", c.root.path().display());
    for (args, says) in [
        (
            vec!["--image", "busybox", "--mount", &outside],
            "not in the tenant's allowed mounts",
        ),
        (
            vec!["--image", "busybox", "--mount", "/etc:/etc"],
            "never mounted",
        ),
        (
            vec!["--image", "busybox", "--mount", "/:/host"],
            "root directory",
        ),
        (
            vec!["--image", "busybox", "--mount", "/srv/../etc:/x"],
            "normal path",
        ),
        (
            vec![
                "--image",
                "busybox",
                "--mount",
                &format!("{}:/proc", shared.display()),
            ],
            "runtime provides",
        ),
        (
            vec!["--image", "Not/A/Valid:ref:x"],
            "not a valid reference",
        ),
        (
            vec!["--image", "", "--mount", &allowed],
            "not a valid reference",
        ),
        (
            vec!["--image", "busybox", "--kind", "vm", "--gpus", "1"],
            "vm job",
        ),
    ] {
        let mut all = vec!["job", "submit", "--tenant", "ct"];
        all.extend_from_slice(&args);
        all.extend_from_slice(&["--", "true"]);
        let (code, _, err) = gpuctl(&c, &all);
        assert_eq!(code, Some(2), "{args:?} must be refused: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let (_, list, _) = gpuctl(&c, &["job", "list"]);
    assert_eq!(
        list.as_array().map(Vec::len),
        Some(0),
        "nothing queued: {list}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_the_container_within_the_grace_and_leaves_none() {
    if !podman_here() {
        return;
    }
    let c = Cluster::start(1, 1, FAST_STOP).await;
    let image = Image::build(c.root.path());
    shared_dir(&c);
    let id = submit(&c, &["--image", &image.0, "--", "sleep", "600"]);
    c.wait_for(
        "the container to run",
        Duration::from_secs(60),
        |_| async move {
            run("podman", &["ps", "--format", "{{.Names}}"]).contains(&format!("gpumesh-j{id}-"))
        },
    )
    .await;
    let asked = std::time::Instant::now();
    c.cancel(1, id).await.expect("cancel");
    let job = c.wait_job(id, Duration::from_secs(30), is_terminal).await;
    assert_eq!(job.state, pb::JobState::Cancelled as i32, "{job:?}");
    c.wait_for("the run to end", Duration::from_secs(30), |c| async move {
        c.job(1, id).await.is_ok_and(|j| j.finished_at_ms.is_some())
    })
    .await;
    // A 2 s grace, podman's own stop and the report: well under the 10 s a missed stop takes.
    let took = asked.elapsed();
    assert!(took < Duration::from_secs(10), "stopped after {took:?}");
    assert!(containers_of(id).is_empty(), "{:?}", containers_of(id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_job_on_a_killed_agent_is_requeued_and_never_runs_twice() {
    if !podman_here() {
        return;
    }
    let mut c = Cluster::start(3, 3, "").await;
    let image = Image::build(c.root.path());
    let shared = shared_dir(&c);
    let mount = format!("{}:/records", shared.display());
    // busybox's date has no %N: whole seconds, far finer than the lease's gap between runs.
    let script = records::script(Path::new("/records"), "8")
        .replace("$(date +%s%N)", "$(date +%s)000000000");
    let id = submit(
        &c,
        &[
            "--gpus",
            "1",
            "--max-attempts",
            "2",
            "--image",
            &image.0,
            "--mount",
            &mount,
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    let running = c
        .wait_job(id, Duration::from_secs(60), |j| {
            j.state == pb::JobState::Running as i32
        })
        .await;
    let victim = running.node_id.expect("placed");
    // The container has started (its record is there) before the agent dies.
    c.wait_for("the first run's record", Duration::from_secs(60), |_| {
        let f = shared.join(format!("j-{id}-g1"));
        async move { f.exists() }
    })
    .await;
    c.kill(victim);
    let done = c.wait_job(id, Duration::from_secs(120), is_terminal).await;
    assert_eq!(
        done.state,
        pb::JobState::Succeeded as i32,
        "{} {}",
        done.reason,
        done.outcome
    );
    assert_eq!(done.generation, 2, "exactly one requeue");
    assert_ne!(done.node_id, Some(victim), "re-placed on another node");
    let first = records::read(&shared, id, 1).expect("first run");
    let second = records::read(&shared, id, 2).expect("second run");
    let first_end = first
        .end_ns
        .expect("the first container was stopped (fenced)");
    assert!(
        first_end <= second.start_ns,
        "containers overlapped: the first ended {first_end} after the second started {}",
        second.start_ns
    );
    c.wait_for(
        "no container of the job left",
        Duration::from_secs(30),
        |_| async move { containers_of(id).is_empty() },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_image_or_command_fails_the_job_with_the_reason() {
    if !podman_here() {
        return;
    }
    let c = Cluster::start(1, 1, "").await;
    let image = Image::build(c.root.path());
    shared_dir(&c);
    let missing = submit(
        &c,
        &["--image", "localhost/gpumesh-no-such-image:1", "--", "true"],
    );
    let no_command = submit(&c, &["--image", &image.0, "--", "no-such-command"]);
    for (id, says) in [
        (missing, "pulling image localhost/gpumesh-no-such-image:1"),
        (no_command, "does not exist in the image"),
    ] {
        let job = c.wait_job(id, Duration::from_secs(120), is_terminal).await;
        assert_eq!(job.state, pb::JobState::Failed as i32, "{job:?}");
        assert!(job.outcome.contains(says), "job get: {}", job.outcome);
        let (code, why, err) = gpuctl(&c, &["job", "why", &id.to_string()]);
        assert_eq!(code, Some(0), "{err}");
        let reason = why["reason"].as_str().unwrap_or_default();
        assert!(reason.contains(says), "job why: {why}");
        assert!(containers_of(id).is_empty(), "{:?}", containers_of(id));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_jobs_keep_the_process_jobs_rules_and_avoid_nodes_without_a_runtime() {
    if !podman_here() {
        return;
    }
    // n3 looks only for enroot, which is not installed: it runs no container job.
    let placements = (0..3)
        .map(|_| gpu_tests::Placement {
            addr: gpu_tests::free_addr(),
            prefix: Vec::new(),
        })
        .collect();
    let c = Cluster::start_prepared(3, FAST_STOP, placements, Default::default(), |c| {
        let config = c.root.path().join("node-3.toml");
        let mut toml = std::fs::read_to_string(&config).expect("n3's config");
        toml.push_str("\n[containers]\nruntimes = [\"enroot\"]\n");
        std::fs::write(&config, toml).expect("n3's config");
    })
    .await;
    let image = Image::build(c.root.path());
    shared_dir(&c);
    for (node, runtime) in [(1, Some("podman")), (3, None)] {
        let n = c.node(1, node, false).await.expect("node get");
        let label = n.labels.get(gpu_raft_store::CONTAINER_RUNTIME_LABEL);
        assert_eq!(
            label.map(String::as_str),
            runtime,
            "n{node}'s labels: {:?}",
            n.labels
        );
    }

    // A gang of two: both members on the two nodes with a runtime, each with the training
    // environment, as a process gang gets it.
    let gang = submit(
        &c,
        &[
            "--nodes",
            "2",
            "--gpus",
            "2",
            "--image",
            &image.0,
            "--",
            "sh",
            "-c",
            "echo MASTER_ADDR=$MASTER_ADDR; echo RANK=$RANK; echo WORLD_SIZE=$WORLD_SIZE",
        ],
    );
    // A run past its time limit is stopped and not retried; a failing run is retried.
    let slow = submit(
        &c,
        &[
            "--gpus",
            "1",
            "--time-limit",
            "3s",
            "--image",
            &image.0,
            "--",
            "sleep",
            "600",
        ],
    );
    let failing = submit(
        &c,
        &[
            "--gpus",
            "1",
            "--max-attempts",
            "2",
            "--retry-backoff",
            "1s",
            "--image",
            &image.0,
            "--",
            "sh",
            "-c",
            "exit 3",
        ],
    );
    // Only n3 has T4s, and it has no runtime: the job waits, saying why.
    let t4 = submit(
        &c,
        &[
            "--gpus",
            "1",
            "--gpu-type",
            "T4",
            "--image",
            &image.0,
            "--",
            "echo",
        ],
    );
    let done = c
        .wait_job(gang, Duration::from_secs(120), is_terminal)
        .await;
    assert_eq!(done.state, pb::JobState::Succeeded as i32, "{done:?}");
    let mut members = done.gang_nodes.clone();
    members.sort_unstable();
    assert_eq!(members, vec![1, 2], "never on n3, which has no runtime");
    let master = c
        .addr(done.gang_nodes[0])
        .rsplit_once(':')
        .map(|(h, _)| h.to_owned())
        .expect("host:port");
    for (rank, node) in done.gang_nodes.iter().enumerate() {
        let out = std::fs::read_to_string(c.run_dir(*node, gang, 1).join("stdout.log"))
            .expect("member's stdout");
        assert_eq!(
            out,
            format!("MASTER_ADDR={master}\nRANK={}\nWORLD_SIZE=2\n", rank),
            "n{node}"
        );
    }
    let slow_done = c
        .wait_job(slow, Duration::from_secs(120), is_terminal)
        .await;
    assert_eq!(slow_done.outcome, "time limit exceeded", "{slow_done:?}");
    assert_eq!(slow_done.generation, 1, "a time limit is not retried");
    let failed = c
        .wait_job(failing, Duration::from_secs(120), is_terminal)
        .await;
    assert_eq!(failed.state, pb::JobState::Failed as i32, "{failed:?}");
    assert_eq!(failed.outcome, "exited with code 3");
    assert_eq!(failed.generation, 2, "retried once, as asked");
    for job in [slow_done, failed] {
        assert_ne!(job.node_id, Some(3), "j-{}: never on n3", job.id);
    }
    let (code, why, err) = gpuctl(&c, &["job", "why", &t4.to_string()]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        why["reason"].as_str(),
        Some(
            "no schedulable node with a container runtime has 1 GPU of type T4 (the most any \
             has is 0)"
        ),
        "{why}"
    );
    assert_eq!(
        c.job(1, t4).await.expect("job get").state,
        pb::JobState::Pending as i32
    );
    for id in [gang, slow, failing] {
        assert!(
            containers_of(id).is_empty(),
            "j-{id}: {:?}",
            containers_of(id)
        );
    }
}

/// A registry address that accepts connections and never answers: a pull from it hangs (podman
/// retries each TLS handshake after its 10 s timeout).
struct SilentRegistry {
    addr: std::net::SocketAddr,
}

impl SilentRegistry {
    fn start() -> SilentRegistry {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for conn in listener.incoming().flatten() {
                held.push(conn);
            }
        });
        SilentRegistry { addr }
    }
}

/// The processes whose command line mentions `needle` (other than this test).
fn processes_naming(needle: &str) -> Vec<String> {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .map(|dir| {
            dir.flatten()
                .filter(|e| e.file_name().to_string_lossy() != me)
                .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
                .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
                .filter(|c| c.contains(needle))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_pull_shows_in_job_get_and_cancel_ends_it_leaving_nothing() {
    if !podman_here() {
        return;
    }
    let c = Cluster::start(1, 1, FAST_STOP).await;
    shared_dir(&c);
    let registry = SilentRegistry::start();
    let image = format!("{}/gpumesh/hang:1", registry.addr);
    let id = submit(&c, &["--image", &image, "--", "true"]);
    let pulling = format!("pulling image {image}");
    let shown = &pulling;
    c.wait_for(
        "job get to say it pulls",
        Duration::from_secs(60),
        |c| async move { c.job(1, id).await.is_ok_and(|j| j.phase.starts_with(shown)) },
    )
    .await;
    let (code, got, err) = gpuctl(&c, &["job", "get", &id.to_string()]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(got["state"], "running", "{got}");
    assert!(got["phase_since_ms"].as_u64().is_some(), "{got}");
    // The table too, and podman's own retry with the registry's reason (its TLS handshake
    // timed out after 10 s), within a report interval.
    let table = c
        .gpuctl()
        .args(["--endpoint", c.addr(1), "job", "get", &id.to_string()])
        .output()
        .expect("gpuctl job get");
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(table.contains("Phase:"), "{table}");
    assert!(table.contains(&pulling), "{table}");
    c.wait_for(
        "the retry to show",
        Duration::from_secs(45),
        |c| async move {
            c.job(1, id).await.is_ok_and(|j| {
                j.phase
                    .contains("retrying (1/3) after: TLS handshake timeout")
            })
        },
    )
    .await;
    assert!(
        !processes_naming(&image).is_empty(),
        "the pull is still on its way"
    );
    let asked = std::time::Instant::now();
    c.cancel(1, id).await.expect("cancel");
    let job = c.wait_job(id, Duration::from_secs(30), is_terminal).await;
    assert_eq!(job.state, pb::JobState::Cancelled as i32, "{job:?}");
    assert_eq!(job.phase, "", "an ended run has no phase");
    let took = asked.elapsed();
    assert!(took < Duration::from_secs(10), "stopped after {took:?}");
    let image = &image;
    c.wait_for(
        "the pull to be gone",
        Duration::from_secs(10),
        |_| async move { processes_naming(image).is_empty() },
    )
    .await;
    assert!(containers_of(id).is_empty(), "{:?}", containers_of(id));
}

/// The images node `node` holds, as `node get` shows them.
async fn images_of(c: &Cluster, node: u64) -> Vec<String> {
    c.node(1, node, false)
        .await
        .map(|n| n.images)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_list_their_images_and_pull_them_through_their_agent() {
    if !podman_here() {
        return;
    }
    let c = Cluster::start(
        2,
        1,
        "[jobs]\nstop_grace = \"2s\"\n[containers]\nimage_refresh = \"1s\"\n",
    )
    .await;
    let image = Image::build_tagged(c.root.path(), "inventory");
    let name = &image.0;
    for node in [1, 2] {
        c.wait_for(
            "the node to list the image",
            Duration::from_secs(30),
            |c| async move { images_of(c, node).await.contains(name) },
        )
        .await;
    }
    let (code, node, err) = gpuctl(&c, &["node", "get", "2"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        node["images"]
            .as_array()
            .is_some_and(|a| a.iter().any(|i| i == name.as_str())),
        "{node}"
    );

    // Through n1's API, carried out by n2's agent: the node holds it, no registry is asked.
    let (code, pulled, err) = gpuctl(&c, &["image", "pull", "--node", "2", name]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(pulled[0]["result"], "already-present", "{pulled}");
    assert_eq!(pulled[0]["image"], name.as_str(), "{pulled}");
    let (code, pulled, err) = gpuctl(&c, &["image", "pull", "--all", name]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(pulled.as_array().map(Vec::len), Some(2), "{pulled}");

    // A pull the registry cannot serve fails with its reason, on the node asked.
    let missing = "localhost/gpumesh-no-such-image:1";
    let (code, pulled, err) = gpuctl(&c, &["image", "pull", "--node", "2", missing]);
    assert_eq!(code, Some(2), "{pulled}");
    assert!(
        err.contains(&format!("pulling image {missing} on node 2:")),
        "{err}"
    );
    assert_eq!(pulled[0]["result"], "failed", "{pulled}");
    // Bad input: refused before any node is asked.
    for (args, says) in [
        (
            vec!["--node", "2", "Not/A/Valid:ref:x"],
            "not a valid reference",
        ),
        (vec!["--node", "9", "busybox"], "node 9"),
    ] {
        let mut all = vec!["image", "pull"];
        all.extend_from_slice(&args);
        let (code, _, err) = gpuctl(&c, &all);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    // Every pull asked is in the audit log.
    let (code, audit, err) = gpuctl(&c, &["audit", "list"]);
    assert_eq!(code, Some(0), "{err}");
    let text = audit.to_string();
    assert!(
        text.contains(&format!("image {name} already on n2")),
        "{text}"
    );
    assert!(
        text.contains(&format!("pulling image {missing} on n2 failed")),
        "{text}"
    );

    // An image removed from the node leaves its list at the next refresh.
    run("podman", &["rmi", "--force", name]);
    for node in [1, 2] {
        c.wait_for(
            "the node to drop the image",
            Duration::from_secs(30),
            |c| async move { !images_of(c, node).await.contains(name) },
        )
        .await;
    }
}

/// Every file under `dir` whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            found.extend(files_containing(&path, needle));
        } else if std::fs::read(&path).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle)) {
            found.push(path);
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_registry_login_is_sealed_never_shown_and_given_only_to_its_pull() {
    if !podman_here() {
        return;
    }
    // n1 is the voter (it holds the CA key), n2 a learner: it runs the job and must ask n1 to
    // open the login.
    let c = Cluster::start(2, 1, FAST_STOP).await;
    shared_dir(&c);
    let registry = SilentRegistry::start();
    let host = registry.addr.to_string();
    const PASSWORD: &str = "s3cret-Pa55word-XYZ";
    let file = c.root.path().join("password");
    std::fs::write(&file, format!("{PASSWORD}\n")).expect("password file");
    let file = file.to_string_lossy().into_owned();
    let set = [
        "tenant",
        "set-registry-credential",
        "ct",
        &host,
        "--username",
        "robot",
        "--password-file",
        &file,
    ];
    // A learner holds no CA key: it cannot seal, and says where to go.
    let learner = c
        .gpuctl()
        .args(["--endpoint", c.addr(2)])
        .args(set)
        .output()
        .expect("gpuctl");
    assert_eq!(learner.status.code(), Some(2));
    let err = String::from_utf8_lossy(&learner.stderr);
    assert!(err.contains("holds no CA key"), "{err}");
    // Only admins: an operator is refused at the edge (and would be by apply), and a tenant's
    // user may not pull images onto nodes either.
    for (role, tenant, args) in [
        ("operator", None, set.to_vec()),
        (
            "user",
            Some("ct"),
            vec!["image", "pull", "--node", "2", "busybox"],
        ),
    ] {
        let mut mint = vec!["token", "create", "--role", role];
        if let Some(t) = tenant {
            mint.extend_from_slice(&["--tenant", t]);
        }
        let (code, token, err) = gpuctl(&c, &mint);
        assert_eq!(code, Some(0), "{err}");
        let bearer = token["bearer"].as_str().expect("bearer");
        let refused = c
            .gpuctl()
            .env("GPUCTL_TOKEN", bearer)
            .env_remove("GPUCTL_TOKEN_FILE")
            .args(["--endpoint", c.addr(1)])
            .args(&args)
            .output()
            .expect("gpuctl");
        let err = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(2), "{role}: {err}");
        assert!(err.to_lowercase().contains("permission"), "{role}: {err}");
    }
    let (code, tenant, err) = gpuctl(&c, &set);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        tenant["registry_logins"][0]["username"], "robot",
        "{tenant}"
    );
    assert_eq!(tenant["registry_logins"][0]["registry"], host.as_str());

    // The job runs on the learner, whose pull gets the login as a 0600 auth file.
    let (code, _, err) = gpuctl(&c, &["node", "cordon", "1"]);
    assert_eq!(code, Some(0), "{err}");
    let image = format!("{host}/gpumesh/private:1");
    let id = submit(&c, &["--image", &image, "--", "true"]);
    let shown = &image;
    c.wait_for(
        "the pull to start",
        Duration::from_secs(60),
        |c| async move {
            c.job(1, id)
                .await
                .is_ok_and(|j| j.phase.starts_with(&format!("pulling image {shown}")))
        },
    )
    .await;
    let auth = c.run_dir(2, id, 1).join("registry-auth.json");
    let mode = std::fs::metadata(&auth)
        .expect("the auth file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let v: Value = serde_json::from_slice(&std::fs::read(&auth).expect("read")).expect("json");
    // base64("robot:s3cret-Pa55word-XYZ")
    assert_eq!(
        v["auths"][host.as_str()]["auth"],
        "cm9ib3Q6czNjcmV0LVBhNTV3b3JkLVhZWg=="
    );
    let pulls = processes_naming(&image);
    assert!(
        pulls
            .iter()
            .any(|p| p.contains(&format!("--authfile {}", auth.display()))),
        "{pulls:?}"
    );
    c.cancel(1, id).await.expect("cancel");
    c.wait_job(id, Duration::from_secs(30), is_terminal).await;
    assert!(!auth.exists(), "the login goes with the pull");

    // Nowhere to be read: not job get, tenant get, the audit log, the agents' logs, their Raft
    // data (log, snapshot) or the run's files.
    for args in [
        vec!["job", "get", &id.to_string()],
        vec!["tenant", "get", "ct"],
        vec!["tenant", "list"],
        vec!["audit", "list"],
    ] {
        let (code, out, err) = gpuctl(&c, &args);
        assert_eq!(code, Some(0), "{args:?}: {err}");
        assert!(!out.to_string().contains(PASSWORD), "{args:?}: {out}");
    }
    let table = c
        .gpuctl()
        .args(["--endpoint", c.addr(1), "tenant", "get", "ct"])
        .output()
        .expect("gpuctl tenant get");
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(table.contains(&format!("{host} (robot)")), "{table}");
    assert!(!table.contains(PASSWORD), "{table}");
    // The check reads the replicated data as stored: the login's username is there in the clear.
    assert!(
        !files_containing(&c.root.path().join("node-2"), b"robot").is_empty(),
        "the learner's Raft data holds the (sealed) login"
    );
    let leaks = files_containing(c.root.path(), PASSWORD.as_bytes());
    let file = PathBuf::from(&file);
    assert_eq!(
        leaks.iter().filter(|p| **p != file).count(),
        0,
        "the password in plain text: {leaks:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpuctl_run_tells_the_pull_and_ctrl_c_cancels_it() {
    use std::io::BufRead;
    if !podman_here() {
        return;
    }
    let c = Cluster::start(1, 1, FAST_STOP).await;
    shared_dir(&c);
    let registry = SilentRegistry::start();
    let image = format!("{}/gpumesh/interactive:1", registry.addr);
    let mut child = c
        .gpuctl()
        .args([
            "--endpoint",
            c.addr(1),
            "run",
            "--tenant",
            "ct",
            "--image",
            &image,
        ])
        .args(["--", "true"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("gpuctl run");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut seen = Vec::new();
    let told = loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) if line.contains(&format!("pulling image {image}")) => break line,
            Ok(line) => seen.push(line),
            Err(e) => panic!("no pull phase on stderr ({e}): {seen:?}"),
        }
    };
    assert!(told.starts_with("gpuctl: j-"), "{told}");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("SIGINT");
    let status = child.wait().expect("gpuctl ends");
    assert_eq!(status.code(), Some(130), "cancelled by Ctrl-C");
}
