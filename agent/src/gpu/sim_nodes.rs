//! Real device nodes for simulated GPUs, so the kernel's device fence and foreign-process
//! detection work on hosts without GPUs: each simulated GPU gets a character device
//! `<dir>/nvidia<index>` with NVIDIA's major (195), mode 0666 like the driver's. No driver
//! stands behind them: opening one the fence allows fails with ENXIO ("No such device or
//! address"), one the fence denies with EPERM. A process "holds" a simulated GPU while it has
//! a descriptor on its node: with no driver, only an `O_PATH` one can exist.
//!
//! Minors never collide between the simulated agents of one host (`gpu-agent dev` runs
//! several) as long as their node ids differ, and never with a real driver's (0..=255: GPUs,
//! `nvidia-modeset` 254, `nvidiactl` 255): see `sim_minor`.

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::sys::stat::{Mode, SFlag, mknod};

use super::{DeviceNode, NVIDIA_MAJOR, dev_number};

/// The first minor simulated GPUs use, above every real driver's.
const FIRST_MINOR: u32 = 256;
/// The largest minor Linux has (20 bits).
const MAX_MINOR: u32 = (1 << 20) - 1;
/// Minors per simulated node: as many as it may have GPUs (the simulator checks).
pub(crate) const MINORS_PER_NODE: u32 = 64;
/// How many nodes' GPUs fit between `FIRST_MINOR` and `MAX_MINOR`.
const NODE_SLOTS: u64 = ((MAX_MINOR - FIRST_MINOR + 1) / MINORS_PER_NODE) as u64;

/// The minor of simulated GPU `index` of node `node_id`: a block of `MINORS_PER_NODE` minors
/// per node id (node ids 16,380 apart share a block).
pub(crate) fn sim_minor(node_id: u64, index: u32) -> u32 {
    FIRST_MINOR + (node_id % NODE_SLOTS) as u32 * MINORS_PER_NODE + index.min(MINORS_PER_NODE - 1)
}

/// The node path of simulated GPU `index` in `dir`.
pub(crate) fn node_path(dir: &Path, index: u32) -> PathBuf {
    dir.join(format!("nvidia{index}"))
}

/// Create (or keep, when already right) the nodes of `count` GPUs of node `node_id` in `dir`.
/// Needs root (`CAP_MKNOD`). `Err` says why there are none; nothing half-made is left behind
/// for a GPU whose node failed.
pub(crate) fn create(dir: &Path, node_id: u64, count: u32) -> Result<Vec<DeviceNode>, String> {
    fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    // Jobs run as other users: they must reach the nodes (the fence, not the mode, decides).
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("chmod {}: {e}", dir.display()))?;
    (0..count)
        .map(|index| {
            let node = DeviceNode {
                path: node_path(dir, index),
                major: NVIDIA_MAJOR,
                minor: sim_minor(node_id, index),
            };
            make_node(&node).map(|()| node)
        })
        .collect()
}

fn make_node(node: &DeviceNode) -> Result<(), String> {
    let path = &node.path;
    let rdev = dev_number::makedev(node.major, node.minor);
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_char_device() && m.rdev() == rdev => {}
        Ok(_) => {
            fs::remove_file(path).map_err(|e| format!("replacing {}: {e}", path.display()))?;
            mknod_char(path, rdev)?;
        }
        Err(e) if e.kind() == ErrorKind::NotFound => mknod_char(path, rdev)?,
        Err(e) => return Err(format!("{}: {e}", path.display())),
    }
    // mknod's mode passes through the umask; the driver's nodes are 0666.
    fs::set_permissions(path, fs::Permissions::from_mode(0o666))
        .map_err(|e| format!("chmod {}: {e}", path.display()))
}

fn mknod_char(path: &Path, rdev: u64) -> Result<(), String> {
    mknod(path, SFlag::S_IFCHR, Mode::from_bits_truncate(0o666), rdev)
        .map_err(|e| format!("mknod {}: {e}", path.display()))
}

/// Whether the filesystem holding `dir` ignores device nodes (mounted `nodev`): opening one
/// there fails with EACCES whatever the fence says.
pub(crate) fn on_nodev_mount(dir: &Path) -> bool {
    nix::sys::statvfs::statvfs(dir)
        .is_ok_and(|s| s.flags().contains(nix::sys::statvfs::FsFlags::ST_NODEV))
}

