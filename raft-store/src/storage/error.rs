//! Why a data directory could not be opened. Each variant is fatal: the agent refuses to start
//! and says why, and never resets data on its own.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("data directory {dir} is in use by another process (lock file {lock} is held)")]
    Locked { dir: PathBuf, lock: PathBuf },
    #[error(
        "data directory {dir} has data format version {found}, this binary understands up to \
         {supported}; upgrade gpu-agent or point --data-dir elsewhere"
    )]
    FutureVersion {
        dir: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error("data directory {dir} is corrupt: {detail}; restore it from a backup or a peer")]
    Corrupt { dir: PathBuf, detail: String },
    #[error("cannot {action} in data directory {dir}: {source}")]
    Io {
        dir: PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
}
