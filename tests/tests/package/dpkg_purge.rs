//! A real `dpkg -i` of the package, `gpu-agent --version` from it, and `dpkg --purge`, with the
//! maintainer scripts run, without touching this machine: in a mount namespace of their own,
//! /etc, /usr, /var and the other top-level directories are overlays whose lower layer is this
//! machine's and whose upper layer is a scratch directory, so every write (dpkg's database, the
//! gpumesh user, the enabled unit, the files) lands there. After the purge the upper layers
//! must hold no trace of gpumesh outside logs, caches and the backups dpkg and shadow keep of
//! the previous state.
//!
//! Limits: the machine's installed packages are the base (dpkg checks Depends against them), not
//! a freshly installed system; /run is an empty tmpfs, so the scripts see no running systemd and
//! take the branch a chroot or container takes (no daemon-reload, start or stop; the unit is still
//! enabled and disabled through deb-systemd-helper); file systems mounted below the overlaid
//! directories are not seen. Needs root, dpkg, unshare and overlayfs: skipped without them unless
//! `GPUMESH_REQUIRE_ROOT` or `GPUMESH_REQUIRE_DPKG` is set (CI sets both).

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use gpu_agent::build_info::COMMIT;
use gpu_tests::package::{deb, have, is_root, run};

/// Runs in the namespace: `$1` the scratch directory, `$2` the package.
const IN_OVERLAY: &str = r#"
set -eu
scratch="$1"; deb="$2"
for d in etc usr var opt root srv home bin sbin lib lib32 lib64 libx32; do
  if [ -d "/$d" ] && [ ! -L "/$d" ]; then
    mkdir -p "$scratch/$d/upper" "$scratch/$d/work"
    mount -t overlay overlay -o "lowerdir=/$d,upperdir=$scratch/$d/upper,workdir=$scratch/$d/work" "/$d"
  fi
done
mount -t tmpfs tmpfs /run
dpkg -i "$deb" >&2
echo "status: $(dpkg-query -W -f '${Status}' gpumesh)"
echo "version: $(gpu-agent --version)"
echo "ctl: $(gpuctl --version)"
echo "user: $(getent passwd gpumesh | cut -d: -f1,7)"
echo "modes: $(stat -c '%n=%a' /etc/gpumesh /etc/gpumesh/agent.toml /var/lib/gpumesh /var/lib/gpumesh-jobs /var/log/gpumesh | tr '\n' ' ')"
echo "enabled: $(readlink /etc/systemd/system/multi-user.target.wants/gpu-agent.service)"
dpkg --purge gpumesh >&2
echo "purged: $(dpkg-query -W -f '${Status}' gpumesh 2>/dev/null || echo gone)"
"#;

#[test]
fn dpkg_installs_runs_and_purges_without_a_trace() {
    if !(is_root()
        && have("dpkg", "GPUMESH_REQUIRE_DPKG")
        && have("unshare", "GPUMESH_REQUIRE_ROOT"))
    {
        return;
    }
    let installed = Command::new("dpkg-query")
        .args(["-W", "-f", "${Status}", "gpumesh"])
        .output()
        .expect("dpkg-query runs");
    let state = String::from_utf8_lossy(&installed.stdout);
    assert!(
        state
            .split_whitespace()
            .last()
            .is_none_or(|s| s == "not-installed"),
        "gpumesh is on this machine ({state}): the test needs a machine without it"
    );
    let deb = deb(Path::new(super::WORK));
    let scratch = tempfile::tempdir().expect("tempdir");
    let said = run(Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            IN_OVERLAY,
            "sh",
        ])
        .arg(scratch.path())
        .arg(deb));
    let line = |key: &str| {
        said.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}: ")))
            .unwrap_or_else(|| panic!("no {key} in:\n{said}"))
            .trim()
            .to_owned()
    };
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(line("status"), "install ok installed");
    assert_eq!(
        line("version"),
        format!("gpu-agent {version} (commit {COMMIT})")
    );
    assert_eq!(line("ctl"), format!("gpuctl {version} (commit {COMMIT})"));
    assert_eq!(
        line("user"),
        "gpumesh:/usr/sbin/nologin",
        "postinst made the user"
    );
    assert_eq!(
        line("modes"),
        "/etc/gpumesh=755 /etc/gpumesh/agent.toml=644 /var/lib/gpumesh=711 \
         /var/lib/gpumesh-jobs=711 /var/log/gpumesh=750"
    );
    assert_eq!(
        line("enabled"),
        "/lib/systemd/system/gpu-agent.service",
        "postinst enabled the unit through deb-systemd-helper"
    );
    assert_eq!(line("purged"), "gone");

    let left = traces(scratch.path());
    assert!(left.is_empty(), "left behind after the purge:\n{left:#?}");
}

