//! `deploy/install.sh` into a scratch root (and `--uninstall`, `--purge` out of it), and the
//! Debian package from `deploy/deb/build.sh` installed by dpkg into a scratch root: binaries that
//! run, the unit, the conffile, man pages and completions generated from the binaries.

use std::path::{Path, PathBuf};
use std::process::Command;

use gpu_tests::bin;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("repo root")
}

fn bin_dir() -> PathBuf {
    bin("gpu-agent").parent().expect("bin dir").to_owned()
}

fn run(cmd: &mut Command) -> String {
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

fn files_under(root: &Path) -> Vec<String> {
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

fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).expect("stat").permissions().mode() & 0o7777
}

#[test]
fn install_script_installs_and_uninstalls_in_a_scratch_root() {
    let root = tempfile::tempdir().expect("tempdir");
    let r = root.path();
    run(Command::new(repo().join("deploy/install.sh"))
        .arg("--root")
        .arg(r)
        .arg("--bin-dir")
        .arg(bin_dir()));
    for f in [
        "usr/bin/gpu-agent",
        "usr/bin/gpuctl",
        "etc/systemd/system/gpu-agent.service",
        "usr/share/man/man1/gpu-agent-restore.1.gz",
        "usr/share/man/man1/gpuctl-cluster-snapshot-save.1.gz",
        "usr/share/bash-completion/completions/gpuctl",
        "usr/share/zsh/vendor-completions/_gpu-agent",
        "usr/share/fish/vendor_completions.d/gpuctl.fish",
        "usr/share/doc/gpumesh/operations.md",
    ] {
        let p = r.join(f);
        assert!(
            std::fs::metadata(&p).is_ok_and(|m| m.len() > 0),
            "{f} missing or empty"
        );
    }
    let completion =
        std::fs::read_to_string(r.join("usr/share/bash-completion/completions/gpuctl"))
            .expect("completion");
    assert!(
        completion.contains("snapshot"),
        "completions come from the real CLI"
    );
    assert_eq!(mode(&r.join("etc/gpumesh")), 0o750);
    assert_eq!(mode(&r.join("etc/gpumesh/agent.toml")), 0o640);
    assert_eq!(mode(&r.join("var/lib/gpumesh")), 0o711);
    assert_eq!(
        mode(&r.join("var/lib/gpumesh-jobs")),
        0o711,
        "job users pass through"
    );
    let config = std::fs::read_to_string(r.join("etc/gpumesh/agent.toml")).expect("config");
    assert!(
        config.contains("\nrun_as = \"gpumesh\""),
        "jobs run as the service user"
    );
    gpu_agent::config::FileConfig::parse(&config).expect("the installed config parses");

    // A second install keeps the operator's config.
    std::fs::write(r.join("etc/gpumesh/agent.toml"), "node_id = 7\n").expect("edit");
    run(Command::new(repo().join("deploy/install.sh"))
        .arg("--root")
        .arg(r)
        .arg("--bin-dir")
        .arg(bin_dir()));
    assert_eq!(
        std::fs::read_to_string(r.join("etc/gpumesh/agent.toml")).expect("kept"),
        "node_id = 7\n"
    );

    std::fs::write(r.join("var/lib/gpumesh/state"), "cluster data").expect("data");
    run(Command::new(repo().join("deploy/install.sh"))
        .args(["--uninstall", "--root"])
        .arg(r));
    assert_eq!(
        files_under(r),
        vec!["etc/gpumesh/agent.toml", "var/lib/gpumesh/state"],
        "uninstall removes what it installed and keeps config and data"
    );
    run(Command::new(repo().join("deploy/install.sh"))
        .args(["--uninstall", "--purge", "--root"])
        .arg(r));
    assert!(files_under(r).is_empty(), "{:?}", files_under(r));
}

#[test]
fn debian_package_builds_and_installs_into_a_scratch_root() {
    if Command::new("dpkg-deb").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("GPUMESH_REQUIRE_DPKG").is_none(),
            "dpkg-deb is required here"
        );
        println!("skipping: dpkg-deb is not installed");
        return;
    }
    let out = tempfile::tempdir().expect("tempdir");
    let deb = run(Command::new(repo().join("deploy/deb/build.sh"))
        .arg("--bin-dir")
        .arg(bin_dir())
        .arg("--out")
        .arg(out.path())
        .args(["--compress", "none"]));
    let deb = PathBuf::from(deb.trim());
    let info = run(Command::new("dpkg-deb").arg("--info").arg(&deb));
    assert!(info.contains("Package: gpumesh"), "{info}");

    // dpkg itself unpacks it into an empty root with its own database (no maintainer scripts
    // run: they would create a user on this host).
    let root = tempfile::tempdir().expect("tempdir");
    let r = root.path();
    for d in ["var/lib/dpkg/info", "var/lib/dpkg/updates"] {
        std::fs::create_dir_all(r.join(d)).expect("dpkg dirs");
    }
    std::fs::write(r.join("var/lib/dpkg/status"), "").expect("status");
    run(Command::new("dpkg")
        .arg(format!("--root={}", r.display()))
        .args(["--force-not-root", "--unpack"])
        .arg(&deb));
    let listed = run(Command::new("dpkg")
        .arg(format!("--root={}", r.display()))
        .args(["-L", "gpumesh"]));
    for f in [
        "/usr/bin/gpu-agent",
        "/usr/bin/gpuctl",
        "/lib/systemd/system/gpu-agent.service",
        "/etc/gpumesh/agent.toml",
        "/usr/share/man/man1/gpu-agent.1.gz",
        "/usr/share/man/man1/gpuctl.1.gz",
    ] {
        assert!(
            listed.lines().any(|l| l == f),
            "{f} not in the package:\n{listed}"
        );
        // Until `configure`, dpkg keeps a conffile as FILE.dpkg-new.
        let unpacked = r.join(&f[1..]);
        assert!(
            unpacked.exists() || r.join(format!("{}.dpkg-new", &f[1..])).exists(),
            "{f} not unpacked"
        );
    }
    assert!(
        !listed.lines().any(|l| l.starts_with("/var/lib/gpumesh")),
        "the package must not own the data directory"
    );
    let conffiles = run(Command::new("dpkg-deb")
        .arg("--info")
        .arg(&deb)
        .arg("conffiles"));
    assert_eq!(
        conffiles.trim(),
        "/etc/gpumesh/agent.toml",
        "upgrades keep the config"
    );
    // The packaged (stripped) binaries run.
    for b in ["gpu-agent", "gpuctl"] {
        let v = run(Command::new(r.join("usr/bin").join(b)).arg("--version"));
        assert!(v.starts_with(b), "{v}");
    }
    let unit =
        std::fs::read_to_string(r.join("lib/systemd/system/gpu-agent.service")).expect("unit");
    assert!(unit.contains("Type=notify"));
}
