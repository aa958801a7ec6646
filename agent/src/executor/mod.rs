//! The executor (every agent): makes this node run exactly the placements the replicated state
//! gives it. Each pass compares desired (bindings for this node) with observed (its job
//! directories and supervisor processes), acts, and reports transitions through Raft.

pub mod isolation;
pub mod job_dir;
pub mod lease;
mod reconcile;
pub mod shim;
mod vm;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gpu_raft_store::job_log::KeptIndex;
use gpu_raft_store::{ClusterState, Command, Job, JobId, JobKind, JobSpec, NodeId, Rejection};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::Child;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use self::job_dir::{JobDir, Supervisor};
use self::reconcile::{Action, Desired, Observed, reconcile};
use crate::config::RunAs;
use crate::gpu::GpuBackend;
use crate::raft::{Cluster, ClusterError};

#[derive(Clone, Debug)]
pub struct ExecutorSettings {
    /// `<data_dir>/jobs`.
    pub jobs_dir: PathBuf,
    /// `<data_dir>/lease`, renewed by `LeaseKeeper`.
    pub lease_path: PathBuf,
    pub lease: Duration,
    /// SIGTERM → SIGKILL grace when stopping a job.
    pub stop_grace: Duration,
    /// This binary, run as `shim`.
    pub agent_exe: PathBuf,
    pub tick: Duration,
    /// The user jobs run as (`jobs.run_as`).
    pub run_as: RunAs,
    /// Per-tenant users (`jobs.run_as_by_tenant`).
    pub run_as_by_tenant: BTreeMap<String, RunAs>,
    /// Where job cgroups go when the node has cgroup v2 (`jobs.cgroup_root`).
    pub cgroup_root: PathBuf,
}

/// What this host offers jobs, found once at start.
#[derive(Clone, Debug, Default)]
struct Host {
    /// `cgroup_root`, ready for job cgroups; `None`: jobs run without CPU/memory limits.
    cgroups: Option<PathBuf>,
}

pub struct Executor {
    pub cluster: Cluster,
    pub gpus: Arc<dyn GpuBackend>,
    pub settings: ExecutorSettings,
}

/// A supervisor this agent started (kept so it can be reaped).
type Children = HashMap<(JobId, u64), Child>;

/// A supervisor still in start-up may take this long to write its pid.
const START_GRACE: Duration = Duration::from_secs(10);

