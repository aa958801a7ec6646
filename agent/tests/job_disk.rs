//! The supervisor's disk handling through the real `gpu-agent shim`, started with the arguments
//! the executor builds: the job's output is capped and rotated per stream while the job runs at
//! full speed; a process the job leaves behind holding its output open does not hold up the
//! outcome; and (as root, on a small tmpfs the test mounts) a job that fills its filesystem
//! still has its outcome recorded.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gpu_agent::config::RunAs;
use gpu_agent::executor::cgroups::CgroupLayout;
use gpu_agent::executor::confine::Confinement;
use gpu_agent::executor::job_dir::{EXIT_RESERVED, JobDir};
use gpu_agent::executor::limits::Limits;
use gpu_agent::executor::{DiskLimits, ExecutorSettings, prepare_run, supervisor_command};
use gpu_raft_store::{JobSpec, Outcome};

/// A jobs directory laid out as an agent's; jobs run as this test's own user.
fn settings(jobs_dir: &Path, log_max: u64) -> ExecutorSettings {
    let lease_path = jobs_dir.with_file_name("lease");
    // The lease timeout below outlasts every test, so the file never needs renewing.
    std::fs::write(&lease_path, "0").expect("lease");
    let me = RunAs {
        name: "me".into(),
        uid: nix::unistd::geteuid().as_raw(),
        gid: nix::unistd::getegid().as_raw(),
    };
    ExecutorSettings {
        jobs_dir: jobs_dir.to_owned(),
        lease_path,
        lease: Duration::from_secs(600),
        stop_grace: Duration::from_secs(2),
        agent_exe: env!("CARGO_BIN_EXE_gpu-agent").into(),
        tick: Duration::from_secs(1),
        run_as: me,
        run_as_by_tenant: Default::default(),
        cgroup_root: "/nonexistent".into(),
        uid_range: Default::default(),
        confine: Default::default(),
        disk: DiskLimits {
            log_max,
            ..DiskLimits::default()
        },
        containers: Default::default(),
    }
}

/// Run `script` under the supervisor as run (job, 1); return its directory, its outcome and
/// how long the supervisor took.
fn supervise(settings: &ExecutorSettings, job: u64, script: &str) -> (JobDir, Outcome, Duration) {
    let spec: JobSpec = serde_json::from_value(serde_json::json!({
        "name": "disk",
        "command": ["sh", "-c", script],
    }))
    .expect("spec");
    let dir = JobDir::new(&settings.jobs_dir, job, 1);
    // Without job cgroups: these tests are about the disk, not limits.
    let plan = Confinement {
        cgroups: CgroupLayout::None {
            reason: "not these tests'".into(),
        },
        limits: Limits::default(),
        devices: Vec::new(),
    };
    let args: Vec<OsString> =
        prepare_run(settings, &spec, &dir, 1, &plan, &[], None).expect("prepare the run");
    let started = Instant::now();
    let mut child = supervisor_command(&settings.agent_exe, &args)
        .spawn()
        .expect("spawn the supervisor");
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if started.elapsed() > Duration::from_secs(60) {
            child.kill().ok();
            child.wait().ok();
            panic!("the supervisor did not finish");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "the supervisor failed: {status}");
    let outcome = dir.exit().expect("exit.json is written");
    (dir, outcome, started.elapsed())
}

fn tempdir() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod tempdir");
    tmp
}

fn jobs_dir(root: &Path) -> PathBuf {
    let dir = root.join("jobs");
    std::fs::create_dir_all(&dir).expect("jobs dir");
    dir
}

fn size(path: &Path) -> u64 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .len()
}

