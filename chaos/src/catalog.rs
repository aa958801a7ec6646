//! The named scenarios the `gpu-chaos` binary can run: each short name maps to the scenario's
//! run name, its default seed and its nemesis; `tests/short_suite.rs` runs these same entries.

use crate::client::Keyed;
use crate::scenario::Nemesis;

/// One runnable scenario.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    /// What to type on the command line: `c1`, `c10-paused`.
    pub short: &'static str,
    /// The run's name (the run directory is `<name>-<seed>`).
    pub name: &'static str,
    /// The seed used when none is given.
    pub default_seed: u64,
    /// The faults it injects.
    pub nemesis: Nemesis,
}

/// Every scenario, in issue order.
pub const ALL: &[Entry] = &[
    Entry {
        short: "c1",
        name: "c1-leader-kill-loop",
        default_seed: 1,
        nemesis: Nemesis::LeaderKillLoop { rounds: 4 },
    },
    Entry {
        short: "c2",
        name: "c2-minority-kill-loop",
        default_seed: 2,
        nemesis: Nemesis::MinorityKillLoop { rounds: 4 },
    },
    Entry {
        short: "c3",
        name: "c3-kill-all",
        default_seed: 3,
        nemesis: Nemesis::KillAll,
    },
    Entry {
        short: "c4",
        name: "c4-rolling-restart",
        default_seed: 4,
        nemesis: Nemesis::RollingRestart,
    },
    Entry {
        short: "c5",
        name: "c5-leader-isolated",
        default_seed: 5,
        nemesis: Nemesis::IsolateLeader,
    },
    Entry {
        short: "c6",
        name: "c6-leader-side-split",
        default_seed: 6,
        nemesis: Nemesis::SplitLeaderSide,
    },
    Entry {
        short: "c7",
        name: "c7-ring",
        default_seed: 7,
        nemesis: Nemesis::Ring,
    },
    Entry {
        short: "c8",
        name: "c8-flapping",
        default_seed: 8,
        nemesis: Nemesis::Flapping {
            rounds: 6,
            agents: 5,
        },
    },
    Entry {
        short: "c9",
        name: "c9-leader-pause",
        default_seed: 9,
        nemesis: Nemesis::LeaderPause { rounds: 2 },
    },
    Entry {
        short: "c10-paused",
        name: "c10-holder-pause",
        default_seed: 10,
        nemesis: Nemesis::HolderPause,
    },
    Entry {
        short: "c10-cut",
        name: "c10-holder-isolated",
        default_seed: 110,
        nemesis: Nemesis::HolderIsolate,
    },
    Entry {
        short: "c11",
        name: "c11-lossy-transport",
        default_seed: 11,
        nemesis: Nemesis::LossyTransport,
    },
    Entry {
        short: "c12",
        name: "c12-voter-lost-learner-promoted",
        default_seed: 12,
        nemesis: Nemesis::VoterLost,
    },
    Entry {
        short: "c13",
        name: "c13-follower-behind-purged-log",
        default_seed: 13,
        nemesis: Nemesis::FollowerBehindPurge { crash_at: None },
    },
    Entry {
        short: "c14-log",
        name: "c14-crash-at-vote-and-append",
        default_seed: 14,
        nemesis: Nemesis::CrashAt {
            points: &[
                "log-append-before-fsync",
                "vote-save-before-fsync",
                "log-append-after-fsync",
                "vote-save-after-fsync",
            ],
        },
    },
    Entry {
        short: "c14-apply",
        name: "c14-crash-at-apply-and-snapshot",
        default_seed: 114,
        nemesis: Nemesis::CrashAt {
            points: &[
                "apply-before",
                "snapshot-build-before-write",
                "apply-after",
                "snapshot-file-before-rename",
                "snapshot-build-after-write",
            ],
        },
    },
    Entry {
        short: "c14-install",
        name: "c14-crash-installing-a-snapshot",
        default_seed: 214,
        nemesis: Nemesis::FollowerBehindPurge {
            crash_at: Some("snapshot-install-before-write"),
        },
    },
    Entry {
        short: "c15",
        name: "c15-fsync-error",
        default_seed: 15,
        nemesis: Nemesis::FsyncError,
    },
    Entry {
        short: "c16",
        name: "c16-retry-storm",
        default_seed: 16,
        nemesis: Nemesis::RetryStorm {
            min_keys: 6,
            tasks: 4,
            keyed: Keyed::Idempotency,
        },
    },
    Entry {
        short: "c17",
        name: "c17-keyless-retry-storm",
        default_seed: 17,
        nemesis: Nemesis::RetryStorm {
            min_keys: 6,
            tasks: 4,
            keyed: Keyed::RequestId,
        },
    },
];

/// The scenario called `short` (or by its full run name).
pub fn find(short: &str) -> Option<Entry> {
    ALL.iter()
        .copied()
        .find(|e| e.short == short || e.name == short)
}

/// Every short name, comma-separated (for error messages).
pub fn names() -> String {
    ALL.iter().map(|e| e.short).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_are_unique_and_found() {
        for e in super::ALL {
            assert_eq!(super::find(e.short).map(|f| f.name), Some(e.name));
            assert_eq!(super::find(e.name).map(|f| f.short), Some(e.short));
        }
        assert!(super::find("c99").is_none());
    }
}