impl Executor {
    pub async fn run(self, cancel: CancellationToken) {
        let host = self.prepare_host();
        let mut applied = self.cluster.state.subscribe();
        let mut children = Children::new();
        let mut mig_errors = HashMap::new();
        let mut mine = Mine::default();
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = applied.changed() => {}
                () = tokio::time::sleep(self.settings.tick) => {}
            }
            self.pass(&mut children, &host, &mut mig_errors, &mut mine)
                .await;
        }
    }

    /// Create the jobs directory, check the job user can reach it, and set up job cgroups,
    /// saying once what jobs will and will not get on this host.
    fn prepare_host(&self) -> Host {
        let s = &self.settings;
        let jobs_dir = &s.jobs_dir;
        // Jobs pass through to their own `work/` directories but cannot list the runs.
        let created = std::fs::create_dir_all(jobs_dir).and_then(|()| {
            std::fs::set_permissions(jobs_dir, std::fs::Permissions::from_mode(0o711))
        });
        if let Err(e) = created {
            warn!(error = %e, dir = %jobs_dir.display(), "cannot create the jobs directory");
        }
        let RunAs { name, uid, gid } = &s.run_as;
        if s.run_as.is_root() {
            warn!(user = %name, "jobs run as root (jobs.run_as): a job can do anything on this host");
        } else {
            info!(user = %name, uid, gid, "jobs run as an unprivileged user");
        }
        for (tenant, user) in &s.run_as_by_tenant {
            if user.is_root() {
                warn!(
                    tenant,
                    "jobs of this tenant run as root (jobs.run_as_by_tenant)"
                );
            } else {
                info!(tenant, user = %user.name, uid = user.uid, "jobs of this tenant run as their own user");
            }
        }
        if let Some(blocked) = isolation::unreachable_ancestor(jobs_dir, *uid, *gid) {
            warn!(
                user = %name,
                dir = %blocked.display(),
                "the job user cannot reach the jobs directory {}: jobs will fail to start until {} is searchable by it (e.g. chmod o+x)",
                jobs_dir.display(),
                blocked.display()
            );
        }
        let root = &s.cgroup_root;
        match isolation::prepare_root(root) {
            Ok(()) => {
                info!(cgroup_root = %root.display(), "each job runs in a cgroup of its own with its CPU/memory limits");
                Host {
                    cgroups: Some(root.clone()),
                }
            }
            Err(reason) => {
                warn!(
                    "cgroup v2 with cpu/memory delegation not available at {}: {reason}: jobs run without CPU/memory limits",
                    root.display()
                );
                Host::default()
            }
        }
    }

    /// Make every local GPU's MIG state match the replicated layout (level-triggered: after
    /// an agent restart, or a reboot that cleared MIG, the layout is re-applied). Only
    /// instances no job holds ever differ (`apply` changes a layout only then), so nothing in
    /// use is destroyed. Each failure is logged once until it changes.
    fn reconcile_mig(&self, errors: &mut HashMap<u32, String>) {
        let me = self.cluster.id;
        let wanted: Vec<(u32, gpu_raft_store::PartitionSpec)> = self.cluster.state.read(|s| {
            s.nodes.get(&me).map_or_else(Vec::new, |n| {
                n.inventory
                    .gpus
                    .iter()
                    .map(|g| (g.index, n.partition(g.index)))
                    .collect()
            })
        });
        for (index, p) in wanted {
            let want = (p.mode == gpu_raft_store::GpuMode::Mig).then_some(p.mig);
            let have = match self.gpus.mig_devices(index) {
                Ok(h) => h,
                Err(e) => {
                    let e = e.to_string();
                    if errors.insert(index, e.clone()).as_ref() != Some(&e) {
                        warn!(gpu = index, error = %e, "cannot read the GPU's MIG state");
                    }
                    continue;
                }
            };
            let same = match (&want, &have) {
                (None, None) => true,
                (Some(w), Some(h)) => crate::gpu::mig_matches(h, w),
                _ => false,
            };
            if same {
                errors.remove(&index);
                continue;
            }
            match self.gpus.apply_mig(index, want.as_deref()) {
                Ok(devices) => {
                    errors.remove(&index);
                    info!(gpu = index, instances = devices.len(), "MIG layout applied");
                }
                Err(e) => {
                    let e = e.to_string();
                    if errors.insert(index, e.clone()).as_ref() != Some(&e) {
                        warn!(gpu = index, error = %e, "cannot apply the MIG layout");
                    }
                }
            }
        }
    }

    async fn pass(
        &self,
        children: &mut Children,
        host: &Host,
        mig_errors: &mut HashMap<u32, String>,
        mine: &mut Mine,
    ) {
        children.retain(|_, child| matches!(child.try_wait(), Ok(None)));
        let me = self.cluster.id;
        let observed = match self.observe() {
            Ok(o) => o,
            Err(e) => {
                warn!(error = %e, "cannot read the jobs directory");
                return;
            }
        };
        let (desired, jobs) = self
            .cluster
            .state
            .read(|s| desired_runs(s, me, &observed, mine));
        self.mark_busy_gpus(&jobs, &observed);
        self.end_expired_vms(&jobs, &observed);
        self.reconcile_mig(mig_errors);
        // Start nothing while out of contact: the supervisor would fence it at once.
        let lease_fresh = lease::lease_age(&self.settings.lease_path)
            .is_some_and(|a| a < self.settings.lease / 2);
        for action in reconcile(&desired, &observed) {
            if !lease_fresh && matches!(action, Action::Start { .. }) {
                continue;
            }
            self.act(action, &jobs, children, host).await;
        }
    }

    /// A vm run has no process to enforce its wall limit: the executor ends it.
    fn end_expired_vms(&self, jobs: &HashMap<JobId, Job>, observed: &[Observed]) {
        let now = crate::clock::now_ms();
        for o in observed.iter().filter(|o| o.alive) {
            let dir = JobDir::new(&self.settings.jobs_dir, o.job, o.generation);
            let expired = jobs
                .get(&o.job)
                .is_some_and(|j| j.generation == o.generation && vm::past_wall_limit(j, now));
            if expired && vm::is_vm(&dir) {
                info!(
                    job_id = o.job,
                    generation = o.generation,
                    "vm run reached its wall limit"
                );
                if let Err(e) = vm::detach(&dir, &gpu_raft_store::Outcome::WallTimeExceeded) {
                    warn!(job_id = o.job, error = %e, "cannot end the vm run");
                }
            }
        }
    }

    /// Start a vm job: its pass-through GPUs' PCI addresses go to the VM (see `vm.rs`).
    fn start_vm(&self, job: &Job, dir: &JobDir) -> Result<(), String> {
        let Some((_, binding)) = job.member_on(self.cluster.id) else {
            return Err("the job has no placement on this node".into());
        };
        let uuids: Vec<String> = self.cluster.state.read(|s| {
            let node = s.nodes.get(&binding.node);
            binding
                .gpus
                .iter()
                .filter_map(|g| node.and_then(|n| n.gpu(*g)).map(|g| g.uuid.clone()))
                .collect()
        });
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

    fn observe(&self) -> std::io::Result<Vec<Observed>> {
        Ok(JobDir::scan(&self.settings.jobs_dir)?
            .into_iter()
            .map(|d| {
                let supervisor = d.supervisor();
                // A vm run has no process: it is live until its exit is recorded.
                let vm = vm::is_vm(&d);
                let alive = if vm {
                    d.exit().is_none()
                } else {
                    supervisor.as_ref().is_some_and(Supervisor::is_running)
                };
                Observed {
                    job: d.job,
                    generation: d.generation,
                    alive,
                    starting: !vm && supervisor.is_none() && d.age() < START_GRACE,
                    exit: d.exit(),
                    stop_requested: d.stop_reason().is_some(),
                    reported: d.is_reported(),
                }
            })
            .collect())
    }

    fn mark_busy_gpus(&self, jobs: &HashMap<JobId, Job>, observed: &[Observed]) {
        let busy: Vec<u32> = observed
            .iter()
            .filter(|o| o.alive)
            .filter_map(|o| jobs.get(&o.job).filter(|j| j.generation == o.generation))
            .filter_map(|j| j.member_on(self.cluster.id).map(|(_, b)| b))
            .flat_map(|b| b.gpus.iter().copied())
            .collect();
        for device in self.gpus.devices() {
            self.gpus
                .set_busy(device.index, busy.contains(&device.index));
        }
    }

    async fn act(
        &self,
        action: Action,
        jobs: &HashMap<JobId, Job>,
        children: &mut Children,
        host: &Host,
    ) {
        match action {
            Action::Start { job, generation } => {
                let Some(j) = jobs.get(&job) else { return };
                let dir = JobDir::new(&self.settings.jobs_dir, job, generation);
                let started = if j.spec.kind == JobKind::Vm {
                    self.start_vm(j, &dir).map(|()| None)
                } else {
                    self.start(j, &dir, host).map(Some)
                };
                match started {
                    Ok(child) => {
                        info!(job_id = job, generation, "started");
                        if let Some(child) = child {
                            children.insert((job, generation), child);
                        }
                    }
                    Err(message) => {
                        warn!(job_id = job, generation, %message, "could not start the supervisor");
                        let outcome = gpu_raft_store::Outcome::FailedToStart { message };
                        if dir
                            .create()
                            .and_then(|()| dir.write_exit(&outcome))
                            .is_err()
                        {
                            self.report(
                                Command::JobFinished {
                                    job,
                                    generation,
                                    outcome,
                                },
                                None,
                            )
                            .await;
                        }
                    }
                }
            }
            Action::Stop {
                job,
                generation,
                reason,
            } => {
                let dir = JobDir::new(&self.settings.jobs_dir, job, generation);
                info!(job_id = job, generation, ?reason, "stopping");
                if let Err(e) = dir.request_stop(reason) {
                    warn!(job_id = job, error = %e, "cannot record the stop request");
                }
                if vm::is_vm(&dir) {
                    if let Err(e) = vm::detach(&dir, &reason.outcome()) {
                        warn!(job_id = job, error = %e, "cannot end the vm run");
                    }
                    return;
                }
                // Checked again here: the supervisor may have ended since it was observed.
                if let Some(s) = dir.supervisor().filter(Supervisor::is_running)
                    && let Ok(pid) = i32::try_from(s.pid)
                {
                    kill(Pid::from_raw(pid), Signal::SIGTERM).ok();
                }
            }
            Action::ReportStarted { job, generation } => {
                self.report(Command::JobStarted { job, generation }, None)
                    .await;
            }
            Action::ReportFinished {
                job,
                generation,
                outcome,
            } => {
                info!(job_id = job, generation, %outcome, "finished");
                let dir = JobDir::new(&self.settings.jobs_dir, job, generation);
                // A gang member that exited 0 reports only itself: the gang succeeds when
                // every member has. Any other end ends the whole gang.
                let gang = jobs.get(&job).is_some_and(|j| !j.gang.is_empty());
                let cmd = if gang && matches!(outcome, gpu_raft_store::Outcome::Exited { code: 0 })
                {
                    Command::GangMemberFinished {
                        job,
                        generation,
                        node: self.cluster.id,
                    }
                } else {
                    Command::JobFinished {
                        job,
                        generation,
                        outcome,
                    }
                };
                self.report(cmd, Some(&dir)).await;
            }
        }
    }

    /// Propose a transition. Once the cluster has it (or has moved past it), `dir` is marked
    /// reported so it is never sent again; other failures are retried on the next pass.
    async fn report(&self, cmd: Command, dir: Option<&JobDir>) {
        let settled = match self.cluster.write(cmd.clone()).await {
            Ok(_) => true,
            Err(ClusterError::Rejected(
                r @ (Rejection::Stale { .. } | Rejection::UnknownJob { .. }),
            )) => {
                info!(reason = %r, "the cluster has moved past this report");
                true
            }
            Err(e) => {
                warn!(error = %e, %cmd, "report failed; will retry");
                false
            }
        };
        if settled
            && let Some(dir) = dir
            && let Err(e) = dir.mark_reported()
        {
            warn!(error = %e, dir = %dir.path.display(), "cannot mark a run reported");
        }
    }

    /// Launch the supervisor for one placement, with the job's environment.
    fn start(&self, job: &Job, dir: &JobDir, host: &Host) -> Result<Child, String> {
        dir.create()
            .map_err(|e| format!("creating {}: {e}", dir.path.display()))?;
        let Some((rank, binding)) = job.member_on(self.cluster.id) else {
            return Err("the job has no placement on this node".into());
        };
        let gang_env = self.cluster.state.read(|s| gang_env(s, job, rank, binding));
        let uuids: Vec<String> = self.cluster.state.read(|s| {
            let node = s.nodes.get(&binding.node);
            binding
                .gpus
                .iter()
                .filter_map(|g| node.and_then(|n| n.gpu(*g)).map(|g| g.uuid.clone()))
                .collect()
        });
        let (visible, slice_env) = match &binding.slice {
            None => (uuids.join(","), Vec::new()),
            Some(slice) => slice_env(self.gpus.as_ref(), binding, slice, &uuids)?,
        };
        let mut cmd = tokio::process::Command::new(&self.settings.agent_exe);
        cmd.args(shim_args(
            &self.settings,
            &job.spec,
            dir,
            host.cgroups.as_deref(),
        ));
        cmd.env_clear()
            .env(
                "PATH",
                std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
            )
            .env("HOME", isolation::work_dir(&dir.path))
            .env("LANG", "C.UTF-8")
            .envs(&job.spec.env)
            .env("CUDA_VISIBLE_DEVICES", &visible)
            .env(
                "NVIDIA_VISIBLE_DEVICES",
                if visible.is_empty() {
                    "void"
                } else {
                    visible.as_str()
                },
            )
            .env("GPUMESH_JOB_ID", job.id.to_string())
            .env("GPUMESH_JOB_NAME", &job.spec.name)
            .env("GPUMESH_TENANT", &job.spec.tenant)
            .env("GPUMESH_GENERATION", binding.generation.to_string())
            .env("GPUMESH_NODE_ID", binding.node.to_string())
            .env(
                "GPUMESH_GPUS",
                binding
                    .gpus
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            )
            .envs(gang_env)
            .envs(slice_env)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0);
        cmd.spawn()
            .map_err(|e| format!("spawning the supervisor: {e}"))
    }
}

