//! The one place where agent errors become gRPC statuses.

use gpu_raft_store::Rejection;
use tonic::Status;

use crate::api::log_target::LogTargetError;
use crate::host::images::PullError;
use crate::raft::ClusterError;
use crate::tls::enroll::IssueError;
use crate::tls::sealing::SealError;

impl From<ClusterError> for Status {
    fn from(e: ClusterError) -> Self {
        match e {
            ClusterError::NoLeader | ClusterError::Timeout(_) => Status::unavailable(e.to_string()),
            ClusterError::Rejected(r) => rejected(r),
            ClusterError::Raft(_) => {
                tracing::error!(error = %e, "raft failure while serving a request");
                Status::internal(e.to_string())
            }
            ClusterError::Remote(status) => status,
            ClusterError::TooLarge { .. } => Status::invalid_argument(e.to_string()),
            ClusterError::LearnerOnly { .. } | ClusterError::NeedsUpgrade { .. } => {
                Status::failed_precondition(e.to_string())
            }
        }
    }
}

/// A rejection, whether apply answered it or a lookup at the edge found nothing: the API's
/// "does not exist" answers are these, never hand-written.
pub(crate) fn rejected(r: Rejection) -> Status {
    match r {
        Rejection::UnknownNode { .. }
        | Rejection::UnknownJob { .. }
        | Rejection::UnknownToken { .. }
        | Rejection::UnknownTenant { .. } => Status::not_found(r.to_string()),
        Rejection::Invalid { .. } => Status::invalid_argument(r.to_string()),
        Rejection::PermissionDenied { .. } => Status::permission_denied(r.to_string()),
        Rejection::IdempotencyConflict { .. } => Status::already_exists(r.to_string()),
        Rejection::TooManyPending { .. } => Status::resource_exhausted(r.to_string()),
        Rejection::JobFinished { .. }
        | Rejection::Stale { .. }
        | Rejection::AccountChanged { .. }
        | Rejection::NotNow { .. } => Status::failed_precondition(r.to_string()),
    }
}

/// A secret this agent could not seal or open: it holds no CA key (a learner), or the secret
/// belongs to another CA or does not open.
pub(crate) fn sealing_failed(e: SealError) -> Status {
    match e {
        SealError::NoKey | SealError::OtherKey { .. } => Status::failed_precondition(e.to_string()),
        SealError::DoesNotOpen => Status::data_loss(e.to_string()),
        SealError::Crypto(_) => Status::internal(e.to_string()),
    }
}

/// A pull a node could not make: it has no podman, or the registry refused or failed.
pub(crate) fn pull_failed(e: PullError) -> Status {
    match e {
        PullError::NoPodman { .. } => Status::failed_precondition(e.to_string()),
        PullError::Failed { .. } => Status::aborted(e.to_string()),
    }
}

/// A `JobLogs` request naming no run or member: a job never placed cannot be read yet; a
/// rank or attempt that cannot exist is a bad argument; one that is not (or no longer) on
/// record is not found.
impl From<LogTargetError> for Status {
    fn from(e: LogTargetError) -> Self {
        match e {
            LogTargetError::NotRunYet { .. } => Status::failed_precondition(e.to_string()),
            LogTargetError::AttemptZero | LogTargetError::NoSuchRank { .. } => {
                Status::invalid_argument(e.to_string())
            }
            LogTargetError::NoSuchAttempt { .. } | LogTargetError::NotKept { .. } => {
                Status::not_found(e.to_string())
            }
        }
    }
}

impl From<IssueError> for Status {
    fn from(e: IssueError) -> Self {
        match e {
            IssueError::Refused(why) => Status::invalid_argument(why),
            IssueError::NotASigner | IssueError::NotTakenUp => Status::unavailable(e.to_string()),
            IssueError::NotRecorded(e) => e.into(),
        }
    }
}

/// A request that failed validation at the edge.
pub(crate) fn invalid(message: impl Into<String>) -> Status {
    Status::invalid_argument(message)
}

/// A peer payload that does not decode.
pub(crate) fn bad_payload(e: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("undecodable payload: {e}"))
}

/// `RESOURCE_EXHAUSTED` when an answer of `len` bytes would exceed the message size limit.
pub(crate) fn fits_in_a_message(what: &str, len: usize) -> Result<(), Status> {
    let max = gpu_proto::MAX_MESSAGE_BYTES;
    if len > max {
        return Err(Status::resource_exhausted(format!(
            "{what} is {len} bytes, over the {max}-byte message limit"
        )));
    }
    Ok(())
}

/// A peer speaking an internal protocol version this agent cannot (`protocol::negotiate`).
pub(crate) fn incompatible_peer(e: &crate::raft::protocol::Incompatible) -> Status {
    Status::failed_precondition(e.to_string())
}
