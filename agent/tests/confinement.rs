//! What confines a job, through the real `gpu-agent shim` started with the arguments the
//! executor builds, in the job cgroups this host really has (cgroup v1 on the project's CI
//! machines, v2 elsewhere): the device fence (a job opens its own simulated GPU's node and gets
//! ENXIO, no driver being there, and EPERM for another's; without the fence both give ENXIO),
//! the limits written into its cgroups (its request, or the defaults for a CPU-only job),
//! "out of memory" for a job killed by its memory cgroup, a job without the agent's OOM shield,
//! cgroups removed after each run, and those of supervisors killed outright swept.
//!
//! Cgroups and device nodes need root: without it these tests say why and return, unless
//! `GPUMESH_REQUIRE_ROOT=1` (CI), which makes them fail instead.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpu_agent::config::{Confine, RunAs};
use gpu_agent::executor::cgroup_v1::Controller;
use gpu_agent::executor::cgroups::CgroupLayout;
use gpu_agent::executor::confine::Confinement;
use gpu_agent::executor::device_fence;
use gpu_agent::executor::job_dir::JobDir;
use gpu_agent::executor::limits::Limits;
use gpu_agent::executor::{ExecutorSettings, isolation, prepare_run, supervisor_command};
use gpu_agent::gpu::{DeviceNode, GpuBackend, SimBackend};
use gpu_raft_store::{JobSpec, Outcome};

/// Root, or say why the test returns (and fail under `GPUMESH_REQUIRE_ROOT=1`).
fn root(why: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("GPUMESH_REQUIRE_ROOT").is_none(),
        "GPUMESH_REQUIRE_ROOT is set, but this test is not root ({why})"
    );
    eprintln!("SKIPPED: {why} needs root, and this test is not root");
    false
}

/// One test's job cgroups: the layout `CgroupLayout::detect` finds under a root name of its
/// own (tests run in parallel), removed (with anything a failed test left in it) when dropped.
struct Cgroups {
    layout: CgroupLayout,
}

impl Cgroups {
    fn detect(test: &str) -> Cgroups {
        let root = PathBuf::from(format!(
            "/sys/fs/cgroup/gpumesh-test-{}-{test}",
            std::process::id()
        ));
        Cgroups {
            layout: CgroupLayout::detect(&root),
        }
    }

    fn roots(&self) -> Vec<PathBuf> {
        match &self.layout {
            CgroupLayout::V2 { root } => vec![root.clone()],
            CgroupLayout::V1 { roots } => roots.values().cloned().collect(),
            CgroupLayout::None { .. } => Vec::new(),
        }
    }

    /// The run cgroups of job `job` left under the roots.
    fn left_of(&self, job: u64) -> Vec<PathBuf> {
        self.roots()
            .iter()
            .filter_map(|r| std::fs::read_dir(r).ok())
            .flatten()
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("job-{job}-g")))
            })
            .collect()
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        for root in self.roots() {
            for child in std::fs::read_dir(&root).into_iter().flatten().flatten() {
                if child.path().is_dir() {
                    std::fs::remove_dir(child.path()).ok();
                }
            }
            std::fs::remove_dir(&root).ok();
        }
    }
}

/// A jobs directory laid out as an agent's, reachable by other users, with two simulated GPUs
/// that have real device nodes.
struct Node {
    tmp: tempfile::TempDir,
    settings: ExecutorSettings,
    gpus: Vec<DeviceNode>,
}

impl Node {
    fn new() -> Node {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod tempdir");
        let jobs_dir = tmp.path().join("jobs");
        std::fs::create_dir(&jobs_dir).expect("jobs dir");
        std::fs::set_permissions(&jobs_dir, std::fs::Permissions::from_mode(0o711))
            .expect("chmod jobs dir");
        let lease_path = tmp.path().join("lease");
        // The lease timeout below outlasts every test, so the file never needs renewing.
        std::fs::write(&lease_path, "0").expect("lease");
        let sim = SimBackend::from_spec("2xA100-80GB", 7)
            .expect("spec")
            .with_device_nodes(&tmp.path().join("dev"), 7);
        let gpus = sim
            .devices()
            .into_iter()
            .map(|d| {
                d.device_node
                    .expect("as root the simulated GPUs have nodes")
            })
            .collect();
        let settings = ExecutorSettings {
            jobs_dir,
            lease_path,
            lease: Duration::from_secs(600),
            stop_grace: Duration::from_secs(2),
            agent_exe: env!("CARGO_BIN_EXE_gpu-agent").into(),
            tick: Duration::from_secs(1),
            run_as: nobody(),
            run_as_by_tenant: BTreeMap::new(),
            cgroup_root: "/nonexistent".into(),
            uid_range: Default::default(),
            disk: Default::default(),
            containers: Default::default(),
            confine: Confine {
                default_tasks_max: 64,
                ..Confine::default()
            },
        };
        Node {
            tmp,
            settings,
            gpus,
        }
    }

