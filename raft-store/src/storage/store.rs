//! Opening a data directory: lock it, check its format version, open the engine and the stores.
//!
//! Layout: `LOCK` (held while the agent runs), `FORMAT` (`gpumesh-data <version>`, `format.rs`),
//! `raft/` (sled: vote, log, committed), `archive/` (the history archive, `archive.rs`),
//! `snapshot` (the latest state-machine snapshot).

use std::fs::{self, File, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::storage::archive::Archive;
use crate::storage::engine::{KvEngine, SledEngine};
use crate::storage::error::OpenError;
use crate::storage::format::{
    ARCHIVE_IN_FILES, DATA_FORMAT_VERSION, PACKED_LOG, check_format, corrupt, write_format,
};
use crate::storage::log_store::{self, LogStore};
use crate::storage::snapshot_file::{SnapshotFile, SnapshotFileError};
use crate::storage::state_machine::StateMachineStore;

/// An open, exclusively locked data directory. Dropping it releases the lock.
#[derive(Debug)]
pub struct DataDir {
    path: PathBuf,
    _lock: File,
}

impl DataDir {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Open (creating if empty) the data directory `dir` and return its stores.
pub fn open(dir: &Path) -> Result<(DataDir, LogStore, StateMachineStore), OpenError> {
    let io = |action, source| OpenError::Io {
        dir: dir.to_owned(),
        action,
        source,
    };
    fs::create_dir_all(dir).map_err(|e| io("create the directory", e))?;
    let lock_path = dir.join("LOCK");
    let lock = File::create(&lock_path).map_err(|e| io("create the lock file", e))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            return Err(OpenError::Locked {
                dir: dir.to_owned(),
                lock: lock_path,
            });
        }
        Err(TryLockError::Error(e)) => return Err(io("lock the directory", e)),
    }
    let format = check_format(dir)?;
    let engine: Arc<dyn KvEngine> = Arc::new(
        SledEngine::open(&dir.join("raft")).map_err(|e| corrupt(dir, format!("raft log: {e}")))?,
    );
    let archive =
        Archive::open(&dir.join("archive")).map_err(|e| corrupt(dir, format!("archive: {e}")))?;
    let sm = StateMachineStore::open(SnapshotFile::new(dir), archive).map_err(|e| match e {
        SnapshotFileError::FutureVersion { found, .. } => OpenError::FutureVersion {
            dir: dir.to_owned(),
            found,
            supported: DATA_FORMAT_VERSION,
        },
        other => corrupt(dir, other.to_string()),
    })?;
    // Migrate only a directory whose snapshot and archive opened: a refused one keeps its
    // format. The log store reads its records in this build's encoding.
    if format < PACKED_LOG {
        let repacked = log_store::repack(&*engine)
            .map_err(|e| corrupt(dir, format!("rewriting the raft log in MessagePack: {e}")))?;
        tracing::info!(dir = %dir.display(), repacked, "raft log records rewritten in MessagePack");
    }
    let log = LogStore::new(engine.clone(), sm.gate()).map_err(|e| corrupt(dir, e.to_string()))?;
    if format < ARCHIVE_IN_FILES {
        let moved = (sm.reader().archive().migrate_from(&*engine))
            .map_err(|e| corrupt(dir, format!("moving the archive out of sled: {e}")))?;
        tracing::info!(dir = %dir.display(), moved, "history archive moved out of sled");
    }
    if format < DATA_FORMAT_VERSION {
        write_format(dir)?;
        tracing::info!(dir = %dir.display(), from = format, "data directory migrated to this build's format");
    }
    Ok((
        DataDir {
            path: dir.to_owned(),
            _lock: lock,
        },
        log,
        sm,
    ))
}
