//! Job cgroups on cgroup v1 hosts (each controller its own hierarchy, as on this project's CI
//! machines): per run, a cgroup `<mount>/<root>/<name>` in each of the `memory`, `cpu`, `pids`
//! and `devices` hierarchies the host mounts, holding the job's limits and its device fence.
//!
//! The decisions (where the hierarchies are, what to write, whether the job ran out of memory)
//! are pure functions of file contents; the I/O around them is kept thin.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io::ErrorKind;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::cgroup_tree::{create_run_dir, descendants};
use super::device_fence::DeviceRule;
use super::isolation::CPU_PERIOD_US;
use super::limits::{Limits, OomEvidence};

/// The v1 controllers a job cgroup uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Controller {
    Memory,
    Cpu,
    Pids,
    Devices,
}

impl Controller {
    pub const ALL: [Controller; 4] = [
        Controller::Memory,
        Controller::Cpu,
        Controller::Pids,
        Controller::Devices,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Cpu => "cpu",
            Controller::Pids => "pids",
            Controller::Devices => "devices",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }
}

impl fmt::Display for Controller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where each controller's hierarchy is mounted, from `/proc/self/mountinfo`: the `cgroup`
/// (v1) mounts whose super options name the controller (`cpu,cpuacct` mounted together counts
/// for `cpu`); the first mount of a hierarchy wins.
pub fn mounts(mountinfo: &str) -> BTreeMap<Controller, PathBuf> {
    let mut found = BTreeMap::new();
    for line in mountinfo.lines() {
        // id parent major:minor root mount-point options [optional fields] - type source super
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let fields: Vec<&str> = left.split_whitespace().collect();
        let Some(point) = fields.get(4) else {
            continue;
        };
        let mut right = right.split_whitespace();
        let (Some("cgroup"), Some(_source), Some(options)) =
            (right.next(), right.next(), right.next())
        else {
            continue;
        };
        for controller in options.split(',').filter_map(Controller::from_name) {
            found
                .entry(controller)
                .or_insert_with(|| PathBuf::from(unescape_octal(point)));
        }
    }
    found
}