/// What the upper layers under `scratch` hold that the purge should have taken away: any path
/// named after gpumesh; anything new on this machine, or removed from it (a whiteout), outside
/// dpkg's and shadow's bookkeeping; any file that mentions gpumesh outside logs, caches and
/// backups of the previous state (`passwd-`, `status-old`).
fn traces(scratch: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack: Vec<(PathBuf, PathBuf)> = std::fs::read_dir(scratch)
        .expect("scratch")
        .map(|e| {
            let top = e.expect("entry").file_name();
            (scratch.join(&top).join("upper"), Path::new("/").join(&top))
        })
        .collect();
    while let Some((upper, host)) = stack.pop() {
        for e in std::fs::read_dir(&upper).expect("read upper") {
            let e = e.expect("entry");
            let (path, on_host) = (e.path(), host.join(e.file_name()));
            let shown = on_host.display().to_string();
            let meta = std::fs::symlink_metadata(&path).expect("stat");
            let bookkeeping = is_bookkeeping(&shown);
            if ["gpumesh", "gpu-agent", "gpuctl"]
                .iter()
                .any(|n| e.file_name().to_string_lossy().contains(n))
            {
                found.push(format!("{shown}: named after gpumesh"));
            } else if meta.file_type().is_char_device() && meta.rdev() == 0 {
                if !bookkeeping {
                    found.push(format!("{shown}: removed from this machine"));
                }
            } else if std::fs::symlink_metadata(&on_host).is_err() && !bookkeeping {
                found.push(format!("{shown}: new"));
            } else if meta.is_file() && !keeps_history(&shown) {
                let bytes = std::fs::read(&path).expect("read");
                if String::from_utf8_lossy(&bytes).contains("gpumesh") {
                    found.push(format!("{shown}: mentions gpumesh"));
                }
            }
            if meta.is_dir() {
                stack.push((path, on_host));
            }
        }
    }
    found.sort();
    found
}

/// Files and directories dpkg, shadow's tools and deb-systemd-helper keep for themselves.
fn is_bookkeeping(path: &str) -> bool {
    path.starts_with("/var/lib/dpkg/")
        || path.starts_with("/var/log/")
        || path.starts_with("/var/cache/")
        || path.starts_with("/var/lib/systemd/deb-systemd-helper-")
        || path.ends_with(".wants")
        || [
            "/etc/.pwd.lock",
            "/etc/passwd-",
            "/etc/group-",
            "/etc/shadow-",
            "/etc/gshadow-",
            "/etc/subuid",
            "/etc/subgid",
            "/etc/subuid-",
            "/etc/subgid-",
        ]
        .contains(&path)
}

/// Files that may still name gpumesh: logs, caches, and the copies of the state before the
/// last change that dpkg and shadow's tools keep.
fn keeps_history(path: &str) -> bool {
    path.starts_with("/var/log/")
        || path.starts_with("/var/cache/")
        || path == "/var/lib/dpkg/status-old"
        || (path.starts_with("/etc/") && path.ends_with('-'))
}
