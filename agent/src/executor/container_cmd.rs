//! The command lines that run a container job, one pure function per runtime: what the
//! supervisor runs to fetch the image, to run the job, to signal it and to clean up. The run's
//! description (`ContainerRun`) is decided by the executor and handed to the supervisor in the
//! run directory's `container.json`.
//!
//! Podman runs rootful: the supervisor (root) starts `podman run --user UID:GID`, so podman,
//! not the supervisor, switches to the job's user. Every guarantee of a process job holds in
//! the container by podman's own flags: the job's uid, gid and groups; only the given device
//! nodes (runc's devices cgroup denies every other); the run's cgroup as the container's
//! parent (its memory, CPU and task limits, and the out-of-memory evidence); no capabilities,
//! no new privileges, never `--privileged`; the environment from a file only root can read.
//! Apptainer and enroot are unprivileged: the supervisor starts them as the job's user inside
//! the job's cgroups and device fence, like any process.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use gpu_raft_store::container::Mount;
use serde::{Deserialize, Serialize};

use super::limits::Limits;
use crate::config::{ContainerNetwork, RuntimeKind};

/// A container run, as the executor decided it (`container.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRun {
    pub runtime: RuntimeKind,
    /// The runtime's program, as found on the agent's `PATH`.
    pub program: PathBuf,
    /// The container's name: `gpumesh-j<id>-g<generation>-n<node>`, unique per run.
    pub name: String,
    pub image: String,
    pub mounts: Vec<Mount>,
    /// The job's working directory inside the container; `None`: the image's.
    pub workdir: Option<String>,
    /// Host device nodes given to the container (the bound GPUs', the NVIDIA control devices
    /// present, `jobs.extra_devices`), and where each appears inside.
    pub devices: Vec<Device>,
    pub network: ContainerNetwork,
    /// Podman's OCI runtime (`--runtime`), if configured.
    pub oci_runtime: Option<String>,
    /// The tenant's login at the image's registry, as a runtime auth file in the run directory
    /// (root's, 0600, removed once the pull is over); `None`: pull anonymously.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_file: Option<PathBuf>,
}

/// A host device node and its path in the container.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    pub host: PathBuf,
    pub container: PathBuf,
}

/// Who the job is inside the container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User<'a> {
    pub uid: u32,
    pub gid: u32,
    pub groups: &'a [u32],
}

/// What the supervisor runs for one container run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invocation {
    /// Tells whether the image is already here (exit 0: skip `fetch`); `None`: always fetch.
    pub have_image: Option<Vec<OsString>>,
    /// Fetch and prepare the image, in order, each to exit 0; empty: the run fetches it.
    pub fetch: Vec<Vec<OsString>>,
    /// Runs the job in the foreground: its exit status is the job's.
    pub run: Vec<OsString>,
    /// Sends a signal to the container through the runtime (the runtime's foreground process
    /// does not pass a kill on); `None`: signal the run's process group.
    pub signal: Option<SignalCommand>,
    /// Run once the job has ended, whatever happened, to leave nothing behind.
    pub cleanup: Vec<Vec<OsString>>,
}

/// A runtime's command that signals one container: `<prefix> <SIGNAL> <container>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignalCommand {
    pub prefix: Vec<OsString>,
    pub container: String,
}

impl SignalCommand {
    /// The command that sends `signal` (`TERM`, `KILL`).
    pub fn argv(&self, signal: &str) -> Vec<OsString> {
        let mut argv = self.prefix.clone();
        argv.push(signal.into());
        argv.push(self.container.clone().into());
        argv
    }
}

/// Where the pieces live on the host for one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Paths<'a> {
    /// The environment file (`KEY=VALUE` lines, root's, 0600).
    pub env_file: &'a Path,
    /// The run's cgroup, as a path from the hierarchy's root (podman's `--cgroup-parent`).
    pub cgroup_parent: Option<&'a str>,
    /// The run's limits, given to podman itself when the container has no cgroup of ours to
    /// sit in (a run in a systemd unit, or a host without job cgroups).
    pub limits: Limits,
    /// A directory the unprivileged runtimes may cache images in (the job's `work/`).
    pub cache: &'a Path,
}

/// The podman (or unprivileged runtime) invocation of `run` for `command`.
pub fn invocation(
    run: &ContainerRun,
    user: &User<'_>,
    command: &[String],
    paths: &Paths<'_>,
    ulimits: &[(&str, u64)],
    stop_grace_s: u64,
) -> Invocation {
    match run.runtime {
        RuntimeKind::Podman => podman(run, user, command, paths, ulimits, stop_grace_s),
        RuntimeKind::Apptainer => apptainer(run, command, paths),
        RuntimeKind::Enroot => enroot(run, command, paths),
    }
}

