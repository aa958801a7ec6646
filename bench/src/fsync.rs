//! The disk's fsync latency: the physical floor under every replicated commit; and sled's
//! durable insert, the floor of gpumesh's own log append.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use crate::stats::Summary;

/// Append `rounds` 4 KiB blocks to a fresh file in `dir`, `fdatasync` after each.
pub fn floor(dir: &Path, rounds: usize) -> std::io::Result<Summary> {
    let path = dir.join("fsync.probe");
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)?;
    let block = [0x5a_u8; 4096];
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        file.write_all(&block)?;
        file.sync_data()?;
        samples.push(t.elapsed());
    }
    drop(file);
    std::fs::remove_file(&path)?;
    Ok(Summary::of(&samples))
}

/// Insert `rounds` entries of `bytes` bytes into a fresh sled database in `dir`, each made
/// durable with `flush`, with the settings of gpumesh's log (`SledEngine`: 64 MiB cache, a
/// background flush every second).
pub fn sled_floor(dir: &Path, rounds: usize, bytes: usize) -> anyhow::Result<Summary> {
    let db = sled::Config::new()
        .path(dir.join("sled.probe"))
        .cache_capacity(64 * 1024 * 1024)
        .flush_every_ms(Some(1000))
        .open()?;
    let log = db.open_tree("log")?;
    let value = vec![0x5a_u8; bytes];
    let mut samples = Vec::with_capacity(rounds);
    for i in 0..rounds as u64 {
        let t = Instant::now();
        log.insert(i.to_be_bytes(), value.as_slice())?;
        db.flush()?;
        samples.push(t.elapsed());
    }
    Ok(Summary::of(&samples))
}
