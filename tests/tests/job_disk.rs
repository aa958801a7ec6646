//! Job disk use on real agents: a job that fills its node's jobs filesystem (a small tmpfs the
//! test mounts) ends with its outcome reported while its agent keeps serving and the mesh keeps
//! accepting writes, and the node then refuses new runs with the "full" reason until space is
//! freed; a job's logs stay within `jobs.log_max` (two files per stream) and `job logs` returns
//! the newest output; an ended, reported run's directory is removed after
//! `jobs.keep_finished_runs` while a running one stays.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_proto::v1::job_service_client::JobServiceClient;
use gpu_tests::{AgentCommand, Cluster, Placement, is_terminal, records, shell_job};

/// A tmpfs of `size` mounted at `path` for the test's life, unmounted even when it fails.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(path: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(path).expect("mount point");
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0711"),
                "tmpfs",
            ])
            .arg(path)
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mount a tmpfs at {}: {status}",
            path.display()
        );
        Tmpfs(path.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: a supervisor still holding a file there must not leave the mount behind.
        Command::new("umount").arg("-l").arg(&self.0).status().ok();
    }
}

fn is_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("GPUMESH_REQUIRE_ROOT").is_none(),
        "GPUMESH_REQUIRE_ROOT is set but this test is not root"
    );
    eprintln!("SKIPPED: mounting a tmpfs needs root, and this test is not root");
    false
}

/// Add `keys` to the `[jobs]` table of agent `id`'s config (before it first starts).
fn add_job_keys(c: &Cluster, id: u64, keys: &str) {
    let config = &c.agents[&id].config;
    let text = std::fs::read_to_string(config).expect("config");
    assert!(text.contains("[jobs]\n"), "{text}");
    std::fs::write(
        config,
        text.replacen("[jobs]\n", &format!("[jobs]\n{keys}"), 1),
    )
    .expect("config");
}

/// A job pinned to n3, the only node with T4s.
fn on_n3(name: &str, script: &str) -> pb::JobSpec {
    pb::JobSpec {
        gpu_types: vec!["T4".into()],
        ..shell_job(name, 1, script)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_fills_its_jobs_filesystem_leaves_the_agent_serving() {
    if !is_root() {
        return;
    }
    // Mounted before the cluster starts and unmounted after its agents are gone.
    let scratch = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o711))
        .expect("chmod");
    let n3_jobs = scratch.path().join("n3-jobs");
    let _tmpfs = Tmpfs::mount(&n3_jobs, "16m");
    let placements = (0..3).map(|_| Placement::loopback()).collect();
    let c = Cluster::start_prepared(3, "", placements, AgentCommand::default(), |c| {
        add_job_keys(c, 3, &format!("dir = {n3_jobs:?}\nmin_free = \"1MiB\"\n"));
    })
    .await;
    records::prepare_dir(c.root.path()).expect("let job users through the root");

    // 1. The job fills the filesystem (dd stops at ENOSPC), says so, and exits 0.
    let fill = c
        .submit(
            1,
            on_n3(
                "fill",
                "dd if=/dev/zero of=big bs=1M; echo \"dd: $?\"; exit 0",
            ),
            "fill",
        )
        .await
        .expect("submit")
        .job_id;
    let done = c.wait_job(fill, Duration::from_secs(60), is_terminal).await;
    assert_eq!(
        (done.state, done.outcome.as_str(), done.node_id),
        (
            pb::JobState::Succeeded as i32,
            "exited with code 0",
            Some(3)
        ),
        "{}",
        done.reason
    );
    let free = nix::sys::statvfs::statvfs(&n3_jobs).expect("statvfs");
    assert!(
        free.blocks_available() * free.fragment_size() < 1 << 20,
        "the job filled the jobs filesystem"
    );

    // 2. n3 keeps serving, and the mesh (through n3 too) accepts writes.
    c.status(3, false)
        .await
        .expect("n3 answers a linearizable read");
    c.label(3, 3, "disk", "full")
        .await
        .expect("a write through n3");
    let node = c.node(1, 3, false).await.expect("n3's record");
    assert_eq!(node.status, pb::NodeStatus::Ready as i32);

    // 3. The next run on n3 does not start on the full filesystem: it fails with the reason
    //    (the filled run's scratch is kept until jobs.keep_finished_runs, 7 days by default).
    let next = c
        .submit(1, on_n3("next", "echo never"), "next")
        .await
        .expect("submit")
        .job_id;
    let refused = c.wait_job(next, Duration::from_secs(30), is_terminal).await;
    assert_eq!(refused.state, pb::JobState::Failed as i32);
    assert!(
        refused.outcome.contains("the jobs filesystem")
            && refused.outcome.contains("is full")
            && refused.outcome.contains("jobs.min_free"),
        "{}",
        refused.outcome
    );

    // 4. Space freed: n3 runs jobs again, outcome and output intact.
    let fill_dir = n3_jobs.join(format!("j-{fill}-g{}", done.generation));
    std::fs::remove_file(fill_dir.join("work/big")).expect("free the space");
    let after = c
        .submit(1, on_n3("after", "echo fine"), "after")
        .await
        .expect("submit")
        .job_id;
    let ok = c
        .wait_job(after, Duration::from_secs(30), is_terminal)
        .await;
    assert_eq!(ok.state, pb::JobState::Succeeded as i32, "{}", ok.outcome);
    assert_eq!(logs(&c, 1, after, pb::LogStream::Stdout).await.1, b"fine\n");
    assert!(
        c.log_of(3)
            .contains("the jobs directory has a filesystem of its own"),
        "the agent says where runs live"
    );
}