fn argv(program: &Path, args: &[&str]) -> Vec<OsString> {
    let mut v = vec![program.as_os_str().to_owned()];
    v.extend(args.iter().map(OsString::from));
    v
}

fn podman(
    run: &ContainerRun,
    user: &User<'_>,
    command: &[String],
    paths: &Paths<'_>,
    ulimits: &[(&str, u64)],
    stop_grace_s: u64,
) -> Invocation {
    let p = &run.program;
    let mut args: Vec<OsString> = argv(p, &["run", "--name", &run.name, "--pull", "never"]);
    let mut flag = |name: &str, value: String| {
        args.push(name.into());
        args.push(value.into());
    };
    if let Some(r) = &run.oci_runtime {
        flag("--runtime", r.clone());
    }
    match paths.cgroup_parent {
        Some(parent) => flag("--cgroup-parent", parent.to_owned()),
        None => {
            let l = &paths.limits;
            if let Some(mib) = l.memory_mib {
                flag("--memory", format!("{mib}m"));
                flag("--memory-swap", format!("{mib}m"));
            }
            if let Some(millis) = l.cpu_millis {
                flag("--cpus", format!("{}.{:03}", millis / 1000, millis % 1000));
            }
            if let Some(n) = l.tasks_max {
                flag("--pids-limit", n.to_string());
            }
        }
    }
    flag("--user", format!("{}:{}", user.uid, user.gid));
    for g in user.groups {
        flag("--group-add", g.to_string());
    }
    flag("--env-file", paths.env_file.to_string_lossy().into_owned());
    flag(
        "--network",
        match run.network {
            ContainerNetwork::Host => "host",
            ContainerNetwork::None => "none",
        }
        .to_owned(),
    );
    flag("--cap-drop", "all".into());
    flag("--security-opt", "no-new-privileges".into());
    for (name, limit) in ulimits {
        flag("--ulimit", format!("{name}={limit}:{limit}"));
    }
    for d in &run.devices {
        flag(
            "--device",
            format!("{}:{}", d.host.display(), d.container.display()),
        );
    }
    for m in &run.mounts {
        let ro = if m.read_only { ",ro=true" } else { "" };
        flag(
            "--mount",
            format!("type=bind,source={},target={}{ro}", m.source, m.target),
        );
    }
    if let Some(w) = &run.workdir {
        flag("--workdir", w.clone());
    }
    flag("--stop-timeout", stop_grace_s.to_string());
    args.push("--".into());
    args.push(run.image.clone().into());
    args.extend(command.iter().map(OsString::from));
    Invocation {
        have_image: Some(argv(p, &["image", "exists", &run.image])),
        // Not --quiet: the supervisor turns the progress lines into the run's phase.
        fetch: vec![match &run.auth_file {
            Some(auth) => argv(
                p,
                &["pull", "--authfile", &auth.to_string_lossy(), &run.image],
            ),
            None => argv(p, &["pull", &run.image]),
        }],
        run: args,
        signal: Some(SignalCommand {
            prefix: argv(p, &["kill", "--signal"]),
            container: run.name.clone(),
        }),
        cleanup: vec![argv(p, &["rm", "--force", "--time", "0", &run.name])],
    }
}

/// `apptainer exec`: the job's own process tree, so its user, cgroups and device fence are the
/// supervisor's doing; `--contain` gives it a minimal `/dev` with the GPUs bound in.
fn apptainer(run: &ContainerRun, command: &[String], paths: &Paths<'_>) -> Invocation {
    let mut args = argv(
        &run.program,
        &["exec", "--contain", "--cleanenv", "--no-home"],
    );
    let mut flag = |name: &str, value: String| {
        args.push(name.into());
        args.push(value.into());
    };
    flag("--env-file", paths.env_file.to_string_lossy().into_owned());
    if run.network == ContainerNetwork::None {
        flag("--network", "none".into());
    }
    for d in &run.devices {
        flag(
            "--bind",
            format!("{}:{}", d.host.display(), d.container.display()),
        );
    }
    for m in &run.mounts {
        let ro = if m.read_only { ":ro" } else { "" };
        flag("--bind", format!("{}:{}{ro}", m.source, m.target));
    }
    if let Some(w) = &run.workdir {
        flag("--pwd", w.clone());
    }
    args.push(format!("docker://{}", run.image).into());
    args.extend(command.iter().map(OsString::from));
    Invocation {
        have_image: None,
        // `exec` of a docker:// reference fetches it into the user's cache.
        fetch: Vec::new(),
        run: args,
        signal: None,
        cleanup: Vec::new(),
    }
}

