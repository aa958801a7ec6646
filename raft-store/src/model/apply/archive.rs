//! Applying `Command::Archive`: the finished jobs and the oldest audit entries that the entry's
//! `Retention` no longer keeps leave the state for the archive outbox (`retention.rs`), decided
//! from the state and the entry alone, so every replica moves the same records at the same index.
//!
//! What stays behind for them: an archived job's idempotency key (`archived_keys`, until it
//! expires), its GPU time in its tenant's fair-share usage (`archived_usage`, by hour), and the
//! last archived audit entry's hash (`audit_base`), from which the kept chain continues.
use std::sync::Arc;

use crate::JobId;
use crate::model::audit::ChainBase;
use crate::model::job::{Job, scoped_key};
use crate::model::outcome::ApplyResult;
use crate::model::retention::{
    ArchivedJob, ArchivedKey, MAX_ARCHIVED_PER_ENTRY, Retention, spec_digest,
};
use crate::model::state::ClusterState;

/// Archived GPU time is kept per tenant in buckets of this length (by the hour its run ended).
pub const USAGE_BUCKET_MS: u64 = 3600 * 1000;
/// A bucket this many usage half-lives old counts for less than 2^-16 of itself: dropped.
const USAGE_HALF_LIVES_KEPT: u64 = 16;

impl ClusterState {
    /// The finished jobs `retention` moves out at `now_ms`, the earliest finished first (at
    /// most `MAX_ARCHIVED_PER_ENTRY`).
    pub fn archivable_jobs(&self, retention: &Retention, now_ms: u64) -> Vec<JobId> {
        let mut finished: Vec<(u64, JobId)> = self
            .jobs
            .values()
            .filter(|j| j.state.is_terminal())
            .map(|j| (j.finished_at_ms.unwrap_or(j.submitted_at_ms), j.id))
            .collect();
        finished.sort_unstable();
        let keep = usize::try_from(retention.finished_keep).unwrap_or(usize::MAX);
        let beyond_keep = finished.len().saturating_sub(keep);
        let too_old = finished
            .partition_point(|(at, _)| at.saturating_add(retention.finished_max_age_ms) <= now_ms);
        finished.truncate(beyond_keep.max(too_old).min(MAX_ARCHIVED_PER_ENTRY));
        finished.into_iter().map(|(_, id)| id).collect()
    }

    /// How many of the oldest audit entries `retention` moves out.
    pub fn archivable_audit(&self, retention: &Retention) -> usize {
        let keep = usize::try_from(retention.audit_keep).unwrap_or(usize::MAX);
        self.audit
            .len()
            .saturating_sub(keep)
            .min(MAX_ARCHIVED_PER_ENTRY)
    }

    /// Whether `Command::Archive` with `retention` would move anything at `now_ms`.
    pub fn has_archivable(&self, retention: &Retention, now_ms: u64) -> bool {
        self.archivable_audit(retention) > 0 || !self.archivable_jobs(retention, now_ms).is_empty()
    }

    pub(crate) fn archive(&mut self, retention: &Retention, now: u64) -> ApplyResult {
        for id in self.archivable_jobs(retention, now) {
            if let Some(job) = self.jobs.remove(&id) {
                self.archive_job(job, now);
            }
        }
        self.archive_audit(retention);
        // A report that came in after its job left (a job archived within seconds of its end)
        // would otherwise stay in the book for good.
        let jobs = &self.jobs;
        self.energy.by_job.retain(|id, _| jobs.contains_key(id));
        let horizon = self
            .scheduler
            .usage_half_life_s
            .saturating_mul(1000 * USAGE_HALF_LIVES_KEPT);
        for buckets in self.archived_usage.values_mut() {
            buckets.retain(|&hour, _| hour.saturating_add(horizon) >= now);
        }
        self.archived_usage.retain(|_, buckets| !buckets.is_empty());
        ApplyResult::Ok
    }

    fn archive_job(&mut self, job: Job, now: u64) {
        let id = job.id;
        if let Some(key) = &job.idempotency_key {
            let scoped = scoped_key(&job.spec.tenant, key);
            if self.idempotency.get(&scoped) == Some(&id) {
                self.idempotency.remove(&scoped);
                let kept = ArchivedKey {
                    job: id,
                    submitted_at_ms: job.submitted_at_ms,
                    spec_digest: spec_digest(&job.spec),
                };
                self.archived_keys.insert(scoped, kept);
            }
        }
        let gpu_ms: u64 = job.gpu_ms.values().sum();
        if gpu_ms > 0
            && let Some(end) = job.finished_at_ms
        {
            let hour = end - end % USAGE_BUCKET_MS;
            let used = self
                .archived_usage
                .entry(job.spec.tenant.clone())
                .or_default()
                .entry(hour)
                .or_insert(0);
            *used = used.saturating_add(gpu_ms);
        }
        let energy_mj = self.energy.by_job.remove(&id).unwrap_or(0);
        self.job_log.record(id);
        self.archive_outbox.jobs.push(ArchivedJob {
            job,
            energy_mj,
            archived_at_ms: now,
        });
    }

    fn archive_audit(&mut self, retention: &Retention) {
        let n = self.archivable_audit(retention);
        let Some(last) = n.checked_sub(1).and_then(|i| self.audit.get(i)) else {
            return;
        };
        let base = ChainBase {
            seq: last.seq,
            hash: last.hash.clone(),
        };
        let heads = self.audit_heads.partition_point(|h| h.seq <= base.seq);
        self.archive_outbox
            .heads
            .extend(self.audit_heads.drain(..heads));
        (self.archive_outbox.audit).extend(self.audit.drain(..n).map(Arc::unwrap_or_clone));
        self.audit_base = Some(base);
    }
}
