//! Embeds the commit this build comes from as `GPUMESH_COMMIT` (`--version`, and the build an
//! agent reports to its peers): `GPUMESH_BUILD_COMMIT` when set (package builds and CI clones
//! pin it, so the result does not depend on the checkout), else `git rev-parse --short=7
//! HEAD`, else "unknown" (a source tree without git). gpuctl's build.rs runs this same `main`.

use std::path::PathBuf;
use std::process::Command;

pub(crate) fn main() {
    println!("cargo:rerun-if-env-changed=GPUMESH_BUILD_COMMIT");
    let commit = match std::env::var("GPUMESH_BUILD_COMMIT") {
        Ok(pinned) => checked(pinned.trim()),
        Err(_) => from_git().unwrap_or_else(|| "unknown".to_owned()),
    };
    println!("cargo:rustc-env=GPUMESH_COMMIT={commit}");
}

/// A pinned commit goes into `--version`, a gRPC header and the package version: hex only.
fn checked(commit: &str) -> String {
    let ok = !commit.is_empty() && commit.bytes().all(|b| b.is_ascii_hexdigit());
    assert!(
        ok,
        "GPUMESH_BUILD_COMMIT={commit:?}: expected a commit hash (hex digits)"
    );
    commit.to_ascii_lowercase()
}

fn from_git() -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").args(args).output().ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        out.status.success().then(|| text.trim().to_owned())
    };
    let commit = git(&["rev-parse", "--short=7", "HEAD"])?;
    // Build again when HEAD moves: HEAD itself (a checkout), the branch it names (a commit),
    // and packed-refs (where git moves branch tips). Only files that exist: cargo reruns a
    // script every time for a path that is missing.
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        let path = git(&["rev-parse", "--path-format=absolute", "--git-path", &name]);
        if let Some(path) = path.filter(|p| PathBuf::from(p).exists()) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    Some(commit)
}