/// Job `id`'s whole log stream through agent `via`: (bytes skipped, bytes).
async fn logs(c: &Cluster, via: u64, id: u64, stream: pb::LogStream) -> (u64, Vec<u8>) {
    let mut client = JobServiceClient::new(c.channel(via).await.expect("channel"));
    let mut chunks = client
        .job_logs(pb::JobLogsRequest {
            job_id: id,
            stream: stream as i32,
            follow: false,
            offset: 0,
            ..Default::default()
        })
        .await
        .expect("job logs")
        .into_inner();
    let (mut skipped, mut data) = (0, Vec::new());
    while let Some(chunk) = chunks.message().await.expect("chunk") {
        skipped += chunk.skipped;
        data.extend(chunk.data);
    }
    (skipped, data)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_stay_within_the_cap_and_ended_runs_are_removed() {
    const CAP: u64 = 16 * 1024;
    let c = Cluster::start(
        2,
        1,
        "[jobs]\nlease = \"2s\"\ndown_after = \"4s\"\nstop_grace = \"2s\"\n\
         log_max = \"16KiB\"\nkeep_finished_runs = \"6s\"\n",
    )
    .await;
    records::prepare_dir(c.root.path()).expect("let job users through the root");
    let jobs_dir = |node: u64| c.root.path().join(format!("node-{node}-jobs"));

    let sleeper = c
        .submit(1, shell_job("sleeper", 0, "sleep 120"), "sleeper")
        .await
        .expect("submit")
        .job_id;
    let running = c
        .wait_job(sleeper, Duration::from_secs(60), |j| {
            j.state == pb::JobState::Running as i32
        })
        .await;
    let sleeper_dir = jobs_dir(running.node_id.expect("placed"))
        .join(format!("j-{sleeper}-g{}", running.generation));

    // ~100 KB on each stream, far past two files of 16 KiB.
    let script = "i=0; while [ $i -lt 2000 ]; do \
                  echo \"stdout line $i of the job's output, padded..........\"; \
                  echo \"stderr line $i\" >&2; i=$((i+1)); done; \
                  echo LAST-OUT; echo LAST-ERR >&2";
    let chatty = c
        .submit(2, shell_job("chatty", 0, script), "chatty")
        .await
        .expect("submit")
        .job_id;
    let done = c
        .wait_job(chatty, Duration::from_secs(60), is_terminal)
        .await;
    assert_eq!(
        done.state,
        pb::JobState::Succeeded as i32,
        "{}",
        done.outcome
    );
    let run_dir =
        jobs_dir(done.node_id.expect("ran")).join(format!("j-{chatty}-g{}", done.generation));
    for stream in ["stdout", "stderr"] {
        for file in [format!("{stream}.log"), format!("{stream}.log.1")] {
            let len = std::fs::metadata(run_dir.join(&file))
                .unwrap_or_else(|e| panic!("{file}: {e}"))
                .len();
            assert!(len <= CAP, "{file} is {len} bytes");
        }
        assert!(!run_dir.join(format!("{stream}.log.2")).exists());
    }
    // Through either agent: the newest output, after what was rotated away.
    let stdout_total = (0..2000)
        .map(|i: u32| format!("stdout line {i} of the job's output, padded..........\n").len())
        .sum::<usize>()
        + "LAST-OUT\n".len();
    for via in [1, 2] {
        let (skipped, out) = logs(&c, via, chatty, pb::LogStream::Stdout).await;
        assert!(out.ends_with(b"LAST-OUT\n") && out.len() as u64 <= 2 * CAP);
        assert_eq!(
            skipped as usize + out.len(),
            stdout_total,
            "offsets span the whole stream"
        );
        let (_, err) = logs(&c, via, chatty, pb::LogStream::Stderr).await;
        assert!(
            err.ends_with(b"LAST-ERR\n"),
            "{}",
            String::from_utf8_lossy(&err)
        );
    }

    // The ended, reported run goes after keep_finished_runs (6 s, swept every second); the
    // running one stays.
    c.wait_for(
        "the chatty run's directory to be removed",
        Duration::from_secs(30),
        |_| {
            let gone = !run_dir.exists();
            async move { gone }
        },
    )
    .await;
    assert!(
        sleeper_dir.join("shim.pid").exists(),
        "the running run is kept"
    );
    let mut client = JobServiceClient::new(c.channel(1).await.expect("channel"));
    // Refused when the call is made (or, from an older agent, as the stream's first message).
    let err = match client
        .job_logs(pb::JobLogsRequest {
            job_id: chatty,
            ..Default::default()
        })
        .await
    {
        Err(e) => e,
        Ok(stream) => stream
            .into_inner()
            .message()
            .await
            .expect_err("no log any more"),
    };
    assert_eq!(err.code(), tonic::Code::NotFound, "{err}");
    assert!(err.message().contains("jobs.keep_finished_runs"), "{err}");
    c.cancel(1, sleeper).await.expect("cancel");
    c.wait_job(sleeper, Duration::from_secs(60), is_terminal)
        .await;
}
