//! gpuctl's contract without a cluster: exit codes, messages on stderr, nothing on stdout.

use std::process::Command;

fn gpuctl(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpuctl"))
        .args(args)
        .env_remove("GPUCTL_ENDPOINT")
        .output()
        .expect("run gpuctl")
}

fn dead_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").to_string()
}

#[test]
fn every_endpoint_down_is_exit_2_naming_each() {
    let (a, b) = (dead_addr(), dead_addr());
    let out = gpuctl(&["--endpoint", &format!("{a},{b}"), "cluster", "status"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no agent answered") && err.contains(&a) && err.contains(&b),
        "{err}"
    );
}

#[test]
fn malformed_label_changes_fail_before_any_call() {
    let out = gpuctl(&["--endpoint", &dead_addr(), "node", "label", "1", "zone"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("key=value"), "{err}");
}

#[test]
fn usage_errors_are_exit_2() {
    assert_eq!(gpuctl(&["cluster", "explode"]).status.code(), Some(2));
    assert_eq!(
        gpuctl(&["--timeout", "0s", "cluster", "status"])
            .status
            .code(),
        Some(2)
    );
    assert_eq!(
        gpuctl(&["-o", "yaml", "cluster", "status"]).status.code(),
        Some(2)
    );
}
