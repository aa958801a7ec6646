//! openraft `RaftLogStorage` on a `KvEngine`: the Raft log, the vote, and the committed index,
//! each record in MessagePack (`codec`; data format 3, `repack` moves older directories to it).
//!
//! Durability rule: `save_vote` returns, and `append` calls back, only after an fsync. `append`
//! itself returns once its entries are readable; the flusher (`log_flush.rs`) reports them.
//! Whatever else changes the log or the vote first waits for every earlier append to be
//! reported, so no report is ever late for entries a truncation removed or a vote overtook.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, RaftLogReader, StorageIOError, Vote};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::storage::engine::{KvEngine, Space};
use crate::storage::log_flush::Flusher;
use crate::storage::snapshot_gate::SnapshotGate;
use crate::write_trace::{self, Stage};
use crate::{Entry, LogId, NodeId, StorageError, TypeConfig};
use crate::{codec, failpoint};

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const LAST_PURGED: &[u8] = b"last_purged";

/// The Raft log store. Cheap to clone; clones share the engine.
#[derive(Clone)]
pub struct LogStore {
    engine: Arc<dyn KvEngine>,
    /// The last committed index openraft told us about (0 = none), for status reporting.
    committed_index: Arc<AtomicU64>,
    /// The state machine's snapshot state: a purge never outruns the snapshot on disk.
    gate: SnapshotGate,
    flusher: Flusher,
}

impl std::fmt::Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore")
            .field("committed_index", &self.committed_index)
            .finish_non_exhaustive()
    }
}

impl LogStore {
    pub(crate) fn new(engine: Arc<dyn KvEngine>, gate: SnapshotGate) -> Result<Self, StorageError> {
        let flusher =
            Flusher::start(engine.clone()).map_err(|e| write_err(ErrorSubject::Store, &e))?;
        let store = Self {
            engine,
            gate,
            flusher,
            committed_index: Arc::new(AtomicU64::new(0)),
        };
        let committed: Option<LogId> = store.read_meta(COMMITTED)?;
        store
            .committed_index
            .store(committed.map_or(0, |c| c.index), Ordering::Relaxed);
        Ok(store)
    }

    /// A live view of the committed index (0 before anything commits).
    pub fn committed_index(&self) -> Arc<AtomicU64> {
        self.committed_index.clone()
    }

    fn read_meta<T: DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>, StorageError> {
        let subject = meta_subject(key);
        let bytes = self
            .engine
            .get(Space::Meta, key)
            .map_err(|e| read_err(subject.clone(), &e))?;
        bytes
            .map(|b| codec::from_slice(&b).map_err(|e| read_err(subject, &e)))
            .transpose()
    }

    fn write_meta<T: Serialize>(&self, key: &[u8], value: &T) -> Result<(), StorageError> {
        let subject = meta_subject(key);
        let bytes = codec::to_vec(value).map_err(|e| write_err(subject.clone(), &e))?;
        self.engine
            .write(Space::Meta, vec![(key.to_vec(), Some(bytes))])
            .map_err(|e| write_err(subject, &e))
    }

    /// Wait until everything written is durable and every earlier append reported.
    async fn flush(&self, subject: ErrorSubject<NodeId>) -> Result<(), StorageError> {
        self.flusher
            .barrier()
            .await
            .map_err(|e| write_err(subject, &e))
    }

