//! Launching one run: a supervisor process (`gpu-agent shim`) with the job's arguments, its
//! identity and its environment (its GPUs, MIG device or MPS limits, gang rendezvous), or for a
//! vm job the record of its pass-through GPUs.
//!
//! The supervisor itself starts with `job_env::SUPERVISOR_ENV` only; the job's environment is
//! written to the run's `env.json` and applied by the supervisor to the job process alone.
//!
//! Working directory: the spec's `workdir`, else the user's home when it exists on this node,
//! else the run's own `work/`. Slurm defaults to the directory `sbatch` ran in; gpumesh's
//! submitter (`gpuctl`, the API) usually runs on another machine, whose directories mean
//! nothing here, so the home directory is the nearest equivalent a job can count on.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use gpu_raft_store::container::ContainerSpec;
use gpu_raft_store::{Binding, ClusterState, Job, JobKind, JobSpec, NodeId, Slice};
use tracing::warn;

use super::confine::Confinement;
use super::container_cmd::{ContainerRun, Device};
use super::device_fence::{self, DeviceRule};
use super::identity::{self, Identity};
use super::job_dir::JobDir;
use super::launcher::{Started, SupervisorStart};
use super::limits::Limits;
use super::setup::Host;
use super::{
    Executor, ExecutorSettings, container_supervise, disk_space, isolation, job_env, registry_auth,
    vm,
};
use crate::gpu::GpuBackend;

