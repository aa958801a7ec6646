//! `[retention]`: how much history the replicated state keeps before the leader archives it
//! (`Command::Archive`; every agent keeps the archive). The leader's settings are the ones that
//! count: they travel in the command, so every replica archives the same records.

use std::time::Duration;

use anyhow::ensure;
use gpu_raft_store::retention::Retention;
use serde::Deserialize;

/// `[retention]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionSection {
    /// A finished job is archived once it finished this long ago (default 1d)...
    #[serde(default, with = "humantime_serde")]
    pub finished_jobs_max_age: Option<Duration>,
    /// ...or once more than this many finished jobs are kept (default 10000).
    pub finished_jobs_kept: Option<u64>,
    /// The oldest audit entries are archived once more than this many are kept (default 10000).
    pub audit_entries_kept: Option<u64>,
    /// How often the leader looks (default 5s).
    #[serde(default, with = "humantime_serde")]
    pub interval: Option<Duration>,
}

#[derive(Clone, Debug)]
pub struct RetentionSettings {
    pub retention: Retention,
    pub interval: Duration,
}

pub(super) fn settings(r: RetentionSection) -> anyhow::Result<RetentionSettings> {
    let default = Retention::default();
    let max_age = r
        .finished_jobs_max_age
        .map_or(default.finished_max_age_ms, |d| d.as_millis() as u64);
    let retention = Retention {
        finished_max_age_ms: max_age,
        finished_keep: r.finished_jobs_kept.unwrap_or(default.finished_keep),
        audit_keep: r.audit_entries_kept.unwrap_or(default.audit_keep),
    };
    let interval = r.interval.unwrap_or(Duration::from_secs(5));
    // A finished job's last energy report lands within seconds of its end; archived sooner,
    // that report would count for nothing.
    ensure!(
        max_age >= 10_000,
        "retention.finished_jobs_max_age must be at least 10s"
    );
    ensure!(
        retention.audit_keep >= 1,
        "retention.audit_entries_kept must be at least 1"
    );
    ensure!(
        interval >= Duration::from_millis(100),
        "retention.interval must be at least 100ms"
    );
    Ok(RetentionSettings {
        retention,
        interval,
    })
}
