//! Applying job arrays: a submission becomes one pending task per index (consecutive ids, the
//! first naming the array); tasks of an array with a `%limit` are tracked while they hold GPUs
//! (`ClusterState::array_live`), so a bind beyond the limit is refused; a cancel or hold of the
//! whole array reaches every task still unfinished.

use std::collections::BTreeSet;

use crate::JobId;
use crate::model::array::ArrayTask;
use crate::model::command::Submission;
use crate::model::job::{Job, JobSpec};
use crate::model::job_log::Cursor;
use crate::model::outcome::{ApplyResult, Rejection};
use crate::model::state::ClusterState;

impl ClusterState {
    /// Insert the jobs of a submission with ids from `first`: one, or a task per index of
    /// its array. Each is recorded as changed and waits for `waiting`.
    pub(crate) fn insert_submitted(
        &mut self,
        first: JobId,
        spec: &JobSpec,
        how: Submission<'_>,
        waiting: &BTreeSet<JobId>,
        now: u64,
    ) {
        let tasks: Vec<Option<ArrayTask>> = match &spec.array {
            None => vec![None],
            Some(array) => array
                .indexes()
                .map(|index| {
                    Some(ArrayTask {
                        array: first,
                        index,
                    })
                })
                .collect(),
        };
        for (id, task) in (first..).zip(tasks) {
            let mut job = Job::pending(id, spec.clone(), how.key.map(str::to_owned), now);
            job.array_task = task;
            job.held = how.hold;
            job.submitted_by = how.owner.map(str::to_owned);
            self.jobs.insert(id, job);
            self.job_log.record(id);
            if !waiting.is_empty() {
                self.wait_for(id, waiting.clone());
            }
        }
    }

    /// How many jobs a submission of `spec` makes.
    pub(crate) fn jobs_in(spec: &JobSpec) -> u64 {
        spec.array.as_ref().map_or(1, |a| a.len())
    }

    /// The tasks of array `array` the state holds, in index order.
    pub fn array_tasks(&self, array: JobId) -> impl Iterator<Item = &Job> {
        self.jobs
            .range(array..)
            .map(|(_, j)| j)
            .take_while(move |j| j.array_task.is_some_and(|t| t.array == array))
    }

    /// Why a task of a throttled array may not start now: its tasks that hold GPUs, and
    /// `starting` more (a scheduling pass's), are as many as its `%limit` allows.
    pub fn array_throttle(&self, job: &Job, starting: usize) -> Option<String> {
        let task = job.array_task?;
        let limit = job.spec.array.as_ref()?.max_running?;
        let live = self.array_live.get(&task.array).map_or(0, BTreeSet::len) + starting;
        (live >= limit as usize).then(|| {
            format!(
                "array j-{}: {live} of its tasks run or start, its limit (%{limit})",
                task.array
            )
        })
    }

    /// Keep `array_live` up to date for `job` (a task of a throttled array or not).
    pub(crate) fn track_array_task(&mut self, job: JobId) {
        let Some(j) = self.jobs.get(&job) else {
            return;
        };
        let (Some(task), Some(_)) = (
            j.array_task,
            j.spec.array.as_ref().and_then(|a| a.max_running),
        ) else {
            return;
        };
        if j.state.is_live() {
            self.array_live.entry(task.array).or_default().insert(job);
        } else if let Some(live) = self.array_live.get_mut(&task.array) {
            live.remove(&job);
            if live.is_empty() {
                self.array_live.remove(&task.array);
            }
        }
    }

    /// After an entry: the throttled tasks that changed since `cursor` and no longer hold
    /// GPUs leave `array_live` (binds add theirs as they bind).
    pub(crate) fn track_array_tasks(&mut self, cursor: Cursor) {
        if self.array_live.is_empty() {
            return;
        }
        let changed: Vec<JobId> = match self.job_log.since(cursor) {
            Some(ids) => ids.collect(),
            // Too many changes for the log to tell: look at every tracked task.
            None => self.array_live.values().flatten().copied().collect(),
        };
        for id in changed {
            self.track_array_task(id);
        }
    }

    /// Cancel every unfinished task of array `array`.
    pub(crate) fn cancel_array(
        &mut self,
        array: JobId,
        now: u64,
    ) -> Result<ApplyResult, Rejection> {
        for id in self.array_task_ids(array)? {
            // A task that already ended stays as it ended.
            let _ = self.cancel(id, now);
        }
        Ok(ApplyResult::Ok)
    }

    /// Hold (or release) every pending task of array `array`.
    pub(crate) fn hold_array(
        &mut self,
        array: JobId,
        hold: bool,
    ) -> Result<ApplyResult, Rejection> {
        for id in self.array_task_ids(array)? {
            // Tasks that run or ended are not held.
            let _ = self.hold(id, hold);
        }
        Ok(ApplyResult::Ok)
    }

    /// The ids of array `array`'s tasks; refused when the state holds none.
    pub(super) fn array_task_ids(&self, array: JobId) -> Result<Vec<JobId>, Rejection> {
        let ids: Vec<JobId> = self.array_tasks(array).map(|j| j.id).collect();
        if ids.is_empty() {
            return Err(Rejection::Invalid {
                message: format!("j-{array} is not an array the cluster's state holds"),
            });
        }
        Ok(ids)
    }
}
