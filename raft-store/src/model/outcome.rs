//! What `apply` answers: `ApplyResult` for every entry, and `Rejection`, the typed reason a
//! command changed nothing. Replicated outcomes: every replica answers an entry the same way.

use serde::{Deserialize, Serialize};

use crate::model::job::JobState;
use crate::{JobId, NodeId};

/// What applying one entry produced. A rejection is a normal, replicated outcome: every replica
/// rejects the same entry the same way.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum ApplyResult {
    Ok,
    JobSubmitted {
        job: JobId,
        existing: bool,
    },
    /// Per bind of a batch: the jobs bound, and the ones refused with why.
    Bound {
        bound: Vec<JobId>,
        rejected: Vec<(JobId, String)>,
    },
    Rejected {
        reason: Rejection,
    },
    /// The alert a `RaiseAlert` opened, or the open one it matched (`existing`).
    AlertRaised {
        alert: u64,
        existing: bool,
    },
    /// The alert a `ResolveAlert` closed (a resolve of no open alert is plain `Ok`).
    AlertResolved {
        alert: u64,
    },
    /// Per preemption of a batch: the jobs asked to stop, and the ones refused with why.
    Preempted {
        preempted: Vec<JobId>,
        rejected: Vec<(JobId, String)>,
    },
    /// A `Batch`'s results, one per entry, in order.
    Batch {
        results: Vec<ApplyResult>,
    },
}

/// Why `apply` refused a command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Rejection {
    #[error("node {node} is not registered")]
    UnknownNode { node: NodeId },
    #[error("invalid argument: {message}")]
    Invalid { message: String },
    #[error("job j-{job} does not exist")]
    UnknownJob { job: JobId },
    #[error("job j-{job} already finished ({state})")]
    JobFinished { job: JobId, state: JobState },
    #[error("idempotency key {key:?} already created job j-{job} with a different spec")]
    IdempotencyConflict { key: String, job: JobId },
    #[error("permission denied: {message}")]
    PermissionDenied { message: String },
    #[error("tenant {name} does not exist")]
    UnknownTenant { name: String },
    #[error("token {id} does not exist")]
    UnknownToken { id: String },
    /// A submission stamped with another account than the submitting token's mapping (else
    /// its tenant's default) names now: the mapping changed after the API read it.
    #[error("the Unix account for this submission changed while it was submitted (now {}); submit again", .now.as_ref().map_or_else(|| "none".to_owned(), ToString::to_string))]
    AccountChanged {
        now: Option<crate::model::account::Account>,
    },
    /// The tenant has as many jobs pending as its record allows.
    #[error(
        "tenant {tenant} already has {cap} jobs pending, its cap: wait for some to start or ask an admin to raise it"
    )]
    TooManyPending { tenant: String, cap: u32 },
    /// Not now: the cluster is not in a state where the command can take effect.
    #[error("{message}")]
    NotNow { message: String },
    #[error(
        "report for job j-{job} generation {generation} is stale (current generation {current}, {state})"
    )]
    Stale {
        job: JobId,
        generation: u64,
        current: u64,
        state: JobState,
    },
}

/// The rejection for input that breaks a rule (`validate`'s reasons and the like).
pub(crate) fn invalid(message: String) -> Rejection {
    Rejection::Invalid { message }
}
