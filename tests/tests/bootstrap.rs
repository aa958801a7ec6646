//! Bootstrapping a cluster where the guide says: the admin token's folder is created when
//! missing (0700), and a token path that cannot be written stops the bootstrap before anything
//! is written, so that fixing the path and starting again bootstraps cleanly (before the fix,
//! the CA and the Raft state were written first, and the restart resumed a cluster with no
//! admin token).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpu_tests::{bin, free_addr};

fn config(dir: &Path, token: &Path) -> std::path::PathBuf {
    let path = dir.join("agent.toml");
    let toml = format!(
        "node_id = 1\nlisten = {:?}\ndata_dir = {:?}\nbootstrap = true\n\
         bootstrap_token_file = {token:?}\ngpu_backend = \"sim\"\n",
        free_addr(),
        dir.join("data"),
    );
    std::fs::write(&path, toml).expect("config");
    path
}

fn start(config: &Path) -> Child {
    Command::new(bin("gpu-agent"))
        .arg("run")
        .arg("--config")
        .arg(config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn gpu-agent")
}

/// Wait for `file` to hold a token, then stop the agent.
fn until_token(mut agent: Child, file: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let token = std::fs::read_to_string(file).unwrap_or_default();
        if token.trim().contains('.') {
            agent.kill().ok();
            agent.wait().ok();
            return token;
        }
        if let Ok(Some(status)) = agent.try_wait() {
            let out = agent.wait_with_output().expect("output");
            panic!(
                "the agent exited ({status}): {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(Instant::now() < deadline, "no token in {}", file.display());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_token_folder_is_made_and_an_unwritable_path_stops_the_bootstrap_before_anything() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A path under a regular file can never be written.
    let blocker = dir.path().join("not-a-dir");
    std::fs::write(&blocker, "").expect("blocker");
    let bad = config(dir.path(), &blocker.join("admin.token"));
    let out = start(&bad).wait_with_output().expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("nothing was written"), "{stderr}");
    assert!(
        !dir.path().join("data").exists(),
        "the data directory was touched"
    );

    // Fixed: the folder does not exist yet; the bootstrap makes it (0700) and writes the token.
    let token = dir.path().join("home/gpumesh/admin.token");
    let good = config(dir.path(), &token);
    until_token(start(&good), &token);
    let mode = |p: &Path| std::fs::metadata(p).expect("exists").permissions().mode() & 0o777;
    assert_eq!(mode(token.parent().expect("folder")), 0o700);
    assert_eq!(mode(&token), 0o600);
    for beside in ["ca.crt", "admin.crt", "admin.key"] {
        assert!(token.with_file_name(beside).exists(), "{beside}");
    }
}
