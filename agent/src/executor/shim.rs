//! `gpu-agent shim`: the per-run supervisor. The agent starts it (as a process-group leader,
//! with a fixed minimal environment); it starts the job in a process group of its own, with the
//! job's environment from the run's `env.json` (see `job_env`), writes the job's output to its
//! logs (`log_writer`: capped, rotated, never blocking the job), waits for it, and writes how
//! it ended to `exit.json` (space reserved first, so a full disk cannot lose it). Because it
//! outlives agent restarts, a restarted agent can still learn every run's outcome.
//!
//! The job runs as the user the executor chose (its uid, gid and supplementary groups, see
//! `identity`), in the run's cgroups with its CPU, memory
//! and task limits and its device fence, entered before it execs (see `cgroups`); the
//! supervisor itself keeps the agent's user and cgroups, so it can always write `exit.json` and
//! signal the job. A job the memory cgroup's OOM killer ended is "out of memory". A run started
//! as a systemd unit (`--systemd-unit`) is in the unit's cgroup, whose limits and device
//! allow-list are systemd's: the supervisor makes none of its own.
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
use nix::unistd::{Pid, geteuid};
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};

use super::cgroups::{CgroupLayout, RunCgroups, V1Root};
use super::container_cmd::{self, ContainerRun, SignalCommand};
use super::device_fence::DeviceRule;
use super::image_pull::{self, Pulled};
use super::job_dir::{JobDir, StopReason, Supervisor};
use super::limits::{self, Enforced, Limits};
use super::log_writer::JobLogs;
use super::pull_progress::PullProgress;
use super::{container_supervise, identity, isolation, job_env, pre_exec, registry_auth};
use crate::run_cgroup_name::cgroup_name;

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
    /// Run the job as this group id.
    #[arg(long, requires = "run_as_uid")]
    pub run_as_gid: Option<u32>,
    /// The job's supplementary groups (gids, comma-separated) [default: none].
    #[arg(long, requires = "run_as_uid", value_delimiter = ',')]
    pub run_as_groups: Vec<u32>,
    /// The cgroup v2 directory the run's cgroup is created in (and removed from when the job
    /// has ended).
    #[arg(long, conflicts_with = "cgroup_v1")]
    pub cgroup_v2: Option<PathBuf>,
    /// `CONTROLLER=DIR`, once per cgroup v1 hierarchy: where the run's cgroup of that
    /// controller is created. With neither flag, limits and the device fence are noted in
    /// stderr.log as not enforced.
    #[arg(long)]
    pub cgroup_v1: Vec<V1Root>,
    /// Each log file (stdout.log, stderr.log) is rotated at this many bytes.
    #[arg(long, default_value_t = crate::config::DEFAULT_LOG_MAX.0)]
    pub log_max: u64,
    /// This run is systemd transient unit NAME: systemd owns its cgroup and enforces its
    /// limits and device allow-list, so the supervisor makes no cgroup of its own.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["cgroup_v2", "cgroup_v1"])]
    pub systemd_unit: Option<String>,
    /// CPU limit, thousandths of a core.
    #[arg(long)]
    pub cpu_millis: Option<u32>,
    /// Memory limit, MiB.
    #[arg(long)]
    pub memory_mib: Option<u64>,
    /// Most processes and threads.
    #[arg(long)]
    pub tasks_max: Option<u64>,
    /// A device the job may open (`c 195:0 rwm`), once per rule: with a devices cgroup, all
    /// others are denied.
    #[arg(long)]
    pub allow_device: Vec<DeviceRule>,
    /// Run the command in a container image, as the run directory's `container.json` says.
    #[arg(long)]
    pub container: bool,
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
    // First, while there is room: the outcome must be recordable even once the job has filled
    // the disk. Without the reservation it is still written, if there is room then.
    let reserved = dir.reserve_exit();
    let outcome = match reserved {
        Ok(()) => runtime.block_on(supervise(&dir, &args)),
        Err(e) => Outcome::FailedToStart {
            message: format!("reserving {}: {e}", dir.path.join("exit.json").display()),
        },
    };
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
    // Only the job gets its environment, and only the job changes user.
    let env = match job_env::read(&dir.path, geteuid().as_raw()) {
        Ok(env) => env,
        Err(e) => return failed(e),
    };
    let target = owner.map(|(uid, gid)| (uid, gid, args.run_as_groups.as_slice()));
    let switch = match identity::switch_for(target, geteuid().as_raw()) {
        Ok(s) => s,
        Err(e) => return failed(e),
    };
    // The job writes into pipes; the supervisor writes the logs, capped and rotated, and
    // finishes them (waiting for the job's last output) when `logs` is dropped, before the
    // outcome is recorded.
    let (logs, pipes) = match JobLogs::start(&dir.stdout(), &dir.stderr(), args.log_max) {
        Ok(started) => started,
        Err(e) => return failed(format!("opening log files: {e}")),
    };
    // The supervisor's own notices go to the job's stderr.log, where its user looks.
    let mut notes = logs.notes();
    let asked = Limits {
        cpu_millis: args.cpu_millis,
        memory_mib: args.memory_mib,
        tasks_max: args.tasks_max,
    };
    let container = match args.container.then(|| container_supervise::read(&dir.path)) {
        None => None,
        Some(Ok(run)) => Some(run),
        Some(Err(e)) => return failed(e),
    };
    // A rootful runtime's container gets the runtime's own device cgroup (only its devices),
    // nested in the run's cgroups for the limits: the run's own device fence would refuse the
    // runtime's rules.
    let rootful = container.as_ref().is_some_and(|c| c.runtime.is_rootful());
    let mut layout = CgroupLayout::from_flags(args.cgroup_v2.as_deref(), &args.cgroup_v1);
    let mut allow_device = args.allow_device.as_slice();
    if rootful {
        layout = layout.without_device_fence();
        allow_device = &[];
    }
    let name = cgroup_name(dir.job, dir.generation, std::process::id());
    let cgroups = match RunCgroups::create(&layout, &name, &asked, allow_device) {
        Ok(c) => c,
        Err(e) => return failed(e),
    };
    let enforced = cgroups
        .as_ref()
        .map_or(Enforced::default(), RunCgroups::enforced);
    let why = match &layout {
        CgroupLayout::V1 { .. } => "this node's cgroup v1 lacks a hierarchy",
        _ => "this node has no job cgroups",
    };
    // In a systemd unit the unit's cgroup carries the limits and the device allow-list.
    let notices = args.systemd_unit.is_none();
    if let Some(notice) = limits::unenforced_notice(&asked, enforced, why).filter(|_| notices) {
        notes.write_all(notice.as_bytes()).ok();
    }
    if let Some(why) = layout.unfenced_reason().filter(|_| notices && !rootful) {
        notes
            .write_all(limits::unfenced_notice(&why).as_bytes())
            .ok();
    }
    let procs = cgroups
        .as_ref()
        .map(RunCgroups::procs_files)
        .unwrap_or_default();
    // The job enters its cgroups before it execs, while still root: no process of it ever runs
    // outside them. Then groups, gid, uid and the working directory, in the child: exactly the
    // job's groups, none of ours. (The cgroup hook must stay ahead of the one that switches
    // user.)
    let as_job = |cmd: &mut Command| {
        pre_exec::enter_cgroups(cmd, &procs)?;
        identity::become_in_child(cmd, switch.clone(), &cwd)
    };
    // A container runtime's commands: a rootful one runs as the supervisor, an unprivileged
    // one as the job.
    let as_runtime_user = |cmd: &mut Command| if rootful { Ok(()) } else { as_job(cmd) };
    let invocation = match &container {
        None => None,
        Some(run) => {
            let user = container_cmd::User {
                uid: owner.map_or_else(|| geteuid().as_raw(), |(uid, _)| uid),
                gid: owner.map_or_else(|| nix::unistd::getegid().as_raw(), |(_, gid)| gid),
                groups: &args.run_as_groups,
            };
            let prepared = prepare_container(
                dir,
                run,
                &user,
                args,
                &asked,
                &env,
                cgroups.as_ref(),
                &mut notes,
                &as_runtime_user,
                stop_asked(&mut term, dir, args),
            )
            .await;
            // The pull is over: the registry login goes at once.
            dir.clear_phase();
            registry_auth::remove(&dir.path);
            match prepared {
                Ok(inv) => Some(inv),
                Err(outcome) => {
                    container_supervise::remove_env_file(&dir.path);
                    return ended(cgroups, outcome).await;
                }
            }
        }
    };
    if lease_expired(&args.lease, args.lease_timeout) {
        return ended(cgroups, Outcome::Fenced).await;
    }
    let argv: Vec<std::ffi::OsString> = match &invocation {
        Some(inv) => inv.run.clone(),
        None => args.command.iter().map(Into::into).collect(),
    };
    let program = argv[0].to_string_lossy().into_owned();
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(pipes.stdout)
        .stderr(pipes.stderr)
        .process_group(0);
    let prepared = if rootful {
        // A rootful runtime keeps the supervisor's clean environment, user and cgroups; it
        // switches user and cgroups for the container itself.
        cmd.current_dir(&dir.path).env_remove("NOTIFY_SOCKET");
        Ok(())
    } else {
        as_job(cmd.env_clear().envs(&env))
    };
    let spawned = prepared.and_then(|()| {
        cmd.spawn()
            .map_err(|e| spawn_error(&program, &e, owner, &cwd))
    });
    // Close our copies of the pipes' write ends, or the log readers never see the output end.
    drop(cmd);
    let mut child = match spawned {
        Ok(c) => c,
        Err(message) => return ended(cgroups, failed(message)).await,
    };
    let Some(pid) = child.id() else {
        return ended(
            cgroups,
            failed("the job exited before it could be supervised".into()),
        )
        .await;
    };
    let Ok(group) = i32::try_from(pid).map(|p| Pid::from_raw(-p)) else {
        return ended(cgroups, failed(format!("pid {pid} out of range"))).await;
    };
    let signal = invocation.as_ref().and_then(|i| i.signal.as_ref());
    let mut outcome = watch(&mut child, group, signal, dir, args, &mut term).await;
    if let (Some(run), Some(inv)) = (&container, &invocation) {
        if let Outcome::Exited { code } = outcome
            && code >= 125
            && rootful
            && container_supervise::podman_never_started(&run.program, &run.name).await
        {
            outcome = container_supervise::never_started(code, &run.image);
        }
        for argv in &inv.cleanup {
            let done = container_supervise::step(argv, &as_runtime_user).await;
            if let Ok((false, out)) | Err(out) = done {
                writeln!(
                    notes,
                    "gpumesh: cleaning up the container: {}",
                    container_supervise::last_words(&out)
                )
                .ok();
            }
        }
        container_supervise::remove_env_file(&dir.path);
    }
    let evidence = cgroups.as_ref().and_then(RunCgroups::oom_evidence);
    let outcome = limits::judge_oom(outcome, evidence, asked.memory_mib);
    if let Some(cg) = &cgroups
        && let Err(e) = cg.remove().await
    {
        writeln!(notes, "gpumesh: {e}").ok();
    }
    outcome
}