    /// The executor's plan for `spec` bound to GPU 0 (`bound`) or no GPU, in `layout`.
    fn plan(&self, spec: &JobSpec, layout: &CgroupLayout, bound: bool) -> Confinement {
        let gpus: Vec<Option<DeviceNode>> = self
            .gpus
            .iter()
            .take(usize::from(bound))
            .cloned()
            .map(Some)
            .collect();
        Confinement {
            cgroups: layout.clone(),
            limits: Limits::for_job(spec, &self.settings.confine),
            devices: device_fence::allow_list(&gpus, &device_fence::host_majors(), &[]),
        }
    }

    /// Start the supervisor for run (job, 1) as the executor would.
    fn start(&self, job: u64, spec: &JobSpec, plan: &Confinement) -> (JobDir, Supervisor) {
        let dir = JobDir::new(&self.settings.jobs_dir, job, 1);
        let args: Vec<OsString> =
            prepare_run(&self.settings, spec, &dir, 1, plan, &[], None).expect("prepare the run");
        let child = supervisor_command(&self.settings.agent_exe, &args)
            .spawn()
            .expect("spawn the supervisor");
        (dir, Supervisor(child))
    }
}

struct Supervisor(std::process::Child);

impl Supervisor {
    fn wait(mut self, dir: &JobDir) -> Outcome {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.0.try_wait().expect("try_wait") {
                assert!(status.success(), "the supervisor failed: {status}");
                return dir.exit().expect("exit.json is written");
            }
            assert!(Instant::now() < deadline, "the supervisor did not finish");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            // SIGTERM: the supervisor stops the job and removes its cgroups.
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.0.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            )
            .ok();
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(self.0.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            self.0.kill().ok();
            self.0.wait().ok();
        }
    }
}

fn nobody() -> RunAs {
    let user = nix::unistd::User::from_name("nobody")
        .expect("reading the user database")
        .expect("this host has a user nobody");
    RunAs {
        name: "nobody".into(),
        uid: user.uid.as_raw(),
        gid: user.gid.as_raw(),
    }
}

fn shell(script: &str, request: serde_json::Value) -> JobSpec {
    let mut spec = serde_json::json!({
        "name": "fence",
        "command": ["sh", "-c", script],
    });
    if let (Some(spec), Some(request)) = (spec.as_object_mut(), request.as_object()) {
        spec.extend(request.clone());
    }
    serde_json::from_value(spec).expect("spec")
}

fn read_work(dir: &JobDir, name: &str) -> String {
    std::fs::read_to_string(isolation::work_dir(&dir.path).join(name)).unwrap_or_else(|e| {
        panic!(
            "{name}: {e}; stderr.log: {:?}",
            std::fs::read_to_string(dir.stderr())
        )
    })
}

/// Opening each GPU node, as the job's user: the shell's message for each.
fn open_each(nodes: &[DeviceNode]) -> String {
    nodes
        .iter()
        .enumerate()
        .map(|(i, n)| format!("(exec 3<{}) 2> open{i}; ", n.path.display()))
        .chain(["true".to_owned()])
        .collect()
}

fn on_nodev_mount(dir: &Path) -> bool {
    nix::sys::statvfs::statvfs(dir)
        .is_ok_and(|s| s.flags().contains(nix::sys::statvfs::FsFlags::ST_NODEV))
}

