//! The jobs filesystem's free space: no run starts on a filesystem below `jobs.min_free` (it
//! fails to start with the reason instead), and whether the jobs directory shares the Raft
//! data's filesystem (a job that fills one then fills the other).

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::config::ByteSize;

/// Bytes an unprivileged process can still write on the filesystem holding `path`.
pub(crate) fn available(path: &Path) -> std::io::Result<u64> {
    let st = nix::sys::statvfs::statvfs(path).map_err(std::io::Error::from)?;
    Ok(st.blocks_available().saturating_mul(st.fragment_size()))
}

/// Pure: why no run may start when `available` bytes are left on `dir`'s filesystem, or `None`.
pub(crate) fn too_full(dir: &Path, available: u64, min_free: u64) -> Option<String> {
    (available < min_free).then(|| {
        format!(
            "the jobs filesystem ({}) is full: {} available, below jobs.min_free ({}); no run starts on this node until space is freed",
            dir.display(),
            mib(available),
            mib(min_free)
        )
    })
}

fn mib(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
    } else {
        ByteSize(bytes).to_string()
    }
}

/// Whether `a` and `b` are on one filesystem (the same device). `None` when either cannot be
/// read.
pub(crate) fn same_filesystem(a: &Path, b: &Path) -> Option<bool> {
    let dev = |p: &Path| std::fs::metadata(p).ok().map(|m| m.dev());
    Some(dev(a)? == dev(b)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_starts_only_above_the_minimum() {
        let dir = Path::new("/srv/jobs");
        assert_eq!(too_full(dir, 100 << 20, 64 << 20), None);
        assert_eq!(too_full(dir, 64 << 20, 64 << 20), None);
        let why = too_full(dir, 3 << 19, 64 << 20).expect("full");
        assert_eq!(
            why,
            "the jobs filesystem (/srv/jobs) is full: 1.5 MiB available, below jobs.min_free (64.0 MiB); no run starts on this node until space is freed"
        );
        assert!(too_full(dir, 0, 1).expect("full").contains("0B available"));
        assert_eq!(
            too_full(dir, 0, 0),
            None,
            "min_free = 0 turns the check off"
        );
    }

    #[test]
    fn this_filesystem_is_measured() {
        let tmp = tempfile::tempdir().expect("tempdir");
        assert!(available(tmp.path()).expect("statvfs") > 0);
        assert_eq!(same_filesystem(tmp.path(), tmp.path()), Some(true));
        assert_eq!(same_filesystem(tmp.path(), Path::new("/proc")), Some(false));
        assert_eq!(same_filesystem(tmp.path(), Path::new("/nonexistent")), None);
    }
}
