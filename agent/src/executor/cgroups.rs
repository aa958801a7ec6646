//! Job cgroups on whichever hierarchy this host has: cgroup v2 with `cpu` and `memory`
//! delegated (`isolation`), else the cgroup v1 controllers (`cgroup_v1`), else none (limits and
//! the device fence are then reported as not enforced). The executor detects the layout once
//! at start; each run's supervisor creates the run's cgroups, the job enters them before it
//! execs (`pre_exec`), and the supervisor removes them when the job has ended.
//!
//! A run's cgroup is named `job-<id>-g<generation>-s<supervisor pid>` (`run_cgroup_name`):
//! the supervisor's pid keeps the runs of several agents on one host apart while it lives. A
//! supervisor killed outright leaves its cgroup behind; a later supervisor given the same pid
//! takes it over if it is empty (`cgroup_tree::create_run_dir`), and the agent sweeps the
//! empty ones whose pid no process has when it starts (`sweep_leftovers`).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::cgroup_tree;
use super::cgroup_v1::{self, Controller, JobCgroups};
use super::device_fence::DeviceRule;
use super::isolation::{self, JobCgroup};
use super::limits::{Enforced, Limits, OomEvidence};

/// Where cgroup v2 is mounted on the hosts gpumesh supports.
const V2_MOUNT: &str = "/sys/fs/cgroup";

/// Where this host's job cgroups go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CgroupLayout {
    /// cgroup v2: under `root`, with `cpu` and `memory` (and `pids` where available) delegated.
    V2 { root: PathBuf },
    /// cgroup v1: under `<mount>/<name of jobs.cgroup_root>` in each controller's hierarchy.
    V1 {
        roots: BTreeMap<Controller, PathBuf>,
    },
    /// No usable hierarchy, and why.
    None { reason: String },
}

impl CgroupLayout {
    /// Find and prepare this host's layout (see the module comment): v2 at `cgroup_root` when it
    /// can delegate, else v1 beside it, else none.
    pub fn detect(cgroup_root: &Path) -> Self {
        let v2 = match isolation::prepare_root(cgroup_root) {
            Ok(()) => {
                return Self::V2 {
                    root: cgroup_root.to_owned(),
                };
            }
            Err(e) => e,
        };
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mounts = cgroup_v1::mounts(&mountinfo);
        let none = |why: String| Self::None {
            reason: format!("no cgroup v2 with cpu/memory delegation ({v2}) and {why}"),
        };
        if mounts.is_empty() {
            return none("no cgroup v1 hierarchy".into());
        }
        let Some(name) = cgroup_root.file_name().and_then(|n| n.to_str()) else {
            return none(format!("{} names no cgroup", cgroup_root.display()));
        };
        match cgroup_v1::prepare_roots(&mounts, name) {
            Ok(roots) => Self::V1 { roots },
            Err(e) => none(format!("the cgroup v1 hierarchies cannot be used: {e}")),
        }
    }

    /// This layout without a device fence (v1: no devices hierarchy), for a run whose
    /// container runtime fences the devices itself.
    pub fn without_device_fence(self) -> Self {
        match self {
            Self::V1 { mut roots } => {
                roots.remove(&Controller::Devices);
                Self::V1 { roots }
            }
            other => other,
        }
    }

    /// Remove the empty run cgroups that supervisors killed outright left in every job root
    /// (`cgroup_tree::sweep_leftovers`); how many went.
    pub fn sweep_leftovers(&self) -> usize {
        match self {
            Self::V2 { root } => cgroup_tree::sweep_leftovers(root),
            Self::V1 { roots } => roots
                .values()
                .map(|r| cgroup_tree::sweep_leftovers(r))
                .sum(),
            Self::None { .. } => 0,
        }
    }

    /// Whether runs get cgroups of their own (so a process's cgroup says which job it is).
    pub fn has_job_cgroups(&self) -> bool {
        !matches!(self, Self::None { .. })
    }

