//! The history archive: the finished jobs, audit entries and signed heads that
//! `Command::Archive` moved out of the replicated state (`model/retention.rs`), kept by every
//! agent in its own data directory (`archive/`), append-only.
//!
//! Each kind of record lies in a `RecordFile` with a dense `SlotFile` index beside it (job id or
//! sequence number to offset), so a read is two positional reads and nothing is held in memory;
//! the jobs also have a list in the order they were archived, for `finished_since`. Records are
//! JSON, each one self-describing and readable by later versions. A record is stored once: it
//! never changes, so storing it again (a peer's copy, a replayed entry) is a no-op.
//!
//! The state machine stores each entry's outbox here under the lock it applied the entry with,
//! so a reader finds a record in the state or in the archive, never in neither. Stored records
//! become durable with the next `flush`, which the state machine calls before it writes a
//! snapshot: until a snapshot without them is on disk, a restart re-applies the entries that
//! moved them, which stores them again. A flush ends by writing how far the files are synced
//! (`SYNCED`); an open cuts each file there, so a crash leaves no torn or half-indexed record.

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

use crate::JobId;
use crate::model::audit::{AuditEntry, SignedHead};
use crate::model::retention::{ArchiveOutbox, ArchivedJob};
use crate::storage::engine::{KvEngine, Space};
use crate::storage::record_file::{RecordFile, invalid};
use crate::storage::replace_file::replace;
use crate::storage::slot_file::SlotFile;

/// A handle on an agent's archive. Clones share it.
#[derive(Clone)]
pub struct Archive {
    files: Arc<Files>,
    /// Whether records may be missing: the archive is not replicated with a snapshot, so an
    /// agent that installs one (or starts from one) may lack what was archived before it,
    /// until it fills the gaps from its peers (`StateReader::archive_gaps`).
    fill: Arc<Mutex<FillState>>,
    /// Woken when a gap may have opened.
    wake: Arc<Notify>,
}

/// The open files of `archive/`.
#[derive(Debug)]
struct Files {
    dir: PathBuf,
    jobs: Shelf,
    /// The jobs in the order they were archived (which is the order they finished, but for
    /// clock skew between leaders and records filled from peers): `[the latest finish time of
    /// this job and all before it, job id]`. The first field never decreases, so
    /// `finished_since` finds where to start by bisection.
    archived_order: SlotFile<2>,
    audit: Shelf,
    heads: Shelf,
    /// Held while storing, so a record and its index entries land together, and a flush
    /// takes a cut that holds whole records.
    storing: Mutex<()>,
    /// One flush at a time, so the synced marks never move back.
    flushing: Mutex<()>,
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
    /// Open (creating) the archive in `dir`, to be checked for gaps once (a data directory
    /// may have been seeded from a backup, or stopped while a snapshot was installed).
    pub(crate) fn open(dir: &Path) -> io::Result<Self> {
        let fill = FillState {
            marked: 1,
            taken: 0,
            complete: false,
        };
        Ok(Self {
            files: Arc::new(Files::open(dir)?),
            fill: Arc::new(Mutex::new(fill)),
            wake: Arc::new(Notify::new()),
        })
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

    /// Store records: what apply moved out, or what a peer sent to fill a gap. Not durable
    /// until `flush`; a record already held is left as it is (records never change).
    pub fn store(&self, outbox: ArchiveOutbox) -> io::Result<()> {
        let files = &self.files;
        let _storing = lock(&files.storing);
        let mut latest = match files.archived_order.len() {
            0 => 0,
            n => files
                .archived_order
                .get(n - 1)?
                .map_or(0, |[latest, _]| latest),
        };
        for archived in &outbox.jobs {
            let id = archived.job.id;
            if files.jobs.put(id, archived)? {
                latest = latest.max(archived.finished_at_ms());
                files.archived_order.push([latest, id])?;
            }
        }
        for entry in &outbox.audit {
            files.audit.put(entry.seq, entry)?;
        }
        for head in &outbox.heads {
            files.heads.put(head.seq, head)?;
        }
        Ok(())
    }

    /// Make every stored record durable.
    pub fn flush(&self) -> io::Result<()> {
        self.files.flush()
    }

    /// The archived job `id`, if it was archived.
    pub fn job(&self, id: JobId) -> io::Result<Option<ArchivedJob>> {
        self.files.jobs.get(id)
    }

    /// The archived jobs that finished at `since_ms` or later, in the order they were archived
    /// (see `Files::archived_order`), each read as the iterator reaches it.
    pub fn finished_since(
        &self,
        since_ms: u64,
    ) -> impl Iterator<Item = io::Result<ArchivedJob>> + '_ {
        let order = &self.files.archived_order;
        let start = partition_point(order.len(), |i| {
            Ok(order.get(i)?.is_some_and(|[latest, _]| latest < since_ms))
        });
        let (start, failed) = match start {
            Ok(start) => (start, None),
            Err(e) => (order.len(), Some(Err(e))),
        };
        let jobs = order.iter(start, order.len()).filter_map(move |slot| {
            let id = match slot {
                Ok((_, Some([_, id]))) => id,
                Ok((i, None)) => {
                    return Some(Err(invalid(format!("archive order slot {i} is empty"))));
                }
                Err(e) => return Some(Err(e)),
            };
            match self.job(id) {
                Ok(Some(job)) => (job.finished_at_ms() >= since_ms).then_some(Ok(job)),
                Ok(None) => Some(Err(invalid(format!("job j-{id} is listed but not stored")))),
                Err(e) => Some(Err(e)),
            }
        });
        failed.into_iter().chain(jobs)
    }