#[test]
fn a_job_opens_its_own_gpu_node_but_not_another() {
    if !root("creating device nodes and cgroups") {
        return;
    }
    let node = Node::new();
    if on_nodev_mount(node.tmp.path()) {
        eprintln!(
            "SKIPPED: {} is on a nodev mount: no device node opens there",
            node.tmp.path().display()
        );
        return;
    }
    let cgroups = Cgroups::detect("fence");
    if let Some(why) = cgroups.layout.unfenced_reason() {
        eprintln!(
            "SKIPPED: {why}: this host cannot fence devices ({})",
            cgroups.layout.describe()
        );
        return;
    }
    let spec = shell(&open_each(&node.gpus), serde_json::json!({"gpus": 1}));

    // Fenced to GPU 0: its own node passes the fence (no driver: ENXIO); GPU 1's does not.
    let (dir, shim) = node.start(1, &spec, &node.plan(&spec, &cgroups.layout, true));
    assert_eq!(shim.wait(&dir), Outcome::Exited { code: 0 });
    let own = read_work(&dir, "open0");
    let other = read_work(&dir, "open1");
    assert!(own.contains("No such device or address"), "GPU 0: {own}");
    assert!(other.contains("Operation not permitted"), "GPU 1: {other}");
    let stderr = std::fs::read_to_string(dir.stderr()).expect("stderr.log");
    assert!(!stderr.contains("not fenced"), "{stderr}");

    // Without the fence (no job cgroups), both reach the missing driver: the test can fail.
    let none = CgroupLayout::None {
        reason: "unfenced on purpose".into(),
    };
    let (dir, shim) = node.start(2, &spec, &node.plan(&spec, &none, true));
    assert_eq!(shim.wait(&dir), Outcome::Exited { code: 0 });
    for i in 0..2 {
        let seen = read_work(&dir, &format!("open{i}"));
        assert!(
            seen.contains("No such device or address"),
            "GPU {i} unfenced: {seen}"
        );
    }
    let stderr = std::fs::read_to_string(dir.stderr()).expect("stderr.log");
    assert!(
        stderr.contains("the job's devices are not fenced"),
        "{stderr}"
    );
    assert!(cgroups.left_of(1).is_empty(), "{:?}", cgroups.left_of(1));
}

/// A job that records its cgroups and waits for `release`.
const WAIT_FOR_RELEASE: &str = "cat /proc/self/cgroup > cgroup; touch started; \
     i=0; while [ ! -e release ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done";

/// Start `spec` (which runs `WAIT_FOR_RELEASE`), hand its cgroups to `check` while it runs,
/// release it, and check it ended well and left no cgroup behind.
fn while_running(
    node: &Node,
    cgroups: &Cgroups,
    job: u64,
    spec: &JobSpec,
    check: impl FnOnce(&BTreeMap<String, PathBuf>),
) {
    let (dir, shim) = node.start(job, spec, &node.plan(spec, &cgroups.layout, false));
    let work = isolation::work_dir(&dir.path);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !work.join("started").exists() {
        assert!(
            Instant::now() < deadline,
            "the job did not start; stderr.log: {:?}",
            std::fs::read_to_string(dir.stderr())
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Each hierarchy's cgroup of the job, from its own /proc/self/cgroup.
    let own: BTreeMap<String, PathBuf> = read_work(&dir, "cgroup")
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            path.contains(&format!("/job-{job}-g1-s"))
                .then(|| (controllers.to_owned(), PathBuf::from(path)))
        })
        .collect();
    check(&own);
    std::fs::write(work.join("release"), "").expect("release the job");
    assert_eq!(shim.wait(&dir), Outcome::Exited { code: 0 });
    assert!(
        cgroups.left_of(job).is_empty(),
        "left behind: {:?}",
        cgroups.left_of(job)
    );
    let stderr = std::fs::read_to_string(dir.stderr()).expect("stderr.log");
    assert!(!stderr.contains("not enforced"), "{stderr}");
}

/// The value of `file` in the job's cgroup of `controller` (v1) or its only cgroup (v2).
fn value(
    layout: &CgroupLayout,
    own: &BTreeMap<String, PathBuf>,
    controller: Controller,
    file: &str,
) -> String {
    let path = match layout {
        CgroupLayout::V1 { .. } => {
            // `cpu` may share a hierarchy: `cpu,cpuacct`.
            let rel = own
                .iter()
                .find(|(names, _)| names.split(',').any(|n| n == controller.name()))
                .map(|(_, rel)| rel)
                .unwrap_or_else(|| panic!("the job is in no {controller} cgroup: {own:?}"));
            let mount = match layout {
                CgroupLayout::V1 { roots } => {
                    roots[&controller].parent().expect("mount").to_owned()
                }
                _ => unreachable!(),
            };
            mount
                .join(rel.strip_prefix("/").expect("absolute"))
                .join(file)
        }
        CgroupLayout::V2 { root } => {
            let rel = own.get("").expect("the job's v2 cgroup");
            root.parent()
                .expect("mount")
                .join(rel.strip_prefix("/").expect("absolute"))
                .join(file)
        }
        CgroupLayout::None { .. } => unreachable!(),
    };
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_owned()
}

