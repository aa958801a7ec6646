//! The device fence: the device nodes a job may open, as the devices cgroup's rules. Everything
//! else is denied by the kernel (EPERM), whatever the node's mode says, so a job can use only
//! its own GPUs, whatever `CUDA_VISIBLE_DEVICES` it sets.
//!
//! Allowed: the character devices every program expects (`null`, `zero`, `full`, `random`,
//! `urandom`, `tty`, `ptmx`, the pseudo-terminals), the job's GPUs' nodes, `nvidiactl`, the
//! `nvidia-uvm` and `nvidia-caps` devices (their majors are dynamic: read from `/proc/devices`
//! at each start, since the uvm module is often loaded by the first CUDA program), and the
//! configured `jobs.extra_devices` (RDMA), each resolved to its device number when the run
//! starts.

use std::collections::BTreeMap;
use std::fmt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::str::FromStr;

use crate::config::DevicePattern;
use crate::gpu::{DeviceNode, NVIDIA_MAJOR, NVIDIACTL_MINOR, dev_number};

/// One devices-cgroup rule, `c 195:0 rwm`: a kind, a major and a minor (`None`: any).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DeviceRule {
    pub kind: DeviceKind,
    pub major: Option<u32>,
    pub minor: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum DeviceKind {
    Char,
    Block,
}

impl DeviceRule {
    pub const fn char(major: u32, minor: u32) -> Self {
        Self {
            kind: DeviceKind::Char,
            major: Some(major),
            minor: Some(minor),
        }
    }

    /// Every minor of a character major.
    pub const fn char_major(major: u32) -> Self {
        Self {
            kind: DeviceKind::Char,
            major: Some(major),
            minor: None,
        }
    }

    /// The name systemd's `DeviceAllow=` reads the device numbers from (`/dev/char/M:N`,
    /// `/dev/block/M:N`); none for a rule over every minor.
    pub fn unit_path(&self) -> Option<std::path::PathBuf> {
        let kind = match self.kind {
            DeviceKind::Char => "char",
            DeviceKind::Block => "block",
        };
        Some(format!("/dev/{kind}/{}:{}", self.major?, self.minor?).into())
    }
}

impl fmt::Display for DeviceRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            DeviceKind::Char => 'c',
            DeviceKind::Block => 'b',
        };
        let number = |n: Option<u32>| n.map_or_else(|| "*".to_owned(), |n| n.to_string());
        write!(
            f,
            "{kind} {}:{} rwm",
            number(self.major),
            number(self.minor)
        )
    }
}

impl FromStr for DeviceRule {
    type Err = String;

    /// `c 195:0 rwm` (the access part must be `rwm`: the fence grants whole devices).
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("bad device rule {s:?} (expected e.g. \"c 195:0 rwm\")");
        let mut parts = s.split_whitespace();
        let (Some(kind), Some(numbers), Some("rwm"), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let kind = match kind {
            "c" => DeviceKind::Char,
            "b" => DeviceKind::Block,
            _ => return Err(bad()),
        };
        let (major, minor) = numbers.split_once(':').ok_or_else(bad)?;
        let number = |n: &str| match n {
            "*" => Ok(None),
            n => n.parse().map(Some).map_err(|_| bad()),
        };
        Ok(Self {
            kind,
            major: number(major)?,
            minor: number(minor)?,
        })
    }
}

/// What every process expects to open: null, zero, full, random, urandom, tty, ptmx and the
/// pseudo-terminals (136:*).
pub const BASE: [DeviceRule; 8] = [
    DeviceRule::char(1, 3),
    DeviceRule::char(1, 5),
    DeviceRule::char(1, 7),
    DeviceRule::char(1, 8),
    DeviceRule::char(1, 9),
    DeviceRule::char(5, 0),
    DeviceRule::char(5, 2),
    DeviceRule::char_major(136),
];

