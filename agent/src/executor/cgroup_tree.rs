//! A run's cgroup directory: made fresh for the run, the cgroups it holds below itself (a
//! container runtime makes the container's, and its monitor's, under the run's, and they must
//! go before the run's can), and the sweep of those that supervisors killed outright left.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::run_cgroup_name::parse_cgroup_name;

/// Make the run's cgroup `dir`. A cgroup of that name already there is a leftover of a
/// supervisor that died without removing it (the name carries the supervisor's pid, now ours):
/// it is taken over only if it is empty, which is what `rmdir` checks on a cgroup (no process,
/// no cgroup below); one that still holds something is never shared.
pub fn create_run_dir(dir: &Path) -> Result<(), String> {
    let create = || std::fs::create_dir(dir);
    let result = match create() {
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            std::fs::remove_dir(dir).map_err(|busy| {
                format!("a leftover cgroup {} is not empty: {busy}", dir.display())
            })?;
            create()
        }
        other => other,
    };
    result.map_err(|e| format!("creating cgroup {}: {e}", dir.display()))
}

/// Remove the run cgroups under `root` that supervisors killed outright left behind: those
/// named for a supervisor pid that no process has now, and empty, with the empty cgroups below
/// them. One that still holds a process is left alone. Returns how many went.
pub fn sweep_leftovers(root: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(root) else {
        return 0;
    };
    let gone = |pid: u32| !Path::new("/proc").join(pid.to_string()).exists();
    (entries.flatten())
        .filter(|entry| {
            let name = entry.file_name();
            let run = name.to_str().and_then(parse_cgroup_name);
            let Some(pid) = run.and_then(|r| r.supervisor) else {
                return false;
            };
            if !gone(pid) || !entry.file_type().is_ok_and(|t| t.is_dir()) {
                return false;
            }
            let dir = entry.path();
            for below in descendants(&dir) {
                std::fs::remove_dir(below).ok();
            }
            std::fs::remove_dir(&dir).is_ok()
        })
        .count()
}

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
    fn an_empty_leftover_is_taken_over_and_a_busy_one_is_refused() {
        let root = tempfile::tempdir().expect("valid");
        let run = root.path().join("job-2-g1-s8091");
        create_run_dir(&run).expect("a fresh name");
        create_run_dir(&run).expect("an empty leftover of the same name");
        std::fs::create_dir(run.join("container")).expect("valid");
        let err = create_run_dir(&run).expect_err("a leftover that holds a cgroup");
        assert!(
            err.contains("leftover cgroup") && err.contains("not empty"),
            "{err}"
        );
        assert!(
            run.join("container").is_dir(),
            "the busy leftover is left alone"
        );
    }

    #[test]
    fn only_empty_runs_of_supervisors_that_are_gone_are_swept() {
        let root = tempfile::tempdir().expect("valid");
        let mut exited = std::process::Command::new("true").spawn().expect("spawn");
        exited.wait().expect("wait");
        let (dead, alive) = (exited.id(), std::process::id());
        let make = |name: &str| {
            let dir = root.path().join(name);
            std::fs::create_dir_all(&dir).expect("valid");
            dir
        };
        make(&format!("job-1-g1-s{dead}/container/monitor"));
        let busy = make(&format!("job-2-g1-s{dead}"));
        std::fs::write(busy.join("cgroup.procs"), "4242\n").expect("valid");
        make(&format!("job-3-g1-s{alive}"));
        make("not-a-run-s1");
        assert_eq!(sweep_leftovers(root.path()), 1);
        let mut left: Vec<String> = std::fs::read_dir(root.path())
            .expect("valid")
            .map(|e| e.expect("valid").file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let expected = [
            format!("job-2-g1-s{dead}"),
            format!("job-3-g1-s{alive}"),
            "not-a-run-s1".to_owned(),
        ];
        assert_eq!(left, expected);
    }

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
