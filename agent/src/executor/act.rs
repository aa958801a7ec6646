//! Acting on what a pass found: each action of the diff (start, stop, report a transition),
//! ending vm runs past their wall limit, reporting live runs' phases, and reporting through
//! Raft.

use std::collections::HashMap;

use gpu_raft_store::{Command, Job, JobId, Outcome, Rejection};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tracing::{debug, info, warn};

use super::job_dir::{JobDir, StopReason, Supervisor};
use super::launcher::Started;
use super::phase_report::PhaseReports;
use super::reconcile::{Action, Observed};
use super::setup::Host;
use super::{Children, Executor, vm};
use crate::raft::ClusterError;

impl Executor {
    pub(super) async fn act(
        &self,
        action: Action,
        jobs: &HashMap<JobId, Job>,
        children: &Children,
        host: &Host,
    ) {
        match action {
            Action::Start { job, generation } => {
                self.start_run(job, generation, jobs, children, host).await;
            }
            Action::Stop {
                job,
                generation,
                reason,
            } => self.stop_run(job, generation, reason),
            Action::ReportStarted { job, generation } => {
                self.report(Command::JobStarted { job, generation }, None)
                    .await;
            }
            Action::ReportFinished {
                job,
                generation,
                outcome,
            } => self.report_finished(job, generation, outcome, jobs).await,
        }
    }

    /// Launch a run; a run that cannot start is recorded as failed to start in its directory
    /// (reported on a later pass), or reported at once when not even that can be written.
    async fn start_run(
        &self,
        job: JobId,
        generation: u64,
        jobs: &HashMap<JobId, Job>,
        children: &Children,
        host: &Host,
    ) {
        let Some(j) = jobs.get(&job) else { return };
        let dir = JobDir::new(&self.settings.jobs_dir, job, generation);
        match self.launch(j, &dir, host).await {
            Ok(started) => {
                info!(job_id = job, generation, "started");
                if let Some(Started::Child(child)) = started {
                    children.watch(child);
                }
            }
            Err(message) => {
                warn!(job_id = job, generation, %message, "could not start the supervisor");
                let outcome = Outcome::FailedToStart { message };
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

    /// Record the stop request, then end a vm run, or send its supervisor SIGTERM (the
    /// supervisor stops the job and escalates after the grace).
    fn stop_run(&self, job: JobId, generation: u64, reason: StopReason) {
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

    async fn report_finished(
        &self,
        job: JobId,
        generation: u64,
        outcome: Outcome,
        jobs: &HashMap<JobId, Job>,
    ) {
        info!(job_id = job, generation, %outcome, "finished");
        let dir = JobDir::new(&self.settings.jobs_dir, job, generation);
        // A supervisor that died mid-pull left the registry login behind.
        super::registry_auth::remove(&dir.path);
        // A gang member that exited 0 reports only itself: the gang succeeds when
        // every member has. Any other end ends the whole gang.
        let gang = jobs.get(&job).is_some_and(|j| !j.gang.is_empty());
        let cmd = if gang && matches!(outcome, Outcome::Exited { code: 0 }) {
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

    /// Report the phase of each live run here whose supervisor says something other than the
    /// replicated state shows (pulling its image), as `phases` allows (not chatty).
    pub(super) async fn report_phases(
        &self,
        jobs: &HashMap<JobId, Job>,
        observed: &[Observed],
        phases: &mut PhaseReports,
    ) {
        let now = std::time::Instant::now();
        let live = |o: &&Observed| {
            o.alive
                && o.exit.is_none()
                && jobs
                    .get(&o.job)
                    .is_some_and(|j| j.state.is_live() && j.generation == o.generation)
        };
        let live_runs: Vec<&Observed> = observed.iter().filter(live).collect();
        phases.retain(|run| live_runs.iter().any(|o| (o.job, o.generation) == *run));
        for o in live_runs {
            let dir = JobDir::new(&self.settings.jobs_dir, o.job, o.generation);
            let current = dir.phase();
            let shown = jobs
                .get(&o.job)
                .and_then(Job::live_phase)
                .map(|p| p.text.as_str());
            let run = (o.job, o.generation);
            let Some(phase) = phases.due(run, current.as_deref(), shown, now) else {
                continue;
            };
            let cmd = Command::ReportRunPhase {
                job: o.job,
                generation: o.generation,
                phase,
            };
            match self.cluster.write(cmd.clone()).await {
                Ok(_) => {}
                // A mesh with agents older than protocol 7, or a run the cluster moved past.
                Err(
                    e @ (ClusterError::NeedsUpgrade { .. }
                    | ClusterError::Rejected(Rejection::Stale { .. })),
                ) => debug!(error = %e, %cmd, "phase not reported"),
                Err(e) => warn!(error = %e, %cmd, "phase report failed; will retry"),
            }
        }
    }

    /// A vm run has no process to enforce its wall limit: the executor ends it.
    pub(super) fn end_expired_vms(&self, jobs: &HashMap<JobId, Job>, observed: &[Observed]) {
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
                if let Err(e) = vm::detach(&dir, &Outcome::WallTimeExceeded) {
                    warn!(job_id = o.job, error = %e, "cannot end the vm run");
                }
            }
        }
    }
}
