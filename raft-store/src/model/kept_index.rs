//! `KeptIndex`: a reader's index of some jobs, kept up to date from the state's `JobLog` instead
//! of being rebuilt by scanning every job on every applied entry; `JobChanges`: just the jobs
//! that changed since a reader last looked.

use std::collections::BTreeSet;

use crate::JobId;
use crate::model::job_log::Cursor;
use crate::model::state::ClusterState;

/// A reader's index `T` of some jobs, kept up to date from the state's `JobLog`.
pub struct KeptIndex<T> {
    kept: Option<(Cursor, T)>,
}

impl<T> Default for KeptIndex<T> {
    fn default() -> Self {
        Self { kept: None }
    }
}

impl<T> KeptIndex<T> {
    /// The index for `state`: the kept one, if `keep` accepts it, with `update` called for each
    /// job that changed state since; else (a new copy of the state, a log that moved on too
    /// far, nothing kept yet) a new one from `build`.
    pub fn get(
        &mut self,
        state: &ClusterState,
        keep: impl FnOnce(&T) -> bool,
        build: impl FnOnce(&ClusterState) -> T,
        mut update: impl FnMut(&mut T, &ClusterState, JobId),
    ) -> &mut T {
        let log = &state.job_log;
        let kept = self.kept.take().and_then(|(cursor, mut index)| {
            let changed = log.since(cursor).filter(|_| keep(&index))?;
            for job in changed {
                update(&mut index, state, job);
            }
            Some(index)
        });
        let index = kept.unwrap_or_else(|| build(state));
        &mut self.kept.insert((log.cursor(), index)).1
    }
}

/// A reader's place in the state's `JobLog`: which jobs changed since it last looked.
#[derive(Default)]
pub struct JobChanges(KeptIndex<()>);

impl JobChanges {
    /// The jobs that changed since the last call, or `None` when that cannot be told: the
    /// first call, another copy of the state, a log that moved on too far since.
    pub fn since_last(&mut self, state: &ClusterState) -> Option<BTreeSet<JobId>> {
        let mut changed = BTreeSet::new();
        let mut known = true;
        self.0.get(
            state,
            |()| true,
            |_| known = false,
            |(), _, job| {
                changed.insert(job);
            },
        );
        known.then_some(changed)
    }
}
