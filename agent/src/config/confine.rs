//! What fences a job on this node besides its own request (`[jobs]`): the limits a job gets
//! when it asks for none, the devices every job may open beyond its GPUs, and what to do with a
//! foreign process on a job's GPU.

use std::path::{Component, Path, PathBuf};

use anyhow::{bail, ensure};

use super::file::JobsSection;

/// `[jobs]`'s limit and fence keys, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Confine {
    /// CPU limit of a CPU-only job (`gpus = 0`) that asked for none, thousandths of a core.
    pub default_cpu_millis: u32,
    /// Memory limit of a CPU-only job that asked for none, MiB.
    pub default_memory_mib: u64,
    /// Most tasks (processes and threads) of every job: a fork bomb stops there.
    pub default_tasks_max: u64,
    /// Device nodes every job may open besides the usual ones and its GPUs' (e.g.
    /// `/dev/infiniband/*` for RDMA), resolved when each run starts.
    pub extra_devices: Vec<DevicePattern>,
    pub foreign_processes: ForeignPolicy,
}

impl Default for Confine {
    fn default() -> Self {
        Self {
            default_cpu_millis: DEFAULT_CPU_MILLIS,
            default_memory_mib: DEFAULT_MEMORY_MIB,
            default_tasks_max: DEFAULT_TASKS_MAX,
            extra_devices: Vec::new(),
            foreign_processes: ForeignPolicy::default(),
        }
    }
}

const DEFAULT_CPU_MILLIS: u32 = 1_000;
const DEFAULT_MEMORY_MIB: u64 = 4_096;
const DEFAULT_TASKS_MAX: u64 = 4_096;
/// Below this a job's shell alone may not start.
const MIN_MEMORY_MIB: u64 = 16;
/// The kernel's smallest CFS quota is 1 ms per 100 ms period.
const MIN_CPU_MILLIS: u32 = 10;
/// A shell and a pipeline.
const MIN_TASKS: u64 = 16;

/// A process on a job's GPU that is not the job's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ForeignPolicy {
    /// Raise the `foreign-process` alert on the GPU.
    #[default]
    Report,
    /// Raise the alert and kill the process (SIGKILL).
    Kill,
}

/// A device path or a pattern with `*` in its last component (`/dev/infiniband/*`,
/// `/dev/infiniband/uverbs*`), under `/dev`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevicePattern {
    /// The directory, literal.
    pub dir: PathBuf,
    /// The last component; `*` matches any run of characters.
    pub name: String,
}

impl DevicePattern {
    pub fn parse(text: &str) -> Result<Self, String> {
        let path = Path::new(text);
        if !path.starts_with("/dev/") {
            return Err(format!("{text:?} is not a path under /dev/"));
        }
        if path
            .components()
            .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
        {
            return Err(format!("{text:?} has a . or .. component"));
        }
        let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str()))
        else {
            return Err(format!("{text:?} names no device"));
        };
        if !dir.starts_with("/dev") {
            return Err(format!("{text:?} names no device"));
        }
        if dir.to_string_lossy().contains('*') {
            return Err(format!(
                "{text:?}: a wildcard may stand only in the last component"
            ));
        }
        Ok(Self {
            dir: dir.to_owned(),
            name: name.to_owned(),
        })
    }

    /// Whether a directory entry's name matches the pattern's last component.
    pub fn matches(&self, name: &str) -> bool {
        wildcard_match(&self.name, name)
    }
}

