//! The history archive: the finished jobs, audit entries and signed heads that
//! `Command::Archive` moved out of the replicated state (`model/retention.rs`), kept by every
//! agent in its own data directory, append-only.
//!
//! The state machine stores each entry's outbox here under the lock it applied the entry
//! with, so a reader finds a record in the state or in the archive, never in neither. Stored
//! records become durable with the next flush, and the state machine flushes before it writes a
//! snapshot: until a snapshot without them is on disk, a restart re-applies the entries that
//! moved them, which stores them again (the same records under the same keys).
//!
//! Records are JSON (each one self-describing, readable by later versions) under big-endian
//! keys, so key order is id, sequence or finish-time order.

use std::collections::BTreeSet;
use std::io;
use std::sync::{Arc, Mutex};

use serde::de::DeserializeOwned;
use tokio::sync::Notify;

use crate::JobId;
use crate::model::audit::{AuditEntry, SignedHead};
use crate::model::retention::{ArchiveOutbox, ArchivedJob};
use crate::storage::engine::{KvEngine, Space};

/// A handle on an agent's archive. Clones share it.
#[derive(Clone)]
pub struct Archive {
    engine: Arc<dyn KvEngine>,
    /// Whether records may be missing: the archive is not replicated with a snapshot, so an
    /// agent that installs one (or starts from one) may lack what was archived before it,
    /// until it fills the gaps from its peers (`StateReader::archive_gaps`).
    fill: Arc<Mutex<FillState>>,
    /// Woken when a gap may have opened.
    wake: Arc<Notify>,
}

/// Marks of possible gaps, and how far the filling has come.
#[derive(Debug)]
struct FillState {
    /// Possible gaps marked so far.
    marked: u64,
    /// The marks the filler has taken up.
    taken: u64,
    /// No gap is left that a peer could fill, as of the last mark.
    complete: bool,
}

/// Where a search for gaps starts: job ids from `jobs`, audit entries after `audit` (a filler
/// moves it past what it asked one peer for, so each pass reads the archive once).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GapsFrom {
    pub jobs: JobId,
    pub audit: u64,
}

/// What the archive should hold by the state but does not: found by `StateReader::archive_gaps`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gaps {
    /// Jobs that are neither in the state nor archived here (ids are dense from 1).
    pub jobs: Vec<JobId>,
    /// The first run of audit entries missing before the state's base: `(after, through]`.
    pub audit: Option<(u64, u64)>,
}

impl Gaps {
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty() && self.audit.is_none()
    }
}

impl std::fmt::Debug for Archive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Archive").finish_non_exhaustive()
    }
}

impl Archive {
    /// The archive in `engine`, to be checked for gaps once (a data directory may have been
    /// seeded from a backup, or stopped while a snapshot was installed).
    pub(crate) fn new(engine: Arc<dyn KvEngine>) -> Self {
        let fill = FillState {
            marked: 1,
            taken: 0,
            complete: false,
        };
        Self {
            engine,
            fill: Arc::new(Mutex::new(fill)),
            wake: Arc::new(Notify::new()),
        }
    }

    fn fill_state(&self) -> std::sync::MutexGuard<'_, FillState> {
        self.fill.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records may be missing (a snapshot was installed, or a fill could not finish): readers
    /// are told so (`is_complete`) until a filler takes this mark up and `mark_filled` it.
    pub fn mark_incomplete(&self) {
        let mut fill = self.fill_state();
        fill.marked += 1;
        fill.complete = false;
        self.wake.notify_one();
    }

    /// Take up the marks not taken yet: `Some(mark)` to look for gaps and then pass to
    /// `mark_filled`, `None` when there is nothing new to look at.
    pub fn take_incomplete(&self) -> Option<u64> {
        let mut fill = self.fill_state();
        (fill.taken < fill.marked).then(|| {
            fill.taken = fill.marked;
            fill.marked
        })
    }

    /// No gap is left that a peer could fill, as of `mark` (unless a newer mark came since).
    pub fn mark_filled(&self, mark: u64) {
        let mut fill = self.fill_state();
        if fill.marked == mark {
            fill.complete = true;
        }
    }

    /// Whether the archive holds all it can: false while gaps may be waiting to be filled.
    pub fn is_complete(&self) -> bool {
        self.fill_state().complete
    }

    /// Wait until `mark_incomplete` is called (at once if it was since the last wait).
    pub async fn marked_incomplete(&self) {
        self.wake.notified().await;
    }

    /// Store records: what apply moved out, or what a peer sent to fill a gap (not durable
    /// until `flush`; storing a record again is harmless: the same record under the same key).
    pub fn store(&self, outbox: ArchiveOutbox) -> io::Result<()> {
        let mut jobs = Vec::with_capacity(outbox.jobs.len());
        let mut by_finish = Vec::with_capacity(outbox.jobs.len());
        for archived in &outbox.jobs {
            let id = archived.job.id;
            jobs.push((id.to_be_bytes().to_vec(), Some(json(archived)?)));
            by_finish.push((finish_key(archived.finished_at_ms(), id), Some(Vec::new())));
        }
        let audit = outbox
            .audit
            .iter()
            .map(|e| Ok((e.seq.to_be_bytes().to_vec(), Some(json(e)?))))
            .collect::<io::Result<Vec<_>>>()?;
        let heads = outbox
            .heads
            .iter()
            .map(|h| Ok((h.seq.to_be_bytes().to_vec(), Some(json(h)?))))
            .collect::<io::Result<Vec<_>>>()?;
        for (space, batch) in [
            (Space::ArchivedJobs, jobs),
            (Space::ArchivedByFinish, by_finish),
            (Space::ArchivedAudit, audit),
            (Space::ArchivedHeads, heads),
        ] {
            if !batch.is_empty() {
                self.engine.write(space, batch)?;
            }
        }
        Ok(())
    }

