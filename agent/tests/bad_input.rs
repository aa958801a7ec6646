//! The agent binary refuses bad configuration and bad data directories with a clear message,
//! exit code 2, and without touching the data.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn agent() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpu-agent"));
    cmd.stdin(Stdio::null());
    cmd
}

fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").to_string()
}

fn run_config(dir: &Path, toml: &str) -> Output {
    let path = dir.join("agent.toml");
    std::fs::write(&path, toml).expect("write config");
    agent()
        .arg("run")
        .arg("--config")
        .arg(&path)
        .output()
        .expect("run gpu-agent")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn an_unknown_config_key_is_named() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = run_config(
        tmp.path(),
        "node_id = 1\ndata_dir = \"d\"\nbootstrap = true\nelection_timeout = \"1s\"\n",
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("unknown field `election_timeout`"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn an_unreachable_join_address_fails_after_retrying() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dead = free_addr(); // nothing listens here
    let ca = gpu_agent::tls::pki::new_ca(std::time::SystemTime::now(), Duration::from_secs(60))
        .expect("ca");
    let (ca_file, token_file) = (tmp.path().join("ca.crt"), tmp.path().join("join.token"));
    std::fs::write(&ca_file, ca.cert_pem).expect("write");
    gpu_agent::tls::files::write_file(&token_file, "id.secret", 0o600).expect("write");
    let toml = format!(
        "node_id = 2\nlisten = {:?}\ndata_dir = {:?}\njoin = [{dead:?}]\njoin_timeout = \"2s\"\n\
         [tls]\nca_file = {ca_file:?}\njoin_token_file = {token_file:?}\n",
        free_addr(),
        tmp.path().join("data")
    );
    let started = std::time::Instant::now();
    let out = run_config(tmp.path(), &toml);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "it should retry before giving up"
    );
    let err = stderr(&out);
    assert!(
        err.contains("no agent signed our certificate") && err.contains(&dead),
        "{err}"
    );
}

#[test]
fn an_empty_data_dir_without_bootstrap_or_join_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let toml = format!(
        "node_id = 1\nlisten = {:?}\ndata_dir = {:?}\n",
        free_addr(),
        tmp.path().join("data")
    );
    let out = run_config(tmp.path(), &toml);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--bootstrap"), "{}", stderr(&out));
}

#[test]
fn a_data_dir_in_use_is_refused_without_harm() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let addr = free_addr();
    let mut first = agent()
        .args(["run", "--node-id", "1", "--bootstrap", "--listen", &addr])
        .arg("--data-dir")
        .arg(&data)
        .stderr(Stdio::null())
        .spawn()
        .expect("first agent");
    // Wait until the first agent holds the directory.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !data.join("FORMAT").exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = agent()
        .args([
            "run",
            "--node-id",
            "1",
            "--bootstrap",
            "--listen",
            &free_addr(),
        ])
        .arg("--data-dir")
        .arg(&data)
        .output()
        .expect("second agent");
    let still_running = first.try_wait().expect("poll").is_none();
    first.kill().ok();
    first.wait().ok();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("in use by another process"),
        "{}",
        stderr(&out)
    );
    assert!(still_running, "the first agent must be unaffected");
    // The directory still opens cleanly: nothing was corrupted.
    let reopened = agent()
        .args([
            "run",
            "--node-id",
            "1",
            "--bootstrap",
            "--listen",
            &free_addr(),
        ])
        .arg("--data-dir")
        .arg(&data)
        .stderr(Stdio::piped())
        .spawn()
        .expect("reopen");
    std::thread::sleep(Duration::from_secs(2));
    let mut reopened = reopened;
    let alive = reopened.try_wait().expect("poll").is_none();
    reopened.kill().ok();
    let out = reopened.wait_with_output().expect("reap");
    assert!(
        alive,
        "the data directory should still open after the refused second agent: {}",
        stderr(&out)
    );
}

#[test]
fn a_future_format_data_dir_is_refused_and_left_alone() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    std::fs::create_dir_all(data.join("raft")).expect("mkdir");
    std::fs::write(data.join("FORMAT"), "gpumesh-data 42\n").expect("format");
    let toml = format!(
        "node_id = 1\nlisten = {:?}\ndata_dir = {data:?}\nbootstrap = true\n",
        free_addr()
    );
    let out = run_config(tmp.path(), &toml);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("format version 42") && err.contains("upgrade gpu-agent"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(data.join("FORMAT")).expect("format"),
        "gpumesh-data 42\n"
    );
}

#[test]
fn a_corrupt_snapshot_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data).expect("mkdir");
    std::fs::write(data.join("FORMAT"), "gpumesh-data 1\n").expect("format");
    std::fs::write(
        data.join("snapshot"),
        "{\"format\":1,\"meta\":{}, garbage\n",
    )
    .expect("snapshot");
    let toml = format!(
        "node_id = 1\nlisten = {:?}\ndata_dir = {data:?}\nbootstrap = true\n",
        free_addr()
    );
    let out = run_config(tmp.path(), &toml);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("is corrupt"), "{}", stderr(&out));
}

/// Wait (up to 60 s) for `child` to exit; kill it and fail if it does not.
fn wait_exit(mut child: std::process::Child, what: &str) -> Output {
    let start = std::time::Instant::now();
    while child.try_wait().expect("poll").is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            child.kill().ok();
            let out = child.wait_with_output().expect("reap");
            panic!("{what}: still running after 60 s\n{}", stderr(&out));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child.wait_with_output().expect("reap")
}

#[test]
fn a_corrupt_raft_log_entry_stops_the_agent_with_a_clear_error() {
    use gpu_raft_store::{KvEngine, SledEngine, Space};
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let token = tmp.path().join("admin.token");
    let toml = format!(
        "node_id = 1\nlisten = {:?}\ndata_dir = {data:?}\nbootstrap = true\n\
         bootstrap_token_file = {token:?}\n",
        free_addr()
    );
    let path = tmp.path().join("agent.toml");
    std::fs::write(&path, toml).expect("write config");
    let start = || {
        agent()
            .arg("run")
            .arg("--config")
            .arg(&path)
            .stderr(Stdio::piped())
            .spawn()
            .expect("start gpu-agent")
    };
    // A real data directory: bootstrap until the admin token is minted (written through Raft),
    // then stop gracefully.
    let first = start();
    let begun = std::time::Instant::now();
    while !token.exists() && begun.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let pid = nix::unistd::Pid::from_raw(i32::try_from(first.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let out = wait_exit(first, "the bootstrapping agent after SIGTERM");
    assert!(token.exists(), "bootstrap never finished: {}", stderr(&out));

    // Garble one committed entry in the middle of the log, the way a bad disk would.
    let engine = SledEngine::open(&data.join("raft")).expect("open the log");
    let keys = engine
        .keys(Space::Log, &0u64.to_be_bytes(), &u64::MAX.to_be_bytes())
        .expect("log keys");
    assert!(keys.len() >= 3, "too short a log: {} entries", keys.len());
    let victim = keys[1].clone();
    engine
        .write(
            Space::Log,
            vec![(victim, Some(b"{\"log_id\": garbage".to_vec()))],
        )
        .expect("garble");
    engine.flush().expect("flush");
    drop(engine);

    let out = wait_exit(start(), "the agent on a corrupt log");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: starting raft") && last.contains("Read Logs"),
        "{err}"
    );
}
