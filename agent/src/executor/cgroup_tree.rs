//! The cgroups a run's cgroup holds below itself: a container runtime makes the container's
//! (and its monitor's) under the run's, and they must go before the run's can.

use std::path::{Path, PathBuf};

/// Every cgroup below `dir`, the deepest first (the order they can be removed in).
pub fn descendants(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    collect(dir, &mut found);
    found.reverse();
    found
}

fn collect(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            let path = entry.path();
            found.push(path.clone());
            collect(&path, found);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deepest_come_first() {
        let root = tempfile::tempdir().expect("valid");
        let a = root.path().join("a");
        std::fs::create_dir_all(a.join("b/c")).expect("valid");
        std::fs::create_dir_all(root.path().join("d")).expect("valid");
        std::fs::write(a.join("cgroup.procs"), "").expect("valid");
        let found = descendants(root.path());
        assert_eq!(found.len(), 4, "{found:?}");
        let at = |p: &Path| found.iter().position(|f| f == p).expect("valid");
        assert!(at(&a.join("b/c")) < at(&a.join("b")));
        assert!(at(&a.join("b")) < at(&a));
    }
}
