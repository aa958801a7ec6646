//! Why a cluster operation failed, and whether a retry loop may try again. Mapped to a gRPC
//! status in exactly one place (`api/status.rs`).

use std::time::Duration;

use gpu_raft_store::{NodeId, Rejection};

/// Why a cluster operation failed. Mapped to a gRPC status in exactly one place (`api/status.rs`).
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("no leader is known: the cluster is electing one or has lost its quorum")]
    NoLeader,
    #[error("the cluster did not answer within {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Rejected(#[from] Rejection),
    #[error("raft: {0}")]
    Raft(String),
    #[error("{}", describe(.0))]
    Remote(tonic::Status),
    #[error("n{node} {why}: it is a learner only and never becomes a voter")]
    LearnerOnly { node: NodeId, why: String },
    #[error(
        "this change needs every member at internal protocol {needed} or newer, and one speaks {lowest}: finish the rolling upgrade first"
    )]
    NeedsUpgrade { needed: u32, lowest: u32 },
    #[error(
        "the write is {bytes} bytes encoded, above the {max} bytes one request may put in the log: send less (a shorter command or environment)"
    )]
    TooLarge { bytes: usize, max: usize },
}

/// One attempt's outcome inside a retry loop.
pub enum Attempt {
    /// Safe to try again (no leader yet, leadership moved, peer not reachable).
    Retry(ClusterError),
    Fail(ClusterError),
}

/// A failed peer call: unreachable or "not the leader" are worth retrying; anything else is the
/// remote's answer and goes back to the client as it is.
pub(crate) fn remote(status: tonic::Status) -> Attempt {
    match status.code() {
        // Unreachable, or the connection dropped mid-call (the peer died). A forwarded write
        // may then have been applied already, so this retry is at-least-once: submissions are
        // made exactly-once by their idempotency key (gpuctl always sends one), most other
        // commands are idempotent, and a repeated one is rejected as stale or duplicate.
        tonic::Code::Unavailable | tonic::Code::Cancelled => {
            Attempt::Retry(ClusterError::Remote(status))
        }
        _ => Attempt::Fail(ClusterError::Remote(status)),
    }
}

/// A peer call's status with its transport cause ("tcp connect error: Connection refused").
fn describe(status: &tonic::Status) -> String {
    let mut text = status.message().to_owned();
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
