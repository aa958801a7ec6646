//! `JobLog`: which jobs lately changed `state`, for readers that keep their own index of some
//! jobs (`KeptIndex`, in `kept_index.rs`: the leader's pending queue, each executor's live runs)
//! instead of scanning every job on every applied entry. Such an index may depend on a job's state, on what is
//! fixed while it keeps that state (its spec, submission time, placement), and on its hold
//! (recorded here when it changes), nothing else.
//!
//! It is an observation of the local copy, not replicated state: it is never serialized, two
//! logs always compare equal, and a state that is deserialized, cloned or created starts a log
//! of its own (a new `epoch`), so a reader that kept an index of another copy sees that it must
//! rebuild. It keeps the last `CAPACITY` changes; a reader further behind rebuilds as well.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::JobId;

/// Changes kept: a reader more than this many behind rebuilds from the state.
const CAPACITY: usize = 1 << 16;

/// Where a reader is in a log: the log's epoch and the number of changes it has seen.
pub(crate) type Cursor = (u64, u64);

pub struct JobLog {
    epoch: u64,
    /// Changes recorded before `recent`'s first.
    dropped: u64,
    recent: VecDeque<JobId>,
}

impl JobLog {
    /// `job`'s state changed (or it was created).
    pub(crate) fn record(&mut self, job: JobId) {
        if self.recent.len() == CAPACITY {
            self.recent.pop_front();
            self.dropped += 1;
        }
        self.recent.push_back(job);
    }

    /// Where a reader that has seen every change so far stands.
    pub fn cursor(&self) -> Cursor {
        (self.epoch, self.dropped + self.recent.len() as u64)
    }

    /// The jobs that changed since `cursor` (some perhaps more than once), or `None` when this
    /// log cannot say: another copy's cursor, or one too far behind.
    pub fn since(&self, cursor: Cursor) -> Option<impl Iterator<Item = JobId> + '_> {
        let (epoch, seen) = cursor;
        let skip = seen.checked_sub(self.dropped)?;
        (epoch == self.epoch && skip <= self.recent.len() as u64)
            .then(|| self.recent.range(skip as usize..).copied())
    }
}

impl Default for JobLog {
    fn default() -> Self {
        static EPOCHS: AtomicU64 = AtomicU64::new(1);
        Self {
            epoch: EPOCHS.fetch_add(1, Ordering::Relaxed),
            dropped: 0,
            recent: VecDeque::new(),
        }
    }
}

/// A clone is another copy, whose changes this log will not see.
impl Clone for JobLog {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl PartialEq for JobLog {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for JobLog {}

impl std::fmt::Debug for JobLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobLog")
            .field("cursor", &self.cursor())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_gets_what_changed_since_its_cursor_or_is_told_to_rebuild() {
        let mut log = JobLog::default();
        log.record(7);
        let cursor = log.cursor();
        log.record(8);
        log.record(7);
        let seen: Vec<JobId> = log.since(cursor).expect("same log").collect();
        assert_eq!(seen, [8, 7]);
        assert_eq!(log.since(log.cursor()).expect("same log").count(), 0);
        assert!(
            log.clone().since(cursor).is_none(),
            "a clone is another copy"
        );
        assert!(JobLog::default().since(cursor).is_none());
        for id in 0..CAPACITY as u64 {
            log.record(id);
        }
        assert!(log.since(cursor).is_none(), "too far behind");
        assert!(log.since((cursor.0, cursor.1 + 10_000_000)).is_none());
    }
}