#[test]
fn the_requested_limits_are_in_the_jobs_cgroups() {
    if !root("creating cgroups") {
        return;
    }
    let node = Node::new();
    let cgroups = Cgroups::detect("limits");
    if !cgroups.layout.has_job_cgroups() {
        eprintln!(
            "SKIPPED: no job cgroups here ({})",
            cgroups.layout.describe()
        );
        return;
    }
    let spec = shell(
        WAIT_FOR_RELEASE,
        serde_json::json!({"cpu_millis": 500, "memory_mib": 256}),
    );
    let layout = &cgroups.layout;
    while_running(&node, &cgroups, 3, &spec, |own| match layout {
        CgroupLayout::V1 { roots } => {
            if roots.contains_key(&Controller::Cpu) {
                assert_eq!(
                    value(layout, own, Controller::Cpu, "cpu.cfs_quota_us"),
                    "50000"
                );
                assert_eq!(
                    value(layout, own, Controller::Cpu, "cpu.cfs_period_us"),
                    "100000"
                );
            }
            assert_eq!(
                value(layout, own, Controller::Memory, "memory.limit_in_bytes"),
                (256u64 << 20).to_string()
            );
            assert_eq!(value(layout, own, Controller::Pids, "pids.max"), "64");
            assert!(own.keys().any(|k| k == "devices"), "fenced: {own:?}");
        }
        _ => {
            assert_eq!(
                value(layout, own, Controller::Memory, "memory.max"),
                (256u64 << 20).to_string()
            );
            assert_eq!(
                value(layout, own, Controller::Cpu, "cpu.max"),
                "50000 100000"
            );
        }
    });
}

#[test]
fn a_cpu_only_job_without_a_request_gets_the_defaults() {
    if !root("creating cgroups") {
        return;
    }
    let node = Node::new();
    let cgroups = Cgroups::detect("defaults");
    let CgroupLayout::V1 { roots } = &cgroups.layout else {
        eprintln!(
            "SKIPPED: checked on cgroup v1 hosts (this one: {})",
            cgroups.layout.describe()
        );
        return;
    };
    let spec = shell(WAIT_FOR_RELEASE, serde_json::json!({}));
    let defaults = Confine::default();
    let layout = &cgroups.layout;
    while_running(&node, &cgroups, 4, &spec, |own| {
        if roots.contains_key(&Controller::Cpu) {
            assert_eq!(
                value(layout, own, Controller::Cpu, "cpu.cfs_quota_us"),
                (u64::from(defaults.default_cpu_millis) * 100).to_string()
            );
        }
        assert_eq!(
            value(layout, own, Controller::Memory, "memory.limit_in_bytes"),
            (defaults.default_memory_mib << 20).to_string()
        );
        assert_eq!(value(layout, own, Controller::Pids, "pids.max"), "64");
    });
}

#[test]
fn a_job_past_its_memory_limit_ends_out_of_memory() {
    if !root("creating cgroups") {
        return;
    }
    let node = Node::new();
    let cgroups = Cgroups::detect("oom");
    if !cgroups.layout.has_job_cgroups() {
        eprintln!(
            "SKIPPED: no job cgroups here ({})",
            cgroups.layout.describe()
        );
        return;
    }
    // tail keeps the whole line: 500 MiB of zeros without a newline.
    let spec = shell(
        "head -c 500m /dev/zero | tail > /dev/null",
        serde_json::json!({"memory_mib": 64}),
    );
    let (dir, shim) = node.start(5, &spec, &node.plan(&spec, &cgroups.layout, false));
    let outcome = shim.wait(&dir);
    assert_eq!(
        outcome,
        Outcome::OutOfMemory {
            limit_mib: Some(64)
        },
        "stderr.log: {:?}",
        std::fs::read_to_string(dir.stderr())
    );
    assert_eq!(outcome.to_string(), "out of memory (limit 64 MiB)");
    assert!(cgroups.left_of(5).is_empty());
    // The supervisor, which wrote exit.json above, was not the one killed; a job within its
    // limit still succeeds in the same cgroups.
    let fine = shell(
        "head -c 8m /dev/zero | tail > /dev/null",
        serde_json::json!({"memory_mib": 64}),
    );
    let (dir, shim) = node.start(6, &fine, &node.plan(&fine, &cgroups.layout, false));
    assert_eq!(shim.wait(&dir), Outcome::Exited { code: 0 });
}