/// `*` matches any run of characters (none included); everything else itself.
fn wildcard_match(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// `[jobs]`'s limit and fence keys with their defaults, each checked.
pub(super) fn confine(j: &JobsSection) -> anyhow::Result<Confine> {
    let c = Confine {
        default_cpu_millis: j.default_cpu_millis.unwrap_or(DEFAULT_CPU_MILLIS),
        default_memory_mib: j.default_memory_mib.unwrap_or(DEFAULT_MEMORY_MIB),
        default_tasks_max: j.default_tasks_max.unwrap_or(DEFAULT_TASKS_MAX),
        extra_devices: match &j.extra_devices {
            None => Vec::new(),
            Some(list) => list
                .iter()
                .map(|d| DevicePattern::parse(d).map_err(anyhow::Error::msg))
                .collect::<anyhow::Result<_>>()
                .map_err(|e| e.context("jobs.extra_devices"))?,
        },
        foreign_processes: match j.foreign_processes.as_deref() {
            None | Some("report") => ForeignPolicy::Report,
            Some("kill") => ForeignPolicy::Kill,
            Some(other) => {
                bail!("jobs.foreign_processes must be \"report\" or \"kill\", got {other:?}")
            }
        },
    };
    let cpu = gpu_raft_store::validate::limits::CPU_MILLIS;
    ensure!(
        (MIN_CPU_MILLIS..=cpu).contains(&c.default_cpu_millis),
        "jobs.default_cpu_millis must be {MIN_CPU_MILLIS}..={cpu}, got {}",
        c.default_cpu_millis
    );
    let memory = gpu_raft_store::validate::limits::MEMORY_MIB;
    ensure!(
        (MIN_MEMORY_MIB..=memory).contains(&c.default_memory_mib),
        "jobs.default_memory_mib must be {MIN_MEMORY_MIB}..={memory}, got {}",
        c.default_memory_mib
    );
    if c.default_tasks_max < MIN_TASKS {
        bail!(
            "jobs.default_tasks_max must be at least {MIN_TASKS} (a shell and a pipeline), got {}",
            c.default_tasks_max
        );
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FileConfig;

    fn parse(jobs: &str) -> anyhow::Result<Confine> {
        let file = FileConfig::parse(&format!("[jobs]\n{jobs}"))?;
        confine(&file.jobs)
    }

    #[test]
    fn defaults_and_keys() {
        assert_eq!(parse("").expect("defaults"), Confine::default());
        let c = parse(
            "default_cpu_millis = 2500\ndefault_memory_mib = 512\ndefault_tasks_max = 100\n\
             extra_devices = [\"/dev/infiniband/*\", \"/dev/fuse\"]\nforeign_processes = \"kill\"\n",
        )
        .expect("valid");
        assert_eq!(
            (
                c.default_cpu_millis,
                c.default_memory_mib,
                c.default_tasks_max
            ),
            (2500, 512, 100)
        );
        assert_eq!(c.foreign_processes, ForeignPolicy::Kill);
        assert_eq!(
            c.extra_devices[0],
            DevicePattern {
                dir: "/dev/infiniband".into(),
                name: "*".into()
            }
        );
        assert_eq!(c.extra_devices[1].name, "fuse");
    }

    #[test]
    fn bad_values_are_named() {
        for (toml, said) in [
            (
                "default_cpu_millis = 5",
                "jobs.default_cpu_millis must be 10..=",
            ),
            (
                "default_memory_mib = 0",
                "jobs.default_memory_mib must be 16..=",
            ),
            (
                "default_memory_mib = 999999999999",
                "jobs.default_memory_mib",
            ),
            (
                "default_tasks_max = 3",
                "jobs.default_tasks_max must be at least 16",
            ),
            (
                "extra_devices = [\"infiniband/*\"]",
                "not a path under /dev/",
            ),
            (
                "extra_devices = [\"/etc/passwd\"]",
                "not a path under /dev/",
            ),
            (
                "extra_devices = [\"/dev/../etc/x\"]",
                "has a . or .. component",
            ),
            (
                "extra_devices = [\"/dev/*/uverbs0\"]",
                "only in the last component",
            ),
            ("extra_devices = [\"/dev/\"]", "names no device"),
        ] {
            let err = format!("{:#}", parse(toml).expect_err(toml));
            assert!(err.contains(said), "{toml}: {err}");
        }
        let err = format!(
            "{:#}",
            parse("foreign_processes = \"kil\"").expect_err("typo")
        );
        assert!(err.contains("kil"), "{err}");
    }

    #[test]
    fn wildcards_match_runs_of_characters() {
        let m = |p: &str, n: &str| DevicePattern::parse(p).expect(p).matches(n);
        assert!(m("/dev/infiniband/*", "uverbs0"));
        assert!(m("/dev/infiniband/*", "rdma_cm"));
        assert!(m("/dev/infiniband/uverbs*", "uverbs12"));
        assert!(!m("/dev/infiniband/uverbs*", "umad0"));
        assert!(m("/dev/fuse", "fuse"));
        assert!(!m("/dev/fuse", "fuse2"));
        assert!(m("/dev/a*b*c", "abc"));
        assert!(m("/dev/a*b*c", "aXXbYYc"));
        assert!(!m("/dev/a*b*c", "aXXcYYb"));
        assert!(!m("/dev/ab*ba", "aba"), "the two ends may not overlap");
    }
}
