//! A run as a systemd transient unit: its name and the properties the executor hands to
//! `StartTransientUnit`, computed purely from the run and the executor's settings (the D-Bus
//! client, `systemd_bus.rs`, only encodes them).
//!
//! The unit runs the same supervisor (`gpu-agent shim`) the direct launcher starts, with the
//! same arguments plus `--systemd-unit`, so the supervisor leaves cgroups to systemd. It stays
//! root inside the unit: it writes `exit.json` (which the job must not be able to forge) and
//! enforces the lease fence and the wall-time limit; the job process alone runs as the job's
//! user. The unit carries the limits for the whole run (supervisor and job, a few MiB apart).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gpu_raft_store::JobId;

/// The slice every run's unit is placed in (created by systemd on first use).
pub(crate) const SLICE: &str = "gpumesh.slice";

/// How long systemd waits, past the supervisor's own stop grace, before it SIGKILLs what is left
/// of a unit it was asked to stop: the supervisor escalates to SIGKILL at the grace itself, so
/// systemd's kill is only the backstop.
const STOP_MARGIN: Duration = Duration::from_secs(10);

/// The lowest CPU quota the kernel accepts: 1 ms per 100 ms period, i.e. 10 ms per second (the
/// same floor the direct path's `cpu.max` gets).
const MIN_CPU_QUOTA_PER_SEC: Duration = Duration::from_millis(10);

/// The NVIDIA devices every GPU job needs besides its own GPUs: the control device, unified
/// memory, and (by driver major) the capability devices through which MIG instances are opened.
const NVIDIA_SHARED: [&str; 4] = [
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "char-nvidia-caps",
];

/// Which memory property the host's systemd enforces: `MemoryLimit=` on the legacy (v1)
/// memory controller, `MemoryMax=` on the unified (v2) hierarchy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CgroupVersion {
    /// `/sys/fs/cgroup` is cgroup v1 (legacy or hybrid: the memory controller is v1).
    V1,
    /// `/sys/fs/cgroup` is the unified cgroup v2 hierarchy.
    V2,
}

impl CgroupVersion {
    /// The host's, from whether `/sys/fs/cgroup` is itself a cgroup v2 root (a hybrid host has
    /// its v2 tree at `/sys/fs/cgroup/unified` and its controllers on v1).
    pub(crate) fn of_host() -> Self {
        if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            CgroupVersion::V2
        } else {
            CgroupVersion::V1
        }
    }
}

/// One value of a unit property, in the D-Bus type systemd expects for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Value {
    /// `s`
    Str(String),
    /// `b`
    Bool(bool),
    /// `t`
    U64(u64),
    /// `as`
    Strs(Vec<String>),
    /// `a(sasb)`: one command, its path and argv (argv[0] included), failure not ignored.
    Exec { path: String, argv: Vec<String> },
    /// `a(ss)`: device path or `char-<driver>` pattern, and access (`rw`).
    Devices(Vec<(String, String)>),
}

/// Everything the unit of one run is computed from.
#[derive(Clone, Debug)]
pub(crate) struct UnitSpec<'a> {
    pub job: JobId,
    pub generation: u64,
    pub job_name: &'a str,
    /// The supervisor program (`gpu-agent`) and its arguments (`shim …`, no argv[0]).
    pub exe: &'a str,
    pub args: &'a [String],
    /// The supervisor's whole environment (fixed; never the job's, which the supervisor reads
    /// from the run's directory).
    pub env: &'a [(&'a str, &'a str)],
    /// SIGTERM → SIGKILL grace the supervisor gives the job.
    pub stop_grace: Duration,
    pub cpu_millis: Option<u32>,
    pub memory_mib: Option<u64>,
    pub tasks_max: u64,
    pub cgroup: CgroupVersion,
    /// What the run may open: `device_allow`'s list.
    pub devices: &'a [String],
}