#[test]
fn each_stream_keeps_at_most_two_files_within_the_cap() {
    let tmp = tempdir();
    let cap = 16 * 1024;
    let s = settings(&jobs_dir(tmp.path()), cap);
    // 2,000 numbered lines on each stream (~90 KB each, far past 2 x 16 KiB), then a last one.
    let script = "i=0; while [ $i -lt 2000 ]; do \
                  echo \"stdout line $i of the job's output, padded...........\"; \
                  echo \"stderr line $i\" >&2; i=$((i+1)); done; \
                  echo LAST-OUT; echo LAST-ERR >&2";
    let (dir, outcome, _) = supervise(&s, 1, script);
    assert_eq!(outcome, Outcome::Exited { code: 0 });
    for (current, last) in [(dir.stdout(), "LAST-OUT\n"), (dir.stderr(), "LAST-ERR\n")] {
        let rotated = PathBuf::from(format!("{}.1", current.display()));
        assert!(size(&current) <= cap, "{}", current.display());
        assert_eq!(size(&rotated), cap, "a rotated file is full to the cap");
        let newest = std::fs::read_to_string(&current).expect("read");
        assert!(newest.ends_with(last), "{newest:?}");
    }
    let mut names: Vec<String> = std::fs::read_dir(&dir.path)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".log"))
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "stderr.log",
            "stderr.log.1",
            "stderr.log.base",
            "stdout.log",
            "stdout.log.1",
            "stdout.log.base"
        ]
    );
    // The outcome was written over the space reserved at the start.
    assert_eq!(size(&dir.path.join("exit.json")), EXIT_RESERVED as u64);
}

#[test]
fn a_job_is_not_slowed_by_its_logging_and_a_leftover_process_does_not_hold_the_outcome() {
    let tmp = tempdir();
    let s = settings(&jobs_dir(tmp.path()), 64 * 1024);
    // 64 MiB of output, as fast as the job can write it.
    let (dir, outcome, took) = supervise(&s, 1, "head -c 67108864 /dev/zero; echo done >&2");
    assert_eq!(outcome, Outcome::Exited { code: 0 });
    assert!(size(&dir.stdout()) <= 64 * 1024);
    assert!(
        std::fs::read_to_string(dir.stderr())
            .expect("stderr")
            .contains("done\n")
    );
    eprintln!(
        "64 MiB of output through a 64 KiB cap took {took:?}; stderr.log: {:?}",
        std::fs::read_to_string(dir.stderr()).unwrap_or_default()
    );
    // A background process keeps stdout open after the job's main process exits: the outcome
    // is recorded after the drain limit (2 s), not when that process ends (30 s).
    let (_, outcome, took) = supervise(&s, 2, "sleep 30 & echo started");
    assert_eq!(outcome, Outcome::Exited { code: 0 });
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

/// A tmpfs of `size` mounted at `path` for the test's life (unmounted even if it fails).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(path: &Path, size: &str) -> Tmpfs {
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(path)
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mount tmpfs at {}: {status}",
            path.display()
        );
        Tmpfs(path.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: a process still holding a file there must not leave the mount behind.
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

#[test]
fn a_job_that_fills_its_filesystem_still_has_its_outcome_recorded() {
    if !is_root() {
        return;
    }
    let tmp = tempdir();
    let jobs = jobs_dir(tmp.path());
    let _fs = Tmpfs::mount(&jobs, "8m");
    let s = settings(&jobs, 1024 * 1024);
    let (dir, outcome, _) = supervise(
        &s,
        1,
        "dd if=/dev/zero of=big bs=64k 2>/dev/null; echo \"dd: $?\"; echo after >&2; exit 3",
    );
    // dd stopped at ENOSPC; the job went on and exited 3, and that is what was recorded.
    assert_eq!(outcome, Outcome::Exited { code: 3 });
    assert_eq!(
        gpu_agent::executor::job_dir::JobDir::new(&jobs, 1, 1).exit(),
        Some(Outcome::Exited { code: 3 })
    );
    // Its output after the disk filled could not be kept (and the filesystem is still full).
    // stdout.log had no page yet; stderr.log may have room left in the page that holds the
    // supervisor's notices, so it proves nothing here.
    let free = nix::sys::statvfs::statvfs(&jobs).expect("statvfs");
    assert_eq!(free.blocks_available(), 0, "the job filled the filesystem");
    assert!(
        !std::fs::read_to_string(dir.stdout())
            .unwrap_or_default()
            .contains("dd:"),
        "nothing could be written once it was full"
    );
    // Space freed: the next run on that filesystem writes its output again.
    std::fs::remove_file(dir.path.join("work/big")).expect("free the space");
    let (dir, outcome, _) = supervise(&s, 2, "echo fine");
    assert_eq!(outcome, Outcome::Exited { code: 0 });
    assert_eq!(
        std::fs::read_to_string(dir.stdout()).expect("stdout"),
        "fine\n"
    );
}
