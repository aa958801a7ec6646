//! The disk's fsync latency: the physical floor under every replicated commit.

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