/// enroot: import the image as a squashfs into the run's cache, create the container from it,
/// start it, and remove the container afterwards.
fn enroot(run: &ContainerRun, command: &[String], paths: &Paths<'_>) -> Invocation {
    let p = &run.program;
    let image_file = paths.cache.join(format!("{}.sqsh", run.name));
    let image_file = image_file.to_string_lossy();
    let mut args = argv(p, &["start"]);
    let mut flag = |name: &str, value: String| {
        args.push(name.into());
        args.push(value.into());
    };
    flag("--env-file", paths.env_file.to_string_lossy().into_owned());
    for d in &run.devices {
        flag(
            "--mount",
            format!("{}:{}:none,bind", d.host.display(), d.container.display()),
        );
    }
    for m in &run.mounts {
        let mode = if m.read_only { "ro" } else { "rw" };
        flag(
            "--mount",
            format!("{}:{}:none,bind,{mode}", m.source, m.target),
        );
    }
    args.push(run.name.clone().into());
    // enroot has no working-directory flag: a shell of the image changes to it.
    if let Some(w) = &run.workdir {
        for a in ["sh", "-c", "cd \"$1\" && shift && exec \"$@\"", "sh", w] {
            args.push(a.into());
        }
    }
    args.extend(command.iter().map(OsString::from));
    let docker = format!("docker://{}", enroot_reference(&run.image));
    Invocation {
        have_image: None,
        fetch: vec![
            argv(p, &["import", "--output", &image_file, &docker]),
            argv(p, &["create", "--force", "--name", &run.name, &image_file]),
        ],
        run: args,
        signal: None,
        cleanup: vec![argv(p, &["remove", "--force", &run.name])],
    }
}

