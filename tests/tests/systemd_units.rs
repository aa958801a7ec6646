//! Jobs as systemd transient units, against a real systemd: this machine's PID 1 is not systemd,
//! so each test boots one as PID 1 of new PID, mount and UTS namespaces (its `/run` a directory
//! of ours) and runs the agents inside them, so the supervisors' pids mean the same to an agent
//! and to systemd.
//!
//! - With `jobs.launcher = "auto"` the agent chooses systemd there; a job then runs as
//!   `gpumesh-j<id>-g<gen>.service` in `gpumesh.slice` with its limits and device allow-list
//!   (the kernel refuses it a GPU node that is not its own), its supervisor root and the job its
//!   user; a restarted agent adopts it; a cancel stops it and the outcome comes back through
//!   `exit.json`; the unit is gone after; a unit systemd refuses is the failed-to-start reason.
//! - Two agents boxed in the shipped unit's sandbox (its hardening lines, as transient units):
//!   the job of the one using the systemd launcher writes outside the agent's writable paths and
//!   creates a user namespace; the direct launcher's job, inside the box, can do neither.
//!
//! The booted systemd starts nothing but the system bus (the agents reach systemd through it):
//! every boot unit that could touch the host (tmpfiles cleaning `/tmp`, sysctl, udev, journald)
//! is masked in its `/run`, so a unit that pulled one in would fail to start instead. One booted
//! systemd at a time: they would share the host's cgroup hierarchies. Needs root
//! (`GPUMESH_REQUIRE_ROOT=1` makes that a failure, not a skip) and systemd, unshare, nsenter and
//! dbus-daemon (`GPUMESH_REQUIRE_SYSTEMD=1`).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gpu_proto::v1 as pb;
use gpu_tests::{AgentCommand, Cluster, Placement, free_addr, is_terminal, shell_job};

const SYSTEMD: &str = "/lib/systemd/systemd";

static ONE_SYSTEMD: Mutex<()> = Mutex::new(());

/// Units the test's systemd must never start, masked in its `/run/systemd/system`.
const MASKED: &[&str] = &[
    "sysinit.target",
    "basic.target",
    "local-fs.target",
    "swap.target",
    "sockets.target",
    "timers.target",
    "paths.target",
    "multi-user.target",
    "graphical.target",
    "systemd-tmpfiles-setup.service",
    "systemd-tmpfiles-setup-dev.service",
    "systemd-tmpfiles-clean.service",
    "systemd-tmpfiles-clean.timer",
    "systemd-sysctl.service",
    "systemd-modules-load.service",
    "systemd-udev-trigger.service",
    "systemd-udevd.service",
    "systemd-journald.service",
    "systemd-journald.socket",
    "systemd-journald-dev-log.socket",
    "systemd-timesyncd.service",
    "systemd-pstore.service",
    "systemd-random-seed.service",
];

/// Where a cgroup made by systemd ends (the test removes those it left behind).
const UNIT_SUFFIXES: &[&str] = &[".slice", ".scope", ".service", ".mount", ".socket", ".swap"];

/// Whether the test can run here; `false` after saying why (only when not required).
fn can_run() -> bool {
    if !nix::unistd::geteuid().is_root() {
        assert!(
            std::env::var_os("GPUMESH_REQUIRE_ROOT").is_none(),
            "GPUMESH_REQUIRE_ROOT is set but the test does not run as root"
        );
        eprintln!("skipping: booting a systemd in namespaces needs root");
        return false;
    }
    let missing: Vec<&str> = [
        SYSTEMD,
        "/usr/bin/unshare",
        "/usr/bin/nsenter",
        "/usr/bin/dbus-daemon",
    ]
    .into_iter()
    .filter(|p| !Path::new(p).exists())
    .collect();
    if !missing.is_empty() {
        assert!(
            std::env::var_os("GPUMESH_REQUIRE_SYSTEMD").is_none(),
            "GPUMESH_REQUIRE_SYSTEMD is set but {missing:?} are missing (apt-get install systemd util-linux dbus)"
        );
        eprintln!("skipping: {missing:?} not installed");
        return false;
    }
    true
}

