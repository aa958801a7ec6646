//! The executor (every agent): makes this node run exactly the placements the replicated state
//! gives it. Each pass compares desired (bindings for this node) with observed (its job
//! directories and supervisor processes), acts, and reports transitions through Raft.

pub mod job_dir;
pub mod lease;
pub mod logs;
mod reconcile;
pub mod shim;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gpu_raft_store::{ClusterState, Command, Job, JobId, JobState, NodeId, Rejection};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::Child;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use self::job_dir::JobDir;
use self::reconcile::{Action, Desired, Observed, reconcile};
use crate::cluster::{Cluster, ClusterError};
use crate::gpu::GpuBackend;

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
        if let Err(e) = std::fs::create_dir_all(&self.settings.jobs_dir) {
            warn!(error = %e, dir = %self.settings.jobs_dir.display(), "cannot create the jobs directory");
        }
        let mut applied = self.cluster.state.subscribe();
        let mut children = Children::new();
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = applied.changed() => {}
                () = tokio::time::sleep(self.settings.tick) => {}
            }
            self.pass(&mut children).await;
        }
    }

    async fn pass(&self, children: &mut Children) {
        children.retain(|_, child| matches!(child.try_wait(), Ok(None)));
        let me = self.cluster.id;
        let (desired, jobs) = self.cluster.state.read(|s| desired_runs(s, me));
        let observed = match self.observe() {
            Ok(o) => o,
            Err(e) => {
                warn!(error = %e, "cannot read the jobs directory");
                return;
            }
        };
        self.mark_busy_gpus(&jobs, &observed);
        // Start nothing while out of contact: the supervisor would fence it at once.
        let lease_fresh = lease::lease_age(&self.settings.lease_path)
            .is_some_and(|a| a < self.settings.lease / 2);
        for action in reconcile(&desired, &observed) {
            if !lease_fresh && matches!(action, Action::Start { .. }) {
                continue;
            }
            self.act(action, &jobs, children).await;
        }
    }

    fn observe(&self) -> std::io::Result<Vec<Observed>> {
        Ok(JobDir::scan(&self.settings.jobs_dir)?
            .into_iter()
            .map(|d| {
                let pid = d.shim_pid();
                let alive = pid.is_some_and(process_alive);
                Observed {
                    job: d.job,
                    generation: d.generation,
                    alive,
                    starting: pid.is_none() && d.age() < START_GRACE,
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
            .filter_map(|j| j.binding.as_ref())
            .flat_map(|b| b.gpus.iter().copied())
            .collect();
        for device in self.gpus.devices() {
            self.gpus
                .set_busy(device.index, busy.contains(&device.index));
        }
    }

    async fn act(&self, action: Action, jobs: &HashMap<JobId, Job>, children: &mut Children) {
        match action {
            Action::Start { job, generation } => {
                let Some(j) = jobs.get(&job) else { return };
                let dir = JobDir::new(&self.settings.jobs_dir, job, generation);
                match self.start(j, &dir) {
                    Ok(child) => {
                        info!(job_id = job, generation, "started");
                        children.insert((job, generation), child);
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
                if let Some(pid) = dir.shim_pid() {
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
                self.report(
                    Command::JobFinished {
                        job,
                        generation,
                        outcome,
                    },
                    Some(&dir),
                )
                .await;
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
    fn start(&self, job: &Job, dir: &JobDir) -> Result<Child, String> {
        dir.create()
            .map_err(|e| format!("creating {}: {e}", dir.path.display()))?;
        let Some(binding) = job.binding.as_ref() else {
            return Err("the job has no binding".into());
        };
        let uuids: Vec<String> = self.cluster.state.read(|s| {
            let node = s.nodes.get(&binding.node);
            binding
                .gpus
                .iter()
                .filter_map(|g| node.and_then(|n| n.gpu(*g)).map(|g| g.uuid.clone()))
                .collect()
        });
        let visible = uuids.join(",");
        let mut cmd = tokio::process::Command::new(&self.settings.agent_exe);
        cmd.arg("shim")
            .arg("--job-dir")
            .arg(&dir.path)
            .arg("--lease")
            .arg(&self.settings.lease_path)
            .arg("--lease-timeout")
            .arg(humantime::format_duration(self.settings.lease).to_string())
            .arg("--grace")
            .arg(humantime::format_duration(self.settings.stop_grace).to_string());
        if let Some(limit) = job.spec.wall_time_limit_s {
            cmd.arg("--wall-time").arg(format!("{limit}s"));
        }
        if let Some(w) = &job.spec.workdir {
            cmd.arg("--workdir").arg(w);
        }
        cmd.arg("--").args(&job.spec.command);
        cmd.env_clear()
            .env(
                "PATH",
                std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
            )
            .env("HOME", &dir.path)
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
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0);
        cmd.spawn()
            .map_err(|e| format!("spawning the supervisor: {e}"))
    }
}

/// This node's live placements, plus the jobs they belong to.
fn desired_runs(state: &ClusterState, me: NodeId) -> (Vec<Desired>, HashMap<JobId, Job>) {
    let mine: Vec<&Job> = state
        .jobs
        .values()
        .filter(|j| j.state.is_live() && j.binding.as_ref().is_some_and(|b| b.node == me))
        .collect();
    let desired = mine
        .iter()
        .map(|j| Desired {
            job: j.id,
            generation: j.generation,
            state: j.state,
            cancel: j.cancel_requested,
            evict: j.evict_requested,
        })
        .collect();
    // Every job with a run on this node at any generation, so stale runs can be named too.
    let jobs = state
        .jobs
        .values()
        .filter(|j| {
            j.binding.as_ref().is_some_and(|b| b.node == me) || j.state == JobState::Pending
        })
        .map(|j| (j.id, j.clone()))
        .collect();
    (desired, jobs)
}

/// Whether `pid` names a live process (a zombie of ours is reaped before this is asked).
fn process_alive(pid: i32) -> bool {
    pid > 0 && kill(Pid::from_raw(pid), None).is_ok() && !is_zombie(pid)
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}