    /// Archived audit entries after `after`, up to and including `through`, in sequence order.
    pub fn audit(
        &self,
        after: u64,
        through: u64,
    ) -> impl Iterator<Item = io::Result<AuditEntry>> + '_ {
        self.files.audit.held(after, through)
    }

    /// Archived signed heads of the entries after `after`, up to and including `through`, in
    /// sequence order.
    pub fn heads(
        &self,
        after: u64,
        through: u64,
    ) -> impl Iterator<Item = io::Result<SignedHead>> + '_ {
        self.files.heads.held(after, through)
    }

    /// Of the jobs from `from` below `next_job_id` that `live` does not hold, those not
    /// archived here, in id order (at most `limit`).
    pub(crate) fn jobs_missing(
        &self,
        from: JobId,
        next_job_id: JobId,
        live: &BTreeSet<JobId>,
        limit: usize,
    ) -> io::Result<Vec<JobId>> {
        (self.files.jobs.absent(from.max(1), next_job_id))
            .filter(|id| id.as_ref().map_or(true, |id| !live.contains(id)))
            .take(limit)
            .collect()
    }

    /// The first run of audit entries after `after`, up to `through`, not archived here:
    /// `(after', through']`.
    pub(crate) fn audit_missing(&self, after: u64, through: u64) -> io::Result<Option<(u64, u64)>> {
        let mut run: Option<(u64, u64)> = None;
        for seq in self
            .files
            .audit
            .absent(after + 1, through.saturating_add(1))
        {
            let seq = seq?;
            match run {
                None => run = Some((seq - 1, seq)),
                Some((from, last)) if last + 1 == seq => run = Some((from, seq)),
                Some(_) => break,
            }
        }
        Ok(run)
    }

    /// How many jobs the archive holds.
    pub fn job_count(&self) -> io::Result<usize> {
        Ok(self.files.archived_order.len() as usize)
    }

    /// Format 1 kept the archive in sled trees: store what they hold here, make it durable, and
    /// empty them. Returns how many records moved.
    pub(crate) fn migrate_from(&self, engine: &dyn KvEngine) -> io::Result<usize> {
        const BATCH: usize = 1000;
        let mut moved = 0;
        let mut outbox = ArchiveOutbox::default();
        let full = |o: &ArchiveOutbox| o.jobs.len() + o.audit.len() + o.heads.len() >= BATCH;
        for space in [
            Space::LegacyArchivedJobs,
            Space::LegacyArchivedAudit,
            Space::LegacyArchivedHeads,
        ] {
            for kv in engine.scan(space, &[], &[0xff; 9]) {
                let bytes = kv?.1;
                match space {
                    Space::LegacyArchivedJobs => outbox.jobs.push(decode(&bytes)?),
                    Space::LegacyArchivedAudit => outbox.audit.push(decode(&bytes)?),
                    _ => outbox.heads.push(decode(&bytes)?),
                }
                moved += 1;
                if full(&outbox) {
                    self.store(std::mem::take(&mut outbox))?;
                }
            }
        }
        self.store(outbox)?;
        self.flush()?;
        for space in [
            Space::LegacyArchivedJobs,
            Space::LegacyArchivedByFinish,
            Space::LegacyArchivedAudit,
            Space::LegacyArchivedHeads,
        ] {
            engine.clear(space)?;
        }
        engine.flush()?;
        Ok(moved)
    }
}