/// Variables a run gets from where it runs (placement, gang, slice).
type RunVars = Vec<(&'static str, String)>;

impl Executor {
    /// Start the run of `job` in `dir`: its supervisor, or for a vm job no process (`None`).
    pub(super) async fn launch(
        &self,
        job: &Job,
        dir: &JobDir,
        host: &Host,
    ) -> Result<Option<Started>, String> {
        self.check_free_space()?;
        if job.spec.kind == JobKind::Vm {
            self.start_vm(job, dir).map(|()| None)
        } else {
            self.start(job, dir, host).await.map(Some)
        }
    }

    /// Launch the supervisor for one placement.
    async fn start(&self, job: &Job, dir: &JobDir, host: &Host) -> Result<Started, String> {
        let Some((rank, binding)) = job.member_on(self.cluster.id) else {
            return Err("the job has no placement on this node".into());
        };
        let gang_env = self.cluster.state.read(|s| gang_env(s, job, rank, binding));
        let uuids = self.bound_uuids(binding);
        let (visible, slice_env) = match &binding.slice {
            None => (uuids.join(","), Vec::new()),
            Some(slice) => slice_env(self.gpus.as_ref(), binding, slice, &uuids)?,
        };
        let mut run_env = placement_env(job, binding, &visible);
        run_env.extend(gang_env);
        run_env.extend(slice_env);
        let confinement = self.confinement(&job.spec, binding, host);
        let limits = confinement.limits;
        let mut container = match &job.spec.container {
            Some(c) => Some(self.container_run(job.id, c, binding)?),
            None => None,
        };
        // The tenant's login at the image's registry, if it has one: opened now, written as the
        // runtime's auth file once the run directory exists.
        let login = crate::tls::registry_login::for_run(
            &self.cluster,
            self.tls.as_ref(),
            job,
            binding.generation,
        )
        .await?;
        if let (Some(run), Some(_)) = (container.as_mut(), &login) {
            run.auth_file = Some(registry_auth::path(&dir.path));
        }
        let (settings, spec, run) = (self.settings.clone(), job.spec.clone(), dir.clone());
        let node = self.cluster.id;
        // NSS may ask a remote directory (LDAP, SSSD): never on the executor's own thread.
        let args = tokio::task::spawn_blocking(move || {
            prepare_run(
                &settings,
                &spec,
                &run,
                node,
                &confinement,
                &run_env,
                container.as_ref(),
            )
        })
        .await
        .map_err(|e| format!("preparing the run: {e}"))??;
        if let Some(l) = &login {
            registry_auth::write(&dir.path, &l.registry, &l.username, &l.password)?;
        }
        let started = self
            .launcher
            .start(SupervisorStart {
                exe: &self.settings.agent_exe,
                args,
                job: job.id,
                generation: binding.generation,
                job_name: &job.spec.name,
                stop_grace: self.settings.stop_grace,
                limits,
                gpu_nodes: self.unit_gpu_nodes(binding),
                extra_devices: self.unit_extra_devices(),
            })
            .await;
        // No supervisor will pull, nor remove the login: it goes now.
        if started.is_err() {
            registry_auth::remove(&dir.path);
        }
        started
    }

    /// What confines the run: its limits, and a device fence letting it open its own GPUs'
    /// nodes (and the configured extras, resolved now) but no other GPU's.
    fn confinement(&self, spec: &JobSpec, binding: &Binding, host: &Host) -> Confinement {
        let devices = self.gpus.devices();
        let nodes: Vec<_> = binding
            .gpus
            .iter()
            .map(|g| {
                devices
                    .iter()
                    .find(|d| d.index == *g)
                    .and_then(|d| d.device_node.clone())
            })
            .collect();
        let (extra, problems) = device_fence::resolve_extra(&self.settings.confine.extra_devices);
        for problem in problems {
            warn!(%problem, "jobs.extra_devices: cannot read a device directory");
        }
        Confinement {
            cgroups: host.cgroups.clone(),
            limits: Limits::for_job(spec, &self.settings.confine),
            devices: device_fence::allow_list(&nodes, &device_fence::host_majors(), &extra),
        }
    }

    /// How a container job runs here: the first configured runtime installed, the bound GPUs'
    /// device nodes (at `/dev/nvidia<minor>` inside), the NVIDIA control devices present and
    /// `jobs.extra_devices`.
    fn container_run(
        &self,
        job: gpu_raft_store::JobId,
        spec: &ContainerSpec,
        binding: &Binding,
    ) -> Result<ContainerRun, String> {
        let c = &self.settings.containers;
        let Some((runtime, program)) = c.installed() else {
            return Err(format!(
                "no container runtime on node n{} (looked for {} on PATH)",
                self.cluster.id,
                c.looked_for()
            ));
        };
        let gpus = self.gpus.devices();
        let mut devices: Vec<Device> = binding
            .gpus
            .iter()
            .filter_map(|g| gpus.iter().find(|d| d.index == *g)?.device_node.clone())
            .map(|n| Device {
                host: n.path,
                container: format!("/dev/nvidia{}", n.minor).into(),
            })
            .collect();
        let present = CONTROL_DEVICES
            .iter()
            .map(PathBuf::from)
            .chain(device_fence::extra_paths(
                &self.settings.confine.extra_devices,
            ))
            .filter(|p| p.exists());
        devices.extend(present.map(|p| Device {
            host: p.clone(),
            container: p,
        }));
        Ok(ContainerRun {
            runtime,
            program,
            name: format!(
                "gpumesh-j{job}-g{}-n{}",
                binding.generation, self.cluster.id
            ),
            image: spec.image.clone(),
            mounts: spec.mounts.clone(),
            workdir: None,
            devices,
            network: c.network,
            oci_runtime: c.oci_runtime.clone(),
            auth_file: None,
        })
    }

    /// The bound GPUs' device nodes as a systemd unit names them: `/dev/char/MAJOR:MINOR`
    /// (systemd reads the numbers from the name, so a node outside /dev, such as the
    /// simulator's, is named too).
    fn unit_gpu_nodes(&self, binding: &Binding) -> Vec<PathBuf> {
        let devices = self.gpus.devices();
        let node = |g: u32| devices.iter().find(|d| d.index == g)?.device_node.clone();
        binding
            .gpus
            .iter()
            .map(|g| {
                node(*g).map_or_else(
                    || format!("/dev/nvidia{g}").into(),
                    |n| {
                        DeviceRule::char(n.major, n.minor)
                            .unit_path()
                            .unwrap_or_default()
                    },
                )
            })
            .collect()
    }

    /// `jobs.extra_devices` as a systemd unit names them.
    fn unit_extra_devices(&self) -> Vec<PathBuf> {
        let (extra, _) = device_fence::resolve_extra(&self.settings.confine.extra_devices);
        extra.iter().filter_map(DeviceRule::unit_path).collect()
    }

    /// A run fails to start, with the reason, on a jobs filesystem below `jobs.min_free`: it
    /// could not be supervised reliably there (and a job that filled the disk must not make
    /// every later run on the node fail in some less clear way).
    fn check_free_space(&self) -> Result<(), String> {
        let dir = &self.settings.jobs_dir;
        match disk_space::available(dir) {
            Ok(free) => match disk_space::too_full(dir, free, self.settings.disk.min_free) {
                Some(why) => Err(why),
                None => Ok(()),
            },
            // Left to the start itself, which says what is wrong with the directory.
            Err(_) => Ok(()),
        }
    }

    /// Start a vm job: its pass-through GPUs' PCI addresses go to the VM (see `vm.rs`).
    fn start_vm(&self, job: &Job, dir: &JobDir) -> Result<(), String> {
        let Some((_, binding)) = job.member_on(self.cluster.id) else {
            return Err("the job has no placement on this node".into());
        };
        let uuids = self.bound_uuids(binding);
        let devices = self.gpus.devices();
        let mut pci = Vec::new();
        for uuid in &uuids {
            let d = devices
                .iter()
                .find(|d| &d.uuid == uuid)
                .ok_or_else(|| format!("GPU {uuid} is not on this host"))?;
            pci.push(d.pci_bus_id.clone());
        }
        vm::attach(dir, &pci).map_err(|e| format!("recording the vm attachment: {e}"))
    }

    /// The UUIDs of the binding's GPUs, as its node registered them.
    fn bound_uuids(&self, binding: &Binding) -> Vec<String> {
        self.cluster.state.read(|s| {
            let node = s.nodes.get(&binding.node);
            binding
                .gpus
                .iter()
                .filter_map(|g| node.and_then(|n| n.gpu(*g)).map(|g| g.uuid.clone()))
                .collect()
        })
    }
}

/// The NVIDIA devices every CUDA program opens besides its GPUs, given to a container when the
/// host has them.
const CONTROL_DEVICES: &[&str] = &[
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
];

/// Everything a run needs before its supervisor starts, done as the executor does it: the run
/// directory (0711: the job may pass through to `work/`, nothing more), the job's identity
/// (through NSS, which may block), its environment in `env.json` (`run_env`: placement, gang and
/// slice variables), for a container job its `container.json` (`container`: how it runs here),
/// and the supervisor's arguments. `Err` is the run's failed-to-start reason.
pub fn prepare_run(
    settings: &ExecutorSettings,
    spec: &JobSpec,
    dir: &JobDir,
    node: NodeId,
    confinement: &Confinement,
    run_env: &[(&'static str, String)],
    container: Option<&ContainerRun>,
) -> Result<Vec<OsString>, String> {
    dir.create()
        .and_then(|()| std::fs::set_permissions(&dir.path, std::fs::Permissions::from_mode(0o711)))
        .map_err(|e| format!("creating {}: {e}", dir.path.display()))?;
    let identity = match &spec.account {
        Some(account) => identity::resolve(
            account,
            &identity::Nss,
            settings.uid_range,
            node,
            nix::unistd::geteuid().as_raw(),
        )?,
        None => Identity::of_run_as(settings.user_for(&spec.tenant)),
    };
    let home = identity.home.as_deref().filter(|h| h.is_dir());
    let workdir = workdir(spec.workdir.as_deref(), home)?;
    // A container job's directories are the image's: its working directory is inside it, and
    // its HOME the working directory (or /tmp) unless the job sets one.
    let (workdir, run_env) = match container {
        None => (workdir, run_env.to_vec()),
        Some(run) => {
            let run = ContainerRun {
                workdir: spec.workdir.clone(),
                ..run.clone()
            };
            container_supervise::write(&dir.path, &run)
                .map_err(|e| format!("writing {}'s container.json: {e}", dir.path.display()))?;
            let mut env = run_env.to_vec();
            if !spec.env.contains_key("HOME") {
                env.push((
                    "HOME",
                    spec.workdir.clone().unwrap_or_else(|| "/tmp".into()),
                ));
            }
            (None, env)
        }
    };
    let path = std::env::var_os("PATH").map_or_else(
        || DEFAULT_PATH.to_owned(),
        |p| p.to_string_lossy().into_owned(),
    );
    let work = isolation::work_dir(&dir.path);
    let env = job_environment(&identity, &work, &path, &spec.env, &run_env);
    job_env::write(&dir.path, &env).map_err(|e| {
        format!(
            "writing the job's environment to {}: {e}",
            job_env::path(&dir.path).display()
        )
    })?;
    Ok(shim_args(
        settings,
        spec,
        dir,
        confinement,
        &identity,
        workdir.as_deref(),
        container.is_some(),
    ))
}

/// The job's `PATH` when the agent has none.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Where the job starts: the spec's `workdir` (absolute; the supervisor checks it exists), else
/// `home` (passed only when it exists), else `None`: the run's `work/`.
fn workdir(spec: Option<&str>, home: Option<&Path>) -> Result<Option<PathBuf>, String> {
    match spec {
        Some(w) if !Path::new(w).is_absolute() => {
            Err(format!("workdir {w:?} is not an absolute path"))
        }
        Some(w) => Ok(Some(w.into())),
        None => Ok(home.map(Path::to_owned)),
    }
}

/// The job's whole environment: `PATH`, `LANG`, then who it is (`HOME`: the passwd home, or the
/// run's `work/` for the node's own job users; `USER`, `LOGNAME`, `SHELL`), then the spec's
/// variables (which may override those), then where it runs (which nothing overrides).
fn job_environment(
    identity: &Identity,
    work: &Path,
    path: &str,
    spec_env: &BTreeMap<String, String>,
    run_env: &[(&'static str, String)],
) -> BTreeMap<String, String> {
    let text = |p: &Path| p.to_string_lossy().into_owned();
    let mut env = BTreeMap::from([
        ("PATH".to_owned(), path.to_owned()),
        ("LANG".to_owned(), "C.UTF-8".to_owned()),
        (
            "HOME".to_owned(),
            text(identity.home.as_deref().unwrap_or(work)),
        ),
        ("USER".to_owned(), identity.name.clone()),
        ("LOGNAME".to_owned(), identity.name.clone()),
    ]);
    if let Some(shell) = &identity.shell {
        env.insert("SHELL".to_owned(), text(shell));
    }
    env.extend(spec_env.clone());
    env.extend(run_env.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
    env
}

/// The variables that tell a run where it runs: the GPUs it sees (`visible`, the value of
/// `CUDA_VISIBLE_DEVICES`) and its job, generation, node and GPU indices; and a task of an
/// array its index, in gpumesh's names and in Slurm's (so scripts written for Slurm run).
fn placement_env(job: &Job, binding: &Binding, visible: &str) -> RunVars {
    let mut env = vec![("SLURM_JOB_ID", job.id.to_string())];
    if let (Some(task), Some(array)) = (job.array_task, &job.spec.array) {
        let (first, last) = (
            array.indexes().next(),
            array.ranges.last().map(|r| r.last()),
        );
        env.extend([
            ("GPUMESH_ARRAY_JOB_ID", task.array.to_string()),
            ("GPUMESH_ARRAY_TASK_ID", task.index.to_string()),
            ("SLURM_ARRAY_JOB_ID", task.array.to_string()),
            ("SLURM_ARRAY_TASK_ID", task.index.to_string()),
            ("SLURM_ARRAY_TASK_COUNT", array.len().to_string()),
            (
                "SLURM_ARRAY_TASK_MIN",
                first.unwrap_or_default().to_string(),
            ),
            ("SLURM_ARRAY_TASK_MAX", last.unwrap_or_default().to_string()),
        ]);
    }
    env.extend([
        ("CUDA_VISIBLE_DEVICES", visible.to_owned()),
        (
            "NVIDIA_VISIBLE_DEVICES",
            if visible.is_empty() { "void" } else { visible }.to_owned(),
        ),
        ("GPUMESH_JOB_ID", job.id.to_string()),
        ("GPUMESH_JOB_NAME", job.spec.name.clone()),
        ("GPUMESH_TENANT", job.spec.tenant.clone()),
        ("GPUMESH_GENERATION", binding.generation.to_string()),
        ("GPUMESH_NODE_ID", binding.node.to_string()),
        (
            "GPUMESH_GPUS",
            binding
                .gpus
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(","),
        ),
    ]);
    env
}

/// `CUDA_VISIBLE_DEVICES` and the extra variables of a sliced run: the MIG device's UUID
/// (from the backend, which created it), or the GPU's UUID with MPS limits for a share.
fn slice_env(
    gpus: &dyn GpuBackend,
    binding: &Binding,
    slice: &Slice,
    uuids: &[String],
) -> Result<(String, RunVars), String> {
    let gpu = binding.gpus.first().copied().unwrap_or_default();
    let mut env = vec![("GPUMESH_GPU_SLICE", slice.to_string())];
    match slice {
        Slice::Mig { profile, start } => {
            let devices = gpus
                .mig_devices(gpu)
                .map_err(|e| format!("reading GPU {gpu}'s MIG devices: {e}"))?
                .unwrap_or_default();
            let device = devices
                .iter()
                .find(|d| d.start == *start && &d.profile == profile)
                .ok_or_else(|| format!("GPU {gpu} has no MIG instance {profile}@{start} yet"))?;
            Ok((device.uuid.clone(), env))
        }
        Slice::Shared { memory_mib, share } => {
            env.push(("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", share.to_string()));
            // Per device of CUDA_VISIBLE_DEVICES (the job sees one: device 0).
            env.push((
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
                format!("0={memory_mib}M"),
            ));
            Ok((uuids.join(","), env))
        }
    }
}

/// The `gpu-agent` arguments that supervise one run: `shim`, its flags, `--`, the job's argv.
/// `cgroup_root` is `Some` when the node can give the run a cgroup; `identity` is who the job
/// runs as, `workdir` where it starts (`None`: the run's `work/`).
fn shim_args(
    settings: &ExecutorSettings,
    spec: &JobSpec,
    dir: &JobDir,
    confinement: &Confinement,
    identity: &Identity,
    workdir: Option<&Path>,
    container: bool,
) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        "shim".into(),
        "--job-dir".into(),
        dir.path.clone().into(),
        "--lease".into(),
        settings.lease_path.clone().into(),
        "--lease-timeout".into(),
        humantime::format_duration(settings.lease)
            .to_string()
            .into(),
        "--grace".into(),
        humantime::format_duration(settings.stop_grace)
            .to_string()
            .into(),
        "--run-as-uid".into(),
        identity.uid.to_string().into(),
        "--run-as-gid".into(),
        identity.gid.to_string().into(),
    ];
    let mut flag = |name: &str, value: OsString| {
        args.push(name.into());
        args.push(value);
    };
    if let Some(limit) = spec.wall_time_limit_s {
        flag("--wall-time", format!("{limit}s").into());
    }
    if !identity.groups.is_empty() {
        let groups: Vec<String> = identity.groups.iter().map(u32::to_string).collect();
        flag("--run-as-groups", groups.join(",").into());
    }
    if let Some(w) = workdir {
        flag("--workdir", w.into());
    }
    // Only when not the supervisor's own default (the same constant), which keeps the common
    // command line short.
    if settings.disk.log_max != crate::config::DEFAULT_LOG_MAX.0 {
        flag("--log-max", settings.disk.log_max.to_string().into());
    }
    args.extend(confinement.flags());
    if container {
        args.push("--container".into());
    }
    args.push("--".into());
    args.extend(spec.command.iter().map(OsString::from));
    args
}

/// The distributed-training environment of a gang member (what torchrun, NCCL and Horovod
/// read), empty for a single-node job. Every member agrees on it: the rendezvous is member 0's
/// host and a port derived from the job id (29500 + id mod 1000); one process per node, so
/// `RANK` is the node's first global rank and `LOCAL_RANK` 0.
fn gang_env(state: &ClusterState, job: &Job, rank: usize, member: &Binding) -> RunVars {
    if job.gang.is_empty() {
        return Vec::new();
    }
    let master = job
        .gang
        .first()
        .and_then(|m| state.nodes.get(&m.node))
        .map(|n| {
            n.addr
                .rsplit_once(':')
                .map_or(n.addr.as_str(), |(host, _)| host)
                .trim_matches(['[', ']'])
                .to_owned()
        })
        .unwrap_or_default();
    let per = member.gpus.len();
    vec![
        ("MASTER_ADDR", master),
        ("MASTER_PORT", (29_500 + job.id % 1000).to_string()),
        ("WORLD_SIZE", (per * job.gang.len()).to_string()),
        ("RANK", (rank * per).to_string()),
        ("NODE_RANK", rank.to_string()),
        ("LOCAL_RANK", "0".to_owned()),
        ("GPUMESH_NNODES", job.gang.len().to_string()),
        ("GPUMESH_GPUS_PER_NODE", per.to_string()),
    ]
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use expect_test::expect;

    use super::*;
    use crate::config::{Confine, RunAs, UidRange};
    use crate::executor::cgroups::CgroupLayout;
    use crate::executor::device_fence::DeviceRule;

    fn settings(run_as: RunAs) -> ExecutorSettings {
        ExecutorSettings {
            jobs_dir: "/data/jobs".into(),
            lease_path: "/data/lease".into(),
            lease: Duration::from_secs(10),
            stop_grace: Duration::from_secs(5),
            agent_exe: "/usr/bin/gpu-agent".into(),
            tick: Duration::from_secs(1),
            run_as,
            run_as_by_tenant: BTreeMap::from([(
                "vision".to_owned(),
                RunAs {
                    name: "vision".into(),
                    uid: 2001,
                    gid: 2001,
                },
            )]),
            cgroup_root: "/sys/fs/cgroup/gpumesh".into(),
            uid_range: UidRange::default(),
            confine: Confine::default(),
            disk: crate::executor::DiskLimits::default(),
            containers: Default::default(),
        }
    }

    /// The plan for `spec` on a node with `cgroups`, fenced to GPU 3's node.
    fn plan(s: &ExecutorSettings, spec: &JobSpec, cgroups: CgroupLayout) -> Confinement {
        Confinement {
            cgroups,
            limits: Limits::for_job(spec, &s.confine),
            devices: vec![DeviceRule::char(195, 3)],
        }
    }

    fn render(args: &[OsString]) -> String {
        args.iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn alice() -> Identity {
        Identity {
            name: "alice".into(),
            uid: 1001,
            gid: 1001,
            groups: vec![44, 1001],
            home: Some("/home/alice".into()),
            shell: Some("/bin/bash".into()),
        }
    }

    #[test]
    fn the_supervisor_gets_the_user_and_the_limits() {
        let nobody = RunAs {
            name: "nobody".into(),
            uid: 65534,
            gid: 65534,
        };
        let s = settings(nobody.clone());
        let dir = JobDir::new(&s.jobs_dir, 42, 3);
        let spec: JobSpec = serde_json::from_value(serde_json::json!({
            "name": "train",
            "command": ["python", "train.py"],
            "wall_time_limit_s": 90,
            "cpu_millis": 1500,
            "memory_mib": 4096,
            "gpus": 1,
        }))
        .expect("spec");
        let v2 = CgroupLayout::V2 {
            root: s.cgroup_root.clone(),
        };
        let args = shim_args(
            &s,
            &spec,
            &dir,
            &plan(&s, &spec, v2),
            &alice(),
            Some(Path::new("/srv/data")),
            false,
        );
        expect!["shim --job-dir /data/jobs/j-42-g3 --lease /data/lease --lease-timeout 10s --grace 5s --run-as-uid 1001 --run-as-gid 1001 --wall-time 90s --run-as-groups 44,1001 --workdir /srv/data --cgroup-v2 /sys/fs/cgroup/gpumesh --cpu-millis 1500 --memory-mib 4096 --tasks-max 4096 --allow-device c 195:3 rwm -- python train.py"]
        .assert_eq(&render(&args));
        // Without cgroups the limits still travel, so the supervisor can say they are not
        // enforced; a CPU-only job gets the defaults for what it did not ask. A
        // node-configured user has no supplementary groups.
        let plain: JobSpec = serde_json::from_value(serde_json::json!({
            "name": "t",
            "command": ["true"],
            "cpu_millis": 500,
        }))
        .expect("spec");
        let user = Identity::of_run_as(s.user_for(&plain.tenant));
        let none = CgroupLayout::None {
            reason: "none".into(),
        };
        let plain_plan = plan(&s, &plain, none);
        expect!["shim --job-dir /data/jobs/j-42-g3 --lease /data/lease --lease-timeout 10s --grace 5s --run-as-uid 65534 --run-as-gid 65534 --cpu-millis 500 --memory-mib 4096 --tasks-max 4096 --allow-device c 195:3 rwm -- true"]
        .assert_eq(&render(&shim_args(&s, &plain, &dir, &plain_plan, &user, None, false)));
        // A tenant with a user of its own runs as that user.
        let vision = Identity::of_run_as(s.user_for("vision"));
        assert_eq!((vision.uid, vision.gid), (2001, 2001));
        assert_eq!(Identity::of_run_as(s.user_for("nlp")).uid, nobody.uid);
    }

    #[test]
    fn the_workdir_is_the_specs_else_the_home_else_the_runs_own() {
        let home = Some(Path::new("/home/alice"));
        assert_eq!(
            workdir(Some("/srv/data"), home),
            Ok(Some(PathBuf::from("/srv/data")))
        );
        assert_eq!(workdir(None, home), Ok(Some(PathBuf::from("/home/alice"))));
        assert_eq!(workdir(None, None), Ok(None));
        let err = workdir(Some("data"), home).expect_err("relative");
        assert!(err.contains("\"data\" is not an absolute path"), "{err}");
    }

    #[test]
    fn the_job_environment_says_who_and_where_and_the_placement_wins() {
        let spec_env = BTreeMap::from([
            ("HOME".to_owned(), "/scratch/alice".to_owned()),
            ("GPUMESH_JOB_ID".to_owned(), "forged".to_owned()),
            ("SECRET".to_owned(), "s".to_owned()),
        ]);
        let run_env = vec![("GPUMESH_JOB_ID", "7".to_owned())];
        let work = Path::new("/data/jobs/j-7-g1/work");
        let env = job_environment(&alice(), work, "/usr/bin:/bin", &spec_env, &run_env);
        let text: String = env.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
        expect![[r#"
            GPUMESH_JOB_ID=7
            HOME=/scratch/alice
            LANG=C.UTF-8
            LOGNAME=alice
            PATH=/usr/bin:/bin
            SECRET=s
            SHELL=/bin/bash
            USER=alice
        "#]]
        .assert_eq(&text);
        // The node's own job user lives in the run's work/ directory.
        let nobody = Identity::of_run_as(&RunAs {
            name: "nobody".into(),
            uid: 65534,
            gid: 65534,
        });
        let env = job_environment(&nobody, work, "/bin", &BTreeMap::new(), &[]);
        assert_eq!(env["HOME"], "/data/jobs/j-7-g1/work");
        assert_eq!(env["USER"], "nobody");
        assert!(!env.contains_key("SHELL"));
    }
}
