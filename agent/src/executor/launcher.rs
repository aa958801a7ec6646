//! How a run's supervisor is started (`jobs.launcher`): as a child process of the agent
//! (`direct`), or as a transient unit of its own in `gpumesh.slice`, started through systemd's
//! D-Bus API (`systemd`), so the run is outside the agent's service sandbox and carries its own
//! limits and device allow-list. `auto` takes systemd when the host was booted with it and its
//! API answers. The choice is made once, when the agent starts, and said in its log.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::process::Child;

use super::job_env;
use super::limits::Limits;
use super::systemd_bus::SystemdBus;
use super::systemd_unit::{self, CgroupVersion, UnitSpec};
use crate::config::LauncherChoice;

/// What starts supervisors on this host (by default: directly).
#[derive(Clone, Debug, Default)]
pub struct Launcher(Kind);

#[derive(Clone, Debug, Default)]
enum Kind {
    /// Each supervisor is a child process of the agent.
    #[default]
    Direct,
    /// Each run is a transient unit of its own.
    Systemd(Arc<SystemdBus>),
}

/// What was found about the host when choosing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Probe {
    /// `/run/systemd/system` exists: systemd is the service manager (PID 1).
    pub booted_with_systemd: bool,
    /// Whether its D-Bus API answered (only asked when booted with systemd).
    pub api: Option<Result<String, String>>,
}

/// The decision: the launcher and the line that says why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    Direct(String),
    Systemd(String),
    /// `jobs.launcher = "systemd"` on a host where that cannot work.
    Refuse(String),
}

/// Choose from the configured choice and what the probe found (pure).
pub(crate) fn decide(choice: LauncherChoice, probe: &Probe) -> Decision {
    let api = || match &probe.api {
        Some(Ok(version)) => Ok(version.clone()),
        Some(Err(e)) => Err(e.clone()),
        None => Err("this host was not booted with systemd (no /run/systemd/system)".into()),
    };
    let systemd = |version: String| {
        Decision::Systemd(format!(
            "each job runs as a transient unit of its own in {} (systemd {version}), outside the agent's service",
            systemd_unit::SLICE
        ))
    };
    match choice {
        LauncherChoice::Direct => Decision::Direct(
            "each job's supervisor runs as a child of the agent (jobs.launcher = \"direct\"), inside whatever sandbox the agent runs in".into(),
        ),
        LauncherChoice::Systemd => match api() {
            Ok(version) => systemd(version),
            Err(e) => Decision::Refuse(format!(
                "jobs.launcher = \"systemd\" but systemd's D-Bus API cannot be used: {e}"
            )),
        },
        LauncherChoice::Auto if !probe.booted_with_systemd => Decision::Direct(
            "each job's supervisor runs as a child of the agent (jobs.launcher = \"auto\": systemd is not this host's service manager)".into(),
        ),
        LauncherChoice::Auto => match api() {
            Ok(version) => systemd(version),
            Err(e) => Decision::Direct(format!(
                "each job's supervisor runs as a child of the agent (jobs.launcher = \"auto\"): systemd runs this host but its D-Bus API cannot be used: {e}"
            )),
        },
    }
}

impl Launcher {
    /// Probe the host and choose. `Err` only when systemd was asked for and cannot be had.
    pub async fn choose(choice: LauncherChoice) -> anyhow::Result<Self> {
        let booted_with_systemd = Path::new("/run/systemd/system").is_dir();
        let wants_api = booted_with_systemd || choice == LauncherChoice::Systemd;
        let (bus, api) = if wants_api && choice != LauncherChoice::Direct {
            match SystemdBus::connect().await {
                Ok((bus, version)) => (Some(bus), Some(Ok(version))),
                Err(e) => (None, Some(Err(e))),
            }
        } else {
            (None, None)
        };
        let probe = Probe {
            booted_with_systemd,
            api,
        };
        match (decide(choice, &probe), bus) {
            (Decision::Systemd(why), Some(bus)) => {
                tracing::info!("{why}");
                Ok(Launcher(Kind::Systemd(Arc::new(bus))))
            }
            (Decision::Refuse(why), _) => anyhow::bail!(why),
            (Decision::Direct(why), _) => {
                tracing::info!("{why}");
                Ok(Launcher(Kind::Direct))
            }
            (Decision::Systemd(_), None) => {
                anyhow::bail!("systemd answered but its connection was lost")
            }
        }
    }

    pub(crate) fn is_systemd(&self) -> bool {
        self.systemd().is_some()
    }

    /// The connection to systemd, when runs are started as units.
    pub(crate) fn systemd(&self) -> Option<&Arc<SystemdBus>> {
        match &self.0 {
            Kind::Systemd(bus) => Some(bus),
            Kind::Direct => None,
        }
    }
}

/// One supervisor to start: the program and its arguments (its environment is always
/// `job_env::SUPERVISOR_ENV`), and what a unit needs besides.
pub(crate) struct SupervisorStart<'a> {
    pub exe: &'a Path,
    pub args: Vec<OsString>,
    pub job: u64,
    pub generation: u64,
    pub job_name: &'a str,
    pub stop_grace: std::time::Duration,
    /// The run's limits (`Limits::for_job`), which a unit carries as its properties.
    pub limits: Limits,
    /// The bound GPUs' device nodes.
    pub gpu_nodes: Vec<PathBuf>,
    /// `jobs.extra_devices`, resolved to device nodes.
    pub extra_devices: Vec<PathBuf>,
}