/// A systemd booted as PID 1 of its own namespaces; killed, and its leftovers removed, on drop.
struct Systemd {
    unshare: Child,
    /// systemd's pid as this process sees it.
    pid: u32,
    /// Its `/run`.
    _run: tempfile::TempDir,
    cgroups_before: BTreeMap<PathBuf, BTreeSet<OsString>>,
    private_tmp_before: BTreeSet<OsString>,
    _turn: MutexGuard<'static, ()>,
}

impl Systemd {
    fn boot() -> Systemd {
        let turn = ONE_SYSTEMD.lock().unwrap_or_else(|p| p.into_inner());
        let run = tempfile::tempdir().expect("tempdir for /run");
        let units = run.path().join("systemd/system");
        std::fs::create_dir_all(&units).expect("unit directory");
        // The boot target: the system bus and nothing else. The bus units are Debian's less
        // their implicit dependencies on boot units (masked below).
        for (name, unit) in [
            (
                "gpumesh-test.target",
                "[Unit]\nDescription=gpumesh test boot: the system bus only\n\
                 DefaultDependencies=no\nWants=dbus.socket dbus.service\nAfter=dbus.service\n",
            ),
            (
                "dbus.socket",
                "[Unit]\nDescription=D-Bus System Message Bus Socket\nDefaultDependencies=no\n\
                 [Socket]\nListenStream=/run/dbus/system_bus_socket\n",
            ),
            (
                "dbus.service",
                "[Unit]\nDescription=D-Bus System Message Bus\nDefaultDependencies=no\n\
                 Requires=dbus.socket\nAfter=dbus.socket\n[Service]\nType=notify\n\
                 NotifyAccess=main\nExecStart=/usr/bin/dbus-daemon --system --address=systemd: \
                 --nofork --nopidfile --systemd-activation --syslog-only\n",
            ),
        ] {
            std::fs::write(units.join(name), unit).expect("write a unit");
        }
        for unit in MASKED {
            std::os::unix::fs::symlink("/dev/null", units.join(unit)).expect("mask");
        }
        let cgroups_before = cgroup_dirs();
        let private_tmp_before = private_tmp();
        let script = format!(
            "mount --bind {} /run && exec {SYSTEMD} --system --unit=gpumesh-test.target",
            run.path().display()
        );
        let unshare = Command::new("unshare")
            .args(["--pid", "--fork", "--mount", "--mount-proc", "--uts"])
            .args(["sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn unshare");
        let mut sd = Systemd {
            pid: 0,
            unshare,
            _run: run,
            cgroups_before,
            private_tmp_before,
            _turn: turn,
        };
        let start = Instant::now();
        while sd.pid == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "systemd did not start"
            );
            sd.pid = child_of(sd.unshare.id()).unwrap_or(0);
            std::thread::sleep(Duration::from_millis(50));
        }
        loop {
            let state = sd.systemctl(&["is-system-running"]);
            let state = String::from_utf8_lossy(&state.stdout).trim().to_owned();
            let bus = sd.show("dbus.service", &["ActiveState"]);
            let bus_up = bus.get("ActiveState").is_some_and(|v| v == &["active"]);
            if (state == "running" || state == "degraded") && bus_up {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the test's systemd is not up after 30 s: {state:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        sd
    }

    /// A guard that kills systemd, and with it every process of its namespaces, when dropped.
    /// Declared after a `Cluster` whose agents run inside, it drops first, so no agent writes
    /// into the cluster's directory while the cluster removes it.
    fn kill_first(&self) -> KillFirst {
        KillFirst { pid: self.pid }
    }

    /// The command prefix that runs a program inside systemd's namespaces.
    fn prefix(&self) -> Vec<String> {
        let pid = self.pid.to_string();
        ["nsenter", "-t", &pid, "-p", "-m", "--"]
            .map(str::to_owned)
            .to_vec()
    }

    fn systemctl(&self, args: &[&str]) -> Output {
        let prefix = self.prefix();
        Command::new(&prefix[0])
            .args(&prefix[1..])
            .args(["systemctl", "--no-pager"])
            .args(args)
            .output()
            .expect("run systemctl")
    }

    /// `systemctl show UNIT -p …` as a map.
    fn show(&self, unit: &str, props: &[&str]) -> BTreeMap<String, Vec<String>> {
        let mut args = vec!["show", unit];
        for p in props {
            args.extend(["-p", p]);
        }
        let out = self.systemctl(&args);
        let mut shown: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some((k, v)) = line.split_once('=') {
                shown.entry(k.to_owned()).or_default().push(v.to_owned());
            }
        }
        shown
    }
}

