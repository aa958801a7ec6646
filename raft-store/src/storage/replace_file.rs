//! Replacing a whole file durably: written under a temporary name beside it (`<name>.tmp`),
//! fsynced, renamed over it, and the directory fsynced, so a crash leaves the old file or the
//! new one, whole, never a mix. The snapshot, the `FORMAT` file and the archive's `SYNCED`
//! marks are written this way.

use std::fs::{self, File};
use std::io;
use std::path::Path;

/// Replace the file at `path` with what `write` writes. `crash_before_rename` names the
/// failpoint (`failpoint.rs`) that crashes between the fsync and the rename.
pub(crate) fn replace(
    path: &Path,
    write: impl FnOnce(&mut File) -> io::Result<()>,
    crash_before_rename: Option<&'static str>,
) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut file = File::create(&tmp)?;
    write(&mut file)?;
    file.sync_all()?;
    if let Some(name) = crash_before_rename {
        crate::failpoint::crash(name);
    }
    fs::rename(&tmp, path)?;
    let dir = (path.parent())
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    File::open(dir)?.sync_all()
}
