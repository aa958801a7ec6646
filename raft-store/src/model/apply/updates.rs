//! Applying a user's second thoughts about a job: an update of what a pending job asks for
//! (`UpdateJob`) and a requeue (`RequeueJob`).

use crate::JobId;
use crate::model::job::JobState;
use crate::model::job_update::JobUpdate;
use crate::model::outcome::{ApplyResult, Rejection, invalid};
use crate::model::state::ClusterState;

impl ClusterState {
    /// Make `update` to pending job `job`, or with `array` to every pending task of array
    /// `job`, all or none: each updated spec is checked first, and one that fails refuses the
    /// whole command. Tasks that run or ended keep the spec they ran with.
    pub(crate) fn update_job(
        &mut self,
        job: JobId,
        array: bool,
        update: &JobUpdate,
    ) -> Result<ApplyResult, Rejection> {
        let targets: Vec<JobId> = if array {
            let pending: Vec<JobId> = (self.array_tasks(job))
                .filter(|j| j.state == JobState::Pending)
                .map(|j| j.id)
                .collect();
            if pending.is_empty() {
                return Err(Rejection::NotNow {
                    message: format!("array j-{job} has no pending task to update"),
                });
            }
            pending
        } else {
            let j = self.jobs.get(&job).ok_or(Rejection::UnknownJob { job })?;
            if j.state != JobState::Pending {
                return Err(Rejection::NotNow {
                    message: format!(
                        "j-{job} is {}: only a pending job can be updated",
                        j.state.to_string().to_lowercase()
                    ),
                });
            }
            vec![job]
        };
        let mut updated = Vec::with_capacity(targets.len());
        for id in targets {
            let spec = &self.jobs[&id].spec;
            let new = update
                .applied_to(spec)
                .map_err(|e| invalid(format!("j-{id}: {e}")))?;
            updated.push((id, new));
        }
        for (id, spec) in updated {
            if let Some(j) = self.jobs.get_mut(&id) {
                j.spec = spec;
                self.job_log.record(id);
            }
        }
        Ok(ApplyResult::Ok)
    }

    /// Queue `job` again, or with `array` every task of array `job` that is not pending. A
    /// live job is asked to stop (as a drain's eviction does) and comes back pending without
    /// spending an attempt; an ended one still in the state is pending again at once, with its
    /// attempts renewed and its runs kept as history. A pending job is left as it is. The jobs
    /// that depended on an ended job were settled when it ended and stay as they are.
    pub(crate) fn requeue(&mut self, job: JobId, array: bool) -> Result<ApplyResult, Rejection> {
        let targets: Vec<JobId> = if array {
            self.array_task_ids(job)?
        } else {
            self.jobs.get(&job).ok_or(Rejection::UnknownJob { job })?;
            vec![job]
        };
        let ended = (targets.iter())
            .filter(|id| self.jobs[id].state.is_terminal())
            .count();
        self.check_pending_cap(&self.jobs[&targets[0]].spec, ended as u64)?;
        if let Some(j) = (targets.iter())
            .map(|id| &self.jobs[id])
            .find(|j| j.state.is_live() && j.cancel_requested)
        {
            return Err(Rejection::NotNow {
                message: format!("j-{} is being cancelled", j.id),
            });
        }
        for id in targets {
            let j = self.job_mut(id)?;
            match j.state {
                JobState::Pending => {}
                JobState::Bound | JobState::Running => {
                    j.evict_requested = true;
                    j.requeue_requested = true;
                }
                JobState::Succeeded | JobState::Failed | JobState::Cancelled => {
                    j.state = JobState::Pending;
                    j.attempts = 0;
                    j.finished_at_ms = None;
                    j.not_before_ms = None;
                    j.reason = Some("requeued on request".into());
                    self.job_log.record(id);
                }
            }
        }
        Ok(ApplyResult::Ok)
    }
}
