//! The README's quickstart, end to end: `gpu-agent dev --nodes 3` forms a mesh and
//! `gpuctl cluster status -o json` shows one leader and three members, each with its build;
//! SIGTERM stops it all.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use gpu_tests::bin;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// gpuctl with the config dev wrote (CA, client certificate) and explicit endpoints and token.
fn gpuctl(config: &Path, endpoint: &str, token_file: &str, args: &[&str]) -> std::process::Output {
    Command::new(bin("gpuctl"))
        .arg("--endpoint")
        .arg(endpoint)
        .env("GPUCTL_CONFIG", config)
        .env("GPUCTL_TOKEN_FILE", token_file)
        .env_remove("GPUCTL_TOKEN")
        .args(args)
        .output()
        .expect("run gpuctl")
}

#[test]
fn dev_mesh_serves_gpuctl_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("gpuctl.toml");
    let mut dev = Command::new(bin("gpu-agent"))
        .args(["dev", "--nodes", "3", "--base-port", "0", "--dir"])
        .arg(dir.path())
        .env("GPUCTL_CONFIG", &config)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start gpu-agent dev");
    let stdout = dev.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
    let endpoint = lines
        .by_ref()
        .find_map(|l| l.strip_prefix("endpoint: ").map(str::to_owned))
        .expect("dev prints its endpoint once the mesh is up");
    let token_file = lines
        .find_map(|l| l.strip_prefix("token file: ").map(str::to_owned))
        .expect("dev prints its admin token file");
    let gpuctl = |endpoint: &str, args: &[&str]| gpuctl(&config, endpoint, &token_file, args);

    // The newcomer path: no flags, no exports; the config file dev wrote says where and how.
    let out = Command::new(bin("gpuctl"))
        .args(["cluster", "status", "-o", "json"])
        .env("GPUCTL_CONFIG", &config)
        .env_remove("GPUCTL_ENDPOINT")
        .env_remove("GPUCTL_TOKEN")
        .env_remove("GPUCTL_TOKEN_FILE")
        .output()
        .expect("run gpuctl");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let members = status["members"].as_array().expect("members");
    assert_eq!(members.len(), 3);
    assert_eq!(
        members.iter().filter(|m| m["is_leader"] == true).count(),
        1,
        "{status}"
    );
    assert!(status["leader_id"].is_u64());

    // The first endpoint is down: gpuctl moves on to the next.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .to_string();
    let out = gpuctl(
        &format!("{dead},{endpoint}"),
        &["cluster", "members", "-o", "json"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let members: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(members.as_array().map(Vec::len), Some(3));
    // Each agent's build, as the leader heard it in its Raft answers (all one binary here),
    // and the protocol it registered with, once every agent's registration is applied (it
    // follows the join).
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let members = loop {
        let out = gpuctl(&endpoint, &["cluster", "members", "-o", "json"]);
        let members: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        let all = members.as_array().into_iter().flatten();
        if all.clone().all(|m| !m["protocol"].is_null()) || std::time::Instant::now() > deadline {
            break members;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    for m in members.as_array().into_iter().flatten() {
        assert_eq!(m["build"], gpu_agent::build_info::BUILD, "{members}");
        assert_eq!(
            m["protocol"],
            gpu_agent::raft::protocol::PROTOCOL_VERSION,
            "{members}"
        );
    }
    let table = gpuctl(&endpoint, &["cluster", "members"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.lines().next().is_some_and(|h| h.contains("BUILD")),
        "{table}"
    );

    let pid = Pid::from_raw(i32::try_from(dev.id()).expect("pid"));
    kill(pid, Signal::SIGTERM).expect("SIGTERM");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = dev.try_wait().expect("poll") {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "dev did not stop within 20s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "dev exits cleanly on SIGTERM: {status}");
    let first = endpoint.split(',').next().expect("an address");
    assert!(
        std::net::TcpStream::connect(first).is_err(),
        "agents must be stopped with dev"
    );
    assert!(
        !config.exists(),
        "dev removes the gpuctl config it wrote for the mesh it stopped"
    );
}
