//! One placement's directory on its node: `<jobs>/j-<id>-g<generation>/`. It is the executor's
//! durable record of what it started, so reconciliation works the same after an agent restart:
//! `shim.pid` (the supervisor), `stdout.log`/`stderr.log`, `stop` (why the agent asked it to
//! stop), `phase` (what the supervisor does before the command starts: pulling the image),
//! `exit.json` (how the run ended, written by the supervisor into space reserved when the run
//! started), `reported` (the cluster has been told the outcome). The log files' layout
//! (rotation) is in `log_files.rs`.

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

    /// How the run ended; `None` while `exit.json` is absent or only reserved (blank).
    pub fn exit(&self) -> Option<Outcome> {
        serde_json::from_slice(&fs::read(self.exit_path()).ok()?).ok()
    }

    /// Reserve `exit.json`'s space now, while the filesystem has room: a blank file of
    /// `EXIT_RESERVED` bytes (it reads as no outcome yet) that `write_exit` later overwrites in
    /// place, so the outcome is recorded even when the job has filled the disk since. An
    /// outcome already there is kept.
    pub fn reserve_exit(&self) -> std::io::Result<()> {
        let path = self.exit_path();
        if fs::metadata(&path).is_ok_and(|m| m.len() >= EXIT_RESERVED as u64)
            || self.exit().is_some()
        {
            return Ok(());
        }
        let mut f = fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&path)?;
        // Written, not fallocated: blocks that hold data are not given back or copied on the
        // overwrite by ext4, xfs or tmpfs (copy-on-write filesystems such as btrfs may still
        // need space then).
        f.write_all(&[b' '; EXIT_RESERVED])?;
        f.sync_all()
    }

    /// Record how the run ended: in place over the reserved file when there is one (no new
    /// space needed), otherwise as a new file written and renamed into place.
    pub fn write_exit(&self, outcome: &Outcome) -> std::io::Result<()> {
        let path = self.exit_path();
        let reserved = fs::metadata(&path).is_ok_and(|m| m.len() == EXIT_RESERVED as u64)
            && self.exit().is_none();
        if !reserved {
            let bytes = serde_json::to_vec(outcome).map_err(std::io::Error::other)?;
            return write_durable(&path, &bytes);
        }
        let bytes = encode_exit(outcome, EXIT_RESERVED)?;
        let f = fs::OpenOptions::new().write(true).open(&path)?;
        std::os::unix::fs::FileExt::write_all_at(&f, &bytes, 0)?;
        f.sync_all()
    }

    fn exit_path(&self) -> PathBuf {
        self.path.join("exit.json")
    }

    pub fn stop_reason(&self) -> Option<StopReason> {
        StopReason::parse(&fs::read_to_string(self.path.join("stop")).ok()?)
    }

    pub fn request_stop(&self, reason: StopReason) -> std::io::Result<()> {
        write_atomic(&self.path.join("stop"), reason.as_str().as_bytes())
    }

    /// What the supervisor does before the job's command starts (`phase`: one line, written
    /// by the supervisor, read by the executor, which reports it); `None` when it does nothing
    /// of the kind, or has done it.
    pub fn phase(&self) -> Option<String> {
        let text = fs::read_to_string(self.path.join("phase")).ok()?;
        let text = text.trim();
        (!text.is_empty()).then(|| text.to_owned())
    }

    pub fn write_phase(&self, text: &str) -> std::io::Result<()> {
        write_atomic(&self.path.join("phase"), text.as_bytes())
    }

    /// The phase is over (the job's command is starting, or the run has ended).
    pub fn clear_phase(&self) {
        fs::remove_file(self.path.join("phase")).ok();
    }

    pub fn is_reported(&self) -> bool {
        self.path.join("reported").exists()
    }

    /// Mark the run's end as reported. Not synced: a marker lost with the machine only makes
    /// the executor report the end again, which the cluster answers as stale.
    pub fn mark_reported(&self) -> std::io::Result<()> {
        fs::File::create(self.path.join("reported")).map(drop)
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

/// The size `exit.json` is reserved at: room for any outcome (long messages are shortened).
pub const EXIT_RESERVED: usize = 4096;

/// Pure: `outcome` as JSON padded with blanks to exactly `size` bytes (JSON allows trailing
/// whitespace, so the file parses as the outcome). A message too long to fit is shortened.
pub fn encode_exit(outcome: &Outcome, size: usize) -> std::io::Result<Vec<u8>> {
    let mut outcome = outcome.clone();
    loop {
        let mut bytes = serde_json::to_vec(&outcome).map_err(std::io::Error::other)?;
        if bytes.len() < size {
            bytes.resize(size - 1, b' ');
            bytes.push(b'\n');
            return Ok(bytes);
        }
        let over = bytes.len() - size + 1;
        let (Outcome::FailedToStart { message } | Outcome::Lost { message }) = &mut outcome else {
            return Err(std::io::Error::other(
                "an outcome without a message does not fit",
            ));
        };
        if message.chars().count() <= 1 {
            return Err(std::io::Error::other("the outcome does not fit"));
        }
        // Cut at least what is over (escapes make the JSON longer than the text) and mark it.
        let mut keep = message
            .len()
            .saturating_sub(over + '…'.len_utf8())
            .min(message.len() - 1);
        while !message.is_char_boundary(keep) {
            keep -= 1;
        }
        message.truncate(keep);
        message.push('…');
    }
}

fn parse_name(name: &str) -> Option<(JobId, u64)> {
    let (job, generation) = name.strip_prefix("j-")?.split_once("-g")?;
    Some((job.parse().ok()?, generation.parse().ok()?))
}

/// Replace `path` with `bytes` so that a reader sees the old content or the new, whole. Not
/// synced: what only a live supervisor or agent reads (the supervisor's record, a stop
/// request, the phase) means nothing once the machine has gone down with its processes.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, bytes)?;
    fs::rename(&tmp, path)
}

