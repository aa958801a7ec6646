//! Opening a data directory: lock it, check its format version, open the engine and the stores.
//!
//! Layout: `LOCK` (held while the agent runs), `FORMAT` (`gpumesh-data <version>`), `raft/`
//! (sled: vote, log, committed), `snapshot` (the latest state-machine snapshot).

use std::fs::{self, File, TryLockError};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::storage::engine::SledEngine;
use crate::storage::error::OpenError;
use crate::storage::log_store::LogStore;
use crate::storage::snapshot_file::{SnapshotFile, SnapshotFileError};
use crate::storage::state_machine::StateMachineStore;

/// The on-disk format this binary writes and the newest it reads.
pub const DATA_FORMAT_VERSION: u32 = 1;
const FORMAT_MAGIC: &str = "gpumesh-data";

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
    check_format(dir)?;
    let engine =
        SledEngine::open(&dir.join("raft")).map_err(|e| corrupt(dir, format!("raft log: {e}")))?;
    let sm = StateMachineStore::open(SnapshotFile::new(dir)).map_err(|e| match e {
        SnapshotFileError::FutureVersion { found, .. } => OpenError::FutureVersion {
            dir: dir.to_owned(),
            found,
            supported: DATA_FORMAT_VERSION,
        },
        other => corrupt(dir, other.to_string()),
    })?;
    let log =
        LogStore::new(Arc::new(engine), sm.gate()).map_err(|e| corrupt(dir, e.to_string()))?;
    Ok((
        DataDir {
            path: dir.to_owned(),
            _lock: lock,
        },
        log,
        sm,
    ))
}

/// A new directory gets a FORMAT file; an existing one must carry a version we understand.
fn check_format(dir: &Path) -> Result<(), OpenError> {
    let format_path = dir.join("FORMAT");
    let has_data = dir.join("raft").exists() || dir.join("snapshot").exists();
    match fs::read_to_string(&format_path) {
        Ok(text) => {
            let found = text
                .trim()
                .strip_prefix(FORMAT_MAGIC)
                .and_then(|v| v.trim().parse::<u32>().ok())
                .ok_or_else(|| corrupt(dir, format!("FORMAT file holds {:?}", text.trim())))?;
            if found > DATA_FORMAT_VERSION {
                return Err(OpenError::FutureVersion {
                    dir: dir.to_owned(),
                    found,
                    supported: DATA_FORMAT_VERSION,
                });
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !has_data => {
            let write = || -> std::io::Result<()> {
                let mut f = File::create(&format_path)?;
                writeln!(f, "{FORMAT_MAGIC} {DATA_FORMAT_VERSION}")?;
                f.sync_all()?;
                File::open(dir)?.sync_all()
            };
            write().map_err(|source| OpenError::Io {
                dir: dir.to_owned(),
                action: "write the FORMAT file",
                source,
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(corrupt(dir, "it holds data but no FORMAT file".into()))
        }
        Err(source) => Err(OpenError::Io {
            dir: dir.to_owned(),
            action: "read the FORMAT file",
            source,
        }),
    }
}

fn corrupt(dir: &Path, detail: String) -> OpenError {
    OpenError::Corrupt {
        dir: dir.to_owned(),
        detail,
    }
}
