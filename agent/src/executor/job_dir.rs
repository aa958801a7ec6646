//! One placement's directory on its node: `<jobs>/j-<id>-g<generation>/`. It is the executor's
//! durable record of what it started, so reconciliation works the same after an agent restart:
//! `shim.pid` (the supervisor), `stdout.log`/`stderr.log`, `stop` (why the agent asked it to
//! stop), `exit.json` (how the run ended, written by the supervisor), `reported` (the cluster
//! has been told the outcome).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use gpu_raft_store::{JobId, Outcome};

use crate::host::proc_stat::ProcStat;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    Cancel,
    Evict,
    /// The placement is no longer current (requeued, cancelled elsewhere, older generation).
    Stale,
}

impl StopReason {
    fn as_str(self) -> &'static str {
        match self {
            StopReason::Cancel => "cancel",
            StopReason::Evict => "evict",
            StopReason::Stale => "stale",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "cancel" => Some(StopReason::Cancel),
            "evict" => Some(StopReason::Evict),
            "stale" => Some(StopReason::Stale),
            _ => None,
        }
    }

    /// The outcome a run stopped for this reason reports.
    pub fn outcome(self) -> Outcome {
        match self {
            StopReason::Cancel => Outcome::Cancelled,
            StopReason::Evict => Outcome::Evicted,
            StopReason::Stale => Outcome::Lost {
                message: "stopped: its placement is no longer current".into(),
            },
        }
    }
}

/// The process supervising a run, named by its pid and its start time (`shim.pid` holds
/// `<pid> <start ticks>`). The pid alone is not enough: once the supervisor is gone the kernel
/// hands its pid to some other process, and the executor would take that one for the run and
/// signal it (a pid reused by the test runner got SIGTERM in CI).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Supervisor {
    pub pid: u32,
    /// Absent in a record written by a build before it was kept: that one is trusted by pid.
    start_ticks: Option<u64>,
}

impl Supervisor {
    /// The calling process.
    pub fn current() -> std::io::Result<Self> {
        let me = ProcStat::of_self()
            .ok_or_else(|| std::io::Error::other("cannot read /proc/self/stat"))?;
        Ok(Self {
            pid: std::process::id(),
            start_ticks: Some(me.start_ticks),
        })
    }

    /// Whether this very process is still running (not a zombie, not a newer owner of its pid).
    pub fn is_running(&self) -> bool {
        ProcStat::of(self.pid).is_some_and(|now| {
            now.is_running() && self.start_ticks.is_none_or(|t| t == now.start_ticks)
        })
    }

    fn record(&self) -> String {
        match self.start_ticks {
            Some(t) => format!("{} {t}", self.pid),
            None => self.pid.to_string(),
        }
    }