impl Drop for Systemd {
    fn drop(&mut self) {
        // PID 1 of a namespace gone: the kernel kills every process in it, then unshare exits.
        if let Ok(pid) = i32::try_from(self.pid)
            && pid > 0
        {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            )
            .ok();
        }
        self.unshare.kill().ok();
        self.unshare.wait().ok();
        remove_new_cgroups(&self.cgroups_before);
        for name in private_tmp().difference(&self.private_tmp_before) {
            let path = Path::new("/tmp").join(name);
            if let Err(e) = std::fs::remove_dir_all(&path) {
                eprintln!("cannot remove {}: {e}", path.display());
            }
        }
    }
}

struct KillFirst {
    pid: u32,
}

impl Drop for KillFirst {
    fn drop(&mut self) {
        let Ok(pid) = i32::try_from(self.pid) else {
            return;
        };
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .ok();
        // The namespace's init becomes a zombie only once every process in it has gone.
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next());
            if state.is_none_or(|s| s == 'Z') {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The first child of `pid`.
fn child_of(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Every cgroup hierarchy mounted under /sys/fs/cgroup (or the unified one itself) and the
/// cgroups directly below its root.
fn cgroup_dirs() -> BTreeMap<PathBuf, BTreeSet<OsString>> {
    let root = Path::new("/sys/fs/cgroup");
    let mut hierarchies = vec![root.to_owned()];
    if let Ok(entries) = std::fs::read_dir(root) {
        for e in entries.filter_map(Result::ok) {
            // Links (`cpu,cpuacct` → `cpu`) name a hierarchy twice.
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                hierarchies.push(e.path());
            }
        }
    }
    hierarchies
        .into_iter()
        .filter(|h| h.join("cgroup.procs").exists())
        .map(|h| {
            let subdirs = std::fs::read_dir(&h)
                .map(|es| {
                    es.filter_map(Result::ok)
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| e.file_name())
                        .collect()
                })
                .unwrap_or_default();
            (h, subdirs)
        })
        .collect()
}

/// Remove, deepest first, the cgroups systemd made (unit-named, new since `before`).
fn remove_new_cgroups(before: &BTreeMap<PathBuf, BTreeSet<OsString>>) {
    for (hierarchy, now) in cgroup_dirs() {
        let old = before.get(&hierarchy).cloned().unwrap_or_default();
        for name in now.difference(&old) {
            let unit_named = name
                .to_str()
                .is_some_and(|n| UNIT_SUFFIXES.iter().any(|s| n.ends_with(s)));
            if unit_named {
                remove_tree(&hierarchy.join(name));
            }
        }
    }
}

fn remove_tree(dir: &Path) {
    let mut dirs = vec![dir.to_owned()];
    let mut i = 0;
    while i < dirs.len() {
        if let Ok(entries) = std::fs::read_dir(&dirs[i]) {
            dirs.extend(
                entries
                    .filter_map(Result::ok)
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
        i += 1;
    }
    for d in dirs.iter().rev() {
        // A cgroup whose last task is still exiting refuses rmdir for a moment.
        let start = Instant::now();
        while let Err(e) = std::fs::remove_dir(d) {
            if e.kind() == std::io::ErrorKind::NotFound {
                break;
            }
            if start.elapsed() > Duration::from_secs(5) {
                eprintln!("cannot remove cgroup {}: {e}", d.display());
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn private_tmp() -> BTreeSet<OsString> {
    std::fs::read_dir("/tmp")
        .map(|es| {
            es.filter_map(Result::ok)
                .map(|e| e.file_name())
                .filter(|n| n.to_string_lossy().starts_with("systemd-private-"))
                .collect()
        })
        .unwrap_or_default()
}

/// The uid of process `pid` (as this process sees it).
fn uid_of(pid: &str) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn logs(c: &Cluster, id: u64, stderr: bool) -> String {
    let mut cmd = c.gpuctl();
    cmd.args(["--endpoint", c.addr(1), "job", "logs", &id.to_string()]);
    if stderr {
        cmd.arg("--stderr");
    }
    let out = cmd.output().expect("gpuctl job logs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_run_as_transient_units_of_a_real_systemd() {
    if !can_run() {
        return;
    }
    let sd = Systemd::boot();

    // A GPU device node that is not the job's: NVIDIA's major, a minor no sim GPU has.
    let devs = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(devs.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let foreign_gpu = devs.path().join("nvidia77");
    let made = Command::new("mknod")
        .arg(&foreign_gpu)
        .args(["c", "195", "77"])
        .status()
        .expect("mknod");
    assert!(made.success(), "mknod {}", foreign_gpu.display());
    std::fs::set_permissions(&foreign_gpu, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    // Outside any fence, opening it reaches the (absent) driver: ENXIO.
    let unfenced = std::fs::File::open(&foreign_gpu).expect_err("no driver behind it");
    assert_eq!(
        unfenced.raw_os_error(),
        Some(nix::libc::ENXIO),
        "{unfenced}"
    );

    // A lease that outlasts the agent's restart below.
    let toml = "[jobs]\nlease = \"6s\"\ndown_after = \"10s\"\nstop_grace = \"2s\"\n\
                launcher = \"auto\"\ndefault_tasks_max = 321\n";
    let mut c = Cluster::start_placed(
        1,
        toml,
        vec![Placement {
            addr: free_addr(),
            prefix: sd.prefix(),
        }],
    )
    .await;
    let _kill_first = sd.kill_first();
    // The job user must be able to pass through the cluster's (0700) directory to its run.
    std::fs::set_permissions(c.root.path(), std::fs::Permissions::from_mode(0o711))
        .expect("chmod the cluster directory");
    let log = c.log_of(1);
    assert!(
        log.contains("each job runs as a transient unit of its own in gpumesh.slice (systemd "),
        "auto did not choose systemd:\n{log}"
    );

    // Phase 1: a running job is its own unit, with its limits and devices.
    let script = format!(
        "head -c 1 /dev/null && echo null-ok; head -c 1 {} ; echo gpu-fenced; exec sleep 600",
        foreign_gpu.display()
    );
    let spec = pb::JobSpec {
        memory_mib: Some(256),
        cpu_millis: Some(500),
        ..shell_job("in-a-unit", 1, &script)
    };
    let id = c.submit(1, spec, "").await.expect("submit").job_id;
    let job = c
        .wait_job(id, Duration::from_secs(30), |j| {
            j.state == pb::JobState::Running as i32
        })
        .await;
    let unit = format!("gpumesh-j{id}-g{}.service", job.generation);
    let shown = sd.show(
        &unit,
        &[
            "ActiveState",
            "Slice",
            "MemoryLimit",
            "TasksMax",
            "CPUQuotaPerSecUSec",
            "DevicePolicy",
            "DeviceAllow",
            "KillMode",
            "Requires",
            "ControlGroup",
        ],
    );
    let one = |k: &str| {
        shown
            .get(k)
            .and_then(|v| v.first())
            .map_or("", String::as_str)
    };
    assert_eq!(one("ActiveState"), "active", "{shown:?}");
    assert_eq!(one("Slice"), "gpumesh.slice", "{shown:?}");
    assert_eq!(one("MemoryLimit"), (256u64 << 20).to_string(), "{shown:?}");
    assert_eq!(one("TasksMax"), "321", "{shown:?}");
    assert_eq!(one("CPUQuotaPerSecUSec"), "500ms", "{shown:?}");
    assert_eq!(one("DevicePolicy"), "closed", "{shown:?}");
    assert_eq!(one("KillMode"), "mixed", "{shown:?}");
    // The job's GPU by its numbers (the simulator's node is outside /dev), and the driver's
    // shared nodes.
    let allowed = shown.get("DeviceAllow").cloned().unwrap_or_default();
    let gpu_minor: u32 = allowed
        .iter()
        .find_map(|d| {
            d.strip_prefix("/dev/char/195:")?
                .strip_suffix(" rw")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("the job's GPU: {allowed:?}"));
    assert!(
        allowed.contains(&"/dev/nvidiactl rw".to_owned()),
        "{allowed:?}"
    );
    assert!(
        !one("Requires").contains("sysinit.target"),
        "a job unit must pull in no boot units: {shown:?}"
    );
    let status = sd.systemctl(&["status", &unit]);
    let status = String::from_utf8_lossy(&status.stdout).into_owned();
    assert!(
        status.contains("gpu-agent shim --systemd-unit") && status.contains("sleep 600"),
        "the supervisor and the job both in the unit:\n{status}"
    );
    println!("{status}");

    // The kernel's view: the unit's cgroup holds the root supervisor and the job as nobody.
    let cgroup = one("ControlGroup").to_owned();
    let procs = std::fs::read_to_string(format!("/sys/fs/cgroup/pids{cgroup}/cgroup.procs"))
        .expect("the unit's cgroup");
    let uids: BTreeSet<u32> = procs.lines().filter_map(uid_of).collect();
    assert_eq!(
        uids,
        BTreeSet::from([0, 65534]),
        "supervisor root, job nobody: {procs}"
    );
    // And its limits, where this host keeps them (cgroup v1 controllers, as here).
    let v1 = |controller: &str, file: &str| {
        let path = Path::new("/sys/fs/cgroup")
            .join(controller)
            .join(cgroup.trim_start_matches('/'))
            .join(file);
        std::fs::read_to_string(path)
            .ok()
            .map(|v| v.trim().to_owned())
    };
    if let Some(limit) = v1("memory", "memory.limit_in_bytes") {
        assert_eq!(limit, (256u64 << 20).to_string());
        assert_eq!(v1("pids", "pids.max").as_deref(), Some("321"));
        let quota = v1("cpu", "cpu.cfs_quota_us").expect("cpu quota");
        let period = v1("cpu", "cpu.cfs_period_us").expect("cpu period");
        let (quota, period): (u64, u64) = (quota.parse().expect("n"), period.parse().expect("n"));
        assert_eq!(quota * 1000 / period, 500, "half a core: {quota}/{period}");
    }
    let devices = Path::new("/sys/fs/cgroup/devices").join(cgroup.trim_start_matches('/'));
    if devices.exists() {
        let list = std::fs::read_to_string(devices.join("devices.list")).expect("devices.list");
        assert!(!list.contains("a *:* rwm"), "{list}");
        assert!(list.contains("c 1:3 rwm"), "/dev/null allowed: {list}");
        assert!(
            list.contains(&format!("c 195:{gpu_minor} rw")),
            "systemd read the GPU's numbers from its name: {list}"
        );
    }
    c.wait_for("the job's log", Duration::from_secs(10), |c| async move {
        logs(c, id, false).contains("gpu-fenced")
    })
    .await;
    assert!(logs(&c, id, false).contains("null-ok"));
    let err = logs(&c, id, true);
    assert!(
        err.contains("Operation not permitted"),
        "the kernel's fence (EPERM), not the missing driver (ENXIO): {err:?}"
    );

    // Phase 2: a restarted agent adopts the run (its supervisor is systemd's, not the agent's
    // child); a cancel then goes through the supervisor; the outcome comes back; the unit goes.
    let nsenter = c.pid(1).expect("n1 running");
    let agent = child_of(nsenter).expect("the agent inside the namespaces");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(agent).expect("pid")),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill -9 the agent");
    // nsenter exits once it has reaped the agent: only then is the data directory's lock free.
    let start = Instant::now();
    while c.exited(1).is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the agent did not die"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.start_agent(1);
    c.wait_serving().await;
    let adopted = c.job(1, id).await.expect("the job after the restart");
    assert_eq!(adopted.state, pb::JobState::Running as i32, "{adopted:?}");
    let still = sd.show(&unit, &["ActiveState"]);
    assert!(
        still.get("ActiveState").is_some_and(|v| v == &["active"]),
        "{still:?}"
    );
    c.cancel(1, id).await.expect("cancel");
    let cancelled = c.wait_job(id, Duration::from_secs(30), is_terminal).await;
    assert_eq!(
        cancelled.state,
        pb::JobState::Cancelled as i32,
        "{cancelled:?}"
    );
    wait_gone(&sd, &unit, &c).await;

    // Phase 3: an exit status travels through exit.json, and is reported as soon as systemd
    // has collected the unit (not at the executor's next tick).
    let id = c
        .submit(1, shell_job("exits", 0, "sleep 1; exit 3"), "")
        .await
        .expect("submit")
        .job_id;
    let done = c.wait_job(id, Duration::from_secs(30), is_terminal).await;
    assert_eq!(done.exit_code, Some(3), "{done:?}");
    assert_eq!(done.state, pb::JobState::Failed as i32, "{done:?}");
    let ran_ms = done.finished_at_ms.unwrap_or(0) - done.started_at_ms.unwrap_or(0);
    println!("a 1 s job ran {ran_ms} ms from started to finished as the cluster saw it");
    wait_gone(
        &sd,
        &format!("gpumesh-j{id}-g{}.service", done.generation),
        &c,
    )
    .await;

    // Phase 4: a unit systemd refuses (its name taken) is the run's failed-to-start reason.
    let next = id + 1;
    let squatter = format!("gpumesh-j{next}-g1.service");
    let prefix = sd.prefix();
    let run = Command::new(&prefix[0])
        .args(&prefix[1..])
        .args([
            "systemd-run",
            "--unit",
            &squatter,
            "-p",
            "DefaultDependencies=no",
        ])
        .args(["sleep", "600"])
        .output()
        .expect("systemd-run");
    assert!(run.status.success(), "{run:?}");
    let id = c
        .submit(1, shell_job("refused", 0, "true"), "")
        .await
        .expect("submit")
        .job_id;
    assert_eq!(id, next, "job ids are sequential");
    let refused = c.wait_job(id, Duration::from_secs(30), is_terminal).await;
    assert_eq!(refused.state, pb::JobState::Failed as i32, "{refused:?}");
    assert!(
        refused.outcome.contains("systemd refused to start") && refused.outcome.contains(&squatter),
        "{refused:?}"
    );
    println!("refused: {}", refused.outcome);
}

/// Wait until systemd has collected `unit`.
async fn wait_gone(sd: &Systemd, unit: &str, c: &Cluster) {
    let start = Instant::now();
    loop {
        let state = sd.show(unit, &["LoadState", "ActiveState"]);
        let load = state.get("LoadState").and_then(|v| v.first()).cloned();
        if load.as_deref() == Some("not-found") {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{unit} still there: {state:?}\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The hardening lines of the shipped unit (`deploy/systemd/gpu-agent.service`) as transient
/// unit properties. Left out: what names the installed paths (its `ReadWritePaths`,
/// `StateDirectory`, …; the test's own `/tmp` and the cgroup tree stand in) and `PrivateTmp`
/// (the agents' files are in `/tmp`).
fn shipped_sandbox() -> Vec<String> {
    const KEYS: &[&str] = &[
        "CapabilityBoundingSet",
        "NoNewPrivileges",
        "ProtectSystem",
        "ProtectHome",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectKernelLogs",
        "ProtectControlGroups",
        "ProtectClock",
        "ProtectHostname",
        "RestrictNamespaces",
        "RestrictRealtime",
        "RestrictSUIDSGID",
        "LockPersonality",
        "RestrictAddressFamilies",
        "SystemCallArchitectures",
        "DeviceAllow",
        "DevicePolicy",
        "KillMode",
        "UMask",
    ];
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd/gpu-agent.service");
    let unit = std::fs::read_to_string(&path).expect("read the shipped unit");
    let mut props: Vec<String> = unit
        .lines()
        .filter(|l| l.split_once('=').is_some_and(|(k, _)| KEYS.contains(&k)))
        .map(str::to_owned)
        .collect();
    for line in ["ProtectSystem=strict", "RestrictNamespaces=yes"] {
        assert!(
            props.iter().any(|p| p == line),
            "{line} left the unit: {props:?}"
        );
    }
    props.push("ReadWritePaths=/tmp /sys/fs/cgroup".into());
    props
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_boxed_agent_starts_jobs_outside_its_box_unless_direct() {
    if !can_run() {
        return;
    }
    let sd = Systemd::boot();
    // Outside every path the agent may write (ProtectSystem=strict); open to the job users.
    let outside = tempfile::Builder::new()
        .prefix("gpumesh-sandbox-")
        .tempdir_in("/var/tmp")
        .expect("a directory in /var/tmp");
    std::fs::set_permissions(outside.path(), std::fs::Permissions::from_mode(0o1777))
        .expect("chmod");
    let sandbox = shipped_sandbox();
    let boxed = |node: u64| {
        let mut prefix = sd.prefix();
        prefix.extend(
            [
                "systemd-run",
                "--quiet",
                "--pipe",
                "--collect",
                "-p",
                "DefaultDependencies=no",
                "-E",
                "RUST_LOG=info,openraft=warn",
            ]
            .map(str::to_owned),
        );
        prefix.push(format!("--unit=gpumesh-test-agent-n{node}.service"));
        for p in &sandbox {
            prefix.extend(["-p".to_owned(), p.clone()]);
        }
        prefix.push("--".into());
        Placement {
            addr: free_addr(),
            prefix,
        }
    };
    let toml =
        "[jobs]\nlease = \"4s\"\ndown_after = \"8s\"\nstop_grace = \"2s\"\nlauncher = \"auto\"\n";
    let c = Cluster::start_prepared(
        1,
        toml,
        vec![boxed(1), boxed(2)],
        AgentCommand::default(),
        |c| {
            // The job users pass through to their runs (the agents' umask is the unit's 0027).
            let traversable = std::fs::Permissions::from_mode(0o711);
            std::fs::set_permissions(c.root.path(), traversable.clone()).expect("chmod root");
            for (id, launcher) in [(1, "auto"), (2, "direct")] {
                let data = c.root.path().join(format!("node-{id}"));
                std::fs::create_dir_all(data.join("jobs")).expect("data directory");
                std::fs::set_permissions(&data, traversable.clone()).expect("chmod");
                std::fs::set_permissions(data.join("jobs"), traversable.clone()).expect("chmod");
                let config = &c.agents[&id].config;
                let text = std::fs::read_to_string(config).expect("config");
                let text =
                    text.replace("launcher = \"auto\"", &format!("launcher = \"{launcher}\""));
                std::fs::write(
                    config,
                    format!("labels = {{ launcher = \"{launcher}\" }}\n{text}"),
                )
                .expect("write config");
            }
        },
    )
    .await;
    let _kill_first = sd.kill_first();
    assert!(
        c.log_of(1)
            .contains("each job runs as a transient unit of its own"),
        "{}",
        c.log_of(1)
    );
    assert!(
        c.log_of(2).contains("jobs.launcher = \"direct\""),
        "{}",
        c.log_of(2)
    );

    let mut ran = BTreeMap::new();
    for launcher in ["auto", "direct"] {
        let marker = outside.path().join(format!("written-by-{launcher}"));
        let script = format!(
            "touch {}; echo write=$?; unshare --user true; echo userns=$?",
            marker.display()
        );
        let spec = pb::JobSpec {
            node_selector: [("launcher".to_owned(), launcher.to_owned())].into(),
            ..shell_job(launcher, 0, &script)
        };
        let id = c.submit(1, spec, "").await.expect("submit").job_id;
        let done = c.wait_job(id, Duration::from_secs(30), is_terminal).await;
        assert_eq!(done.state, pb::JobState::Succeeded as i32, "{done:?}");
        ran.insert(
            launcher,
            (logs(&c, id, false), logs(&c, id, true), marker.exists()),
        );
    }
    println!("{ran:#?}");
    let (out, err, wrote) = &ran["auto"];
    assert!(
        out.contains("write=0") && out.contains("userns=0") && *wrote,
        "a job in its own unit is not held by the agent's sandbox: {out:?} {err:?}"
    );
    let (out, err, wrote) = &ran["direct"];
    assert!(
        out.contains("write=1") && err.contains("Read-only file system") && !*wrote,
        "a direct job inherits ProtectSystem=strict: {out:?} {err:?}"
    );
    assert!(
        out.contains("userns=1") && err.contains("Operation not permitted"),
        "a direct job inherits RestrictNamespaces=yes: {out:?} {err:?}"
    );
}