    /// Why jobs' devices cannot be fenced here, if they cannot.
    pub fn unfenced_reason(&self) -> Option<String> {
        match self {
            Self::V1 { roots } if roots.contains_key(&Controller::Devices) => None,
            Self::V1 { .. } => Some("this node mounts no cgroup v1 devices hierarchy".into()),
            Self::V2 { .. } => Some("this node has cgroup v2 without a BPF device program".into()),
            Self::None { .. } => Some("this node has no job cgroups".into()),
        }
    }

    /// One line for the log: what job cgroups this host gives.
    pub fn describe(&self) -> String {
        match self {
            Self::V2 { root } => format!("cgroup v2 under {}", root.display()),
            Self::V1 { roots } => {
                let each: Vec<String> = roots
                    .iter()
                    .map(|(c, r)| format!("{c} {}", r.display()))
                    .collect();
                format!("cgroup v1 ({})", each.join(", "))
            }
            Self::None { reason } => format!("none: {reason}"),
        }
    }

    /// The supervisor's flags for this layout.
    pub fn flags(&self) -> Vec<OsString> {
        match self {
            Self::V2 { root } => vec!["--cgroup-v2".into(), root.into()],
            Self::V1 { roots } => roots
                .iter()
                .flat_map(|(c, root)| {
                    let mut value = OsString::from(format!("{c}="));
                    value.push(root);
                    ["--cgroup-v1".into(), value]
                })
                .collect(),
            Self::None { .. } => Vec::new(),
        }
    }

    /// The layout the supervisor's flags give.
    pub fn from_flags(v2: Option<&Path>, v1: &[V1Root]) -> Self {
        match v2 {
            Some(root) => Self::V2 {
                root: root.to_owned(),
            },
            None if !v1.is_empty() => Self::V1 {
                roots: v1.iter().map(|r| (r.controller, r.root.clone())).collect(),
            },
            None => Self::None {
                reason: "this node has no job cgroups".into(),
            },
        }
    }
}

/// `--cgroup-v1 memory=/sys/fs/cgroup/memory/gpumesh`: a controller and the parent of its job
/// cgroups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct V1Root {
    pub controller: Controller,
    pub root: PathBuf,
}

impl std::str::FromStr for V1Root {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (name, root) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?} is not CONTROLLER=PATH"))?;
        let controller = Controller::from_name(name).ok_or_else(|| {
            format!("unknown cgroup v1 controller {name:?} (memory, cpu, pids or devices)")
        })?;
        let root = PathBuf::from(root);
        if !root.is_absolute() {
            return Err(format!("{} is not an absolute path", root.display()));
        }
        Ok(Self { controller, root })
    }
}

/// One run's cgroups.
#[derive(Debug)]
pub enum RunCgroups {
    V2(JobCgroup),
    V1(JobCgroups),
}

impl RunCgroups {
    /// Create the run's cgroups `name` with its limits and (v1) device fence; `None` where the
    /// host has none.
    pub fn create(
        layout: &CgroupLayout,
        name: &str,
        limits: &Limits,
        devices: &[DeviceRule],
    ) -> Result<Option<Self>, String> {
        Ok(match layout {
            CgroupLayout::V2 { root } => {
                Some(Self::V2(JobCgroup::create(&root.join(name), limits)?))
            }
            CgroupLayout::V1 { roots } => {
                Some(Self::V1(JobCgroups::create(roots, name, limits, devices)?))
            }
            CgroupLayout::None { .. } => None,
        })
    }