/// The synced length of each file, written at the end of every flush.
const SYNCED: &str = "SYNCED";
/// The files (and their names in `SYNCED`).
const JOBS: &str = "jobs";
const ARCHIVED_ORDER: &str = "jobs.archived-order";
const AUDIT: &str = "audit";
const HEADS: &str = "heads";

impl Files {
    fn open(dir: &Path) -> io::Result<Self> {
        fs::create_dir_all(dir)?;
        let synced = read_synced(&dir.join(SYNCED))?;
        let mark = |name: &str| {
            synced
                .iter()
                .find(|(n, _)| n == name)
                .map_or(0, |(_, v)| *v)
        };
        Ok(Self {
            jobs: Shelf::open(dir, JOBS, mark(JOBS))?,
            archived_order: SlotFile::open(&dir.join(ARCHIVED_ORDER), Some(mark(ARCHIVED_ORDER)))?,
            audit: Shelf::open(dir, AUDIT, mark(AUDIT))?,
            heads: Shelf::open(dir, HEADS, mark(HEADS))?,
            dir: dir.to_owned(),
            storing: Mutex::new(()),
            flushing: Mutex::new(()),
        })
    }

    fn flush(&self) -> io::Result<()> {
        let _one = lock(&self.flushing);
        let cut = {
            let _storing = lock(&self.storing);
            [
                (JOBS, self.jobs.records.len()),
                (ARCHIVED_ORDER, self.archived_order.len()),
                (AUDIT, self.audit.records.len()),
                (HEADS, self.heads.records.len()),
            ]
        };
        for shelf in [&self.jobs, &self.audit, &self.heads] {
            shelf.records.sync()?;
            shelf.at.sync()?;
        }
        self.archived_order.sync()?;
        let text: String = cut
            .iter()
            .map(|(name, n)| format!("{name} {n}\n"))
            .collect();
        replace(
            &self.dir.join(SYNCED),
            |f| f.write_all(text.as_bytes()),
            None,
        )
    }
}

fn read_synced(path: &Path) -> io::Result<Vec<(String, u64)>> {
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    text.lines()
        .map(|line| {
            line.split_once(' ')
                .and_then(|(name, n)| Some((name.to_owned(), n.parse().ok()?)))
                .ok_or_else(|| invalid(format!("{} holds {line:?}", path.display())))
        })
        .collect()
}

/// Records keyed by a dense number (a job id, a sequence number): the records in one file, and
/// where each lies (its offset + 1) in a slot file beside it.
#[derive(Debug)]
struct Shelf {
    records: RecordFile,
    at: SlotFile<1>,
}

impl Shelf {
    /// Open `name` and `name.at` in `dir`, cutting the records at `synced` bytes and dropping
    /// index entries that pointed past it (written after the last flush).
    fn open(dir: &Path, name: &str, synced: u64) -> io::Result<Self> {
        let records = RecordFile::open(&dir.join(name), synced)?;
        let at = SlotFile::open(&dir.join(format!("{name}.at")), None)?;
        for slot in at.iter(0, at.len()) {
            if let (key, Some([pos])) = slot?
                && pos > synced
            {
                at.clear(key)?;
            }
        }
        Ok(Self { records, at })
    }

