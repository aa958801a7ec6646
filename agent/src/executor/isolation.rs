//! Job isolation on the host: the job's own directory (owned by the user the job runs as) and,
//! on cgroup v2 hosts, a cgroup per run carrying its CPU, memory and task limits (cgroup v1
//! hosts: `cgroup_v1`; which one a host has: `cgroups`).
//!
//! Layout: the agent manages one cgroup, `jobs.cgroup_root` (default `/sys/fs/cgroup/gpumesh`),
//! with `cpu` and `memory` (and `pids` where available) enabled in its `cgroup.subtree_control`;
//! each run's supervisor creates `<root>/<run's cgroup name>/`, writes `cpu.max`, `memory.max`
//! and `pids.max`, the job enters it before it execs, and the supervisor removes it when the
//! job has ended. The root holds no processes itself (cgroup v2 allows controllers to be
//! delegated only from cgroups without processes).
//!
//! The decisions (which limits to write, whether a hierarchy can be used and what to enable)
//! are pure functions of file contents; the I/O around them is kept thin.

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::cgroup_tree::{create_run_dir, descendants};
use super::limits::{Limits, OomEvidence};

/// The controllers a job cgroup needs.
pub const CONTROLLERS: [&str; 2] = ["cpu", "memory"];

/// Enabled where the hierarchy has it, for the task limit (`pids.max`).
const OPTIONAL_CONTROLLER: &str = "pids";

/// The `cpu.max` period, µs (the kernel's default).
pub const CPU_PERIOD_US: u64 = 100_000;

/// The smallest quota the kernel accepts in `cpu.max`, µs.
const CPU_MIN_QUOTA_US: u64 = 1_000;

/// The directory inside a run's directory that belongs to the job: its `HOME` and default
/// working directory. The run directory itself stays the supervisor's, so the job cannot forge
/// `exit.json` or `shim.pid` or swap its log files for links.
pub const WORK_DIR: &str = "work";

pub fn work_dir(run_dir: &Path) -> PathBuf {
    run_dir.join(WORK_DIR)
}

/// `cpu.max` for `millis` thousandths of a core: `"<quota> <period>"`. The quota is raised to
/// the kernel's minimum (1 ms per period, i.e. 10 millicores) when the limit is below it.
pub fn cpu_max(millis: u32) -> String {
    let quota = (u64::from(millis) * CPU_PERIOD_US / 1000).max(CPU_MIN_QUOTA_US);
    format!("{quota} {CPU_PERIOD_US}")
}

/// `memory.max` for `mib` MiB, in bytes (`max` if it does not fit in 64 bits).
pub fn memory_max(mib: u64) -> String {
    mib.checked_mul(1024 * 1024)
        .map_or_else(|| "max".into(), |bytes| bytes.to_string())
}

/// The OOM killer's kills in a cgroup, from its `memory.events`.
pub fn oom_kills(memory_events: &str) -> Option<u64> {
    memory_events.lines().find_map(|l| {
        let (key, value) = l.split_once(' ')?;
        (key == "oom_kill").then(|| value.trim().parse().ok())?
    })
}

/// Whether a cgroup can delegate `cpu` and `memory` to its children, from its
/// `cgroup.controllers` (`None`: the file does not exist, so this is not cgroup v2) and
/// `cgroup.subtree_control`. `Ok(Some(line))`: write `line` to `cgroup.subtree_control` first.
pub fn delegation(
    controllers: Option<&str>,
    subtree_control: &str,
) -> Result<Option<String>, String> {
    let Some(controllers) = controllers else {
        return Err("not a cgroup v2 hierarchy (no cgroup.controllers)".into());
    };
    let unavailable = missing(controllers);
    if !unavailable.is_empty() {
        return Err(format!(
            "controller(s) {} not available (cgroup.controllers: {:?})",
            unavailable.join(", "),
            controllers.trim()
        ));
    }
    let disabled = missing(subtree_control);
    Ok((!disabled.is_empty()).then(|| {
        disabled
            .iter()
            .map(|c| format!("+{c}"))
            .collect::<Vec<_>>()
            .join(" ")
    }))
}

/// The needed controllers absent from a space-separated controller list.
fn missing(list: &str) -> Vec<&'static str> {
    CONTROLLERS
        .into_iter()
        .filter(|c| !list.split_whitespace().any(|l| l == *c))
        .collect()
}