    /// The `cgroup.procs` files the job writes `0` to before it execs.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        match self {
            Self::V2(cg) => vec![cg.path.join("cgroup.procs")],
            Self::V1(cgs) => cgs.procs_files(),
        }
    }

    /// The run's cgroup as a path from its hierarchy's root (`/gpumesh/job-7-g1-s42`), the
    /// same in every v1 hierarchy (each job root sits at the top of its hierarchy): what a
    /// container runtime takes as the parent of the container's cgroup.
    pub fn hierarchy_path(&self) -> Option<String> {
        match self {
            Self::V2(cg) => cg
                .path
                .strip_prefix(V2_MOUNT)
                .ok()
                .map(|p| format!("/{}", p.display())),
            Self::V1(cgs) => {
                let dir = cgs.dirs.values().next()?;
                let name = dir.file_name()?.to_str()?;
                let root = dir.parent()?.file_name()?.to_str()?;
                Some(format!("/{root}/{name}"))
            }
        }
    }

    pub fn enforced(&self) -> Enforced {
        match self {
            Self::V2(cg) => Enforced {
                cpu: true,
                memory: true,
                tasks: cg.pids,
            },
            Self::V1(cgs) => Enforced {
                cpu: cgs.has(Controller::Cpu),
                memory: cgs.has(Controller::Memory),
                tasks: cgs.has(Controller::Pids),
            },
        }
    }

    pub fn oom_evidence(&self) -> Option<OomEvidence> {
        match self {
            Self::V2(cg) => cg.oom_evidence(),
            Self::V1(cgs) => cgs.oom_evidence(),
        }
    }

    /// Kill what the job left behind and remove the cgroups.
    pub async fn remove(&self) -> Result<(), String> {
        match self {
            Self::V2(cg) => cg.remove().await,
            Self::V1(cgs) => cgs.remove().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_travels_through_the_supervisor_flags() {
        let v1 = CgroupLayout::V1 {
            roots: BTreeMap::from([
                (
                    Controller::Memory,
                    PathBuf::from("/sys/fs/cgroup/memory/gpumesh"),
                ),
                (
                    Controller::Devices,
                    PathBuf::from("/sys/fs/cgroup/devices/gpumesh"),
                ),
            ]),
        };
        let flags: Vec<String> = v1
            .flags()
            .iter()
            .map(|f| f.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            flags.join(" "),
            "--cgroup-v1 memory=/sys/fs/cgroup/memory/gpumesh --cgroup-v1 devices=/sys/fs/cgroup/devices/gpumesh"
        );
        let parsed: Vec<V1Root> = flags
            .iter()
            .skip(1)
            .step_by(2)
            .map(|f| f.parse().expect("flag"))
            .collect();
        assert_eq!(CgroupLayout::from_flags(None, &parsed), v1);
        let v2 = CgroupLayout::V2 {
            root: "/sys/fs/cgroup/gpumesh".into(),
        };
        assert_eq!(v2.flags(), ["--cgroup-v2", "/sys/fs/cgroup/gpumesh"]);
        assert_eq!(
            CgroupLayout::from_flags(Some(Path::new("/sys/fs/cgroup/gpumesh")), &[]),
            v2
        );
        assert!(!CgroupLayout::from_flags(None, &[]).has_job_cgroups());
        assert!(CgroupLayout::None { reason: "x".into() }.flags().is_empty());
    }

    #[test]
    fn bad_v1_flags_are_refused() {
        for (bad, said) in [
            ("memory", "is not CONTROLLER=PATH"),
            ("cpuacct=/x", "unknown cgroup v1 controller \"cpuacct\""),
            ("pids=relative", "not an absolute path"),
        ] {
            let err = bad.parse::<V1Root>().expect_err(bad);
            assert!(err.contains(said), "{err}");
        }
    }

    #[test]
    fn only_v1_with_a_devices_hierarchy_fences() {
        let v1 = |c: &[Controller]| CgroupLayout::V1 {
            roots: c.iter().map(|c| (*c, PathBuf::from("/x"))).collect(),
        };
        assert_eq!(v1(&[Controller::Devices]).unfenced_reason(), None);
        assert!(
            v1(&[Controller::Memory])
                .unfenced_reason()
                .is_some_and(|r| r.contains("no cgroup v1 devices hierarchy"))
        );
        assert!(
            CgroupLayout::V2 { root: "/x".into() }
                .unfenced_reason()
                .is_some_and(|r| r.contains("BPF device program"))
        );
    }
}