/// Extra environment variables of a sliced run.
type SliceVars = Vec<(&'static str, String)>;

/// `CUDA_VISIBLE_DEVICES` and the extra variables of a sliced run: the MIG device's UUID
/// (from the backend, which created it), or the GPU's UUID with MPS limits for a share.
fn slice_env(
    gpus: &dyn GpuBackend,
    binding: &gpu_raft_store::Binding,
    slice: &gpu_raft_store::Slice,
    uuids: &[String],
) -> Result<(String, SliceVars), String> {
    let gpu = binding.gpus.first().copied().unwrap_or_default();
    let mut env = vec![("GPUMESH_GPU_SLICE", slice.to_string())];
    match slice {
        gpu_raft_store::Slice::Mig { profile, start } => {
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
        gpu_raft_store::Slice::Shared { memory_mib, share } => {
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

impl ExecutorSettings {
    /// The user a job of `tenant` runs as.
    pub fn user_for(&self, tenant: &str) -> &RunAs {
        self.run_as_by_tenant.get(tenant).unwrap_or(&self.run_as)
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
pub(crate) fn gang_env(
    state: &ClusterState,
    job: &Job,
    rank: usize,
    member: &gpu_raft_store::Binding,
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

/// The ids of the live jobs placed (in whole or in part) on this node, kept between passes:
/// a pass runs on every applied entry, and scanning every job each time (tens of thousands in a
/// long-lived state, on every agent) made each entry cost O(all jobs) on every agent.
type Mine = KeptIndex<BTreeSet<JobId>>;

fn placed_here(job: &Job, me: NodeId) -> bool {
    job.state.is_live() && job.on_node(me)
}

/// This node's live placements, plus the jobs they and the runs `observed` here belong to.
/// Only those jobs are copied.
fn desired_runs(
    state: &ClusterState,
    me: NodeId,
    observed: &[Observed],
    mine: &mut Mine,
) -> (Vec<Desired>, HashMap<JobId, Job>) {
    let mine = mine.get(
        state,
        |_| true,
        |s| {
            s.jobs
                .values()
                .filter(|j| placed_here(j, me))
                .map(|j| j.id)
                .collect()
        },
        |ids, s, job| {
            if s.jobs.get(&job).is_some_and(|j| placed_here(j, me)) {
                ids.insert(job);
            } else {
                ids.remove(&job);
            }
        },
    );
    let desired = mine
        .iter()
        .filter_map(|id| state.jobs.get(id))
        .map(|j| Desired {
            job: j.id,
            generation: j.generation,
            state: j.state,
            cancel: j.cancel_requested,
            evict: j.evict_requested,
        })
        .collect();
    // The jobs of stale runs too (a requeued job's old run here), so they can be named.
    let jobs = mine
        .iter()
        .copied()
        .chain(observed.iter().map(|o| o.job))
        .filter_map(|id| state.jobs.get(&id).map(|j| (id, j.clone())))
        .collect();
    (desired, jobs)
}

#[cfg(test)]
mod tests {
    use expect_test::expect;
    use proptest::prelude::*;

    use super::*;
    use crate::scheduler::random_history::{job_step, step_command};
    use crate::scheduler::testkit::{apply, gpu, node};

    proptest! {
        /// Whatever entries are applied, the runs a pass wants from the kept set of this
        /// node's jobs are those a scan of every job finds.
        #[test]
        fn kept_placements_equal_a_scan_of_every_job(
            steps in proptest::collection::vec(job_step(), 1..60),
        ) {
            let mut state = ClusterState::new();
            for id in [1, 2] {
                node(&mut state, id, (0..2).map(|i| gpu(i, "A100", 0)).collect());
            }
            let mut kept = [Mine::default(), Mine::default()];
            for step in &steps {
                if let Some(cmd) = step_command(&state, step) {
                    apply(&mut state, cmd);
                }
                for (me, mine) in [1, 2].into_iter().zip(&mut kept) {
                    let (want, _) = desired_runs(&state, me, &[], mine);
                    let (scanned, _) = desired_runs(&state, me, &[], &mut Mine::default());
                    prop_assert_eq!(want, scanned);
                }
            }
        }
    }

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
    }
}