    /// Store `record` under `key` unless one is held there; returns whether it stored.
    fn put<T: Serialize>(&self, key: u64, record: &T) -> io::Result<bool> {
        if self.at.get(key)?.is_some() {
            return Ok(false);
        }
        let bytes = serde_json::to_vec(record).map_err(io::Error::other)?;
        let offset = self.records.append(&bytes)?;
        self.at.set(key, [offset + 1])?;
        Ok(true)
    }

    fn get<T: DeserializeOwned>(&self, key: u64) -> io::Result<Option<T>> {
        match self.at.get(key)? {
            Some([pos]) => decode(&self.records.read(pos - 1)?).map(Some),
            None => Ok(None),
        }
    }

    /// The records held after `after`, up to and including `through`, in key order.
    fn held<T: DeserializeOwned>(
        &self,
        after: u64,
        through: u64,
    ) -> impl Iterator<Item = io::Result<T>> + '_ {
        let to = through.saturating_add(1).min(self.at.len());
        self.at
            .iter(after.saturating_add(1), to)
            .filter_map(move |slot| match slot {
                Ok((_, Some([pos]))) => Some(self.records.read(pos - 1).and_then(|b| decode(&b))),
                Ok((_, None)) => None,
                Err(e) => Some(Err(e)),
            })
    }

    /// The keys from `from` below `to` that hold no record, in order.
    fn absent(&self, from: u64, to: u64) -> impl Iterator<Item = io::Result<u64>> + '_ {
        self.at.iter(from, to).filter_map(|slot| match slot {
            Ok((key, None)) => Some(Ok(key)),
            Ok((_, Some(_))) => None,
            Err(e) => Some(Err(e)),
        })
    }
}