#[test]
fn a_fork_bomb_stops_at_the_task_limit() {
    if !root("creating cgroups") {
        return;
    }
    let node = Node::new();
    let cgroups = Cgroups::detect("tasks");
    let enforced = match &cgroups.layout {
        CgroupLayout::V1 { roots } => roots.contains_key(&Controller::Pids),
        CgroupLayout::V2 { root } => root.join("cgroup.subtree_control").exists(),
        CgroupLayout::None { .. } => false,
    };
    if !enforced {
        eprintln!(
            "SKIPPED: no pids controller here ({})",
            cgroups.layout.describe()
        );
        return;
    }
    // A shell starting 100 sleeping children under a limit of 64 tasks: a fork fails (and
    // the shell gives up there); the cgroup's removal kills the children left.
    let spec = shell(
        "i=0; while [ $i -lt 100 ]; do sleep 3 & i=$((i+1)); echo $i > started; done",
        serde_json::json!({}),
    );
    let (dir, shim) = node.start(7, &spec, &node.plan(&spec, &cgroups.layout, false));
    let outcome = shim.wait(&dir);
    let started: u32 = read_work(&dir, "started").trim().parse().expect("count");
    let stderr = std::fs::read_to_string(dir.stderr()).expect("stderr.log");
    assert!(
        (50..64).contains(&started),
        "{started} children started; {outcome}; {stderr}"
    );
    assert!(stderr.to_lowercase().contains("fork"), "{stderr}");
    assert_ne!(outcome, Outcome::Exited { code: 0 });
    assert!(cgroups.left_of(7).is_empty());
}

/// Puts this process's `oom_score_adj` back when dropped.
struct OomScore(String);

impl Drop for OomScore {
    fn drop(&mut self) {
        std::fs::write("/proc/self/oom_score_adj", &self.0).ok();
    }
}

#[test]
fn a_job_gives_up_the_agents_oom_shield() {
    if !root("lowering an OOM score") {
        return;
    }
    let node = Node::new();
    let cgroups = Cgroups::detect("oom-score");
    // As the agent does at start (`Host::prepare`); its supervisors inherit it.
    let _restore = OomScore(
        std::fs::read_to_string("/proc/self/oom_score_adj")
            .expect("our OOM score")
            .trim()
            .to_owned(),
    );
    // Root in a sandbox without CAP_SYS_RESOURCE may not lower its score (nor may the agent,
    // which says so at start): a raised score, which anyone may set, shows the reset instead.
    let shield = ["-1000", "300"]
        .into_iter()
        .find(|score| std::fs::write("/proc/self/oom_score_adj", score).is_ok())
        .expect("an OOM score of 300 may always be set");
    let spec = shell(
        "cat /proc/self/oom_score_adj > job; cat /proc/$PPID/oom_score_adj > supervisor",
        serde_json::json!({}),
    );
    let (dir, shim) = node.start(8, &spec, &node.plan(&spec, &cgroups.layout, false));
    assert_eq!(shim.wait(&dir), Outcome::Exited { code: 0 });
    assert_eq!(
        read_work(&dir, "supervisor").trim(),
        shield,
        "the supervisor keeps the agent's score"
    );
    assert_eq!(read_work(&dir, "job").trim(), "0", "the job does not");
}

#[test]
fn the_empty_cgroups_of_supervisors_that_are_gone_are_swept() {
    if !root("job cgroups") {
        return;
    }
    let cgroups = Cgroups::detect("sweep");
    let roots = cgroups.roots();
    assert!(!roots.is_empty(), "{}", cgroups.layout.describe());
    let mut exited = std::process::Command::new("true").spawn().expect("spawn");
    exited.wait().expect("wait");
    let dead = exited.id();
    let mut sleeper = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("spawn");
    for root in &roots {
        std::fs::create_dir(root.join(format!("job-1-g1-s{dead}"))).expect("mkdir");
        let busy = root.join(format!("job-2-g1-s{dead}"));
        std::fs::create_dir(&busy).expect("mkdir");
        std::fs::write(busy.join("cgroup.procs"), sleeper.id().to_string()).expect("move in");
        let alive = format!("job-3-g1-s{}", std::process::id());
        std::fs::create_dir(root.join(alive)).expect("mkdir");
    }
    assert_eq!(cgroups.layout.sweep_leftovers(), roots.len());
    assert!(cgroups.left_of(1).is_empty(), "the empty leftover went");
    assert_eq!(
        cgroups.left_of(2).len(),
        roots.len(),
        "one with a process stays"
    );
    assert_eq!(
        cgroups.left_of(3).len(),
        roots.len(),
        "a live supervisor's stays"
    );
    sleeper.kill().expect("kill");
    sleeper.wait().expect("reap");
    assert_eq!(cgroups.layout.sweep_leftovers(), roots.len());
    assert!(cgroups.left_of(2).is_empty(), "emptied, it goes too");
}