/// Why the job could not be started, with who and where when it was a permission.
fn spawn_error(
    program: &str,
    e: &std::io::Error,
    owner: Option<(u32, u32)>,
    cwd: &std::path::Path,
) -> String {
    let mut message = format!("{program}: {e}");
    if e.kind() == std::io::ErrorKind::PermissionDenied {
        let uid = owner.map_or_else(|| geteuid().as_raw(), |(uid, _)| uid);
        message.push_str(&format!(" (as uid {uid}, in {})", cwd.display()));
    }
    message
}

/// Remove the run's cgroups (when there are any) and end with `outcome`.
async fn ended(cgroups: Option<RunCgroups>, outcome: Outcome) -> Outcome {
    if let Some(cg) = cgroups {
        cg.remove().await.ok();
    }
    outcome
}

/// Wait for the job, stopping it on request, at its wall-time limit or when the lease expires:
/// SIGTERM, then SIGKILL after the grace, to its container (`signal_command`) or its process
/// group.
async fn watch(
    child: &mut Child,
    group: Pid,
    signal_command: Option<&SignalCommand>,
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
    send(signal_command, group, Signal::SIGTERM).await;
    let status = match tokio::time::timeout(stop_grace(&stop, args), child.wait()).await {
        Ok(status) => status.ok(),
        Err(_) => {
            send(signal_command, group, Signal::SIGKILL).await;
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

/// Send `signal` to the job: to its container through the runtime when there is one (and
/// wait for the runtime to have sent it), else to its process group.
async fn send(container: Option<&SignalCommand>, group: Pid, signal: Signal) {
    match container {
        Some(cmd) => {
            let name = signal.as_str().trim_start_matches("SIG");
            container_supervise::step(&cmd.argv(name), |_| Ok(()))
                .await
                .ok();
        }
        None => {
            kill(group, signal).ok();
        }
    }
}

/// Everything before a container run can start: its environment file, its command lines (with
/// the run's cgroup as the container's parent), and its image, fetched unless it is here (its
/// progress in the run's phase). A run stopped meanwhile (`stop`) ends at once.
#[allow(clippy::too_many_arguments)]
async fn prepare_container(
    dir: &JobDir,
    run: &ContainerRun,
    user: &container_cmd::User<'_>,
    args: &ShimArgs,
    limits: &Limits,
    env: &std::collections::BTreeMap<String, String>,
    cgroups: Option<&RunCgroups>,
    notes: &mut impl Write,
    as_runtime_user: &impl Fn(&mut Command) -> Result<(), String>,
    stop: impl std::future::Future<Output = Outcome>,
) -> Result<container_cmd::Invocation, Outcome> {
    let failed = |message: String| Outcome::FailedToStart { message };
    let env_file = container_supervise::write_env_file(&dir.path, env).map_err(failed)?;
    let parent = cgroups.and_then(RunCgroups::hierarchy_path);
    let work = isolation::work_dir(&dir.path);
    let paths = container_cmd::Paths {
        env_file: &env_file,
        cgroup_parent: parent.as_deref(),
        cache: &work,
        limits: *limits,
    };
    let inv = container_cmd::invocation(
        run,
        user,
        &args.command,
        &paths,
        &limits::container_rlimits(),
        args.grace.as_secs(),
    );
    if let Some(check) = &inv.have_image
        && let Ok((true, _)) = container_supervise::step(check, as_runtime_user).await
    {
        return Ok(inv);
    }
    let mut progress = PullProgress::new(&run.image);
    tokio::pin!(stop);
    for argv in &inv.fetch {
        writeln!(notes, "gpumesh: fetching image {}", run.image).ok();
        let pulled = image_pull::pull(argv, as_runtime_user, &mut progress, dir, &mut stop)
            .await
            .map_err(failed)?;
        match pulled {
            Pulled::Done => {}
            Pulled::Stopped(outcome) => {
                writeln!(
                    notes,
                    "gpumesh: the run was stopped while fetching its image"
                )
                .ok();
                return Err(outcome);
            }
            Pulled::Failed(out) => {
                notes.write_all(out.as_bytes()).ok();
                return Err(failed(format!(
                    "pulling image {}: {}",
                    run.image,
                    container_supervise::last_words(&out)
                )));
            }
        }
    }
    Ok(inv)
}

/// Resolves when the run must stop before its command has started (the agent's SIGTERM, or the
/// lease ran out), with the outcome it ends with.
async fn stop_asked(
    term: &mut tokio::signal::unix::Signal,
    dir: &JobDir,
    args: &ShimArgs,
) -> Outcome {
    loop {
        tokio::select! {
            _ = term.recv() => {
                return dir.stop_reason().map_or(
                    Outcome::Signaled { signal: Signal::SIGTERM as i32 },
                    StopReason::outcome,
                );
            }
            () = tokio::time::sleep(CHECK_EVERY) => {
                if lease_expired(&args.lease, args.lease_timeout) {
                    return Outcome::Fenced;
                }
            }
        }
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
