//! What the Debian package holds, unpacked by dpkg into an empty root with its own database (no
//! maintainer scripts run): binaries that run and name their commit, the unit, the conffile,
//! man pages, the changelogs, the version with the commit, and a copyright file that lists the
//! crates compiled in with their licenses.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use gpu_agent::build_info::COMMIT;
use gpu_tests::package::{deb, have, run};

#[test]
fn debian_package_builds_and_unpacks_into_a_scratch_root() {
    if !have("dpkg-deb", "GPUMESH_REQUIRE_DPKG") {
        return;
    }
    let deb = deb(Path::new(super::WORK));
    let field = |name: &str| run(Command::new("dpkg-deb").arg("--field").arg(deb).arg(name));
    assert_eq!(field("Package").trim(), "gpumesh");
    let version = field("Version").trim().to_owned();
    let upstream = env!("CARGO_PKG_VERSION");
    assert!(
        version == format!("{upstream}-1")
            || (version.starts_with(&format!("{upstream}+git"))
                && version.ends_with(&format!(".{COMMIT}-1"))),
        "{version}: the workspace version, and between releases the commit"
    );
    assert_eq!(
        field("Maintainer").trim(),
        "gpumesh maintainers <maintainers@gpumesh.dev>"
    );
    let depends = field("Depends");
    assert!(
        depends.contains("libc6 (>= "),
        "from dpkg-shlibdeps: {depends}"
    );

    let root = tempfile::tempdir().expect("tempdir");
    let r = root.path();
    for d in ["var/lib/dpkg/info", "var/lib/dpkg/updates"] {
        std::fs::create_dir_all(r.join(d)).expect("dpkg dirs");
    }
    std::fs::write(r.join("var/lib/dpkg/status"), "").expect("status");
    run(Command::new("dpkg")
        .arg(format!("--root={}", r.display()))
        .args(["--force-not-root", "--unpack"])
        .arg(deb));
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
        "/usr/share/doc/gpumesh/copyright",
        "/usr/share/doc/gpumesh/changelog.gz",
        "/usr/share/doc/gpumesh/changelog.Debian.gz",
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
        !listed.lines().any(|l| l.starts_with("/var/")),
        "the package must not own the data, jobs or log directories"
    );
    let conffiles = run(Command::new("dpkg-deb")
        .arg("--info")
        .arg(deb)
        .arg("conffiles"));
    assert_eq!(
        conffiles.trim(),
        "/etc/gpumesh/agent.toml",
        "upgrades keep the config"
    );
    // The packaged (stripped) binaries run and say which commit they are.
    for b in ["gpu-agent", "gpuctl"] {
        let v = run(Command::new(r.join("usr/bin").join(b)).arg("--version"));
        assert_eq!(v.trim(), format!("{b} {upstream} (commit {COMMIT})"));
    }
    let unit =
        std::fs::read_to_string(r.join("lib/systemd/system/gpu-agent.service")).expect("unit");
    assert!(unit.contains("Type=notify"));

    let changelog =
        run(Command::new("zcat").arg(r.join("usr/share/doc/gpumesh/changelog.Debian.gz")));
    assert!(
        changelog.starts_with(&format!("gpumesh ({version}) unstable; urgency=medium\n")),
        "{changelog}"
    );
    let copyright =
        std::fs::read_to_string(r.join("usr/share/doc/gpumesh/copyright")).expect("copyright");
    check_copyright(&copyright);
}

/// The copyright file is machine-readable (DEP-5) and generated from the dependency graph: the
/// crates linked into the binaries are there, the compile-time and test-only ones are not, and
/// every license a Files paragraph names has a paragraph of its own with its text.
fn check_copyright(text: &str) {
    let paragraphs: Vec<&str> = text.split("\n\n").collect();
    assert!(
        paragraphs[0].starts_with(
            "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
        ),
        "{}",
        paragraphs[0]
    );
    let value = |p: &str, key: &str| {
        p.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}: ")))
            .map(str::to_owned)
    };
    let crates: BTreeSet<String> = paragraphs
        .iter()
        .filter_map(|p| value(p, "Files"))
        .filter_map(|f| f.strip_prefix("vendor/").map(str::to_owned))
        .collect();
    let has = |name: &str| {
        crates.iter().any(|c| {
            c.strip_prefix(name).is_some_and(|v| {
                v.starts_with('-') && v[1..].starts_with(|ch: char| ch.is_ascii_digit())
            })
        })
    };
    for shipped in [
        "openraft", "sled", "tonic", "tokio", "rustls", "ring", "clap",
    ] {
        assert!(has(shipped), "{shipped} is compiled in but not listed");
    }
    for not_shipped in [
        "serde_derive",
        "tonic-prost-build",
        "protoc-bin-vendored",
        "proptest",
        "criterion",
    ] {
        assert!(
            !has(not_shipped),
            "{not_shipped} is not in the binaries but listed"
        );
    }
    let mut used = BTreeSet::new();
    let mut defined = BTreeSet::new();
    for p in &paragraphs {
        let Some(license) = value(p, "License") else {
            continue;
        };
        if value(p, "Files").is_some() {
            used.extend(license.split([',']).flat_map(|part| {
                part.split(" or ")
                    .flat_map(|a| a.split(" and "))
                    .map(|n| n.trim().to_owned())
                    .filter(|n| !n.is_empty())
                    .collect::<Vec<_>>()
            }));
        } else {
            assert!(p.lines().count() > 1, "license {license} without its text");
            defined.insert(license);
        }
    }
    let missing: Vec<_> = used.difference(&defined).collect();
    assert!(
        missing.is_empty(),
        "licenses without a paragraph: {missing:?}"
    );
}