/// Whether a user (`uid`, primary `gid`) may pass through a directory with this mode and owner.
pub fn can_search(mode: u32, owner: u32, group: u32, uid: u32, gid: u32) -> bool {
    uid == 0
        || if owner == uid {
            mode & 0o100 != 0
        } else if group == gid {
            mode & 0o010 != 0
        } else {
            mode & 0o001 != 0
        }
}

/// The first directory on the way to `path` (itself included) the user cannot pass through.
/// Supplementary groups are not considered: jobs run without them.
pub fn unreachable_ancestor(path: &Path, uid: u32, gid: u32) -> Option<PathBuf> {
    path.ancestors()
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .find_map(|dir| {
            let m = fs::metadata(dir).ok()?;
            (!can_search(m.mode(), m.uid(), m.gid(), uid, gid)).then(|| dir.to_owned())
        })
}

/// Make `root` ready for job cgroups: check its parent is cgroup v2 with `cpu` and `memory`,
/// enable them for the parent's children, create `root`, and enable them for its children.
/// `Err` says why job cgroups cannot be used (nothing is created in that case unless the
/// parent qualified).
pub fn prepare_root(root: &Path) -> Result<(), String> {
    let parent = root
        .parent()
        .ok_or_else(|| format!("{} has no parent cgroup", root.display()))?;
    enable_for_children(parent)?;
    match fs::create_dir(root) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("creating {}: {e}", root.display())),
    }
    enable_for_children(root)
}

fn enable_for_children(cgroup: &Path) -> Result<(), String> {
    let controllers = read_optional(&cgroup.join("cgroup.controllers"))
        .map_err(|e| format!("{}: {e}", cgroup.display()))?;
    let subtree_path = cgroup.join("cgroup.subtree_control");
    let subtree = if controllers.is_some() {
        fs::read_to_string(&subtree_path)
            .map_err(|e| format!("reading {}: {e}", subtree_path.display()))?
    } else {
        String::new()
    };
    let decision = delegation(controllers.as_deref(), &subtree)
        .map_err(|e| format!("{}: {e}", cgroup.display()))?;
    if let Some(line) = decision {
        fs::write(&subtree_path, &line)
            .map_err(|e| format!("writing {line:?} to {}: {e}", subtree_path.display()))?;
    }
    // The task limit where the hierarchy can give it; without, it is reported per run.
    let optional = controllers
        .as_deref()
        .is_some_and(|c| c.split_whitespace().any(|c| c == OPTIONAL_CONTROLLER))
        && !subtree.split_whitespace().any(|c| c == OPTIONAL_CONTROLLER);
    if optional {
        fs::write(&subtree_path, format!("+{OPTIONAL_CONTROLLER}")).ok();
    }
    Ok(())
}