/// The first `i` in `0..n` for which `before(i)` is false (`before` holds for a prefix).
fn partition_point(n: u64, before: impl Fn(u64) -> io::Result<bool>) -> io::Result<u64> {
    let (mut low, mut high) = (0, n);
    while low < high {
        let mid = low + (high - low) / 2;
        if before(mid)? {
            low = mid + 1;
        } else {
            high = mid;
        }
    }
    Ok(low)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> io::Result<T> {
    serde_json::from_slice(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Command;
    use crate::model::retention::Retention;
    use crate::model::state::ClusterState;
    use crate::storage::engine::SledEngine;
    use crate::testing::{at, spec, submit};

    /// Jobs `1..=n` archived, job `i` having finished at `i` seconds.
    fn archived_jobs(n: u64) -> Vec<ArchivedJob> {
        let mut s = ClusterState::default();
        for job in 1..=n {
            submit(&mut s, spec(0), None);
            s.apply(&at(job * 1000, Command::CancelJob { job }));
        }
        let retention = Retention {
            finished_max_age_ms: 0,
            finished_keep: 0,
            audit_keep: 0,
        };
        s.apply(&at(n * 1000 + 1, Command::Archive { retention }));
        std::mem::take(&mut s.archive_outbox).jobs
    }

    fn audit_entry(seq: u64) -> AuditEntry {
        AuditEntry {
            seq,
            time_ms: seq,
            actor: "a".into(),
            verb: "v".into(),
            object: "o".into(),
            outcome: "ok".into(),
            request_id: format!("r{seq}"),
            source: "s".into(),
            prev_hash: String::new(),
            hash: format!("h{seq}"),
        }
    }

    fn outbox(jobs: &[ArchivedJob], audit: &[u64]) -> ArchiveOutbox {
        ArchiveOutbox {
            jobs: jobs.to_vec(),
            audit: audit.iter().copied().map(audit_entry).collect(),
            heads: Vec::new(),
        }
    }

    fn json<T: Serialize>(record: &T) -> Vec<u8> {
        serde_json::to_vec(record).expect("json")
    }

    fn finished(archive: &Archive, since_ms: u64) -> Vec<JobId> {
        (archive.finished_since(since_ms))
            .map(|j| j.expect("read").job.id)
            .collect()
    }

    #[test]
    fn a_restart_keeps_what_was_flushed_and_cuts_the_rest() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let jobs = archived_jobs(4);
        let archive = Archive::open(tmp.path()).expect("open");
        archive.store(outbox(&jobs[..2], &[1, 2])).expect("store");
        archive.flush().expect("flush");
        archive.store(outbox(&jobs[2..], &[3])).expect("store");
        assert_eq!(finished(&archive, 0), vec![1, 2, 3, 4]);
        drop(archive); // as a crash would: no flush

        let archive = Archive::open(tmp.path()).expect("reopen");
        assert_eq!(finished(&archive, 0), vec![1, 2]);
        assert_eq!(archive.job(3).expect("read"), None, "not flushed: cut");
        assert_eq!(archive.job(2).expect("read"), Some(jobs[1].clone()));
        let missing = archive
            .jobs_missing(1, 6, &BTreeSet::from([5]), 10)
            .expect("gaps");
        assert_eq!(missing, vec![3, 4]);
        assert_eq!(archive.audit_missing(0, 4).expect("gaps"), Some((2, 4)));

        // The replayed entries store them again; a second copy of a held record is ignored.
        archive.store(outbox(&jobs, &[1, 2, 3])).expect("store");
        assert_eq!(finished(&archive, 0), vec![1, 2, 3, 4]);
        assert_eq!(archive.job_count().expect("count"), 4);
        let seqs: Vec<u64> = (archive.audit(0, 10))
            .map(|e| e.expect("read").seq)
            .collect();
        assert_eq!(seqs, vec![1, 2, 3]);
    }

    #[test]
    fn finished_since_skips_what_finished_before_even_out_of_order() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let jobs = archived_jobs(6);
        let archive = Archive::open(tmp.path()).expect("open");
        // A peer fills jobs 1 and 2 after 3-6 were archived here.
        archive.store(outbox(&jobs[2..], &[])).expect("store");
        archive.store(outbox(&jobs[..2], &[])).expect("store");
        assert_eq!(finished(&archive, 0), vec![3, 4, 5, 6, 1, 2]);
        assert_eq!(finished(&archive, 2000), vec![3, 4, 5, 6, 2]);
        assert_eq!(finished(&archive, 5000), vec![5, 6]);
        assert_eq!(finished(&archive, 7000), Vec::<JobId>::new());
    }

    #[test]
    fn a_format_1_archive_moves_out_of_sled() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let engine = SledEngine::open(&tmp.path().join("raft")).expect("sled");
        let jobs = archived_jobs(3);
        for job in &jobs {
            let key = job.job.id.to_be_bytes().to_vec();
            (engine.write(Space::LegacyArchivedJobs, vec![(key, Some(json(job)))])).expect("put");
        }
        let entry = audit_entry(1);
        let key = 1u64.to_be_bytes().to_vec();
        (engine.write(Space::LegacyArchivedAudit, vec![(key, Some(json(&entry)))])).expect("put");

        let archive = Archive::open(&tmp.path().join("archive")).expect("open");
        assert_eq!(archive.migrate_from(&engine).expect("migrate"), 4);
        assert_eq!(finished(&archive, 0), vec![1, 2, 3]);
        assert_eq!(
            archive.audit(0, 1).next().expect("one").expect("read"),
            entry
        );
        for space in [Space::LegacyArchivedJobs, Space::LegacyArchivedAudit] {
            assert_eq!(engine.last(space).expect("read"), None, "{space:?} emptied");
        }
        drop(archive);
        let archive = Archive::open(&tmp.path().join("archive")).expect("reopen");
        assert_eq!(finished(&archive, 0), vec![1, 2, 3], "flushed");
    }
}
