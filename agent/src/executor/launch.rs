//! Launching one run: a supervisor process (`gpu-agent shim`) with the job's arguments and
//! environment (its GPUs, MIG device or MPS limits, gang rendezvous), or for a vm job the
//! record of its pass-through GPUs.

use std::ffi::OsString;
use std::path::Path;

use gpu_raft_store::{Binding, ClusterState, Job, JobKind, JobSpec, Slice};

use super::job_dir::JobDir;
use super::launcher::{self, Started, SupervisorStart};
use super::setup::Host;
use super::{Executor, ExecutorSettings, isolation, vm};
use crate::gpu::GpuBackend;

/// The supervisor's whole environment when it runs as a systemd unit: a unit's `Environment=`
/// is readable by every user of the host (`systemctl show`), so it never carries the job's.
const SUPERVISOR_ENV: [(&str, &str); 2] = [
    (
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    ),
    ("LANG", "C.UTF-8"),
];

impl Executor {
    /// Start the run of `job` in `dir`: its supervisor, or for a vm job nothing (`None`).
    pub(super) async fn launch(
        &self,
        job: &Job,
        dir: &JobDir,
        host: &Host,
    ) -> Result<Option<Started>, String> {
        if job.spec.kind == JobKind::Vm {
            self.start_vm(job, dir).map(|()| None)
        } else {
            self.start(job, dir, host).await.map(Some)
        }
    }