/// `gpumesh-j<id>-g<generation>.service`.
pub(crate) fn unit_name(job: JobId, generation: u64) -> String {
    format!("gpumesh-j{job}-g{generation}.service")
}

/// The supervisor's arguments in a unit: the direct launcher's (`shim …`, from `shim_args`)
/// with `--systemd-unit NAME` first, so the supervisor leaves cgroups to systemd. `Err` when
/// they are not a supervisor's, or not UTF-8 (D-Bus strings are).
pub(crate) fn unit_args(args: &[OsString], name: &str) -> Result<Vec<String>, String> {
    let Some((shim, rest)) = args.split_first().filter(|(a, _)| *a == "shim") else {
        return Err(format!("not a supervisor command line: {args:?}"));
    };
    let mut out = vec![
        shim.to_string_lossy().into_owned(),
        "--systemd-unit".into(),
        name.into(),
    ];
    for a in rest {
        let a = a
            .to_str()
            .ok_or_else(|| format!("the argument {a:?} is not UTF-8, which systemd needs"))?;
        out.push(a.to_owned());
    }
    Ok(out)
}

/// The devices a run may open (with `DevicePolicy=closed`, which already admits the standard
/// pseudo devices: `/dev/null`, `zero`, `full`, `random`, `urandom`, `tty`, `ptmx`, `pts/*`):
/// its GPUs' nodes, the NVIDIA devices every GPU job needs (only when it has GPUs), then the
/// configured extras. A path that does not exist on the host is skipped by systemd when it
/// applies the list (with a warning in its journal).
pub(crate) fn device_allow(gpu_nodes: &[PathBuf], extras: &[PathBuf]) -> Vec<String> {
    let mut devices: Vec<String> = gpu_nodes
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if !gpu_nodes.is_empty() {
        devices.extend(NVIDIA_SHARED.iter().map(|d| (*d).to_owned()));
    }
    devices.extend(extras.iter().map(|p| p.to_string_lossy().into_owned()));
    devices
}

