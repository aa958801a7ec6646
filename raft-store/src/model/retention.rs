//! Retention: what leaves the replicated state for each agent's local history archive, so that
//! the state a mesh carries is bounded by what is live, not by how long it has run.
//!
//! `Command::Archive` carries a `Retention`; every replica applies it at the same log index and
//! so moves the same finished jobs and the same oldest audit entries out of `ClusterState`, into
//! `ClusterState::archive_outbox`. The state machine empties that outbox into the archive store
//! (`storage/archive.rs`) under the same lock, so a reader never sees a record in neither place.
//! The outbox is an observation of the local copy, like `JobLog`: never serialized, and two
//! outboxes always compare equal.

use serde::{Deserialize, Serialize};

use crate::JobId;
use crate::model::audit::{AuditEntry, SignedHead};
use crate::model::job::Job;

/// How much history the replicated state keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    /// A finished job leaves once it finished this long ago...
    pub finished_max_age_ms: u64,
    /// ...or once more than this many finished jobs are kept, the earliest finished first.
    pub finished_keep: u64,
    /// The oldest audit entries leave once more than this many are kept.
    pub audit_keep: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            finished_max_age_ms: 24 * 3600 * 1000,
            finished_keep: 10_000,
            audit_keep: 10_000,
        }
    }
}

/// The most jobs, and the most audit entries, one `Command::Archive` moves: an apply stays short,
/// and a backlog leaves over several entries.
pub const MAX_ARCHIVED_PER_ENTRY: usize = 10_000;

/// A job as it left the replicated state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchivedJob {
    pub job: Job,
    /// Millijoules its GPUs used (its `EnergyBook` entry, which left with it).
    #[serde(default)]
    pub energy_mj: u64,
    /// When it was archived (the `Command::Archive` entry's time).
    pub archived_at_ms: u64,
}

impl ArchivedJob {
    /// When the job finished (its submission, if it never ran).
    pub fn finished_at_ms(&self) -> u64 {
        self.job.finished_at_ms.unwrap_or(self.job.submitted_at_ms)
    }
}

/// An idempotency key whose job was archived: enough to answer a retry until the key expires.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchivedKey {
    pub job: JobId,
    pub submitted_at_ms: u64,
    /// `spec_digest` of the job's spec: a retry must ask for the same job.
    pub spec_digest: String,
}

/// The hex SHA-256 (first 128 bits) of a spec's canonical JSON, the account left out (the
/// cluster's part of a spec, not the client's: see `submit`).
pub fn spec_digest(spec: &crate::model::job::JobSpec) -> String {
    use sha2::{Digest, Sha256};
    let client_part = crate::model::job::JobSpec {
        account: None,
        ..spec.clone()
    };
    let bytes = serde_json::to_vec(&client_part).unwrap_or_default();
    hex::encode(&Sha256::digest(bytes)[..16])
}

/// What apply moved out of the replicated state and the archive store has not taken yet.
#[derive(Debug, Default)]
pub struct ArchiveOutbox {
    pub jobs: Vec<ArchivedJob>,
    pub audit: Vec<AuditEntry>,
    pub heads: Vec<SignedHead>,
}

impl ArchiveOutbox {
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty() && self.audit.is_empty() && self.heads.is_empty()
    }
}

/// A copy starts with nothing to hand over: the outbox belongs to the copy that applied.
impl Clone for ArchiveOutbox {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl PartialEq for ArchiveOutbox {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for ArchiveOutbox {}