/// NVIDIA's dynamic-major character devices a CUDA job needs, by their `/proc/devices` names
/// (`nvidia-uvm-tools` shares `nvidia-uvm`'s major on current drivers).
const NVIDIA_DYNAMIC: [&str; 3] = ["nvidia-uvm", "nvidia-uvm-tools", "nvidia-caps"];

/// The character devices' majors by name, from `/proc/devices`.
pub fn char_majors(proc_devices: &str) -> BTreeMap<String, u32> {
    proc_devices
        .lines()
        .skip_while(|l| l.trim() != "Character devices:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty() && !l.trim_end().ends_with(':'))
        .filter_map(|l| {
            let (major, name) = l.trim().split_once(char::is_whitespace)?;
            Some((name.trim().to_owned(), major.parse().ok()?))
        })
        .collect()
}

/// The fence of a run: the base devices, the run's GPUs' nodes, `nvidiactl`, NVIDIA's dynamic
/// devices present on the host, and the extra rules; each once, in a stable order. A bound GPU
/// whose node is unknown (`None`) opens every NVIDIA GPU node instead: a weaker fence, but the
/// job can use the GPU it was given.
pub fn allow_list(
    gpus: &[Option<DeviceNode>],
    majors: &BTreeMap<String, u32>,
    extra: &[DeviceRule],
) -> Vec<DeviceRule> {
    let mut rules: Vec<DeviceRule> = BASE.to_vec();
    if gpus.iter().any(Option::is_none) {
        rules.push(DeviceRule::char_major(NVIDIA_MAJOR));
    }
    rules.extend(
        gpus.iter()
            .flatten()
            .map(|n| DeviceRule::char(n.major, n.minor)),
    );
    rules.push(DeviceRule::char(NVIDIA_MAJOR, NVIDIACTL_MINOR));
    rules.extend(
        NVIDIA_DYNAMIC
            .iter()
            .filter_map(|name| majors.get(*name))
            .map(|major| DeviceRule::char_major(*major)),
    );
    rules.extend_from_slice(extra);
    let mut seen = Vec::with_capacity(rules.len());
    rules.retain(|r| {
        let new = !seen.contains(r);
        seen.push(*r);
        new
    });
    rules
}

/// The extra devices' rules: each pattern's matching device nodes, resolved by `stat` now (a
/// node may come and go with its driver). A pattern matching nothing gives nothing; problems
/// come back as messages, for the log.
pub fn resolve_extra(patterns: &[DevicePattern]) -> (Vec<DeviceRule>, Vec<String>) {
    let mut rules = Vec::new();
    let mut problems = Vec::new();
    for pattern in patterns {
        match matching_devices(pattern) {
            Ok(found) => rules.extend(found.into_iter().map(|(_, rule)| rule)),
            Err(e) => problems.push(format!("{}: {e}", pattern.dir.display())),
        }
    }
    (rules, problems)
}

/// The device nodes `jobs.extra_devices` names on this host now, by path (what a container is
/// given); unreadable directories are `resolve_extra`'s to report.
pub fn extra_paths(patterns: &[DevicePattern]) -> Vec<std::path::PathBuf> {
    patterns
        .iter()
        .filter_map(|p| matching_devices(p).ok())
        .flatten()
        .map(|(path, _)| path)
        .collect()
}

/// The character and block devices in `pattern`'s directory whose names match it, each with
/// its rule, in rule order; a missing directory has none.
fn matching_devices(
    pattern: &DevicePattern,
) -> std::io::Result<Vec<(std::path::PathBuf, DeviceRule)>> {
    let entries = match std::fs::read_dir(&pattern.dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut found: Vec<(std::path::PathBuf, DeviceRule)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_str().is_some_and(|n| pattern.matches(n)))
        // Follows links: /dev/infiniband may hold links to the nodes.
        .filter_map(|e| Some((e.path(), std::fs::metadata(e.path()).ok()?)))
        .filter_map(|(path, m)| {
            let kind = if m.file_type().is_char_device() {
                DeviceKind::Char
            } else if m.file_type().is_block_device() {
                DeviceKind::Block
            } else {
                return None;
            };
            let rule = DeviceRule {
                kind,
                major: Some(dev_number::major(m.rdev())),
                minor: Some(dev_number::minor(m.rdev())),
            };
            Some((path, rule))
        })
        .collect();
    found.sort_unstable_by_key(|(_, rule)| *rule);
    Ok(found)
}

/// NVIDIA's dynamic majors on this host now (none without the driver).
pub fn host_majors() -> BTreeMap<String, u32> {
    std::fs::read_to_string("/proc/devices")
        .map(|s| char_majors(&s))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    /// A GPU host's `/proc/devices`, abridged.
    const PROC_DEVICES: &str = "Character devices:
  1 mem
  5 /dev/tty
136 pts
195 nvidia-frontend
235 nvidia-caps
236 nvidia-nvswitch
510 nvidia-uvm

Block devices:
  7 loop
259 blkext
";

    #[test]
    fn majors_come_from_the_character_section() {
        let m = char_majors(PROC_DEVICES);
        assert_eq!(m.get("nvidia-uvm"), Some(&510));
        assert_eq!(m.get("nvidia-caps"), Some(&235));
        assert_eq!(m.get("pts"), Some(&136));
        assert_eq!(m.get("loop"), None, "a block device");
        assert!(char_majors("").is_empty());
    }

    #[test]
    fn the_fence_allows_the_base_the_gpus_and_the_driver() {
        let gpus = [Some(DeviceNode::nvidia(2)), Some(DeviceNode::nvidia(2))];
        let extra: Vec<DeviceRule> = vec!["c 231:192 rwm".parse().expect("rule")];
        let rules = allow_list(&gpus, &char_majors(PROC_DEVICES), &extra);
        let shown: Vec<String> = rules.iter().map(ToString::to_string).collect();
        expect![[r#"
            c 1:3 rwm
            c 1:5 rwm
            c 1:7 rwm
            c 1:8 rwm
            c 1:9 rwm
            c 5:0 rwm
            c 5:2 rwm
            c 136:* rwm
            c 195:2 rwm
            c 195:255 rwm
            c 510:* rwm
            c 235:* rwm
            c 231:192 rwm"#]]
        .assert_eq(&shown.join("\n"));
        // No driver, no GPU: the base and nvidiactl only (a CPU-only job).
        let bare = allow_list(&[], &BTreeMap::new(), &[]);
        assert_eq!(bare.len(), BASE.len() + 1);
        assert!(
            !bare
                .iter()
                .any(|r| r.major == Some(195) && r.minor != Some(255))
        );
        // A GPU of unknown node: every NVIDIA node, rather than a job that cannot use its GPU.
        let unknown = allow_list(&[None, Some(DeviceNode::nvidia(1))], &BTreeMap::new(), &[]);
        assert!(
            unknown.contains(&DeviceRule::char_major(195)),
            "{unknown:?}"
        );
    }

    #[test]
    fn rules_print_and_parse() {
        for text in ["c 195:0 rwm", "c 136:* rwm", "b 8:0 rwm", "c *:* rwm"] {
            let rule: DeviceRule = text.parse().expect(text);
            assert_eq!(rule.to_string(), text);
        }
        for bad in [
            "",
            "a",
            "c 195:0",
            "c 195:0 rw",
            "x 1:3 rwm",
            "c 1-3 rwm",
            "c 1:3 rwm x",
            "c -1:3 rwm",
        ] {
            let err = bad.parse::<DeviceRule>().expect_err(bad);
            assert!(err.contains("bad device rule"), "{err}");
        }
    }

    #[test]
    fn extra_devices_resolve_to_their_numbers() {
        let pattern = |p: &str| DevicePattern::parse(p).expect(p);
        let (rules, problems) = resolve_extra(&[
            pattern("/dev/null"),
            pattern("/dev/zer*"),
            pattern("/dev/no-such-dir/*"),
        ]);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(rules, [DeviceRule::char(1, 3), DeviceRule::char(1, 5)]);
    }
}
