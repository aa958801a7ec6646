//! `gpuctl run`, the real binary against real agents: it streams the job's stdout to stdout and
//! its stderr to stderr and exits with the job's exit code; SIGINT (Ctrl-C) cancels the job,
//! and gpuctl exits non-zero once it has stopped.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use gpu_proto::v1 as pb;
use gpu_tests::{Cluster, is_terminal};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Kills the child if the test fails before it has exited.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpuctl_run_streams_the_job_and_exits_with_its_code_and_ctrl_c_cancels() {
    let c = Cluster::start(3, 3, "").await;

    // Phase 1: output on both streams, exit code 3.
    let out = c
        .gpuctl()
        .args(["--endpoint", c.addr(2), "run", "--"])
        .args(["sh", "-c", "echo hi; echo oops >&2; exit 3"])
        .output()
        .expect("run gpuctl");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(
        out.status.code(),
        Some(3),
        "stdout {stdout:?}, stderr {stderr:?}"
    );
    assert_eq!(
        stdout, "hi\n",
        "only the job's stdout on stdout; stderr {stderr:?}"
    );
    assert!(
        stderr.contains("oops\n"),
        "the job's stderr on stderr: {stderr:?}"
    );
    assert!(
        stderr.contains("submitted j-") && stderr.contains("exited with code 3"),
        "progress and the outcome on stderr: {stderr:?}"
    );

    // Phase 2: a job that succeeds exits 0.
    let ok = c
        .gpuctl()
        .args(["--endpoint", c.addr(1), "run", "--gpus", "1", "--", "true"])
        .output()
        .expect("run gpuctl");
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );

    // Phase 3: SIGINT to a running `gpuctl run` cancels its job.
    let child = c
        .gpuctl()
        .args(["--endpoint", c.addr(3), "run", "--", "sleep", "600"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start gpuctl run");
    let mut child = Reaped(child);
    let stderr = child.0.stderr.take().expect("stderr");
    // Read its progress lines until the job is bound, then keep draining them.
    let (lines_tx, lines_rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let id: u64 = loop {
        let line = lines_rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("no progress from gpuctl run ({e}): {seen:?}"));
        seen.push(line.clone());
        if let Some(rest) = line.strip_prefix("gpuctl: j-")
            && rest.contains("bound to")
        {
            break rest
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .expect("a job id");
        }
    };
    c.wait_job(id, Duration::from_secs(30), |j| {
        j.state == pb::JobState::Running as i32
    })
    .await;
    let pid = Pid::from_raw(i32::try_from(child.0.id()).expect("pid"));
    kill(pid, Signal::SIGINT).expect("SIGINT to gpuctl");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.0.try_wait().expect("wait for gpuctl") {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "gpuctl run did not exit after SIGINT: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    seen.extend(lines_rx.try_iter());
    assert!(!status.success(), "{status:?}: {seen:?}");
    assert_eq!(status.code(), Some(130), "{seen:?}");
    let job = c.wait_job(id, Duration::from_secs(30), is_terminal).await;
    assert_eq!(job.state, pb::JobState::Cancelled as i32, "{job:?}");
    assert!(
        seen.iter().any(|l| l.contains("cancelling")),
        "it said it was cancelling: {seen:?}"
    );
}