    /// Make every stored record durable.
    pub fn flush(&self) -> io::Result<()> {
        self.engine.flush()
    }

    /// The archived job `id`, if it was archived.
    pub fn job(&self, id: JobId) -> io::Result<Option<ArchivedJob>> {
        self.engine
            .get(Space::ArchivedJobs, &id.to_be_bytes())?
            .map(|bytes| decode(&bytes))
            .transpose()
    }

    /// The archived jobs that finished at `since_ms` or later, in the order they finished, each
    /// read as the iterator reaches it.
    pub fn finished_since(
        &self,
        since_ms: u64,
    ) -> impl Iterator<Item = io::Result<ArchivedJob>> + '_ {
        self.engine
            .scan(
                Space::ArchivedByFinish,
                &finish_key(since_ms, 0),
                &[0xff; 17],
            )
            .map(move |kv| {
                let (key, _) = kv?;
                let id = u64_at(&key, 8)?;
                self.job(id)?.ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("archive: job j-{id} is indexed but not stored"),
                    )
                })
            })
    }

    /// Archived audit entries after `after`, up to and including `through`, in sequence order.
    pub fn audit(
        &self,
        after: u64,
        through: u64,
    ) -> impl Iterator<Item = io::Result<AuditEntry>> + '_ {
        self.records(Space::ArchivedAudit, after, through)
    }

    /// Archived signed heads of the entries after `after`, up to and including `through`, in
    /// sequence order.
    pub fn heads(
        &self,
        after: u64,
        through: u64,
    ) -> impl Iterator<Item = io::Result<SignedHead>> + '_ {
        self.records(Space::ArchivedHeads, after, through)
    }

    /// Of the jobs below `next_job_id` that `live` does not hold, those not archived here, in id
    /// order (at most `limit`).
    pub(crate) fn jobs_missing(
        &self,
        from: JobId,
        next_job_id: JobId,
        live: &BTreeSet<JobId>,
        limit: usize,
    ) -> io::Result<Vec<JobId>> {
        let mut missing = Vec::new();
        let mut expected = from.max(1);
        let keys = (self.engine).scan(Space::ArchivedJobs, &expected.to_be_bytes(), &[0xff; 9]);
        let archived = keys.map(|kv| kv.and_then(|(k, _)| u64_at(&k, 0)));
        for id in archived.chain(std::iter::once(Ok(next_job_id))) {
            let id = id?.min(next_job_id);
            for gap in expected..id {
                if missing.len() == limit {
                    return Ok(missing);
                }
                if !live.contains(&gap) {
                    missing.push(gap);
                }
            }
            expected = id.saturating_add(1);
            if id == next_job_id {
                break;
            }
        }
        Ok(missing)
    }

    /// The first run of audit entries after `after`, up to `through`, not archived here:
    /// `(after', through']`.
    pub(crate) fn audit_missing(&self, after: u64, through: u64) -> io::Result<Option<(u64, u64)>> {
        let mut expected = after + 1;
        let keys = self.engine.scan(
            Space::ArchivedAudit,
            &expected.to_be_bytes(),
            &through.saturating_add(1).to_be_bytes(),
        );
        for key in keys {
            let seq = u64_at(&key?.0, 0)?;
            if seq != expected {
                return Ok(Some((expected - 1, seq - 1)));
            }
            expected = seq + 1;
        }
        Ok((expected <= through).then_some((expected - 1, through)))
    }

    /// How many jobs the archive holds.
    pub fn job_count(&self) -> io::Result<usize> {
        let mut n = 0;
        for kv in self.engine.scan(Space::ArchivedJobs, &[], &[0xff; 9]) {
            kv?;
            n += 1;
        }
        Ok(n)
    }

    fn records<T: DeserializeOwned>(
        &self,
        space: Space,
        after: u64,
        through: u64,
    ) -> impl Iterator<Item = io::Result<T>> + '_ {
        let from = after.saturating_add(1).to_be_bytes();
        // Past the last key: every key is 8 bytes, below a 9-byte bound.
        let to = through
            .checked_add(1)
            .map_or_else(|| vec![0xff; 9], |t| t.to_be_bytes().to_vec());
        self.engine
            .scan(space, &from, &to)
            .map(|kv| kv.and_then(|(_, v)| decode(&v)))
    }
}

fn finish_key(finished_ms: u64, id: JobId) -> Vec<u8> {
    let mut key = finished_ms.to_be_bytes().to_vec();
    key.extend_from_slice(&id.to_be_bytes());
    key
}

fn u64_at(key: &[u8], at: usize) -> io::Result<u64> {
    key.get(at..at + 8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "archive: a malformed key"))
}

fn json<T: serde::Serialize>(value: &T) -> io::Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(io::Error::other)
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> io::Result<T> {
    serde_json::from_slice(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}
