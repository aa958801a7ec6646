//! The systemd unit (`deploy/systemd/gpu-agent.service`) passes `systemd-analyze verify` with no
//! output at all, and a real agent speaks the notify protocol to a real unix datagram socket:
//! READY=1 only once it has caught up with a quorum, WATCHDOG=1 while alive, STOPPING=1.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::process::Command;
use std::time::{Duration, Instant};

use gpu_tests::{Cluster, bin};

fn unit_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd/gpu-agent.service")
}

/// `systemd-analyze verify` prints warnings and still exits 0, so any output fails. The unit's
/// `ExecStart=/usr/bin/gpu-agent` is pointed at the built binary (verify checks that it is
/// executable; the binary is not installed here) and man pages are not looked up (they are
/// generated at install time). Skipped without systemd-analyze unless `GPUMESH_REQUIRE_SYSTEMD`
/// (CI sets it).
#[test]
fn unit_verifies_without_a_warning() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(
            std::env::var_os("GPUMESH_REQUIRE_SYSTEMD").is_none(),
            "systemd-analyze is required here (apt-get install systemd)"
        );
        println!("skipping: systemd-analyze is not installed");
        return;
    }
    let original = std::fs::read_to_string(unit_path()).expect("read the unit");
    let unit = original.clone();
    assert!(unit.contains("ExecStart=/usr/bin/gpu-agent run "), "{unit}");
    let agent = bin("gpu-agent");
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = dir.path().join("gpu-agent.service");
    let unit = unit.replace("/usr/bin/gpu-agent", agent.to_str().expect("utf-8 path"));
    std::fs::write(&copy, unit).expect("write the unit");
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&copy)
        .current_dir(dir.path())
        .output()
        .expect("run systemd-analyze");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.trim().is_empty(),
        "systemd-analyze verify: {}\n{text}",
        out.status
    );
    // The settings the agent's notify support and GPU access rely on.
    for line in [
        "Type=notify",
        "WatchdogSec=",
        "Restart=on-failure",
        "KillMode=process",
    ] {
        assert!(original.lines().any(|l| l.starts_with(line)), "{line}");
    }
}

/// Datagrams received on `socket` until `done` holds of one, or `timeout`.
fn receive_until(
    socket: &UnixDatagram,
    got: &mut Vec<String>,
    timeout: Duration,
    done: impl Fn(&str) -> bool,
) -> bool {
    let start = Instant::now();
    let mut buf = vec![0u8; 4096];
    while start.elapsed() < timeout {
        match socket.recv(&mut buf) {
            Ok(n) => {
                let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
                let hit = done(&msg);
                got.push(msg);
                if hit {
                    return true;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("recv: {e}"),
        }
    }
    false
}

fn is_ready(m: &str) -> bool {
    m.lines().any(|l| l == "READY=1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_notifies_ready_only_once_caught_up_then_watchdog_then_stopping() {
    let mut c = Cluster::start(3, 3, "").await;
    // n3 falls behind: stopped, then a write it has not seen.
    c.terminate(3);
    while c.exited(3).is_none() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.label(1, 1, "behind", "yes")
        .await
        .unwrap_or_else(|e| panic!("write: {e}\n{}", c.logs()));
    // Without a majority (n2 down too, n1 down) n3 cannot catch up: it must not say READY.
    c.kill(1);
    c.kill(2);

    let name = format!("gpumesh-notify-test-{}", std::process::id());
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("abstract address");
    let socket = UnixDatagram::bind_addr(&addr).expect("bind the notify socket");
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let agent = c.agents.get_mut(&3).expect("n3");
    agent.env.insert("NOTIFY_SOCKET".into(), format!("@{name}"));
    agent.env.insert("WATCHDOG_USEC".into(), "1000000".into());
    c.start_agent(3);

    let mut got = Vec::new();
    // A quiet window only ever makes this pass more easily on a slow machine, never fail.
    assert!(
        !receive_until(&socket, &mut got, Duration::from_secs(4), is_ready),
        "READY=1 without a quorum to catch up with: {got:?}\n{}",
        c.logs()
    );
    assert!(
        got.iter().any(|m| m == "WATCHDOG=1"),
        "no watchdog ping while waiting (alive, just not ready): {got:?}\n{}",
        c.logs()
    );
    assert!(
        got.iter()
            .any(|m| m.starts_with("STATUS=waiting to catch up")),
        "no STATUS saying why it is not ready: {got:?}"
    );

    c.start_agent(1);
    assert!(
        receive_until(&socket, &mut got, Duration::from_secs(60), is_ready),
        "no READY=1 once a majority was back: {got:?}\n{}",
        c.logs()
    );
    // READY meant caught up: n3's own replica (a stale, local read) has the write it missed.
    let labels = c
        .node(3, 1, true)
        .await
        .unwrap_or_else(|e| panic!("stale read on n3: {e}\n{}", c.logs()))
        .labels;
    assert_eq!(labels.get("behind").map(String::as_str), Some("yes"));

    let pings_before = got.iter().filter(|m| *m == "WATCHDOG=1").count();
    assert!(
        receive_until(&socket, &mut got, Duration::from_secs(30), |m| m
            == "WATCHDOG=1"),
        "no watchdog ping after READY: {got:?}"
    );
    assert!(got.iter().filter(|m| *m == "WATCHDOG=1").count() > pings_before);

    c.terminate(3);
    assert!(
        receive_until(&socket, &mut got, Duration::from_secs(30), |m| m
            .lines()
            .any(|l| l == "STOPPING=1")),
        "no STOPPING=1 on SIGTERM: {got:?}\n{}",
        c.logs()
    );
    assert_eq!(
        got.iter().filter(|m| is_ready(m)).count(),
        1,
        "READY=1 sent more than once: {got:?}"
    );
}
