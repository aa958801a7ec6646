//! openraft `RaftStateMachine`: the in-memory `ClusterState`, rebuilt on start from the snapshot
//! file and the log (openraft re-applies committed entries), and the snapshot builder.

use std::collections::BTreeSet;
use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, EntryPayload, ErrorSubject, ErrorVerb, RaftSnapshotBuilder, StorageIOError,
    StoredMembership,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::codec::{self, CodecError, PROTOCOL_16};
use crate::failpoint;
use crate::model::digest;
use crate::model::outcome::ApplyResult;
use crate::model::state::ClusterState;
use crate::storage::archive::{Archive, Gaps, GapsFrom};
use crate::storage::snapshot_file::{SnapshotFile, SnapshotFileError, SnapshotMeta};
use crate::storage::snapshot_gate::SnapshotGate;
use crate::write_trace::{self, Stage};
use crate::{Entry, JobId, LogId, NodeId, StorageError, TypeConfig};

/// What a snapshot holds: the domain state plus what openraft needs to resume from it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct MachineData {
    pub last_applied: Option<LogId>,
    pub last_membership: StoredMembership<NodeId, BasicNode>,
    pub state: ClusterState,
}

impl MachineData {
    /// The snapshot payload: MessagePack once every member speaks `PROTOCOL_16`, else the
    /// JSON older members read. Either decodes with `codec::from_either`.
    fn encode(&self) -> Result<Vec<u8>, CodecError> {
        let members = self.last_membership.membership().nodes().map(|(id, _)| *id);
        if self.state.lowest_protocol(members) >= PROTOCOL_16 {
            codec::to_vec(self)
        } else {
            Ok(serde_json::to_vec(self)?)
        }
    }
}

/// The state machine. Clones share the same state.
#[derive(Clone)]
pub struct StateMachineStore {
    data: Arc<RwLock<MachineData>>,
    file: SnapshotFile,
    applied: Arc<watch::Sender<u64>>,
    snapshot_seq: Arc<AtomicU64>,
    /// Which snapshot is on disk and whether one is being received (for the log's purges).
    gate: SnapshotGate,
    /// Serialises snapshot writes, so an older one never replaces a newer one.
    writing: Arc<std::sync::Mutex<()>>,
    /// Where the records that leave the state go (`archive.rs`).
    archive: Archive,
    /// Commands applied since the state the last snapshot holds (a `Command::Batch` counts
    /// each of its entries).
    since_snapshot: Arc<AtomicU64>,
}

/// A read-only handle on the applied state, for services, the scheduler and the executor.
#[derive(Clone)]
pub struct StateReader {
    data: Arc<RwLock<MachineData>>,
    applied: watch::Receiver<u64>,
    archive: Archive,
    since_snapshot: Arc<AtomicU64>,
}

impl StateReader {
    /// The records that left the state (finished jobs, old audit entries).
    pub fn archive(&self) -> &Archive {
        &self.archive
    }

    /// What the archive lacks, from `from` on, that the state says was archived (at most
    /// `limit` jobs): the state is read under the lock, the archive outside it (a job archived
    /// in between is then found there).
    pub fn archive_gaps(&self, from: GapsFrom, limit: usize) -> std::io::Result<Gaps> {
        let (next_job_id, live, base) = self.read(|s| {
            let live: BTreeSet<JobId> = s.jobs.keys().copied().collect();
            (
                s.next_job_id,
                live,
                s.audit_base.as_ref().map_or(0, |b| b.seq),
            )
        });
        Ok(Gaps {
            jobs: (self.archive).jobs_missing(from.jobs, next_job_id, &live, limit)?,
            audit: self.archive.audit_missing(from.audit, base)?,
        })
    }

    /// Run `f` on the current state. Keep `f` short: apply waits while it runs.
    pub fn read<T>(&self, f: impl FnOnce(&ClusterState) -> T) -> T {
        f(&read_lock(&self.data).state)
    }

    /// Index of the last applied entry (0 before anything is applied).
    pub fn applied_index(&self) -> u64 {
        *self.applied.borrow()
    }

    /// The index of the last applied entry and the digest of the state at exactly that index
    /// (`digest::state_digest`), read together.
    pub fn applied_digest(&self) -> (u64, String) {
        let (index, bytes) = self.read_applied(|applied, state| {
            (
                applied.map_or(0, |l| l.index),
                digest::canonical_bytes(state),
            )
        });
        (index, digest::digest_bytes(&bytes))
    }