/// The supervisor's command: `agent_exe` with `args`, the fixed `SUPERVISOR_ENV` and nothing
/// else of ours, no stdio, leading a process group of its own.
pub fn supervisor_command(agent_exe: &Path, args: &[OsString]) -> std::process::Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(agent_exe);
    cmd.args(args)
        .env_clear()
        .envs(job_env::SUPERVISOR_ENV)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0);
    cmd
}

/// What was started: a child to reap (direct), or a unit (systemd).
pub(crate) enum Started {
    Child(Child),
    Unit,
}

impl Launcher {
    /// Start the supervisor. `Err` is the run's failed-to-start reason.
    pub(crate) async fn start(&self, s: SupervisorStart<'_>) -> Result<Started, String> {
        match &self.0 {
            Kind::Direct => tokio::process::Command::from(supervisor_command(s.exe, &s.args))
                .spawn()
                .map(Started::Child)
                .map_err(|e| format!("spawning the supervisor: {e}")),
            Kind::Systemd(bus) => {
                let name = systemd_unit::unit_name(s.job, s.generation);
                let exe = s.exe.to_str().ok_or_else(|| {
                    format!(
                        "the agent's path {:?} is not UTF-8, which systemd needs",
                        s.exe
                    )
                })?;
                let args = systemd_unit::unit_args(&s.args, &name)?;
                let devices = systemd_unit::device_allow(&s.gpu_nodes, &s.extra_devices);
                let unit = UnitSpec {
                    job: s.job,
                    generation: s.generation,
                    job_name: s.job_name,
                    exe,
                    args: &args,
                    env: &job_env::SUPERVISOR_ENV,
                    stop_grace: s.stop_grace,
                    cpu_millis: s.limits.cpu_millis,
                    memory_mib: s.limits.memory_mib,
                    // `Limits::for_job` gives every run one; none would be `infinity`.
                    tasks_max: s.limits.tasks_max.unwrap_or(u64::MAX),
                    cgroup: CgroupVersion::of_host(),
                    devices: &devices,
                };
                let props = systemd_unit::properties(&unit);
                tracing::debug!(job_id = s.job, unit = %name, properties = %systemd_unit::render(&props), "starting the run's unit");
                bus.start_transient_unit(&name, &props)
                    .await
                    .map(|()| Started::Unit)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(booted: bool, api: Option<Result<&str, &str>>) -> Probe {
        Probe {
            booted_with_systemd: booted,
            api: api.map(|r| r.map(str::to_owned).map_err(str::to_owned)),
        }
    }

    #[test]
    fn auto_takes_systemd_only_where_it_runs_the_host_and_answers() {
        use LauncherChoice::{Auto, Direct, Systemd};
        let up = probe(true, Some(Ok("252")));
        let down = probe(true, Some(Err("connection refused")));
        let none = probe(false, None);
        let kind = |d: Decision| match d {
            Decision::Direct(why) => format!("direct: {why}"),
            Decision::Systemd(why) => format!("systemd: {why}"),
            Decision::Refuse(why) => format!("refuse: {why}"),
        };
        let cases = [
            (
                Auto,
                &up,
                "systemd: each job runs as a transient unit of its own in gpumesh.slice (systemd 252)",
            ),
            (
                Auto,
                &down,
                "direct: each job's supervisor runs as a child of the agent (jobs.launcher = \"auto\"): systemd runs this host but its D-Bus API cannot be used: connection refused",
            ),
            (
                Auto,
                &none,
                "direct: each job's supervisor runs as a child of the agent (jobs.launcher = \"auto\": systemd is not this host's service manager)",
            ),
            (Systemd, &up, "systemd: "),
            (
                Systemd,
                &down,
                "refuse: jobs.launcher = \"systemd\" but systemd's D-Bus API cannot be used: connection refused",
            ),
            (
                Systemd,
                &none,
                "refuse: jobs.launcher = \"systemd\" but systemd's D-Bus API cannot be used: this host was not booted with systemd",
            ),
            (
                Direct,
                &up,
                "direct: each job's supervisor runs as a child of the agent (jobs.launcher = \"direct\")",
            ),
            (Direct, &none, "direct: "),
        ];
        for (choice, p, says) in cases {
            let got = kind(decide(choice, p));
            assert!(got.starts_with(says), "{choice} {p:?}: {got}");
        }
    }

    #[test]
    fn the_supervisor_command_carries_only_path_lang_and_its_allocators_setting() {
        let cmd = supervisor_command(Path::new("/usr/bin/gpu-agent"), &["shim".into()]);
        let env: Vec<_> = cmd
            .get_envs()
            .map(|(k, v)| (k.to_string_lossy().into_owned(), v.is_some()))
            .collect();
        assert_eq!(
            env,
            [
                ("LANG".into(), true),
                ("PATH".into(), true),
                ("_RJEM_MALLOC_CONF".into(), true)
            ]
        );
        // `env_clear` was called: nothing of ours is inherited.
        let debug = format!("{cmd:?}");
        assert!(debug.starts_with("env -i "), "{debug}");
    }
}
