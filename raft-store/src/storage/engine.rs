//! The narrow key-value surface the stores need, and its sled implementation.
//!
//! Everything above this file speaks `KvEngine`; swapping sled for another engine means writing
//! one new implementation of this trait.

use std::path::Path;
use std::sync::Mutex;

/// A key space. Each maps to one sled tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Space {
    /// Small named records: format version, vote, committed, last purged.
    Meta,
    /// Raft log entries keyed by big-endian index.
    Log,
    /// Format 1's history archive (jobs by id, by finish time, audit entries and signed heads
    /// by sequence number), read once to move it into `archive/` and then emptied
    /// (`Archive::migrate_from`).
    LegacyArchivedJobs,
    LegacyArchivedByFinish,
    LegacyArchivedAudit,
    LegacyArchivedHeads,
}

/// Entries in key order, read as they are needed.
pub type Scan<'a> = Box<dyn Iterator<Item = std::io::Result<(Vec<u8>, Vec<u8>)>> + 'a>;

/// A write of several keys that lands atomically.
pub(crate) type Batch = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// Ordered key-value storage with an explicit durability point.
pub trait KvEngine: Send + Sync + 'static {
    fn get(&self, space: Space, key: &[u8]) -> std::io::Result<Option<Vec<u8>>>;
    /// Atomically apply puts (`Some`) and deletes (`None`). Not durable until `flush`.
    fn write(&self, space: Space, batch: Batch) -> std::io::Result<()>;
    /// Entries with `from <= key < to`, in key order.
    fn range(
        &self,
        space: Space,
        from: &[u8],
        to: &[u8],
    ) -> std::io::Result<Vec<(Vec<u8>, Vec<u8>)>>;
    /// Keys with `from <= key < to`, in key order.
    fn keys(&self, space: Space, from: &[u8], to: &[u8]) -> std::io::Result<Vec<Vec<u8>>>;
    fn last(&self, space: Space) -> std::io::Result<Option<(Vec<u8>, Vec<u8>)>>;
    /// Entries with `from <= key < to`, in key order, read one at a time (for ranges too large
    /// to hold).
    fn scan(&self, space: Space, from: &[u8], to: &[u8]) -> Scan<'_>;
    /// Remove every entry of `space`. Not durable until `flush`.
    fn clear(&self, space: Space) -> std::io::Result<()>;
    /// Make every earlier write durable (fsync). Blocking.
    fn flush(&self) -> std::io::Result<()>;
}

/// sled 0.34 behind `KvEngine`.
pub struct SledEngine {
    db: sled::Db,
    meta: sled::Tree,
    log: sled::Tree,
    archived_jobs: sled::Tree,
    archived_by_finish: sled::Tree,
    archived_audit: sled::Tree,
    archived_heads: sled::Tree,
    /// sled must never run two flushes at once (sled issue #1308); all of ours go through here.
    flush_lock: Mutex<()>,
}

/// sled's page cache. The working set is the Raft log tail and a few meta keys.
const CACHE_BYTES: u64 = 64 * 1024 * 1024;

impl SledEngine {
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        let config = sled::Config::new()
            .path(dir)
            .cache_capacity(CACHE_BYTES)
            // Durability comes from our explicit flush before acknowledging; the background
            // flusher only bounds how much un-acknowledged data a crash can drop.
            .flush_every_ms(Some(1000));
        // The caller holds the data directory's own lock, so a held sled lock can only be an
        // instance of this process still shutting down (sled releases it from a background
        // thread after drop): wait for it briefly.
        let mut attempts = 0;
        let db = loop {
            match config.open() {
                Err(sled::Error::Io(e))
                    if e.to_string().contains("could not acquire lock") && attempts < 50 =>
                {
                    attempts += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                other => break other.map_err(io)?,
            }
        };
        let meta = db.open_tree("meta").map_err(io)?;
        let log = db.open_tree("log").map_err(io)?;
        let tree = |name: &str| db.open_tree(name).map_err(io);
        Ok(Self {
            archived_jobs: tree("archived_jobs")?,
            archived_by_finish: tree("archived_by_finish")?,
            archived_audit: tree("archived_audit")?,
            archived_heads: tree("archived_heads")?,
            db,
            meta,
            log,
            flush_lock: Mutex::new(()),
        })
    }

    fn tree(&self, space: Space) -> &sled::Tree {
        match space {
            Space::Meta => &self.meta,
            Space::Log => &self.log,
            Space::LegacyArchivedJobs => &self.archived_jobs,
            Space::LegacyArchivedByFinish => &self.archived_by_finish,
            Space::LegacyArchivedAudit => &self.archived_audit,
            Space::LegacyArchivedHeads => &self.archived_heads,
        }
    }
}

impl KvEngine for SledEngine {
    fn get(&self, space: Space, key: &[u8]) -> std::io::Result<Option<Vec<u8>>> {
        Ok(self.tree(space).get(key).map_err(io)?.map(|v| v.to_vec()))
    }

    fn write(&self, space: Space, batch: Batch) -> std::io::Result<()> {
        let mut b = sled::Batch::default();
        for (k, v) in batch {
            match v {
                Some(v) => b.insert(k, v),
                None => b.remove(k),
            }
        }
        self.tree(space).apply_batch(b).map_err(io)
    }

    fn range(
        &self,
        space: Space,
        from: &[u8],
        to: &[u8],
    ) -> std::io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.tree(space)
            .range(from..to)
            .map(|kv| kv.map(|(k, v)| (k.to_vec(), v.to_vec())).map_err(io))
            .collect()
    }

    fn keys(&self, space: Space, from: &[u8], to: &[u8]) -> std::io::Result<Vec<Vec<u8>>> {
        self.tree(space)
            .range(from..to)
            .keys()
            .map(|k| k.map(|k| k.to_vec()).map_err(io))
            .collect()
    }

    fn last(&self, space: Space) -> std::io::Result<Option<(Vec<u8>, Vec<u8>)>> {
        Ok(self
            .tree(space)
            .last()
            .map_err(io)?
            .map(|(k, v)| (k.to_vec(), v.to_vec())))
    }

    fn scan(&self, space: Space, from: &[u8], to: &[u8]) -> Scan<'_> {
        Box::new(
            self.tree(space)
                .range(from.to_vec()..to.to_vec())
                .map(|kv| kv.map(|(k, v)| (k.to_vec(), v.to_vec())).map_err(io)),
        )
    }

    fn clear(&self, space: Space) -> std::io::Result<()> {
        self.tree(space).clear().map_err(io)
    }

    fn flush(&self) -> std::io::Result<()> {
        let _one_at_a_time = self.flush_lock.lock().unwrap_or_else(|p| p.into_inner());
        crate::failpoint::io_error("fsync-error")?;
        self.db.flush().map(drop).map_err(io)
    }
}

fn io(e: sled::Error) -> std::io::Error {
    match e {
        sled::Error::Io(e) => e,
        other => std::io::Error::other(other.to_string()),
    }
}