    /// Run `f` on the last applied log id and the state at exactly that entry, read together
    /// under the lock. Keep `f` short: apply waits while it runs.
    pub(crate) fn read_applied<T>(&self, f: impl FnOnce(Option<LogId>, &ClusterState) -> T) -> T {
        let data = read_lock(&self.data);
        f(data.last_applied, &data.state)
    }

    /// Commands applied since the state the last snapshot holds: what a restart would apply
    /// again, and what the agent snapshots by (openraft's own policy counts log entries, and
    /// one batch entry holds many commands).
    pub fn commands_since_snapshot(&self) -> u64 {
        self.since_snapshot.load(Ordering::Relaxed)
    }

    /// A receiver that changes whenever an entry is applied.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.applied.clone()
    }
}

impl std::fmt::Debug for StateMachineStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateMachineStore")
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

impl StateMachineStore {
    /// Open the state machine of a data directory, restoring its snapshot when there is one.
    pub(crate) fn open(file: SnapshotFile, archive: Archive) -> Result<Self, SnapshotFileError> {
        let data = match file.read()? {
            Some((_, bytes)) => {
                codec::from_either(&bytes).map_err(|e| SnapshotFileError::Corrupt {
                    path: file.path().to_owned(),
                    detail: e.to_string(),
                })?
            }
            None => MachineData::default(),
        };
        let applied = data.last_applied.map_or(0, |l: LogId| l.index);
        let gate = SnapshotGate::new(data.last_applied.map(|l: LogId| l.index));
        Ok(Self {
            gate,
            archive,
            writing: Arc::new(std::sync::Mutex::new(())),
            data: Arc::new(RwLock::new(data)),
            file,
            applied: Arc::new(watch::Sender::new(applied)),
            snapshot_seq: Arc::new(AtomicU64::new(0)),
            since_snapshot: Arc::new(AtomicU64::new(0)),
        })
    }

    pub fn reader(&self) -> StateReader {
        StateReader {
            data: self.data.clone(),
            applied: self.applied.subscribe(),
            archive: self.archive.clone(),
            since_snapshot: self.since_snapshot.clone(),
        }
    }

    /// The gate the log store consults before purging.
    pub(crate) fn gate(&self) -> SnapshotGate {
        self.gate.clone()
    }

    /// Replace the state with `data` and write it as the snapshot (`backup::seed`, into a data
    /// directory no agent is running on).
    pub(crate) fn seed(&self, data: MachineData) -> Result<(), StorageError> {
        let bytes = data
            .encode()
            .map_err(|e| snapshot_err(ErrorVerb::Write, &e))?;
        let meta = SnapshotMeta {
            last_log_id: data.last_applied,
            last_membership: data.last_membership.clone(),
            snapshot_id: format!("restored-{}", data.last_applied.map_or(0, |l| l.index)),
        };
        self.write_snapshot(&meta, &bytes, false)?;
        let applied = data.last_applied.map_or(0, |l| l.index);
        *self.data.write().unwrap_or_else(|p| p.into_inner()) = data;
        self.applied.send_replace(applied);
        Ok(())
    }