/// enroot writes a registry apart from the path (`nvcr.io#nvidia/pytorch:24.05`).
fn enroot_reference(image: &str) -> String {
    match image.split_once('/') {
        Some((host, rest)) if host.contains(['.', ':']) || host == "localhost" => {
            format!("{host}#{rest}")
        }
        _ => image.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    fn run(runtime: RuntimeKind, program: &str) -> ContainerRun {
        ContainerRun {
            runtime,
            program: program.into(),
            name: "gpumesh-j7-g2-n3".into(),
            image: "nvcr.io/nvidia/pytorch:24.05-py3".into(),
            mounts: vec![
                Mount {
                    source: "/data/team".into(),
                    target: "/data".into(),
                    read_only: true,
                },
                Mount {
                    source: "/scratch/j7".into(),
                    target: "/scratch".into(),
                    read_only: false,
                },
            ],
            workdir: Some("/workspace".into()),
            devices: vec![
                Device {
                    host: "/var/lib/gpumesh/dev/nvidia3".into(),
                    container: "/dev/nvidia0".into(),
                },
                Device {
                    host: "/dev/nvidiactl".into(),
                    container: "/dev/nvidiactl".into(),
                },
            ],
            network: ContainerNetwork::Host,
            oci_runtime: Some("runc".into()),
            auth_file: None,
        }
    }

    fn render(argv: &[OsString]) -> String {
        argv.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn build(r: &ContainerRun) -> Invocation {
        let paths = Paths {
            env_file: Path::new("/jobs/j-7-g2/container.env"),
            cgroup_parent: Some("/gpumesh/job-7-g2-s99"),
            cache: Path::new("/jobs/j-7-g2/work"),
            limits: Limits {
                cpu_millis: Some(1500),
                memory_mib: Some(4096),
                tasks_max: Some(512),
            },
        };
        let user = User {
            uid: 1001,
            gid: 1001,
            groups: &[44],
        };
        let command = ["python".to_owned(), "train.py".to_owned()];
        invocation(r, &user, &command, &paths, &[("nofile", 1024)], 10)
    }

    #[test]
    fn podman_runs_the_job_as_its_user_with_its_devices_limits_and_mounts() {
        let inv = build(&run(RuntimeKind::Podman, "/usr/bin/podman"));
        assert!(RuntimeKind::Podman.is_rootful());
        expect!["/usr/bin/podman run --name gpumesh-j7-g2-n3 --pull never --runtime runc --cgroup-parent /gpumesh/job-7-g2-s99 --user 1001:1001 --group-add 44 --env-file /jobs/j-7-g2/container.env --network host --cap-drop all --security-opt no-new-privileges --ulimit nofile=1024:1024 --device /var/lib/gpumesh/dev/nvidia3:/dev/nvidia0 --device /dev/nvidiactl:/dev/nvidiactl --mount type=bind,source=/data/team,target=/data,ro=true --mount type=bind,source=/scratch/j7,target=/scratch --workdir /workspace --stop-timeout 10 -- nvcr.io/nvidia/pytorch:24.05-py3 python train.py"]
            .assert_eq(&render(&inv.run));
        assert!(!render(&inv.run).contains("--privileged"));
        assert_eq!(
            render(inv.have_image.as_deref().expect("valid")),
            "/usr/bin/podman image exists nvcr.io/nvidia/pytorch:24.05-py3"
        );
        let fetch: Vec<String> = inv.fetch.iter().map(|a| render(a)).collect();
        assert_eq!(
            fetch,
            ["/usr/bin/podman pull nvcr.io/nvidia/pytorch:24.05-py3"]
        );
        let with_login = build(&ContainerRun {
            auth_file: Some("/jobs/j-7-g2/registry-auth.json".into()),
            ..run(RuntimeKind::Podman, "/usr/bin/podman")
        });
        let fetch: Vec<String> = with_login.fetch.iter().map(|a| render(a)).collect();
        assert_eq!(
            fetch,
            [
                "/usr/bin/podman pull --authfile /jobs/j-7-g2/registry-auth.json nvcr.io/nvidia/pytorch:24.05-py3"
            ]
        );
        let signal = inv.signal.expect("podman signals through the runtime");
        assert_eq!(
            render(&signal.argv("TERM")),
            "/usr/bin/podman kill --signal TERM gpumesh-j7-g2-n3"
        );
        let cleanup: Vec<String> = inv.cleanup.iter().map(|a| render(a)).collect();
        assert_eq!(
            cleanup,
            ["/usr/bin/podman rm --force --time 0 gpumesh-j7-g2-n3"]
        );
    }

    #[test]
    fn apptainer_runs_as_the_job_itself() {
        let inv = build(&run(RuntimeKind::Apptainer, "/usr/bin/apptainer"));
        assert!(!RuntimeKind::Apptainer.is_rootful());
        assert!(inv.signal.is_none() && inv.fetch.is_empty());
        expect!["/usr/bin/apptainer exec --contain --cleanenv --no-home --env-file /jobs/j-7-g2/container.env --bind /var/lib/gpumesh/dev/nvidia3:/dev/nvidia0 --bind /dev/nvidiactl:/dev/nvidiactl --bind /data/team:/data:ro --bind /scratch/j7:/scratch --pwd /workspace docker://nvcr.io/nvidia/pytorch:24.05-py3 python train.py"]
            .assert_eq(&render(&inv.run));
    }

    #[test]
    fn enroot_imports_creates_starts_and_removes() {
        let inv = build(&run(RuntimeKind::Enroot, "/usr/bin/enroot"));
        assert!(!RuntimeKind::Enroot.is_rootful());
        assert!(inv.signal.is_none());
        let fetch: Vec<String> = inv.fetch.iter().map(|a| render(a)).collect();
        expect![[r#"
            [
                "/usr/bin/enroot import --output /jobs/j-7-g2/work/gpumesh-j7-g2-n3.sqsh docker://nvcr.io#nvidia/pytorch:24.05-py3",
                "/usr/bin/enroot create --force --name gpumesh-j7-g2-n3 /jobs/j-7-g2/work/gpumesh-j7-g2-n3.sqsh",
            ]
        "#]]
        .assert_debug_eq(&fetch);
        expect![[r#"/usr/bin/enroot start --env-file /jobs/j-7-g2/container.env --mount /var/lib/gpumesh/dev/nvidia3:/dev/nvidia0:none,bind --mount /dev/nvidiactl:/dev/nvidiactl:none,bind --mount /data/team:/data:none,bind,ro --mount /scratch/j7:/scratch:none,bind,rw gpumesh-j7-g2-n3 sh -c cd "$1" && shift && exec "$@" sh /workspace python train.py"#]]
            .assert_eq(&render(&inv.run));
        assert_eq!(
            enroot_reference("busybox"),
            "busybox",
            "Docker Hub images need no registry"
        );
    }

    #[test]
    fn without_a_cgroup_of_ours_podman_enforces_the_limits_itself() {
        let r = run(RuntimeKind::Podman, "podman");
        let paths = Paths {
            env_file: Path::new("/e"),
            cgroup_parent: None,
            cache: Path::new("/c"),
            limits: Limits {
                cpu_millis: Some(1500),
                memory_mib: Some(4096),
                tasks_max: Some(512),
            },
        };
        let user = User {
            uid: 1,
            gid: 1,
            groups: &[],
        };
        let line = render(&invocation(&r, &user, &[], &paths, &[], 10).run);
        assert!(
            line.contains("--memory 4096m --memory-swap 4096m --cpus 1.500 --pids-limit 512"),
            "{line}"
        );
        assert!(!line.contains("--cgroup-parent"), "{line}");
        assert!(
            !render(&build(&r).run).contains("--memory"),
            "ours hold them"
        );
    }

    #[test]
    fn no_network_is_passed_on() {
        let mut r = run(RuntimeKind::Podman, "podman");
        r.network = ContainerNetwork::None;
        assert!(render(&build(&r).run).contains("--network none"));
        r.runtime = RuntimeKind::Apptainer;
        assert!(render(&build(&r).run).contains("--network none"));
    }
}
