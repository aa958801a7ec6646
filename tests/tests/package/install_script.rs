//! `deploy/install.sh` into a scratch root, and `--uninstall`, `--purge` out of it.

use std::process::Command;

use gpu_tests::package::{bin_dir, files_under, mode, repo, run};

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
    // The configuration holds no secret (tokens and keys are files of their own, 0600).
    assert_eq!(mode(&r.join("etc/gpumesh")), 0o755);
    assert_eq!(mode(&r.join("etc/gpumesh/agent.toml")), 0o644);
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
