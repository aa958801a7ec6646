//! What the checkers read besides the history: the final job list, the jobs' own run records,
//! each replica's final digest, and what they report (named violations).

use std::fmt;

use serde::{Deserialize, Serialize};

/// The final state name of a job that finished well (`gpu_proto` `JobState::Succeeded`).
pub const SUCCEEDED: &str = "JOB_STATE_SUCCEEDED";

/// One job as the cluster lists it at the end of a run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalJob {
    pub id: u64,
    pub key: String,
    /// `JobState` name, e.g. `JOB_STATE_SUCCEEDED`.
    pub state: String,
    pub generation: u64,
    /// Why it is still pending, or why it failed (empty when none was recorded).
    #[serde(default)]
    pub reason: String,
}

/// One run of a job as the job itself recorded it.
pub use gpu_tests::records::RunRecord;

/// What one agent reported of its replica once the cluster had settled.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaDigest {
    pub node: u64,
    /// Its last applied log index (`None` when it did not answer).
    pub applied_index: Option<u64>,
    /// Hex SHA-256 of its state at `applied_index`.
    pub sha256: Option<String>,
    /// Why it did not answer.
    pub error: Option<String>,
}

/// A named violation found by a checker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub checker: &'static str,
    pub kind: &'static str,
    pub detail: String,
}

impl Violation {
    pub fn new(checker: &'static str, kind: &'static str, detail: String) -> Violation {
        Violation {
            checker,
            kind,
            detail,
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}: {}", self.checker, self.kind, self.detail)
    }
}