/// The properties of the run's unit, in the order they are sent.
pub(crate) fn properties(u: &UnitSpec<'_>) -> Vec<(&'static str, Value)> {
    let s = |v: &str| Value::Str(v.to_owned());
    let mut argv = vec![u.exe.to_owned()];
    argv.extend(u.args.iter().cloned());
    let mut props = vec![
        (
            "Description",
            Value::Str(format!(
                "gpumesh job j-{} ({}), generation {}",
                u.job, u.job_name, u.generation
            )),
        ),
        // `exec`: the start job succeeds only once the supervisor has been executed, so a
        // supervisor that cannot be started is the start's error, not a unit that dies later.
        ("Type", s("exec")),
        (
            "ExecStart",
            Value::Exec {
                path: u.exe.to_owned(),
                argv,
            },
        ),
        (
            "Environment",
            Value::Strs(u.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
        ),
        ("Slice", s(SLICE)),
        // No implicit dependency on sysinit.target/basic.target: starting a run must never
        // pull boot-time units into a transaction (on a system still booting, or a test
        // manager, that would start them). A run is still stopped before shutdown.
        ("DefaultDependencies", Value::Bool(false)),
        ("Conflicts", Value::Strs(vec!["shutdown.target".into()])),
        ("Before", Value::Strs(vec!["shutdown.target".into()])),
        // SIGTERM to the supervisor only, which stops the job within its grace and records the
        // outcome; whatever remains gets SIGKILL when systemd's stop timeout runs out.
        ("KillMode", s("mixed")),
        (
            "TimeoutStopUSec",
            Value::U64(micros(u.stop_grace.saturating_add(STOP_MARGIN))),
        ),
        // Jobs get SIGPIPE's default action, as in a shell.
        ("IgnoreSIGPIPE", Value::Bool(false)),
        // A job killed for memory ends the job, not the unit: the supervisor reports it.
        ("OOMPolicy", s("continue")),
        // The run's record is its directory; the unit goes away as soon as it has ended,
        // failed or not, so the next generation can reuse nothing of it.
        ("CollectMode", s("inactive-or-failed")),
        ("TasksAccounting", Value::Bool(true)),
        ("TasksMax", Value::U64(u.tasks_max)),
    ];
    if let Some(mib) = u.memory_mib {
        let bytes = mib.saturating_mul(1024 * 1024);
        let name = match u.cgroup {
            CgroupVersion::V1 => "MemoryLimit",
            CgroupVersion::V2 => "MemoryMax",
        };
        props.push(("MemoryAccounting", Value::Bool(true)));
        props.push((name, Value::U64(bytes)));
    }
    if let Some(millis) = u.cpu_millis {
        let per_sec = Duration::from_micros(u64::from(millis) * 1000).max(MIN_CPU_QUOTA_PER_SEC);
        props.push(("CPUAccounting", Value::Bool(true)));
        props.push(("CPUQuotaPerSecUSec", Value::U64(micros(per_sec))));
    }
    props.push(("DevicePolicy", s("closed")));
    if !u.devices.is_empty() {
        let allow = u.devices.iter().map(|d| (d.clone(), "rw".to_owned()));
        props.push(("DeviceAllow", Value::Devices(allow.collect())));
    }
    props
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The properties as unit-file lines (`Name=value`, one line per list element), for logs and
/// tests.
pub(crate) fn render(props: &[(&'static str, Value)]) -> String {
    let mut out = String::new();
    for (name, value) in props {
        match value {
            Value::Str(v) => out.push_str(&format!("{name}={v}\n")),
            Value::Bool(v) => out.push_str(&format!("{name}={}\n", if *v { "yes" } else { "no" })),
            Value::U64(v) => out.push_str(&format!("{name}={v}\n")),
            Value::Strs(vs) => {
                for v in vs {
                    out.push_str(&format!("{name}={v}\n"));
                }
            }
            Value::Exec { path, argv } => {
                out.push_str(&format!("{name}={path} argv[]={}\n", argv.join(" ")));
            }
            Value::Devices(ds) => {
                for (d, access) in ds {
                    out.push_str(&format!("{name}={d} {access}\n"));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    fn spec<'a>(args: &'a [String], devices: &'a [String], cgroup: CgroupVersion) -> UnitSpec<'a> {
        UnitSpec {
            job: 42,
            generation: 3,
            job_name: "train",
            exe: "/usr/bin/gpu-agent",
            args,
            env: &[
                (
                    "PATH",
                    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                ),
                ("LANG", "C.UTF-8"),
            ],
            stop_grace: Duration::from_secs(5),
            cpu_millis: Some(1500),
            memory_mib: Some(4096),
            tasks_max: 16_384,
            cgroup,
            devices,
        }
    }

    #[test]
    fn a_gpu_run_becomes_a_fenced_unit_in_the_gpumesh_slice() {
        assert_eq!(unit_name(42, 3), "gpumesh-j42-g3.service");
        let args: Vec<String> = "shim --systemd-unit gpumesh-j42-g3.service --job-dir /data/jobs/j-42-g3 --lease /data/lease --lease-timeout 10s --grace 5s --run-as-uid 65534 --run-as-gid 65534 -- python train.py"
            .split(' ')
            .map(str::to_owned)
            .collect();
        let devices = device_allow(
            &["/dev/nvidia0".into(), "/dev/nvidia3".into()],
            &["/dev/infiniband/uverbs0".into()],
        );
        expect![[r#"
            Description=gpumesh job j-42 (train), generation 3
            Type=exec
            ExecStart=/usr/bin/gpu-agent argv[]=/usr/bin/gpu-agent shim --systemd-unit gpumesh-j42-g3.service --job-dir /data/jobs/j-42-g3 --lease /data/lease --lease-timeout 10s --grace 5s --run-as-uid 65534 --run-as-gid 65534 -- python train.py
            Environment=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
            Environment=LANG=C.UTF-8
            Slice=gpumesh.slice
            DefaultDependencies=no
            Conflicts=shutdown.target
            Before=shutdown.target
            KillMode=mixed
            TimeoutStopUSec=15000000
            IgnoreSIGPIPE=no
            OOMPolicy=continue
            CollectMode=inactive-or-failed
            TasksAccounting=yes
            TasksMax=16384
            MemoryAccounting=yes
            MemoryLimit=4294967296
            CPUAccounting=yes
            CPUQuotaPerSecUSec=1500000
            DevicePolicy=closed
            DeviceAllow=/dev/nvidia0 rw
            DeviceAllow=/dev/nvidia3 rw
            DeviceAllow=/dev/nvidiactl rw
            DeviceAllow=/dev/nvidia-uvm rw
            DeviceAllow=/dev/nvidia-uvm-tools rw
            DeviceAllow=char-nvidia-caps rw
            DeviceAllow=/dev/infiniband/uverbs0 rw
        "#]]
        .assert_eq(&render(&properties(&spec(
            &args,
            &devices,
            CgroupVersion::V1
        ))));
    }

    #[test]
    fn the_unit_runs_the_direct_supervisor_command_told_it_is_a_unit() {
        let args: Vec<OsString> = [
            "shim",
            "--job-dir",
            "/d/j-1-g2",
            "--",
            "sh",
            "-c",
            "echo hi",
        ]
        .map(OsString::from)
        .to_vec();
        assert_eq!(
            unit_args(&args, "gpumesh-j1-g2.service").expect("args"),
            [
                "shim",
                "--systemd-unit",
                "gpumesh-j1-g2.service",
                "--job-dir",
                "/d/j-1-g2",
                "--",
                "sh",
                "-c",
                "echo hi"
            ]
        );
        let err = unit_args(&args[1..], "u").expect_err("not shim");
        assert!(err.contains("not a supervisor command line"), "{err}");
        use std::os::unix::ffi::OsStringExt;
        let bad = vec!["shim".into(), OsString::from_vec(vec![0xff])];
        let err = unit_args(&bad, "u").expect_err("not UTF-8");
        assert!(err.contains("not UTF-8"), "{err}");
    }

    #[test]
    fn cgroup_v2_hosts_get_memory_max_and_tiny_quotas_are_raised() {
        let args = vec!["shim".to_owned()];
        let mut u = spec(&args, &[], CgroupVersion::V2);
        u.cpu_millis = Some(1);
        u.memory_mib = Some(512);
        let text = render(&properties(&u));
        assert!(text.contains("\nMemoryMax=536870912\n"), "{text}");
        assert!(!text.contains("MemoryLimit="), "{text}");
        assert!(text.contains("\nCPUQuotaPerSecUSec=10000\n"), "{text}");
    }

    #[test]
    fn a_cpu_only_run_without_limits_opens_no_gpu_and_no_nvidia_device() {
        let args = vec!["shim".to_owned()];
        let devices = device_allow(&[], &[]);
        assert!(devices.is_empty(), "{devices:?}");
        let mut u = spec(&args, &devices, CgroupVersion::V1);
        u.cpu_millis = None;
        u.memory_mib = None;
        let text = render(&properties(&u));
        for absent in ["Memory", "CPUQuota", "DeviceAllow="] {
            assert!(!text.contains(absent), "{absent}: {text}");
        }
        // Closed with nothing allowed: only the standard pseudo devices.
        assert!(text.ends_with("DevicePolicy=closed\n"), "{text}");
        // Extras still apply to CPU-only runs (an RDMA job without GPUs).
        let devices = device_allow(&[], &["/dev/infiniband/rdma_cm".into()]);
        assert_eq!(devices, ["/dev/infiniband/rdma_cm"]);
    }
}
