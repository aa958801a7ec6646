//! `gpu-agent shim`: the per-run supervisor. The agent starts it (as a process-group leader,
//! with the job's environment); it starts the job in a process group of its own, waits for it,
//! and writes how it ended to `exit.json`. Because it outlives agent restarts, a restarted agent
//! can still learn every run's outcome.
//!
//! The job runs as the configured unprivileged user, in the run's cgroup with its CPU and memory
//! limits when the node has cgroup v2 (see `isolation`), or in the run's systemd unit
//! (`--systemd-unit`), whose cgroup and limits are systemd's; the supervisor itself keeps the
//! agent's user, so it can always write `exit.json` and signal the job.
//!
//! It also enforces what must hold even when the agent is gone: the wall-time limit, and
//! self-fencing — when the agent stops renewing the node's lease file (it lost contact with the
//! cluster, or died), the job is stopped before the leader can place it elsewhere.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use gpu_raft_store::Outcome;
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, getegid, geteuid};
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};

use super::isolation::{self, JobCgroup};
use super::job_dir::{JobDir, Supervisor};

#[derive(Debug, clap::Args)]
pub struct ShimArgs {
    /// The run's directory (`j-<id>-g<generation>`).
    #[arg(long)]
    pub job_dir: PathBuf,
    /// The node lease file the agent touches while it is in contact with the cluster.
    #[arg(long)]
    pub lease: PathBuf,
    #[arg(long, value_parser = humantime::parse_duration)]
    pub lease_timeout: Duration,
    /// Time between SIGTERM and SIGKILL.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub grace: Duration,
    #[arg(long, value_parser = humantime::parse_duration)]
    pub wall_time: Option<Duration>,
    /// Must exist [default: the job's `work/` directory].
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// Run the job (not the supervisor) as this user id.
    #[arg(long, requires = "run_as_gid")]
    pub run_as_uid: Option<u32>,
    /// Run the job as this group id; supplementary groups are dropped.
    #[arg(long, requires = "run_as_uid")]
    pub run_as_gid: Option<u32>,
    /// The run's cgroup, created here and removed when the job has ended. Absent when the node
    /// has no usable cgroup v2: limits are then noted in stderr.log as not enforced.
    #[arg(long)]
    pub cgroup: Option<PathBuf>,
    /// This run is systemd transient unit NAME: systemd owns its cgroup and enforces its
    /// limits and device allow-list, so the supervisor makes no cgroup of its own.
    #[arg(long, value_name = "NAME", conflicts_with = "cgroup")]
    pub systemd_unit: Option<String>,
    /// CPU limit, thousandths of a core.
    #[arg(long)]
    pub cpu_millis: Option<u32>,
    /// Memory limit, MiB.
    #[arg(long)]
    pub memory_mib: Option<u64>,
    /// The job's argv.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

const CHECK_EVERY: Duration = Duration::from_millis(250);

pub fn run(args: ShimArgs) -> ExitCode {
    let Some((dir, job, generation)) = parse_dir(&args.job_dir) else {
        eprintln!("shim: {} is not a job directory", args.job_dir.display());
        return ExitCode::from(2);
    };
    let dir = JobDir {
        path: dir,
        job,
        generation,
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("shim: starting the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let outcome = runtime.block_on(supervise(&dir, &args));
    match dir.write_exit(&outcome) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shim: writing the outcome of {}: {e}", dir.path.display());
            ExitCode::from(2)
        }
    }
}

fn parse_dir(path: &std::path::Path) -> Option<(PathBuf, u64, u64)> {
    let name = path.file_name()?.to_str()?;
    let (job, generation) = name.strip_prefix("j-")?.split_once("-g")?;
    Some((path.to_owned(), job.parse().ok()?, generation.parse().ok()?))
}

enum Stop {
    Requested,
    Fenced,
    WallTime,
}

async fn supervise(dir: &JobDir, args: &ShimArgs) -> Outcome {
    let failed = |message: String| Outcome::FailedToStart { message };
    if let Err(e) = Supervisor::current().and_then(|me| dir.write_supervisor(&me)) {
        return failed(format!("recording the supervisor pid: {e}"));
    }
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => return failed(format!("installing SIGTERM handler: {e}")),
    };
    // The run directory (pid, stop request, outcome, logs) stays the supervisor's; the job may
    // pass through it to `work/`, which is its own.
    let work = isolation::work_dir(&dir.path);
    let owner = args.run_as_uid.zip(args.run_as_gid);
    let prepared = std::fs::set_permissions(&dir.path, std::fs::Permissions::from_mode(0o711))
        .and_then(|()| isolation::prepare_work_dir(&work, owner));
    if let Err(e) = prepared {
        return failed(format!(
            "preparing the job's directory {}: {e}",
            work.display()
        ));
    }
    let cwd = match &args.workdir {
        None => work,
        Some(w) if w.is_dir() => w.clone(),
        Some(w) if w.exists() => {
            return failed(format!("workdir {} is not a directory", w.display()));
        }
        Some(w) => {
            return failed(format!(
                "workdir {} does not exist on this node",
                w.display()
            ));
        }
    };
    let open = |path: PathBuf| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    };
    let (stdout, stderr) = match (open(dir.stdout()), open(dir.stderr())) {
        (Ok(o), Ok(e)) => (o, e),
        (Err(e), _) | (_, Err(e)) => return failed(format!("opening log files: {e}")),
    };
    // The supervisor's own notices go to the job's stderr.log, where its user looks.
    let mut notes = match stderr.try_clone() {
        Ok(f) => f,
        Err(e) => return failed(format!("opening log files: {e}")),
    };
    let limited = args.cpu_millis.is_some() || args.memory_mib.is_some();
    let cgroup = match &args.cgroup {
        Some(path) => match JobCgroup::create(path, args.cpu_millis, args.memory_mib) {
            Ok(cg) => Some(cg),
            Err(e) if limited => return failed(e),
            Err(e) => {
                writeln!(
                    notes,
                    "gpumesh: {e}; the job runs without a cgroup of its own"
                )
                .ok();
                None
            }
        },
        None if args.systemd_unit.is_some() => None,
        None => {
            if let Some(notice) = isolation::not_enforced_notice(args.cpu_millis, args.memory_mib) {
                notes.write_all(notice.as_bytes()).ok();
            }
            None
        }
    };
    let program = &args.command[0];
    let mut cmd = Command::new(program);
    cmd.args(&args.command[1..])
        .current_dir(&cwd)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0);
    // Only the job changes user. Switching uid as root also drops the supplementary groups
    // (std calls setgroups(0) when no groups are given), so the job keeps none of ours.
    if let Some(uid) = args.run_as_uid.filter(|u| *u != geteuid().as_raw()) {
        cmd.uid(uid);
    }
    if let Some(gid) = args.run_as_gid.filter(|g| *g != getegid().as_raw()) {
        cmd.gid(gid);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let mut message = format!("{program}: {e}");
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                let uid = args.run_as_uid.unwrap_or_else(|| geteuid().as_raw());
                message.push_str(&format!(" (as uid {uid}, in {})", cwd.display()));
            }
            if let Some(cg) = &cgroup {
                cg.remove().await.ok();
            }
            return failed(message);
        }
    };
    let Some(pid) = child.id() else {
        if let Some(cg) = &cgroup {
            cg.remove().await.ok();
        }
        return failed("the job exited before it could be supervised".into());
    };
    let Ok(group) = i32::try_from(pid).map(|p| Pid::from_raw(-p)) else {
        return failed(format!("pid {pid} out of range"));
    };
    if let Some(cg) = &cgroup {
        // The job runs from the moment spawn returns, so a process it forks at once starts in
        // our cgroup; sweeping its process group right after moving it catches those. Still
        // uncovered: a child that leaves the process group within that first moment. (Closing
        // the gap needs clone3(CLONE_INTO_CGROUP) or a pre_exec hook.)
        if let Err(e) = cg.add(pid) {
            kill(group, Signal::SIGKILL).ok();
            child.wait().await.ok();
            cg.remove().await.ok();
            return failed(format!(
                "moving the job into its cgroup {}: {e}",
                cg.path.display()
            ));
        }
        cg.adopt_group(pid);
    }
    let outcome = watch(&mut child, group, dir, args, &mut term).await;
    if let Some(cg) = &cgroup
        && let Err(e) = cg.remove().await
    {
        writeln!(notes, "gpumesh: {e}").ok();
    }
    outcome
}

