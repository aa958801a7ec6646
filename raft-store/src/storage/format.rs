//! The data directory's format version: the `FORMAT` file (`gpumesh-data <version>`), written
//! into a new directory, checked at every open and rewritten once an older directory is
//! migrated (`store.rs`), and the same version in every snapshot file's header. Unknown (newer)
//! versions are refused, never rewritten.
//!
//! 1: the history archive in sled trees beside the log. 2: the archive in its own files
//! (`archive.rs`). 3: the log store's records in MessagePack (`codec`), not JSON.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

use crate::storage::error::OpenError;
use crate::storage::replace_file::replace;

/// The on-disk format this binary writes and the newest it reads.
pub const DATA_FORMAT_VERSION: u32 = 3;
/// The first format that keeps the history archive in its own files: older directories are
/// migrated at open (`store.rs`).
pub(crate) const ARCHIVE_IN_FILES: u32 = 2;
/// The first format whose log store records are MessagePack: older directories are repacked
/// at open (`log_store::repack`).
pub(crate) const PACKED_LOG: u32 = 3;
const FORMAT_MAGIC: &str = "gpumesh-data";

/// A new directory gets a FORMAT file; an existing one must carry a version we understand.
/// Returns the version the directory holds.
pub(crate) fn check_format(dir: &Path) -> Result<u32, OpenError> {
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
            Ok(found)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !has_data => {
            write_format(dir).map(|()| DATA_FORMAT_VERSION)
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

/// Write this binary's version into the FORMAT file: replaced whole, then made durable.
pub(crate) fn write_format(dir: &Path) -> Result<(), OpenError> {
    let write = |f: &mut File| writeln!(f, "{FORMAT_MAGIC} {DATA_FORMAT_VERSION}");
    replace(&dir.join("FORMAT"), write, None).map_err(|source| OpenError::Io {
        dir: dir.to_owned(),
        action: "write the FORMAT file",
        source,
    })
}

pub(crate) fn corrupt(dir: &Path, detail: String) -> OpenError {
    OpenError::Corrupt {
        dir: dir.to_owned(),
        detail,
    }
}
