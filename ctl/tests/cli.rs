//! gpuctl's contract without a cluster: exit codes, messages on stderr, nothing on stdout.

use std::process::Command;

fn gpuctl(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpuctl"))
        .args(args)
        .env_remove("GPUCTL_ENDPOINT")
        .env_remove("GPUCTL_TOKEN")
        .env_remove("GPUCTL_TOKEN_FILE")
        .env("GPUCTL_CONFIG", "/nonexistent/gpuctl.toml")
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

/// Accepts connections and never answers: every request hangs until its deadline.
fn black_hole() -> (std::net::TcpListener, String) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    (l, addr)
}

#[test]
fn new_commands_report_unreachable_endpoints() {
    let a = dead_addr();
    let commands: &[&[&str]] = &[
        &["node", "get", "n1"],
        &["node", "cordon", "n1"],
        &["node", "uncordon", "1"],
        &["node", "drain", "1", "--evict"],
        &["gpu", "list"],
        &["gpu", "list", "--node", "n2"],
        &["job", "submit", "--gpus", "1", "--", "python", "train.py"],
        &["job", "list", "--state", "running", "--limit", "5"],
        &["job", "get", "j-42"],
        &["job", "cancel", "42"],
        &["job", "logs", "j-42", "-f"],
        &["job", "wait", "j-42", "--timeout", "5s"],
        &["debug", "inject", "n1", "0", "xid:79"],
    ];
    for args in commands {
        let out = gpuctl(&[&["--endpoint", a.as_str()][..], args].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert!(
            err.contains("no agent answered") && err.contains(&a),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn new_commands_refuse_bad_arguments_with_exit_2() {
    let a = dead_addr();
    let commands: &[&[&str]] = &[
        &["node", "get", "x1"],
        &["node", "cordon"],
        &["node", "drain", "-1"],
        &["gpu", "list", "--node", "nn"],
        &["job", "submit"],
        &["job", "submit", "python"],
        &["job", "submit", "--gpus", "-1", "--", "x"],
        &["job", "submit", "--gpus", "99999999999", "--", "x"],
        &["job", "submit", "--min-gpu-memory", "80GB", "--", "x"],
        &["job", "submit", "--env", "NOEQUALS", "--", "x"],
        &["job", "submit", "--selector", "=a", "--", "x"],
        &["job", "submit", "--estimate", "500ms", "--", "x"],
        &["job", "submit", "--wall-time", "forever", "--", "x"],
        &["job", "submit", "--priority", "high", "--", "x"],
        &["job", "submit", "--gpu-type", "A100,", "--", "x"],
        &["job", "list", "--state", "exploded"],
        &["job", "list", "--limit", "-3"],
        &["job", "get", "j-"],
        &["job", "get", "j-99999999999999999999"],
        &["job", "cancel", "-1"],
        &["job", "logs"],
        &["job", "wait", "42", "--timeout", "0s"],
        &["job", "wait", "42", "--timeout", "10"],
        &["debug", "inject", "1", "0", "meltdown"],
        &["debug", "inject", "1", "0", "xid:abc"],
        &["debug", "inject", "1", "-1", "ecc"],
    ];
    for args in commands {
        let out = gpuctl(&[&["--endpoint", a.as_str()][..], args].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert!(
            !err.contains("no agent answered"),
            "{args:?} was sent: {err}"
        );
    }
}

#[test]
fn duplicate_env_keys_fail_before_any_call() {
    let out = gpuctl(&[
        "--endpoint",
        &dead_addr(),
        "job",
        "submit",
        "--env",
        "A=1",
        "--env",
        "A=2",
        "--",
        "x",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--env \"A\" is given more than once"), "{err}");
}

#[test]
fn submit_help_explains_the_generated_idempotency_key() {
    let out = gpuctl(&["job", "submit", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("generates a random key") && help.contains("never create two jobs"),
        "{help}"
    );
}

#[test]
fn wait_times_out_with_exit_2() {
    let (_listener, addr) = black_hole();
    let started = std::time::Instant::now();
    let out = gpuctl(&["--endpoint", &addr, "job", "wait", "7", "--timeout", "1s"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("timed out after 1s"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(8));
}