/// Wait for the job, stopping it on request, at its wall-time limit or when the lease expires.
async fn watch(
    child: &mut Child,
    group: Pid,
    dir: &JobDir,
    args: &ShimArgs,
    term: &mut tokio::signal::unix::Signal,
) -> Outcome {
    let started = Instant::now();
    let stop = loop {
        tokio::select! {
            status = child.wait() => return match status {
                Ok(s) => exit_outcome(s),
                Err(e) => Outcome::Lost { message: format!("waiting for the job: {e}") },
            },
            _ = term.recv() => break Stop::Requested,
            () = tokio::time::sleep(CHECK_EVERY) => {
                if args.wall_time.is_some_and(|limit| started.elapsed() >= limit) {
                    break Stop::WallTime;
                }
                if lease_expired(&args.lease, args.lease_timeout) {
                    break Stop::Fenced;
                }
            }
        }
    };
    kill(group, Signal::SIGTERM).ok();
    let status = match tokio::time::timeout(stop_grace(&stop, args), child.wait()).await {
        Ok(status) => status.ok(),
        Err(_) => {
            kill(group, Signal::SIGKILL).ok();
            child.wait().await.ok()
        }
    };
    match stop {
        Stop::WallTime => Outcome::WallTimeExceeded,
        Stop::Fenced => Outcome::Fenced,
        Stop::Requested => match dir.stop_reason() {
            Some(reason) => reason.outcome(),
            None => status.map_or(
                Outcome::Signaled {
                    signal: Signal::SIGTERM as i32,
                },
                exit_outcome,
            ),
        },
    }
}

/// SIGTERM → SIGKILL time. A fenced run must be gone before the leader, waiting `down_after`
/// (≥ 1.5 × lease) from the same lost contact, places it again; fencing starts up to
/// `CHECK_EVERY` after the lease ran out, so its grace is at most a quarter of the lease.
fn stop_grace(stop: &Stop, args: &ShimArgs) -> Duration {
    match stop {
        Stop::Fenced => args.grace.min(args.lease_timeout / 4),
        Stop::Requested | Stop::WallTime => args.grace,
    }
}

fn exit_outcome(status: std::process::ExitStatus) -> Outcome {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => Outcome::Exited { code },
        (None, Some(signal)) => Outcome::Signaled { signal },
        (None, None) => Outcome::Lost {
            message: format!("unrecognised exit status {status}"),
        },
    }
}

/// The lease is expired when its file is missing or older than `timeout`.
fn lease_expired(lease: &std::path::Path, timeout: Duration) -> bool {
    super::lease::lease_age(lease).is_none_or(|age| age > timeout)
}