    fn parse(record: &str) -> Option<Self> {
        let mut fields = record.split_whitespace();
        let pid = fields.next()?.parse().ok().filter(|p| *p > 0)?;
        let start_ticks = match fields.next() {
            Some(t) => Some(t.parse().ok()?),
            None => None,
        };
        Some(Self { pid, start_ticks })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobDir {
    pub path: PathBuf,
    pub job: JobId,
    pub generation: u64,
}

impl JobDir {
    pub fn new(root: &Path, job: JobId, generation: u64) -> Self {
        Self {
            path: root.join(format!("j-{job}-g{generation}")),
            job,
            generation,
        }
    }

    /// Every placement directory under `root` (missing root = none).
    pub fn scan(root: &Path) -> std::io::Result<Vec<JobDir>> {
        let entries = match fs::read_dir(root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut dirs = Vec::new();
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            let Some((job, generation)) = name.to_str().and_then(parse_name) else {
                continue;
            };
            dirs.push(JobDir {
                path: entry.path(),
                job,
                generation,
            });
        }
        dirs.sort_by_key(|d| (d.job, d.generation));
        Ok(dirs)
    }

    pub fn create(&self) -> std::io::Result<()> {
        fs::create_dir_all(&self.path)
    }

    pub fn stdout(&self) -> PathBuf {
        self.path.join("stdout.log")
    }

    pub fn stderr(&self) -> PathBuf {
        self.path.join("stderr.log")
    }

    /// The run's supervisor as it recorded itself at start.
    pub fn supervisor(&self) -> Option<Supervisor> {
        Supervisor::parse(&fs::read_to_string(self.path.join("shim.pid")).ok()?)
    }

    pub fn write_supervisor(&self, supervisor: &Supervisor) -> std::io::Result<()> {
        write_atomic(&self.path.join("shim.pid"), supervisor.record().as_bytes())
    }

    pub fn exit(&self) -> Option<Outcome> {
        serde_json::from_slice(&fs::read(self.path.join("exit.json")).ok()?).ok()
    }

    pub fn write_exit(&self, outcome: &Outcome) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(outcome).map_err(std::io::Error::other)?;
        write_atomic(&self.path.join("exit.json"), &bytes)
    }

    pub fn stop_reason(&self) -> Option<StopReason> {
        StopReason::parse(&fs::read_to_string(self.path.join("stop")).ok()?)
    }

    pub fn request_stop(&self, reason: StopReason) -> std::io::Result<()> {
        write_atomic(&self.path.join("stop"), reason.as_str().as_bytes())
    }

    pub fn is_reported(&self) -> bool {
        self.path.join("reported").exists()
    }

    pub fn mark_reported(&self) -> std::io::Result<()> {
        write_atomic(&self.path.join("reported"), b"")
    }

    /// Seconds since the directory was created (to tell a supervisor still starting from a
    /// vanished one).
    pub fn age(&self) -> std::time::Duration {
        fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .unwrap_or_default()
    }
}

fn parse_name(name: &str) -> Option<(JobId, u64)> {
    let (job, generation) = name.strip_prefix("j-")?.split_once("-g")?;
    Some((job.parse().ok()?, generation.parse().ok()?))
}

/// Write a small file so readers see the old content or the new, never a torn one.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_junk_is_ignored() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let d = JobDir::new(tmp.path(), 42, 3);
        d.create().expect("create");
        fs::create_dir_all(tmp.path().join("not-a-job")).expect("junk");
        fs::create_dir_all(tmp.path().join("j-x-g1")).expect("junk");
        assert_eq!(JobDir::scan(tmp.path()).expect("scan"), vec![d.clone()]);
        assert_eq!(d.exit(), None);
        d.write_exit(&Outcome::Exited { code: 3 }).expect("exit");
        assert_eq!(d.exit(), Some(Outcome::Exited { code: 3 }));
        d.request_stop(StopReason::Evict).expect("stop");
        assert_eq!(d.stop_reason(), Some(StopReason::Evict));
        assert!(!d.is_reported());
        d.mark_reported().expect("reported");
        assert!(d.is_reported());
    }

    #[test]
    fn a_supervisor_is_its_pid_and_start_time() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let d = JobDir::new(tmp.path(), 7, 1);
        d.create().expect("create");
        assert_eq!(d.supervisor(), None);
        let me = Supervisor::current().expect("this process");
        d.write_supervisor(&me).expect("record");
        assert_eq!(d.supervisor(), Some(me));
        assert!(me.is_running());
        // Our pid with another start time: a process that took over a dead supervisor's pid.
        let reused = Supervisor {
            start_ticks: me.start_ticks.map(|t| t + 1),
            ..me
        };
        assert!(!reused.is_running());
        // A record from an older build (pid only) is trusted by pid.
        let legacy = Supervisor::parse(&me.pid.to_string()).expect("legacy record");
        assert!(legacy.is_running());
        for junk in ["", "0", "-4", "12 x", "x 12"] {
            assert_eq!(Supervisor::parse(junk), None, "{junk:?}");
        }
    }
}
