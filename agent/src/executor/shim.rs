//! `gpu-agent shim`: the per-run supervisor. The agent starts it (as a process-group leader,
//! with the job's environment); it starts the job in a process group of its own, waits for it,
//! and writes how it ended to `exit.json`. Because it outlives agent restarts, a restarted agent
//! can still learn every run's outcome.
//!
//! It also enforces what must hold even when the agent is gone: the wall-time limit, and
//! self-fencing — when the agent stops renewing the node's lease file (it lost contact with the
//! cluster, or died), the job is stopped before the leader can place it elsewhere.

use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use gpu_raft_store::Outcome;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::Command;
use tokio::signal::unix::{SignalKind, signal};

use super::job_dir::JobDir;

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
    #[arg(long)]
    pub workdir: Option<PathBuf>,
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
    if let Err(e) = dir.write_shim_pid(std::process::id()) {
        return Outcome::FailedToStart {
            message: format!("recording the supervisor pid: {e}"),
        };
    }
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            return Outcome::FailedToStart {
                message: format!("installing SIGTERM handler: {e}"),
            };
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
        (Err(e), _) | (_, Err(e)) => {
            return Outcome::FailedToStart {
                message: format!("opening log files: {e}"),
            };
        }
    };
    let program = &args.command[0];
    let mut child = match Command::new(program)
        .args(&args.command[1..])
        .current_dir(args.workdir.as_deref().unwrap_or(&dir.path))
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            return Outcome::FailedToStart {
                message: format!("{program}: {e}"),
            };
        }
    };
    let Some(group) = child
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .map(|p| Pid::from_raw(-p))
    else {
        return Outcome::FailedToStart {
            message: "the job exited before it could be supervised".into(),
        };
    };
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
    let status = match tokio::time::timeout(args.grace, child.wait()).await {
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