/// mountinfo writes space, tab, newline and backslash in paths as `\040`-style escapes.
fn unescape_octal(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let code = bytes.get(i + 1..i + 4).and_then(|d| {
            d.iter()
                .all(|b| (b'0'..=b'7').contains(b))
                .then(|| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok())
                .flatten()
        });
        match (bytes[i], code) {
            (b'\\', Some(c)) => {
                out.push(c);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `cpu.cfs_quota_us` for `millis` thousandths of a core, with `CPU_PERIOD_US` as the period:
/// at least the kernel's minimum (1 ms).
pub fn cfs_quota_us(millis: u32) -> u64 {
    (u64::from(millis) * CPU_PERIOD_US / 1000).max(1_000)
}

/// `memory.limit_in_bytes` for `mib` MiB (`-1`, no limit, when it does not fit in 63 bits).
pub fn limit_in_bytes(mib: u64) -> String {
    mib.checked_mul(1024 * 1024)
        .filter(|b| i64::try_from(*b).is_ok())
        .map_or_else(|| "-1".into(), |b| b.to_string())
}

/// What `memory.oom_control` (and `memory.failcnt`) say about the OOM killer in the cgroup:
/// the `oom_kill` count where the kernel has it (4.13 on), otherwise how often the limit was
/// hit.
pub fn oom_evidence(oom_control: &str, failcnt: Option<&str>) -> OomEvidence {
    let kills = oom_control.lines().find_map(|l| {
        let (key, value) = l.split_once(char::is_whitespace)?;
        (key == "oom_kill").then(|| value.trim().parse().ok())?
    });
    match kills {
        Some(n) => OomEvidence::Kills(n),
        None => OomEvidence::LimitHits(failcnt.and_then(|f| f.trim().parse().ok()).unwrap_or(0)),
    }
}

/// The files to write in each controller's job cgroup, in order. The devices fence first
/// denies everything, then allows each rule. `memsw`: the hierarchy counts swap, so the memory
/// limit covers memory plus swap too (written after the memory limit, which it may not be
/// below).
pub fn writes(
    controller: Controller,
    limits: &Limits,
    devices: &[DeviceRule],
    memsw: bool,
) -> Vec<(&'static str, String)> {
    match controller {
        Controller::Memory => limits
            .memory_mib
            .map(|mib| {
                let mut w = vec![("memory.limit_in_bytes", limit_in_bytes(mib))];
                if memsw {
                    w.push(("memory.memsw.limit_in_bytes", limit_in_bytes(mib)));
                }
                w
            })
            .unwrap_or_default(),
        Controller::Cpu => limits
            .cpu_millis
            .map(|m| {
                vec![
                    ("cpu.cfs_period_us", CPU_PERIOD_US.to_string()),
                    ("cpu.cfs_quota_us", cfs_quota_us(m).to_string()),
                ]
            })
            .unwrap_or_default(),
        Controller::Pids => limits
            .tasks_max
            .map(|n| vec![("pids.max", n.to_string())])
            .unwrap_or_default(),
        Controller::Devices => std::iter::once(("devices.deny", "a".to_owned()))
            .chain(devices.iter().map(|r| ("devices.allow", r.to_string())))
            .collect(),
    }
}

/// Make `<mount>/<root_name>` in every hierarchy found: the parents of job cgroups.
pub fn prepare_roots(
    mounts: &BTreeMap<Controller, PathBuf>,
    root_name: &str,
) -> Result<BTreeMap<Controller, PathBuf>, String> {
    let mut roots = BTreeMap::new();
    for (controller, mount) in mounts {
        let root = mount.join(root_name);
        match fs::create_dir(&root) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("creating {}: {e}", root.display())),
        }
        roots.insert(*controller, root);
    }
    Ok(roots)
}

/// One run's cgroups, one per hierarchy, created by its supervisor.
#[derive(Debug)]
pub struct JobCgroups {
    pub dirs: BTreeMap<Controller, PathBuf>,
}

impl JobCgroups {
    /// Create `<root>/<name>` under each root and write the limits and the device fence. On
    /// any failure what was made is removed again.
    pub fn create(
        roots: &BTreeMap<Controller, PathBuf>,
        name: &str,
        limits: &Limits,
        devices: &[DeviceRule],
    ) -> Result<Self, String> {
        let mut made = Self {
            dirs: BTreeMap::new(),
        };
        let result = roots.iter().try_for_each(|(controller, root)| {
            // An empty root may have been removed since the agent made it (a service manager
            // trimming empty cgroups it does not know): make it again.
            match fs::create_dir(root) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                Err(e) => return Err(format!("creating cgroup {}: {e}", root.display())),
            }
            let dir = root.join(name);
            create_run_dir(&dir)?;
            made.dirs.insert(*controller, dir.clone());
            let memsw = dir.join("memory.memsw.limit_in_bytes").exists();
            for (file, value) in writes(*controller, limits, devices, memsw) {
                let target = dir.join(file);
                fs::write(&target, &value)
                    .map_err(|e| format!("writing {value:?} to {}: {e}", target.display()))?;
            }
            Ok(())
        });
        match result {
            Ok(()) => Ok(made),
            Err(e) => {
                for dir in made.dirs.values() {
                    fs::remove_dir(dir).ok();
                }
                Err(e)
            }
        }
    }

    /// The `cgroup.procs` files a process writes `0` to, to enter every cgroup of the run.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.values().map(|d| d.join("cgroup.procs")).collect()
    }

    pub fn has(&self, controller: Controller) -> bool {
        self.dirs.contains_key(&controller)
    }

    /// What the memory cgroup says about the OOM killer; `None` without one.
    pub fn oom_evidence(&self) -> Option<OomEvidence> {
        let dir = self.dirs.get(&Controller::Memory)?;
        let control = fs::read_to_string(dir.join("memory.oom_control")).ok()?;
        let failcnt = fs::read_to_string(dir.join("memory.failcnt")).ok();
        Some(oom_evidence(&control, failcnt.as_deref()))
    }

    /// The processes left in any of the run's cgroups or below them.
    fn pids(&self) -> Vec<i32> {
        let mut files = self.procs_files();
        for dir in self.dirs.values() {
            files.extend(descendants(dir).iter().map(|d| d.join("cgroup.procs")));
        }
        let mut pids: Vec<i32> = files
            .iter()
            .filter_map(|f| fs::read_to_string(f).ok())
            .flat_map(|s| {
                s.lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect::<Vec<i32>>()
            })
            .filter(|pid| *pid > 0)
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Kill whatever the job left behind and remove every cgroup of the run, retrying for a
    /// moment while the kernel still counts exiting processes. `Err` names what stays. (v1 has
    /// no `cgroup.kill`: a process forking right now is caught on the next round.)
    pub async fn remove(&self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            for pid in self.pids() {
                kill(Pid::from_raw(pid), Signal::SIGKILL).ok();
            }
            let mut stays = None;
            for dir in self.dirs.values() {
                for below in descendants(dir) {
                    fs::remove_dir(below).ok();
                }
                match fs::remove_dir(dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(e) => stays = Some(format!("removing cgroup {}: {e}", dir.display())),
                }
            }
            match stays {
                None => return Ok(()),
                Some(e) if Instant::now() >= deadline => return Err(e),
                Some(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use expect_test::expect;

    use super::*;

    /// This project's CI machines: every controller its own hierarchy, plus a systemd name=
    /// hierarchy and an empty cgroup2.
    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn hierarchies_are_found_in_mountinfo() {
        let m = mounts(HYBRID);
        expect![[r#"
            {
                Memory: "/sys/fs/cgroup/memory",
                Cpu: "/sys/fs/cgroup/cpu",
                Pids: "/sys/fs/cgroup/pids",
                Devices: "/sys/fs/cgroup/devices",
            }
        "#]]
        .assert_debug_eq(&m);
        // systemd's v1 layout: cpu and cpuacct in one hierarchy, optional fields before " - ".
        let systemd = "25 24 0:22 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:9 - cgroup cgroup rw,cpu,cpuacct\n\
                       26 24 0:23 / /sys/fs/cgroup/my\\040mem rw shared:10 - cgroup cgroup rw,memory\n";
        let m = mounts(systemd);
        assert_eq!(m[&Controller::Cpu], Path::new("/sys/fs/cgroup/cpu,cpuacct"));
        assert_eq!(m[&Controller::Memory], Path::new("/sys/fs/cgroup/my mem"));
        assert!(!m.contains_key(&Controller::Devices));
        // A pure cgroup v2 host has no v1 hierarchy.
        assert!(
            mounts("30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n").is_empty()
        );
        assert!(mounts("garbage\n\n").is_empty());
    }

    #[test]
    fn limits_become_v1_values() {
        assert_eq!(cfs_quota_us(1500), 150_000);
        assert_eq!(cfs_quota_us(250), 25_000);
        assert_eq!(cfs_quota_us(1), 1_000, "raised to the kernel's minimum");
        assert_eq!(limit_in_bytes(256), "268435456");
        assert_eq!(limit_in_bytes(u64::MAX), "-1");
        assert_eq!(limit_in_bytes(1 << 43), "-1", "past i64");
    }

    #[test]
    fn each_controller_gets_its_files_in_order() {
        let limits = Limits {
            cpu_millis: Some(500),
            memory_mib: Some(64),
            tasks_max: Some(100),
        };
        let devices: Vec<DeviceRule> = ["c 1:3 rwm", "c 195:320 rwm"]
            .iter()
            .map(|r| r.parse().expect("rule"))
            .collect();
        let all: Vec<String> = Controller::ALL
            .iter()
            .flat_map(|c| writes(*c, &limits, &devices, true))
            .map(|(f, v)| format!("{f} = {v}"))
            .collect();
        expect![[r#"
            memory.limit_in_bytes = 67108864
            memory.memsw.limit_in_bytes = 67108864
            cpu.cfs_period_us = 100000
            cpu.cfs_quota_us = 50000
            pids.max = 100
            devices.deny = a
            devices.allow = c 1:3 rwm
            devices.allow = c 195:320 rwm"#]]
        .assert_eq(&all.join("\n"));
        let none = Limits::default();
        assert!(writes(Controller::Memory, &none, &devices, true).is_empty());
        assert!(writes(Controller::Cpu, &none, &devices, true).is_empty());
        assert!(writes(Controller::Pids, &none, &devices, true).is_empty());
        assert_eq!(
            writes(Controller::Memory, &limits, &[], false).len(),
            1,
            "no memsw without swap accounting"
        );
        assert_eq!(
            writes(Controller::Devices, &none, &[], false),
            [("devices.deny", "a".to_owned())],
            "no rule: nothing is allowed"
        );
    }

    #[test]
    fn the_oom_killer_is_read_from_the_memory_files() {
        let modern = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(oom_evidence(modern, Some("0\n")), OomEvidence::Kills(2));
        assert_eq!(
            oom_evidence("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n", Some("7")),
            OomEvidence::Kills(0)
        );
        let old = "oom_kill_disable 0\nunder_oom 0\n";
        assert_eq!(oom_evidence(old, Some("7\n")), OomEvidence::LimitHits(7));
        assert_eq!(oom_evidence(old, None), OomEvidence::LimitHits(0));
        assert_eq!(oom_evidence("", Some("x")), OomEvidence::LimitHits(0));
    }

    #[test]
    fn controllers_by_name() {
        for c in Controller::ALL {
            assert_eq!(Controller::from_name(c.name()), Some(c));
        }
        assert_eq!(Controller::from_name("cpuacct"), None);
        assert_eq!(Controller::Pids.to_string(), "pids");
    }
}