    /// Remove log keys in `[from, to)` and flush.
    async fn remove_range(&self, from: u64, to: u64) -> Result<(), StorageError> {
        let keys = self
            .engine
            .keys(Space::Log, &from.to_be_bytes(), &to.to_be_bytes())
            .map_err(|e| write_err(ErrorSubject::Logs, &e))?;
        let batch = keys.into_iter().map(|k| (k, None)).collect();
        self.engine
            .write(Space::Log, batch)
            .map_err(|e| write_err(ErrorSubject::Logs, &e))?;
        self.flush(ErrorSubject::Logs).await
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let from = match range.start_bound() {
            Bound::Included(i) => *i,
            Bound::Excluded(i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let to = match range.end_bound() {
            Bound::Included(i) => i.saturating_add(1),
            Bound::Excluded(i) => *i,
            Bound::Unbounded => u64::MAX,
        };
        if from >= to {
            return Ok(Vec::new());
        }
        let rows = self
            .engine
            .range(Space::Log, &from.to_be_bytes(), &to.to_be_bytes())
            .map_err(|e| read_err(ErrorSubject::Logs, &e))?;
        rows.into_iter()
            .map(|(_, v)| codec::from_slice(&v).map_err(|e| read_err(ErrorSubject::Logs, &e)))
            .collect()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id: Option<LogId> = self.read_meta(LAST_PURGED)?;
        let last = self
            .engine
            .last(Space::Log)
            .map_err(|e| read_err(ErrorSubject::Logs, &e))?;
        let last_log_id = match last {
            Some((_, v)) => {
                let entry: Entry =
                    codec::from_slice(&v).map_err(|e| read_err(ErrorSubject::Logs, &e))?;
                Some(entry.log_id)
            }
            None => last_purged_log_id,
        };
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.flush(ErrorSubject::Vote).await?;
        self.write_meta(VOTE, vote)?;
        failpoint::crash("vote-save-before-fsync");
        self.flush(ErrorSubject::Vote).await?;
        failpoint::crash("vote-save-after-fsync");
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        self.read_meta(VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // Not flushed on purpose (an fsync per commit): it only saves replaying the log on
        // restart. A leader restarting in its term may so come back with a committed index
        // below writes it acknowledged; reads never trust it (`Cluster::read_index_as_leader`).
        self.write_meta(COMMITTED, &committed)?;
        self.committed_index
            .store(committed.map_or(0, |c| c.index), Ordering::Relaxed);
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.read_meta::<Option<LogId>>(COMMITTED)?.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut batch = Vec::new();
        let mut indexes = None::<(u64, u64)>;
        for entry in entries {
            let index = entry.log_id.index;
            indexes = Some(indexes.map_or((index, index), |(first, _)| (first, index)));
            let bytes = codec::to_vec(&entry)
                .map_err(|e| write_err(ErrorSubject::Log(entry.log_id), &e))?;
            batch.push((entry.log_id.index.to_be_bytes().to_vec(), Some(bytes)));
        }
        self.engine
            .write(Space::Log, batch)
            .map_err(|e| write_err(ErrorSubject::Logs, &e))?;
        // Entries are readable now; openraft hears they are durable once the flusher's fsync
        // that began after this write has ended.
        if let Some((first, last)) = indexes {
            write_trace::stamp_each(Stage::Appended, first..=last);
        }
        self.flusher.append(callback, indexes);
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.flush(ErrorSubject::Logs).await?;
        self.remove_range(log_id.index, u64::MAX).await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        // openraft 0.9 purges for a snapshot install without waiting for the install to be
        // durable (`snapshot_gate.rs`): a crash in between must not find the log purged past
        // the snapshot on disk.
        self.gate
            .purge_allowed(log_id.index)
            .await
            .map_err(|e| write_err(ErrorSubject::Logs, &std::io::Error::other(e)))?;
        // Every earlier append reported first, as before any change to the log.
        self.flush(ErrorSubject::Logs).await?;
        // Record the purge point first: a crash in between leaves extra entries, never a hole.
        self.write_meta(LAST_PURGED, &log_id)?;
        self.flush(ErrorSubject::Logs).await?;
        self.remove_range(0, log_id.index.saturating_add(1)).await
    }
}

/// Rewrite the records of a directory older than data format 3 (JSON) in MessagePack: the
/// vote, the committed and last purged log ids, and every log entry, a batch at a time, then
/// flush. A record already in MessagePack is left as it is, so an open that crashed halfway
/// finishes the work the next time. Returns how many records it rewrote.
pub(crate) fn repack(engine: &dyn KvEngine) -> std::io::Result<u64> {
    const BATCH: usize = 1024;
    let mut rewritten = 0;
    let meta: [(&[u8], Repack); 3] = [
        (VOTE, repacked::<Vote<NodeId>>),
        (COMMITTED, repacked::<Option<LogId>>),
        (LAST_PURGED, repacked::<LogId>),
    ];
    for (key, repack) in meta {
        if let Some(bytes) = engine.get(Space::Meta, key)?
            && codec::is_json(&bytes)
        {
            engine.write(Space::Meta, vec![(key.to_vec(), Some(repack(&bytes)?))])?;
            rewritten += 1;
        }
    }
    let mut batch = Vec::new();
    for row in engine.scan(Space::Log, &[], &u64::MAX.to_be_bytes()) {
        let (key, bytes) = row?;
        if codec::is_json(&bytes) {
            batch.push((key, Some(repacked::<Entry>(&bytes)?)));
        }
        if batch.len() == BATCH {
            rewritten += BATCH as u64;
            engine.write(Space::Log, std::mem::take(&mut batch))?;
        }
    }
    rewritten += batch.len() as u64;
    engine.write(Space::Log, batch)?;
    engine.flush()?;
    Ok(rewritten)
}

type Repack = fn(&[u8]) -> std::io::Result<Vec<u8>>;

/// A JSON record of type `T` in MessagePack.
fn repacked<T: Serialize + DeserializeOwned>(json: &[u8]) -> std::io::Result<Vec<u8>> {
    let value: T = serde_json::from_slice(json).map_err(std::io::Error::other)?;
    codec::to_vec(&value).map_err(std::io::Error::other)
}

fn meta_subject(key: &[u8]) -> ErrorSubject<NodeId> {
    if key == VOTE {
        ErrorSubject::Vote
    } else {
        ErrorSubject::Store
    }
}

fn read_err(subject: ErrorSubject<NodeId>, e: &(dyn std::error::Error + 'static)) -> StorageError {
    StorageIOError::new(
        subject,
        ErrorVerb::Read,
        openraft::AnyError::from_dyn(e, None),
    )
    .into()
}

fn write_err(subject: ErrorSubject<NodeId>, e: &(dyn std::error::Error + 'static)) -> StorageError {
    StorageIOError::new(
        subject,
        ErrorVerb::Write,
        openraft::AnyError::from_dyn(e, None),
    )
    .into()
}
