//! `[jobs]`'s disk keys: where run directories live (`dir`), how much log each stream keeps
//! (`log_max`), the free space below which no run starts (`min_free`), and how long an ended,
//! reported run's directory is kept (`keep_finished_runs`).
//!
//! The default directory is `<data_dir>-jobs`, beside the data directory rather than inside it:
//! - a job's scratch and logs are not mixed into the directory that holds the Raft log, the
//!   vote and the keys (which an operator backs up, copies or wipes as one);
//! - it follows `data_dir`, so every agent of a dev mesh or test harness (several agents on one
//!   host, each with its own data directory) gets its own jobs directory with no extra key, and
//!   two agents never share one (a fixed path such as `/var/lib/gpumesh-jobs` would be shared);
//! - the job users can reach it: the data directory may be closed to them (0700/0750, the
//!   systemd unit's StateDirectory), its parent is usually not.
//!
//! It is usually still on the Raft data's filesystem; the agent warns at start when it is, and
//! operators should point `jobs.dir` at a filesystem of its own (see `executor::setup`).

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, ensure};

use super::size::ByteSize;

/// Where run directories live and how their disk use is bounded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobDiskSettings {
    /// `jobs.dir`: one directory per run, `j-<id>-g<generation>/`.
    pub dir: PathBuf,
    /// How `dir` was chosen, so the agent can say so at start.
    pub dir_origin: DirOrigin,
    /// `jobs.log_max`: a log file is rotated (to `stdout.log.1`) when it reaches this size, so a
    /// stream keeps at most twice this on disk.
    pub log_max: ByteSize,
    /// `jobs.min_free`: no run starts while the jobs filesystem has less space available.
    pub min_free: ByteSize,
    /// `jobs.keep_finished_runs`: an ended, reported run's directory is removed this long after
    /// it was reported.
    pub keep_finished_runs: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirOrigin {
    /// `jobs.dir` in the file.
    Configured,
    /// `<data_dir>-jobs`.
    Default,
    /// `<data_dir>/jobs`, where earlier versions kept runs: it exists, so it is kept (a run
    /// still going there must stay visible to the executor).
    Legacy,
}

impl JobDiskSettings {
    /// The defaults, for a directory chosen elsewhere (tests).
    pub fn defaults() -> Self {
        Self {
            dir: PathBuf::new(),
            dir_origin: DirOrigin::Configured,
            log_max: DEFAULT_LOG_MAX,
            min_free: DEFAULT_MIN_FREE,
            keep_finished_runs: DEFAULT_KEEP_FINISHED_RUNS,
        }
    }
}

pub(crate) const DEFAULT_LOG_MAX: ByteSize = ByteSize(64 << 20);
pub(crate) const DEFAULT_MIN_FREE: ByteSize = ByteSize(64 << 20);
pub(crate) const DEFAULT_KEEP_FINISHED_RUNS: Duration = Duration::from_secs(7 * 86_400);
/// Below this a log would rotate every few lines.
pub(crate) const MIN_LOG_MAX: ByteSize = ByteSize(4 << 10);

/// The disk keys of `[jobs]`, checked against `data_dir`.
pub(super) fn settings(
    dir: Option<PathBuf>,
    log_max: Option<ByteSize>,
    min_free: Option<ByteSize>,
    keep_finished_runs: Option<Duration>,
    data_dir: &Path,
) -> anyhow::Result<JobDiskSettings> {
    let legacy = data_dir.join("jobs");
    let (dir, dir_origin) = match dir {
        Some(d) => {
            check_dir(&d, data_dir).context("invalid jobs.dir")?;
            (d, DirOrigin::Configured)
        }
        None if legacy.is_dir() => (legacy, DirOrigin::Legacy),
        None => (default_dir(data_dir)?, DirOrigin::Default),
    };
    let settings = JobDiskSettings {
        dir,
        dir_origin,
        log_max: log_max.unwrap_or(DEFAULT_LOG_MAX),
        min_free: min_free.unwrap_or(DEFAULT_MIN_FREE),
        keep_finished_runs: keep_finished_runs.unwrap_or(DEFAULT_KEEP_FINISHED_RUNS),
    };
    ensure!(
        settings.log_max >= MIN_LOG_MAX,
        "jobs.log_max must be at least {MIN_LOG_MAX}, got {}",
        settings.log_max
    );
    ensure!(
        settings.keep_finished_runs >= Duration::from_secs(1),
        "jobs.keep_finished_runs must be at least 1s"
    );
    Ok(settings)
}