/// `write_atomic`, synced before the rename: the run's outcome outlives a machine's crash.
fn write_durable(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
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
    fn a_reserved_exit_reads_as_none_until_written_in_place() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let d = JobDir::new(tmp.path(), 9, 2);
        d.create().expect("create");
        d.reserve_exit().expect("reserve");
        let size = |d: &JobDir| fs::metadata(d.exit_path()).expect("exit.json").len();
        assert_eq!(size(&d), EXIT_RESERVED as u64);
        assert_eq!(d.exit(), None, "blank means no outcome yet");
        let ino = |d: &JobDir| {
            std::os::unix::fs::MetadataExt::ino(&fs::metadata(d.exit_path()).expect("meta"))
        };
        let before = ino(&d);
        d.write_exit(&Outcome::Exited { code: 7 }).expect("write");
        assert_eq!(d.exit(), Some(Outcome::Exited { code: 7 }));
        assert_eq!(
            (size(&d), ino(&d)),
            (EXIT_RESERVED as u64, before),
            "in place"
        );
        // Reserving again keeps the outcome.
        d.reserve_exit().expect("reserve again");
        assert_eq!(d.exit(), Some(Outcome::Exited { code: 7 }));
    }

    #[test]
    fn every_outcome_fits_its_reservation() {
        let long = "é\"x".repeat(3000);
        for outcome in [
            Outcome::Exited { code: -1 },
            Outcome::OutOfMemory { limit_mib: Some(1) },
            Outcome::Fenced,
            Outcome::FailedToStart {
                message: "no such file".into(),
            },
            Outcome::FailedToStart {
                message: long.clone(),
            },
            Outcome::Lost {
                message: long.clone(),
            },
        ] {
            let bytes = encode_exit(&outcome, EXIT_RESERVED).expect("fits");
            assert_eq!(bytes.len(), EXIT_RESERVED);
            let back: Outcome = serde_json::from_slice(&bytes).expect("parses");
            match (&outcome, &back) {
                (Outcome::Lost { message: m }, Outcome::Lost { message: b })
                | (Outcome::FailedToStart { message: m }, Outcome::FailedToStart { message: b })
                    if m.len() > 100 =>
                {
                    assert!(
                        b.ends_with('…') && m.starts_with(b.trim_end_matches('…')),
                        "{b}"
                    );
                }
                _ => assert_eq!(back, outcome),
            }
        }
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
