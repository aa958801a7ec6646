//! An append-only file of checksummed records, each read back at the offset it was written to.
//!
//! A record is `length: u32 LE | crc32 of the payload: u32 LE | payload`. Appends take one lock;
//! reads are positional and take none. Nothing is durable until `sync`, which says how far it
//! made the file durable; the owner keeps that mark and passes it to `open`, which cuts away
//! whatever lies past it (a torn tail, or records a restart will write again).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;

const HEADER: usize = 8;
/// No record is larger: a length above it is damage, not a record.
const MAX_RECORD: u32 = 64 * 1024 * 1024;

#[derive(Debug)]
pub(crate) struct RecordFile {
    file: File,
    /// Bytes written so far; appends hold it.
    len: Mutex<u64>,
}

impl RecordFile {
    /// Open (creating) the file at `path`, keeping its first `durable` bytes. A file shorter
    /// than `durable` lost synced data, and is refused.
    pub(crate) fn open(path: &Path, durable: u64) -> io::Result<Self> {
        let file = open_or_create(path)?;
        let len = file.metadata()?.len();
        if len < durable {
            return Err(invalid(format!(
                "{} holds {len} bytes, but {durable} were synced",
                path.display()
            )));
        }
        if len > durable {
            file.set_len(durable)?;
        }
        Ok(Self {
            file,
            len: Mutex::new(durable),
        })
    }

    /// Append `payload`; returns the offset to `read` it at.
    pub(crate) fn append(&self, payload: &[u8]) -> io::Result<u64> {
        let size = u32::try_from(payload.len())
            .ok()
            .filter(|n| *n <= MAX_RECORD)
            .ok_or_else(|| invalid(format!("a record of {} bytes is too large", payload.len())))?;
        let mut record = Vec::with_capacity(HEADER + payload.len());
        record.extend_from_slice(&size.to_le_bytes());
        record.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        record.extend_from_slice(payload);
        let mut len = self.len.lock().unwrap_or_else(|p| p.into_inner());
        let offset = *len;
        // On an error, whatever part landed is overwritten by the next append.
        self.file.write_all_at(&record, offset)?;
        *len += record.len() as u64;
        Ok(offset)
    }

    /// The payload of the record at `offset`, checked against its checksum.
    pub(crate) fn read(&self, offset: u64) -> io::Result<Vec<u8>> {
        let mut header = [0u8; HEADER];
        self.file.read_exact_at(&mut header, offset)?;
        let [a, b, c, d, e, f, g, h] = header;
        let size = u32::from_le_bytes([a, b, c, d]);
        let crc = u32::from_le_bytes([e, f, g, h]);
        if size > MAX_RECORD {
            return Err(invalid(format!("no record at offset {offset}")));
        }
        let mut payload = vec![0u8; size as usize];
        self.file
            .read_exact_at(&mut payload, offset + HEADER as u64)?;
        if crc32fast::hash(&payload) != crc {
            return Err(invalid(format!(
                "the record at offset {offset} fails its checksum"
            )));
        }
        Ok(payload)
    }

    /// Bytes written so far.
    pub(crate) fn len(&self) -> u64 {
        *self.len.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Make every record appended before the call durable; returns how many bytes now are.
    pub(crate) fn sync(&self) -> io::Result<u64> {
        let len = self.len();
        self.file.sync_data()?;
        Ok(len)
    }
}

/// Open the file at `path` to read and write in place, creating it empty if it is missing.
pub(crate) fn open_or_create(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
}

/// Damage found in the archive's files.
pub(crate) fn invalid(detail: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("archive: {detail}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_and_open_cuts_what_was_not_synced() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("records");
        let file = RecordFile::open(&path, 0).expect("open");
        let first = file.append(b"one").expect("append");
        let second = file.append(b"").expect("append");
        let synced = file.sync().expect("sync");
        let third = file.append(b"three").expect("append");
        assert_eq!(file.read(first).expect("read"), b"one");
        assert_eq!(file.read(second).expect("read"), b"");
        assert_eq!(file.read(third).expect("read"), b"three");
        drop(file);

        let file = RecordFile::open(&path, synced).expect("reopen");
        assert_eq!(file.len(), synced);
        assert!(file.read(third).is_err(), "cut at the synced length");
        assert_eq!(file.append(b"four").expect("append"), third);
        assert_eq!(file.read(third).expect("read"), b"four");
        drop(file);

        let err = RecordFile::open(&path, synced + 100).expect_err("lost synced data");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn damage_is_detected_not_returned() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("records");
        let file = RecordFile::open(&path, 0).expect("open");
        let at = file.append(b"payload").expect("append");
        file.file.write_all_at(b"X", at + 9).expect("damage");
        let err = file.read(at).expect_err("checksum");
        assert!(err.to_string().contains("checksum"), "{err}");
        assert!(file.read(at + 3).is_err(), "not a record boundary");
    }
}
