//! Helpers of the package tests (`tests/tests/package/`): the repository, commands that must
//! succeed, the Debian package built once per test binary, and the `GPUMESH_REQUIRE_*` gates.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::bin;

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("repo root")
}

/// Where the workspace binaries the tests run are.
pub fn bin_dir() -> PathBuf {
    bin("gpu-agent").parent().expect("bin dir").to_owned()
}

/// Run `cmd`, which must succeed; its stdout.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether `tool` runs here. Without it the caller skips, unless `require` (a
/// `GPUMESH_REQUIRE_*` variable) is set: then it is a failure, as in CI.
pub fn have(tool: &str, require: &str) -> bool {
    let found = Command::new(tool).arg("--version").output().is_ok();
    assert!(
        found || std::env::var_os(require).is_none(),
        "{require} is set, but {tool} does not run here"
    );
    if !found {
        println!("skipping: {tool} is not installed");
    }
    found
}

/// Whether this test runs as root; if not, it skips unless `GPUMESH_REQUIRE_ROOT` is set.
pub fn is_root() -> bool {
    let root = nix::unistd::geteuid().is_root();
    assert!(
        root || std::env::var_os("GPUMESH_REQUIRE_ROOT").is_none(),
        "GPUMESH_REQUIRE_ROOT is set, but this test is not root"
    );
    if !root {
        println!("skipping: not root");
    }
    root
}

/// The package `deploy/deb/build.sh` makes from the binaries beside the tests (gzip: xz takes
/// longer and lintian refuses no compression), built once per test binary into `dir`.
pub fn deb(dir: &Path) -> &'static Path {
    static DEB: OnceLock<PathBuf> = OnceLock::new();
    DEB.get_or_init(|| {
        let out = dir.join("deb");
        if out.exists() {
            std::fs::remove_dir_all(&out).expect("clear the package directory");
        }
        let deb = run(Command::new(repo().join("deploy/deb/build.sh"))
            .arg("--bin-dir")
            .arg(bin_dir())
            .arg("--out")
            .arg(&out)
            .args(["--compress", "gzip"]));
        PathBuf::from(deb.trim())
    })
}

/// Every file (not directory) under `root`, relative to it, sorted.
pub fn files_under(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("read dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(root).expect("under").display().to_string());
            }
        }
    }
    out.sort();
    out
}

/// The permission bits of `p`.
pub fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).expect("stat").permissions().mode() & 0o7777
}