/// `<data_dir>-jobs`.
fn default_dir(data_dir: &Path) -> anyhow::Result<PathBuf> {
    let name = data_dir.file_name().with_context(|| {
        format!(
            "data_dir {} has no final name to derive the jobs directory from: set jobs.dir",
            data_dir.display()
        )
    })?;
    let mut name = name.to_owned();
    name.push("-jobs");
    Ok(data_dir.with_file_name(name))
}

/// An explicit `jobs.dir` is absolute (not relative to wherever the agent was started), and is
/// neither the data directory, nor above it (the executor makes it 0711 and would list the
/// Raft data as runs' neighbours), nor inside it except for `<data_dir>/jobs`, the old place.
fn check_dir(dir: &Path, data_dir: &Path) -> anyhow::Result<()> {
    ensure!(
        dir.is_absolute(),
        "{} is not an absolute path",
        dir.display()
    );
    ensure!(
        !dir.components().any(|c| c == Component::ParentDir),
        "{} must not contain ..",
        dir.display()
    );
    let data = std::path::absolute(data_dir).unwrap_or_else(|_| data_dir.to_owned());
    ensure!(
        !data.starts_with(dir),
        "{} is the data directory or contains it ({})",
        dir.display(),
        data.display()
    );
    ensure!(
        !dir.starts_with(&data) || dir == data.join("jobs"),
        "{} is inside the data directory {}: use a directory beside it (or on a filesystem of its own)",
        dir.display(),
        data.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_dir(dir: Option<&str>, data: &Path) -> anyhow::Result<JobDiskSettings> {
        settings(dir.map(PathBuf::from), None, None, None, data)
    }

    #[test]
    fn the_default_is_beside_the_data_directory_and_follows_it() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = tmp.path().join("node-1");
        let s = with_dir(None, &data).expect("valid");
        assert_eq!(s.dir, tmp.path().join("node-1-jobs"));
        assert_eq!(s.dir_origin, DirOrigin::Default);
        assert_eq!(
            (s.log_max, s.min_free, s.keep_finished_runs),
            (
                DEFAULT_LOG_MAX,
                DEFAULT_MIN_FREE,
                DEFAULT_KEEP_FINISHED_RUNS
            )
        );
        // Two agents of one host, two data directories: two jobs directories.
        let other = with_dir(None, &tmp.path().join("node-2")).expect("valid");
        assert_ne!(s.dir, other.dir);
        assert_eq!(
            with_dir(None, Path::new("/var/lib/gpumesh/"))
                .expect("valid")
                .dir,
            Path::new("/var/lib/gpumesh-jobs")
        );
        let err = with_dir(None, Path::new("/")).expect_err("no name");
        assert!(err.to_string().contains("set jobs.dir"), "{err}");
    }

    #[test]
    fn runs_left_in_the_old_place_keep_it() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let data = tmp.path().join("d");
        std::fs::create_dir_all(data.join("jobs")).expect("old jobs dir");
        let s = with_dir(None, &data).expect("valid");
        assert_eq!(
            (s.dir, s.dir_origin),
            (data.join("jobs"), DirOrigin::Legacy)
        );
        // Named explicitly it is allowed too.
        let explicit = data.join("jobs");
        let s = with_dir(explicit.to_str(), &data).expect("valid");
        assert_eq!(s.dir_origin, DirOrigin::Configured);
    }

    #[test]
    fn bad_directories_and_sizes_are_refused() {
        let data = Path::new("/var/lib/gpumesh");
        for (dir, why) in [
            ("jobs", "absolute"),
            ("/var/lib/gpumesh", "contains it"),
            ("/var/lib", "contains it"),
            ("/var/lib/gpumesh/raft/jobs", "inside the data directory"),
            ("/srv/../var/lib/gpumesh/x", ".."),
        ] {
            let err = with_dir(Some(dir), data).expect_err(dir);
            assert!(format!("{err:#}").contains(why), "{dir}: {err:#}");
        }
        with_dir(Some("/srv/scratch/gpumesh"), data).expect("elsewhere is fine");
        let tiny = settings(None, Some(ByteSize(100)), None, None, data).expect_err("tiny");
        assert!(tiny.to_string().contains("jobs.log_max"), "{tiny}");
        let zero = settings(None, None, None, Some(Duration::ZERO), data).expect_err("zero");
        assert!(zero.to_string().contains("keep_finished_runs"), "{zero}");
    }
}