    /// Write `meta`'s snapshot unless a newer one is already on disk; `installed`: it is the
    /// one being received from the leader.
    fn write_snapshot(
        &self,
        meta: &SnapshotMeta,
        bytes: &[u8],
        installed: bool,
    ) -> Result<(), StorageError> {
        let _one = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        // The snapshot no longer holds what was archived up to it: the archive must, first.
        self.archive
            .flush()
            .map_err(|e| snapshot_err(ErrorVerb::Write, &e))?;
        let index = meta.last_log_id.map(|l| l.index);
        let on_disk = self.gate.get().durable;
        if index < on_disk {
            tracing::debug!(
                ?index,
                ?on_disk,
                "not replacing a newer snapshot with an older one"
            );
            if installed {
                self.gate.durable(on_disk, true);
            }
            return Ok(());
        }
        self.file.write(meta, bytes).map_err(|e| -> StorageError {
            StorageIOError::new(
                ErrorSubject::Snapshot(Some(meta.signature())),
                ErrorVerb::Write,
                openraft::AnyError::new(&e),
            )
            .into()
        })?;
        self.gate.durable(index, installed);
        Ok(())
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        // Copy a consistent view under the lock; serialise and write outside it.
        let data = {
            let data = read_lock(&self.data);
            // Apply counts under the write lock: nothing is applied while this one is held.
            self.since_snapshot.store(0, Ordering::Relaxed);
            data.clone()
        };
        let bytes = data
            .encode()
            .map_err(|e| snapshot_err(ErrorVerb::Write, &e))?;
        let seq = self.snapshot_seq.fetch_add(1, Ordering::Relaxed);
        let snapshot_id = match data.last_applied {
            Some(l) => format!("{}-{}-{seq}", l.leader_id, l.index),
            None => format!("empty-{seq}"),
        };
        let meta = SnapshotMeta {
            last_log_id: data.last_applied,
            last_membership: data.last_membership,
            snapshot_id,
        };
        failpoint::crash("snapshot-build-before-write");
        self.write_snapshot(&meta, &bytes, false)?;
        failpoint::crash("snapshot-build-after-write");
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembership<NodeId, BasicNode>), StorageError> {
        let data = read_lock(&self.data);
        Ok((data.last_applied, data.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<ApplyResult>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        failpoint::crash("apply-before");
        let mut results = Vec::new();
        let mut last = None;
        {
            let mut data = self.data.write().unwrap_or_else(|p| p.into_inner());
            for entry in entries {
                data.last_applied = Some(entry.log_id);
                last = Some(entry.log_id.index);
                write_trace::stamp(Stage::Applying, entry.log_id.index);
                let commands = match &entry.payload {
                    EntryPayload::Normal(e) => e.cmd.commands(),
                    _ => 1,
                };
                self.since_snapshot.fetch_add(commands, Ordering::Relaxed);
                results.push(match entry.payload {
                    EntryPayload::Blank => ApplyResult::Ok,
                    EntryPayload::Normal(ref e) => {
                        let result = data.state.apply(e);
                        if let ApplyResult::Rejected { reason } = &result {
                            tracing::debug!(log_index = entry.log_id.index, %reason, "command rejected");
                        }
                        let moved = std::mem::take(&mut data.state.archive_outbox);
                        if !moved.is_empty() {
                            self.archive.store(moved).map_err(|e| {
                                StorageIOError::new(
                                    ErrorSubject::Apply(entry.log_id),
                                    ErrorVerb::Write,
                                    openraft::AnyError::new(&e),
                                )
                            })?;
                        }
                        result
                    }
                    EntryPayload::Membership(m) => {
                        data.last_membership = StoredMembership::new(Some(entry.log_id), m);
                        ApplyResult::Ok
                    }
                });
                write_trace::stamp(Stage::Applied, entry.log_id.index);
            }
        }
        failpoint::crash("apply-after");
        if let Some(index) = last {
            self.applied.send_replace(index);
        }
        Ok(results)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        self.gate.receiving();
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let bytes = snapshot.into_inner();
        let data: MachineData =
            codec::from_either(&bytes).map_err(|e| snapshot_err(ErrorVerb::Read, &e))?;
        failpoint::crash("snapshot-install-before-write");
        self.write_snapshot(meta, &bytes, true)?;
        failpoint::crash("snapshot-install-after-write");
        let applied = data.last_applied.map_or(0, |l| l.index);
        {
            let mut held = self.data.write().unwrap_or_else(|p| p.into_inner());
            *held = data;
            self.since_snapshot.store(0, Ordering::Relaxed);
        }
        // The snapshot carries no archive: what was archived before it must come from peers.
        self.archive.mark_incomplete();
        self.applied.send_replace(applied);
        tracing::info!(log_index = applied, snapshot_id = %meta.snapshot_id, "installed a snapshot from the leader");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let stored = self
            .file
            .read()
            .map_err(|e| snapshot_err(ErrorVerb::Read, &e))?;
        Ok(stored.map(|(meta, bytes)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        }))
    }
}

fn read_lock(data: &RwLock<MachineData>) -> RwLockReadGuard<'_, MachineData> {
    data.read().unwrap_or_else(|p| p.into_inner())
}

fn snapshot_err(verb: ErrorVerb, e: &(dyn std::error::Error + 'static)) -> StorageError {
    StorageIOError::new(
        ErrorSubject::Snapshot(None),
        verb,
        openraft::AnyError::from_dyn(e, None),
    )
    .into()
}
