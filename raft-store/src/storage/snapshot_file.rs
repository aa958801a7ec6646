//! The on-disk snapshot: one file, a JSON header line then the payload, checksummed.
//!
//! Replaced durably (`replace_file.rs`): a crash leaves either the old or the new snapshot, whole.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::NodeId;
use crate::storage::format::DATA_FORMAT_VERSION;
use crate::storage::replace_file::replace;

pub(super) type SnapshotMeta = openraft::SnapshotMeta<NodeId, openraft::BasicNode>;

#[derive(Serialize, Deserialize)]
struct Header {
    format: u32,
    meta: SnapshotMeta,
    len: u64,
    sha256: String,
}

/// Why a stored snapshot cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SnapshotFileError {
    #[error("snapshot {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("snapshot {path} is corrupt: {detail}")]
    Corrupt { path: PathBuf, detail: String },
    #[error(
        "snapshot {path} has format version {found}, newer than supported {DATA_FORMAT_VERSION}"
    )]
    FutureVersion { path: PathBuf, found: u32 },
}

/// The snapshot file of one data directory.
#[derive(Clone, Debug)]
pub(crate) struct SnapshotFile {
    path: PathBuf,
}

impl SnapshotFile {
    pub(crate) fn new(dir: &Path) -> Self {
        Self {
            path: dir.join("snapshot"),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Durably replace the stored snapshot.
    pub(crate) fn write(&self, meta: &SnapshotMeta, data: &[u8]) -> Result<(), SnapshotFileError> {
        let io = |source| SnapshotFileError::Io {
            path: self.path.clone(),
            source,
        };
        let header = Header {
            format: DATA_FORMAT_VERSION,
            meta: meta.clone(),
            len: data.len() as u64,
            sha256: hex::encode(Sha256::digest(data)),
        };
        let mut line = serde_json::to_vec(&header).map_err(|e| io(std::io::Error::other(e)))?;
        line.push(b'\n');
        let write = |file: &mut File| {
            file.write_all(&line)?;
            file.write_all(data)
        };
        replace(&self.path, write, Some("snapshot-file-before-rename")).map_err(io)
    }

    /// The stored snapshot, verified, or `None` when there is none.
    pub(crate) fn read(&self) -> Result<Option<(SnapshotMeta, Vec<u8>)>, SnapshotFileError> {
        let path = self.path.clone();
        let file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(SnapshotFileError::Io { path, source }),
        };
        let corrupt = |detail: String| SnapshotFileError::Corrupt {
            path: path.clone(),
            detail,
        };
        let mut reader = BufReader::new(file);
        let mut line = Vec::new();
        reader
            .read_until(b'\n', &mut line)
            .map_err(|source| SnapshotFileError::Io {
                path: path.clone(),
                source,
            })?;
        let header: Header =
            serde_json::from_slice(&line).map_err(|e| corrupt(format!("bad header: {e}")))?;
        if header.format > DATA_FORMAT_VERSION {
            return Err(SnapshotFileError::FutureVersion {
                path,
                found: header.format,
            });
        }
        let mut data = Vec::new();
        reader
            .read_to_end(&mut data)
            .map_err(|source| SnapshotFileError::Io {
                path: path.clone(),
                source,
            })?;
        if data.len() as u64 != header.len {
            return Err(corrupt(format!(
                "{} payload bytes, header says {}",
                data.len(),
                header.len
            )));
        }
        let digest = hex::encode(Sha256::digest(&data));
        if digest != header.sha256 {
            return Err(corrupt(format!(
                "checksum {digest} does not match {}",
                header.sha256
            )));
        }
        Ok(Some((header.meta, data)))
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    fn meta() -> SnapshotMeta {
        SnapshotMeta {
            last_log_id: None,
            last_membership: Default::default(),
            snapshot_id: "s1".into(),
        }
    }

    #[test]
    fn round_trip_and_detect_corruption() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = SnapshotFile::new(dir.path());
        assert!(file.read().expect("no snapshot is fine").is_none());
        file.write(&meta(), b"hello state").expect("write");
        let (m, data) = file.read().expect("read").expect("present");
        assert_eq!(
            (m.snapshot_id.as_str(), data.as_slice()),
            ("s1", b"hello state".as_slice())
        );

        let mut bytes = fs::read(file.path()).expect("raw");
        let last = bytes.len() - 1;
        bytes[last] ^= 0x01;
        fs::write(file.path(), &bytes).expect("corrupt it");
        let err = file.read().expect_err("flipped byte must be detected");
        assert!(err.to_string().contains("checksum"), "{err}");
    }

    #[test]
    fn future_format_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = SnapshotFile::new(dir.path());
        file.write(&meta(), b"x").expect("write");
        let text = fs::read_to_string(file.path()).expect("raw");
        let bumped = text.replacen(
            &format!("\"format\":{DATA_FORMAT_VERSION}"),
            "\"format\":999",
            1,
        );
        fs::write(file.path(), bumped).expect("bump");
        assert!(matches!(
            file.read(),
            Err(SnapshotFileError::FutureVersion { found: 999, .. })
        ));
    }
}
