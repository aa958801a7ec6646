//! Every example config shipped in `deploy/` parses and validates.

use gpu_agent::config::{Config, FileConfig, Overrides};

#[test]
fn every_example_config_is_valid() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/config");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("deploy/config exists") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "toml") {
            let file =
                FileConfig::load(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            Config::parse_and_validate(file, Overrides::default())
                .unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            checked += 1;
        }
    }
    assert!(checked > 0, "no example configs found in {}", dir.display());
}