    /// Launch the supervisor for one placement, with the job's environment.
    async fn start(&self, job: &Job, dir: &JobDir, host: &Host) -> Result<Started, String> {
        dir.create()
            .map_err(|e| format!("creating {}: {e}", dir.path.display()))?;
        let Some((rank, binding)) = job.member_on(self.cluster.id) else {
            return Err("the job has no placement on this node".into());
        };
        let gang_env = self.cluster.state.read(|s| gang_env(s, job, rank, binding));
        let uuids = self.bound_uuids(binding);
        let (visible, slice_env) = match &binding.slice {
            None => (uuids.join(","), Vec::new()),
            Some(slice) => slice_env(self.gpus.as_ref(), binding, slice, &uuids)?,
        };
        let args = shim_args(&self.settings, &job.spec, dir, host.cgroups.as_deref());
        let env: Vec<(String, String)> = if self.launcher.is_systemd() {
            // Only the fixed environment: until the job's variables travel in the run's
            // directory, a job started as a unit gets none of them.
            let text = |(k, v): &(&str, &str)| ((*k).to_owned(), (*v).to_owned());
            SUPERVISOR_ENV.iter().map(text).collect()
        } else {
            let path = std::env::var_os("PATH")
                .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into())
                .to_string_lossy()
                .into_owned();
            let home = isolation::work_dir(&dir.path)
                .to_string_lossy()
                .into_owned();
            let mut env = vec![
                ("PATH".to_owned(), path),
                ("HOME".to_owned(), home),
                ("LANG".to_owned(), "C.UTF-8".to_owned()),
            ];
            env.extend(job.spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
            let run = placement_env(job, binding, &visible)
                .into_iter()
                .chain(gang_env)
                .chain(slice_env);
            env.extend(run.map(|(k, v)| (k.to_owned(), v)));
            env
        };
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.launcher
            .start(SupervisorStart {
                exe: &self.settings.agent_exe,
                args,
                env: &env,
                job: job.id,
                generation: binding.generation,
                job_name: &job.spec.name,
                stop_grace: self.settings.stop_grace,
                cpu_millis: job.spec.cpu_millis,
                memory_mib: job.spec.memory_mib,
                tasks_max: self.settings.tasks_max,
                gpu_nodes: binding.gpus.iter().map(|g| gpu_node(*g)).collect(),
                extra_devices: launcher::expand_devices(&self.settings.extra_devices),
            })
            .await
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

/// The device node of the GPU with driver index `index`.
// The GPU backend's device info will name each GPU's node; until then NVIDIA's fixed naming.
fn gpu_node(index: u32) -> std::path::PathBuf {
    format!("/dev/nvidia{index}").into()
}

/// The variables that tell a run where it runs: the GPUs it sees (`visible`, the value of
/// `CUDA_VISIBLE_DEVICES`) and its job, generation, node and GPU indices.
fn placement_env(job: &Job, binding: &Binding, visible: &str) -> Vec<(&'static str, String)> {
    vec![
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
    ]
}

/// Extra environment variables of a sliced run.
type SliceVars = Vec<(&'static str, String)>;

/// `CUDA_VISIBLE_DEVICES` and the extra variables of a sliced run: the MIG device's UUID
/// (from the backend, which created it), or the GPU's UUID with MPS limits for a share.
fn slice_env(
    gpus: &dyn GpuBackend,
    binding: &Binding,
    slice: &Slice,
    uuids: &[String],
) -> Result<(String, SliceVars), String> {
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
/// `cgroup_root` is `Some` when the node can give the run a cgroup.
pub fn shim_args(
    settings: &ExecutorSettings,
    spec: &JobSpec,
    dir: &JobDir,
    cgroup_root: Option<&Path>,
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
        settings.user_for(&spec.tenant).uid.to_string().into(),
        "--run-as-gid".into(),
        settings.user_for(&spec.tenant).gid.to_string().into(),
    ];
    let mut flag = |name: &str, value: OsString| {
        args.push(name.into());
        args.push(value);
    };
    if let Some(limit) = spec.wall_time_limit_s {
        flag("--wall-time", format!("{limit}s").into());
    }
    if let Some(w) = &spec.workdir {
        flag("--workdir", w.into());
    }
    if let Some(root) = cgroup_root {
        flag(
            "--cgroup",
            isolation::job_cgroup(root, dir.job, dir.generation).into(),
        );
    }
    if let Some(m) = spec.cpu_millis {
        flag("--cpu-millis", m.to_string().into());
    }
    if let Some(m) = spec.memory_mib {
        flag("--memory-mib", m.to_string().into());
    }
    args.push("--".into());
    args.extend(spec.command.iter().map(OsString::from));
    args
}

/// The distributed-training environment of a gang member (what torchrun, NCCL and Horovod
/// read), empty for a single-node job. Every member agrees on it: the rendezvous is member 0's
/// host and a port derived from the job id (29500 + id mod 1000); one process per node, so
/// `RANK` is the node's first global rank and `LOCAL_RANK` 0.
fn gang_env(
    state: &ClusterState,
    job: &Job,
    rank: usize,
    member: &Binding,
) -> Vec<(&'static str, String)> {
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
    use crate::config::RunAs;

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
            extra_devices: Vec::new(),
            tasks_max: 16_384,
        }
    }

    fn render(args: &[OsString]) -> String {
        args.iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn the_supervisor_gets_the_user_and_the_limits() {
        let s = settings(RunAs {
            name: "nobody".into(),
            uid: 65534,
            gid: 65534,
        });
        let dir = JobDir::new(&s.jobs_dir, 42, 3);
        let spec: JobSpec = serde_json::from_value(serde_json::json!({
            "name": "train",
            "command": ["python", "train.py"],
            "workdir": "/srv/data",
            "wall_time_limit_s": 90,
            "cpu_millis": 1500,
            "memory_mib": 4096,
        }))
        .expect("spec");
        expect![[r#"shim --job-dir /data/jobs/j-42-g3 --lease /data/lease --lease-timeout 10s --grace 5s --run-as-uid 65534 --run-as-gid 65534 --wall-time 90s --workdir /srv/data --cgroup /sys/fs/cgroup/gpumesh/job-42-g3 --cpu-millis 1500 --memory-mib 4096 -- python train.py"#]]
        .assert_eq(&render(&shim_args(&s, &spec, &dir, Some(&s.cgroup_root))));
        // Without cgroup v2 the limits still travel, so the supervisor can say they are not
        // enforced.
        let plain: JobSpec = serde_json::from_value(serde_json::json!({
            "name": "t",
            "command": ["true"],
            "cpu_millis": 500,
        }))
        .expect("spec");
        expect![[r#"shim --job-dir /data/jobs/j-42-g3 --lease /data/lease --lease-timeout 10s --grace 5s --run-as-uid 65534 --run-as-gid 65534 --cpu-millis 500 -- true"#]]
        .assert_eq(&render(&shim_args(&s, &plain, &dir, None)));
        // A tenant with a user of its own runs as that user.
        let vision: JobSpec = serde_json::from_value(serde_json::json!({
            "name": "t",
            "tenant": "vision",
            "command": ["true"],
        }))
        .expect("spec");
        expect![[r#"shim --job-dir /data/jobs/j-42-g3 --lease /data/lease --lease-timeout 10s --grace 5s --run-as-uid 2001 --run-as-gid 2001 -- true"#]]
        .assert_eq(&render(&shim_args(&s, &vision, &dir, None)));
        // A run started as a systemd unit: the same command, told so, without a cgroup of its
        // own (the launcher's host has none to offer).
        let unit = crate::executor::systemd_unit::unit_args(
            &shim_args(&s, &spec, &dir, None),
            "gpumesh-j42-g3.service",
        )
        .expect("args");
        expect![[r#"shim --systemd-unit gpumesh-j42-g3.service --job-dir /data/jobs/j-42-g3 --lease /data/lease --lease-timeout 10s --grace 5s --run-as-uid 65534 --run-as-gid 65534 --wall-time 90s --workdir /srv/data --cpu-millis 1500 --memory-mib 4096 -- python train.py"#]]
        .assert_eq(&unit.join(" "));
    }
}