/// For each node, the processes with a descriptor on it, ascending: from every
/// `/proc/<pid>/fd/<n>` link this agent can read (as root: all of them).
pub(crate) fn holders(nodes: &[Option<DeviceNode>]) -> Vec<Vec<u32>> {
    let mut held = vec![Vec::new(); nodes.len()];
    let Ok(procs) = fs::read_dir("/proc") else {
        return held;
    };
    for pid in procs
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
    {
        let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        let targets = fds
            .filter_map(Result::ok)
            .filter_map(|fd| fs::read_link(fd.path()).ok());
        for index in held_nodes(targets, nodes) {
            held[index].push(pid);
        }
    }
    for pids in &mut held {
        pids.sort_unstable();
    }
    held
}

/// The indexes of the nodes among a process's descriptor targets, each once.
pub(crate) fn held_nodes(
    targets: impl Iterator<Item = PathBuf>,
    nodes: &[Option<DeviceNode>],
) -> Vec<usize> {
    let mut found: Vec<usize> = targets
        .filter_map(|t| {
            nodes
                .iter()
                .position(|n| n.as_ref().is_some_and(|n| n.path == t))
        })
        .collect();
    found.sort_unstable();
    found.dedup();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minors_are_distinct_per_node_and_above_the_drivers() {
        assert_eq!(sim_minor(1, 0), 320);
        assert_eq!(sim_minor(1, 3), 323);
        assert_eq!(sim_minor(2, 0), 384);
        assert_eq!(sim_minor(0, 0), FIRST_MINOR);
        let mut all = Vec::new();
        for node in 1..=8 {
            for gpu in 0..MINORS_PER_NODE {
                all.push(sim_minor(node, gpu));
            }
        }
        let count = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), count, "no two GPUs of nodes 1..=8 share a minor");
        assert!(all.iter().all(|m| *m > 255));
        assert!(sim_minor(u64::MAX, MINORS_PER_NODE + 5) <= MAX_MINOR);
        assert_eq!(
            sim_minor(NODE_SLOTS + 1, 0),
            sim_minor(1, 0),
            "the wrap-around"
        );
    }

    #[test]
    fn descriptor_targets_name_the_nodes_held() {
        let nodes = vec![
            Some(DeviceNode {
                path: "/d/dev/nvidia0".into(),
                major: 195,
                minor: 320,
            }),
            None,
            Some(DeviceNode {
                path: "/d/dev/nvidia2".into(),
                major: 195,
                minor: 322,
            }),
        ];
        let targets = |t: &[&str]| t.iter().map(PathBuf::from).collect::<Vec<_>>().into_iter();
        assert_eq!(
            held_nodes(
                targets(&[
                    "/d/dev/nvidia2",
                    "socket:[1234]",
                    "/d/dev/nvidia0",
                    "/d/dev/nvidia2"
                ]),
                &nodes
            ),
            [0, 2]
        );
        assert_eq!(
            held_nodes(targets(&["/dev/null", "/d/dev/nvidia1"]), &nodes),
            Vec::<usize>::new()
        );
    }

    #[test]
    fn nodes_are_made_where_root_may() {
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var_os("GPUMESH_REQUIRE_ROOT").is_none(),
                "GPUMESH_REQUIRE_ROOT is set but this test is not root"
            );
            eprintln!("SKIPPED: mknod needs root, and this test is not root");
            return;
        }
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("dev");
        let nodes = create(&dir, 3, 2).expect("mknod as root");
        assert_eq!(nodes[1].path, dir.join("nvidia1"));
        for node in &nodes {
            let m = fs::metadata(&node.path).expect("node");
            assert!(m.file_type().is_char_device());
            assert_eq!(m.mode() & 0o777, 0o666);
            assert_eq!(
                (dev_number::major(m.rdev()), dev_number::minor(m.rdev())),
                (195, sim_minor(3, 0) + node.minor - nodes[0].minor)
            );
        }
        // Again, over a plain file put in its place: made right.
        fs::remove_file(&nodes[0].path).expect("rm");
        fs::write(&nodes[0].path, "not a node").expect("plant");
        assert_eq!(create(&dir, 3, 2).expect("again"), nodes);
        assert!(
            fs::metadata(&nodes[0].path)
                .expect("node")
                .file_type()
                .is_char_device()
        );
        if on_nodev_mount(&dir) {
            eprintln!(
                "{} is on a nodev mount: not opening the nodes",
                dir.display()
            );
            return;
        }
        let err = fs::File::open(&nodes[0].path).expect_err("no driver behind the node");
        assert_eq!(err.raw_os_error(), Some(nix::libc::ENXIO), "{err}");
    }
}
