//! Debian's own checker on the package: no error and no warning (`--fail-on error,warning`).
//! Skipped without lintian unless `GPUMESH_REQUIRE_LINTIAN` is set (CI sets it).

use std::path::Path;
use std::process::Command;

use gpu_tests::package::{deb, have};

#[test]
fn lintian_finds_no_error_and_no_warning() {
    if !(have("dpkg-deb", "GPUMESH_REQUIRE_DPKG") && have("lintian", "GPUMESH_REQUIRE_LINTIAN")) {
        return;
    }
    let deb = deb(Path::new(super::WORK));
    let out = Command::new("lintian")
        .args(["--fail-on", "error,warning", "--no-tag-display-limit"])
        .arg(deb)
        .output()
        .expect("lintian runs");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "lintian {}: {}\n{}{}",
        deb.display(),
        out.status,
        said,
        String::from_utf8_lossy(&out.stderr)
    );
    let tagged: Vec<&str> = said
        .lines()
        .filter(|l| l.starts_with("E:") || l.starts_with("W:"))
        .collect();
    assert!(tagged.is_empty(), "{tagged:#?}");
}
