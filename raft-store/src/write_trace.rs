//! Stage stamps of replicated writes: where one write's time goes, stage by stage, on the
//! leader and on its followers (`gpu-bench stages`). Off unless `GPUMESH_WRITE_TRACE` names a
//! directory when the process starts; then every stamp is a line `stage index nanos` in
//! `<dir>/<pid>.stamps`, the time read from the wall clock, which the members on one host
//! share. Stamping only pushes to a vector; a thread of its own writes the lines out every
//! 50 ms. Off, a stamp is one load of an initialised `OnceLock`.
//!
//! A stamp names a log index where the stage knows it; the API's, the write path's and the
//! proposer's stamps come before the write has one (0), and are matched to their write by time.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The environment variable naming the directory stamps go to.
pub const TRACE_DIR_ENV: &str = "GPUMESH_WRITE_TRACE";

/// Where a write is, in the order a replicated write passes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    /// The API has the request, decoded, and starts to authenticate its caller.
    Request,
    /// The agent's write path has the command (after the API's checks): `Cluster::write_as`.
    WriteIn,
    /// The proposer hands the entry (alone or in a batch) to openraft.
    Proposed,
    /// The log store writes the entry (readable, not yet durable).
    Appended,
    /// The log flusher's fsync covering the entry has ended.
    Flushed,
    /// The leader sends an AppendEntries message holding the entry to a follower.
    Sent,
    /// A follower has decoded that message.
    Received,
    /// The follower's openraft has answered it (after the follower's flush).
    Replied,
    /// The leader has the follower's answer.
    Acked,
    /// The state machine starts applying the entry.
    Applying,
    /// The state machine has applied it.
    Applied,
    /// The write path returns the result to the API.
    WriteOut,
}

impl Stage {
    pub const ALL: [Stage; 12] = [
        Stage::Request,
        Stage::WriteIn,
        Stage::Proposed,
        Stage::Appended,
        Stage::Flushed,
        Stage::Sent,
        Stage::Received,
        Stage::Replied,
        Stage::Acked,
        Stage::Applying,
        Stage::Applied,
        Stage::WriteOut,
    ];

    fn name(self) -> &'static str {
        match self {
            Stage::Request => "request",
            Stage::WriteIn => "write-in",
            Stage::Proposed => "proposed",
            Stage::Appended => "appended",
            Stage::Flushed => "flushed",
            Stage::Sent => "sent",
            Stage::Received => "received",
            Stage::Replied => "replied",
            Stage::Acked => "acked",
            Stage::Applying => "applying",
            Stage::Applied => "applied",
            Stage::WriteOut => "write-out",
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Stage {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Stage::ALL
            .into_iter()
            .find(|stage| stage.name() == s)
            .ok_or_else(|| format!("no stage {s:?}"))
    }
}

/// One stamp: a stage, the log index it concerns (0: not known yet), wall-clock nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub stage: Stage,
    pub index: u64,
    pub nanos: u64,
}

impl Stamp {
    /// Parse one line of a stamps file.
    pub fn parse(line: &str) -> Result<Stamp, String> {
        let mut fields = line.split_ascii_whitespace();
        let mut next = || fields.next().ok_or_else(|| format!("short line {line:?}"));
        let stage = next()?.parse()?;
        let index = next()?.parse().map_err(|e| format!("{line:?}: {e}"))?;
        let nanos = next()?.parse().map_err(|e| format!("{line:?}: {e}"))?;
        Ok(Stamp {
            stage,
            index,
            nanos,
        })
    }
}

/// How often the writer thread writes the stamps out.
const WRITE_EVERY: Duration = Duration::from_millis(50);

/// Stamp `stage` of the entry at `index` (0 when the write has none yet), if tracing is on.
pub fn stamp(stage: Stage, index: u64) {
    let Some(stamps) = recorder() else {
        return;
    };
    let nanos = now_nanos();
    stamps
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Stamp {
            stage,
            index,
            nanos,
        });
}

/// The clock of every stamp: wall-clock nanoseconds, which the processes on one host share
/// (a reader times its own events with it to match them to the stamps).
pub fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Stamp `stage` of every index in `indexes`.
pub fn stamp_each(stage: Stage, indexes: impl IntoIterator<Item = u64>) {
    if recorder().is_some() {
        for index in indexes {
            stamp(stage, index);
        }
    }
}

/// The stamps waiting to be written, when tracing is on (the writer thread started).
fn recorder() -> Option<&'static Mutex<Vec<Stamp>>> {
    static RECORDER: OnceLock<Option<&'static Mutex<Vec<Stamp>>>> = OnceLock::new();
    *RECORDER.get_or_init(|| {
        let dir = PathBuf::from(std::env::var_os(TRACE_DIR_ENV)?);
        let stamps: &'static Mutex<Vec<Stamp>> = Box::leak(Box::default());
        let path = dir.join(format!("{}.stamps", std::process::id()));
        let started = std::thread::Builder::new()
            .name("write-trace".into())
            .spawn(move || write_out(stamps, &path));
        match started {
            Ok(_) => Some(stamps),
            Err(e) => {
                tracing::warn!(error = %e, "write tracing stays off: no thread for it");
                None
            }
        }
    })
}

/// Append the stamps to `path` every `WRITE_EVERY`, for the life of the process.
fn write_out(stamps: &Mutex<Vec<Stamp>>, path: &Path) {
    loop {
        std::thread::sleep(WRITE_EVERY);
        let taken = std::mem::take(&mut *stamps.lock().unwrap_or_else(|p| p.into_inner()));
        if taken.is_empty() {
            continue;
        }
        let mut text = String::with_capacity(taken.len() * 32);
        for s in &taken {
            text.push_str(&format!("{} {} {}\n", s.stage, s.index, s.nanos));
        }
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(text.as_bytes()));
        if let Err(e) = written {
            tracing::warn!(error = %e, path = %path.display(), "writing stamps failed; tracing stops");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stage_reads_back_from_its_name() {
        for stage in Stage::ALL {
            assert_eq!(stage.to_string().parse::<Stage>(), Ok(stage));
        }
        let line = "flushed 42 1700000000000000000";
        assert_eq!(
            Stamp::parse(line),
            Ok(Stamp {
                stage: Stage::Flushed,
                index: 42,
                nanos: 1_700_000_000_000_000_000
            })
        );
        assert!(Stamp::parse("flushed 42").is_err());
        assert!(Stamp::parse("landed 42 7").is_err());
    }
}
