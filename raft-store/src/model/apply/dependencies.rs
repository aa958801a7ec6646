//! Applying what a pending job waits for before the scheduler may place it: its dependencies
//! (checked at submission, settled whenever a job they name changes state, the job ended once
//! one can never be met), its singleton group, and a user's hold.

use std::collections::{BTreeSet, VecDeque};

use crate::JobId;
use crate::model::dependency::{Progress, Verdict};
use crate::model::job::{Job, JobSpec, JobState};
use crate::model::job_log::Cursor;
use crate::model::outcome::{ApplyResult, Rejection, invalid};
use crate::model::state::ClusterState;

impl ClusterState {
    /// The jobs of `spec.after` it must still wait for. Each must be a job of its tenant that
    /// the state holds (any other id gets the same answer, so a caller learns nothing of other
    /// tenants' jobs), and none may have ended in a way that never meets its dependency.
    pub(crate) fn unmet_dependencies(&self, spec: &JobSpec) -> Result<BTreeSet<JobId>, Rejection> {
        let mut waiting = BTreeSet::new();
        for d in &spec.after {
            let on = self
                .jobs
                .get(&d.job)
                .filter(|j| j.spec.tenant == spec.tenant)
                .ok_or_else(|| {
                    invalid(format!(
                        "--after {d}: tenant {} has no job j-{} in the cluster's state (finished jobs leave it after the retention period)",
                        spec.tenant, d.job
                    ))
                })?;
            match d.verdict(progress(on)) {
                Verdict::Met => {}
                Verdict::Waiting => {
                    waiting.insert(d.job);
                }
                Verdict::Never => {
                    return Err(invalid(format!(
                        "--after {d} can never be met: j-{} already {}",
                        d.job,
                        on.state.to_string().to_lowercase()
                    )));
                }
            }
        }
        Ok(waiting)
    }

    /// Job `id` (just submitted) waits for `waiting`.
    pub(crate) fn wait_for(&mut self, id: JobId, waiting: BTreeSet<JobId>) {
        for &on in &waiting {
            self.dependents.entry(on).or_default().insert(id);
        }
        if let Some(j) = self.jobs.get_mut(&id) {
            j.waiting_for = waiting;
        }
    }

    /// Settle the dependencies on every job that changed state since `cursor`: a dependency
    /// met is crossed off its job's list, and a job with one that can never be met is
    /// cancelled with the reason — which settles the jobs waiting for it in turn.
    pub(crate) fn settle_dependents(&mut self, cursor: Cursor, now: u64) {
        if self.dependents.is_empty() {
            return;
        }
        let changed: Vec<JobId> = match self.job_log.since(cursor) {
            Some(ids) => ids.filter(|id| self.dependents.contains_key(id)).collect(),
            // Too many changes for the log to tell: look at every job that has dependents.
            None => self.dependents.keys().copied().collect(),
        };
        let mut work: VecDeque<JobId> = changed.into();
        while let Some(on) = work.pop_front() {
            work.extend(self.settle_on(on, now));
        }
    }

    /// Settle the dependencies on job `on`; the jobs this cancelled.
    fn settle_on(&mut self, on: JobId, now: u64) -> Vec<JobId> {
        let Some(waiters) = self.dependents.remove(&on) else {
            return Vec::new();
        };
        let Some(on_job) = self.jobs.get(&on) else {
            return Vec::new();
        };
        let mut still = BTreeSet::new();
        let mut met = Vec::new();
        let mut never = Vec::new();
        for w in waiters {
            let Some(job) = self.jobs.get(&w).filter(|j| j.waiting_for.contains(&on)) else {
                continue;
            };
            let verdicts = job.spec.after.iter().filter(|d| d.job == on);
            let mut verdict = Verdict::Met;
            for d in verdicts {
                match d.verdict(progress(on_job)) {
                    Verdict::Never => {
                        never.push((w, format!("{d}: j-{on} {}", state_word(on_job))));
                        verdict = Verdict::Never;
                        break;
                    }
                    Verdict::Waiting => verdict = Verdict::Waiting,
                    Verdict::Met => {}
                }
            }
            match verdict {
                Verdict::Met => met.push(w),
                Verdict::Waiting => {
                    still.insert(w);
                }
                Verdict::Never => {}
            }
        }
        if !still.is_empty() {
            self.dependents.insert(on, still);
        }
        for w in met {
            if let Some(j) = self.jobs.get_mut(&w) {
                j.waiting_for.remove(&on);
                if j.waiting_for.is_empty() {
                    self.job_log.record(w);
                }
            }
        }
        let mut cancelled = Vec::new();
        for (w, why) in never {
            if let Some(j) = self
                .jobs
                .get_mut(&w)
                .filter(|j| j.state == JobState::Pending)
            {
                j.cancel_pending(now, Some(format!("dependency never satisfied: {why}")));
                self.job_log.record(w);
                cancelled.push(w);
            }
        }
        cancelled
    }

    /// Hold a pending job (it is not placed until released), or release it.
    pub(crate) fn hold(&mut self, job: JobId, hold: bool) -> Result<ApplyResult, Rejection> {
        let j = self.job_mut(job)?;
        if j.state != JobState::Pending {
            if !hold {
                return Ok(ApplyResult::Ok);
            }
            return Err(Rejection::NotNow {
                message: format!(
                    "j-{job} is {}: only a pending job can be held",
                    j.state.to_string().to_lowercase()
                ),
            });
        }
        if j.held != hold {
            j.held = hold;
            self.job_log.record(job);
        }
        Ok(ApplyResult::Ok)
    }

    /// Why pending `job` may not be placed yet, if something other than room holds it: a
    /// user's hold, a dependency not met, a live job of its singleton group, or its array's
    /// `%limit`.
    pub fn gate(&self, job: &Job) -> Option<String> {
        if job.held {
            return Some("held: release it with `gpuctl job release`".into());
        }
        if !job.waiting_for.is_empty() {
            let waits: Vec<String> = job
                .spec
                .after
                .iter()
                .filter(|d| job.waiting_for.contains(&d.job))
                .map(|d| d.wait_text())
                .collect();
            return Some(format!("dependency: waiting for {}", waits.join(", ")));
        }
        if job.spec.singleton
            && let Some(other) = self.live_namesake(job)
        {
            return Some(format!(
                "singleton: waiting for j-{other} (also named {:?}) to end",
                job.spec.name
            ));
        }
        self.array_throttle(job, 0)
    }

    /// A live job of `job`'s tenant with its name, other than itself.
    pub fn live_namesake(&self, job: &Job) -> Option<JobId> {
        self.jobs
            .values()
            .find(|j| {
                j.state.is_live()
                    && j.id != job.id
                    && j.spec.name == job.spec.name
                    && j.spec.tenant == job.spec.tenant
            })
            .map(|j| j.id)
    }
}

/// How far `job` has got, as a dependency on it sees it.
fn progress(job: &Job) -> Progress {
    match job.state {
        JobState::Pending | JobState::Bound => Progress::NotStarted,
        JobState::Running => Progress::Running,
        JobState::Succeeded => Progress::Succeeded,
        JobState::Failed | JobState::Cancelled => Progress::NotOk,
    }
}

/// `failed`, `succeeded`, `was cancelled`: how a job ended, for a reason.
fn state_word(job: &Job) -> String {
    match job.state {
        JobState::Cancelled => "was cancelled".to_owned(),
        s => s.to_string().to_lowercase(),
    }
}
