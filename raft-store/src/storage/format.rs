//! The data directory's format version: the `FORMAT` file (`gpumesh-data <version>`), written
//! once into a new directory and checked at every open, and the same version in every snapshot
//! file's header. Unknown (newer) versions are refused, never rewritten.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

use crate::storage::error::OpenError;

/// The on-disk format this binary writes and the newest it reads.
pub const DATA_FORMAT_VERSION: u32 = 1;
const FORMAT_MAGIC: &str = "gpumesh-data";

/// A new directory gets a FORMAT file; an existing one must carry a version we understand.
pub(crate) fn check_format(dir: &Path) -> Result<(), OpenError> {
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

pub(crate) fn corrupt(dir: &Path, detail: String) -> OpenError {
    OpenError::Corrupt {
        dir: dir.to_owned(),
        detail,
    }
}