fn read_optional(path: &Path) -> std::io::Result<Option<String>> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Give the job its own directory: created if missing, owned by the job's user, private to it.
pub fn prepare_work_dir(dir: &Path, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    match fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    if let Some((uid, gid)) = owner {
        // lchown: never follow a link, whoever put it there.
        std::os::unix::fs::lchown(dir, Some(uid), Some(gid))?;
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
}

/// One run's cgroup v2, created by its supervisor.
#[derive(Debug)]
pub struct JobCgroup {
    pub path: PathBuf,
    /// It has `pids.max`, so the task limit holds.
    pub pids: bool,
}

impl JobCgroup {
    /// Create the cgroup and write the run's limits (the others stay `max`). A cgroup of that
    /// name already there is taken over only when empty (`cgroup_tree::create_run_dir`).
    pub fn create(path: &Path, limits: &Limits) -> Result<Self, String> {
        create_run_dir(path)?;
        let cgroup = Self {
            path: path.to_owned(),
            pids: path.join("pids.max").exists(),
        };
        let tasks = limits.tasks_max.filter(|_| cgroup.pids);
        let values = [
            ("cpu.max", limits.cpu_millis.map(cpu_max)),
            ("memory.max", limits.memory_mib.map(memory_max)),
            ("pids.max", tasks.map(|n| n.to_string())),
        ];
        for (file, value) in values {
            if let Some(value) = value {
                let target = path.join(file);
                if let Err(e) = fs::write(&target, &value) {
                    fs::remove_dir(path).ok();
                    return Err(format!("writing {value:?} to {}: {e}", target.display()));
                }
            }
        }
        Ok(cgroup)
    }

    pub fn oom_evidence(&self) -> Option<OomEvidence> {
        let events = fs::read_to_string(self.path.join("memory.events")).ok()?;
        oom_kills(&events).map(OomEvidence::Kills)
    }

    /// The processes still in the cgroup.
    fn pids(&self) -> Vec<i32> {
        let mut dirs = descendants(&self.path);
        dirs.push(self.path.clone());
        dirs.iter()
            .filter_map(|d| fs::read_to_string(d.join("cgroup.procs")).ok())
            .flat_map(|s| {
                s.lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .filter(|pid| *pid > 0)
                    .collect::<Vec<i32>>()
            })
            .collect()
    }

    /// Kill whatever the job left behind in the cgroup and remove it, retrying for a moment
    /// while the kernel still counts exiting processes. `Err` only if it stays.
    pub async fn remove(&self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let left = self.pids();
            if !left.is_empty() {
                // cgroup.kill (Linux 5.14+) also catches processes that are forking right now.
                fs::write(self.path.join("cgroup.kill"), "1").ok();
                for pid in left {
                    kill(Pid::from_raw(pid), Signal::SIGKILL).ok();
                }
            }
            for below in descendants(&self.path) {
                fs::remove_dir(below).ok();
            }
            match fs::remove_dir(&self.path) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!("removing cgroup {}: {e}", self.path.display()));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_become_cgroup_values() {
        assert_eq!(cpu_max(1500), "150000 100000");
        assert_eq!(cpu_max(1000), "100000 100000");
        assert_eq!(cpu_max(250), "25000 100000");
        assert_eq!(cpu_max(10), "1000 100000");
        assert_eq!(cpu_max(1), "1000 100000", "raised to the kernel's minimum");
        assert_eq!(cpu_max(u32::MAX), "429496729500 100000");
        assert_eq!(memory_max(4096), "4294967296");
        assert_eq!(memory_max(1), "1048576");
        assert_eq!(memory_max(u64::MAX), "max");
    }

    #[test]
    fn delegation_is_decided_from_the_files() {
        assert!(
            delegation(None, "")
                .expect_err("v1")
                .contains("not a cgroup v2 hierarchy")
        );
        // A cgroup2 mount without controllers (cgroup v1 hybrid hosts: /sys/fs/cgroup/unified).
        let err = delegation(Some("\n"), "").expect_err("no controllers");
        assert!(err.contains("cpu, memory not available"), "{err}");
        let err = delegation(Some("cpuset cpu io pids\n"), "").expect_err("no memory");
        assert!(err.contains("memory not available"), "{err}");
        let all = "cpuset cpu io memory hugetlb pids rdma misc\n";
        assert_eq!(delegation(Some(all), "cpu memory pids\n"), Ok(None));
        assert_eq!(
            delegation(Some(all), "pids\n"),
            Ok(Some("+cpu +memory".into()))
        );
        assert_eq!(
            delegation(Some(all), "cpuset cpu\n"),
            Ok(Some("+memory".into()))
        );
        // `cpuset` is not `cpu`.
        assert_eq!(
            delegation(Some(all), "cpuset memory"),
            Ok(Some("+cpu".into()))
        );
    }

    #[test]
    fn oom_kills_are_read_from_memory_events() {
        let events = "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(oom_kills(events), Some(1));
        assert_eq!(oom_kills("low 0\noom 0\n"), None, "kernels before 4.13");
        assert_eq!(oom_kills("oom_kill x\n"), None);
    }

    #[test]
    fn search_permission_follows_the_mode_bits() {
        let (nobody, nogroup) = (65534, 65534);
        assert!(!can_search(0o700, 0, 0, nobody, nogroup));
        assert!(can_search(0o711, 0, 0, nobody, nogroup));
        assert!(can_search(0o750, 0, nogroup, nobody, nogroup));
        assert!(
            !can_search(0o705, 0, nogroup, nobody, nogroup),
            "group bits apply"
        );
        assert!(can_search(0o700, nobody, 0, nobody, nogroup));
        assert!(can_search(0o000, 1, 1, 0, 0), "root passes anywhere");
    }

    #[test]
    fn names_and_paths() {
        assert_eq!(
            work_dir(Path::new("/d/j-1-g1")),
            Path::new("/d/j-1-g1/work")
        );
    }

    #[test]
    fn a_root_is_not_prepared_where_there_is_no_cgroup_v2() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("gpumesh");
        let err = prepare_root(&root).expect_err("a plain directory is no cgroup");
        assert!(err.contains("not a cgroup v2 hierarchy"), "{err}");
        assert!(
            !root.exists(),
            "nothing is created outside a cgroup hierarchy"
        );
    }
}
