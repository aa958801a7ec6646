//! The disk's fsync latency: the physical floor under every replicated commit; and sled's
//! durable insert, the floor of gpumesh's own log append.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use gpu_raft_store::{KvEngine, SledEngine, Space};

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

/// Append `rounds` log entries of `bytes` bytes through gpumesh's own storage engine (sled,
/// opened in a fresh directory under `dir` with the log's settings), each made durable with
/// `flush` as the log store does.
pub fn sled_floor(dir: &Path, rounds: usize, bytes: usize) -> anyhow::Result<Summary> {
    let engine = SledEngine::open(&dir.join("sled.probe"))?;
    let value = vec![0x5a_u8; bytes];
    let mut samples = Vec::with_capacity(rounds);
    for i in 0..rounds as u64 {
        let t = Instant::now();
        engine.write(
            Space::Log,
            vec![(i.to_be_bytes().to_vec(), Some(value.clone()))],
        )?;
        engine.flush()?;
        samples.push(t.elapsed());
    }
    Ok(Summary::of(&samples))
}
