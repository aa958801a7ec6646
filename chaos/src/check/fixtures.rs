//! Hand-made history pieces for the checkers' unit tests.

use crate::history::{Event, OpKind, Phase};
use crate::model::{FinalJob, ReplicaDigest, SUCCEEDED, Violation};

pub(crate) fn submit(process: &str, phase: Phase, key: &str, job_id: Option<u64>) -> Event {
    Event {
        key: Some(key.to_owned()),
        job_id,
        ..Event::new(process, phase, OpKind::Submit)
    }
}

/// invoke + ok for `key` acknowledged as `job_id`.
pub(crate) fn acked(process: &str, key: &str, job_id: u64) -> Vec<Event> {
    vec![
        submit(process, Phase::Invoke, key, None),
        submit(process, Phase::Ok, key, Some(job_id)),
    ]
}

pub(crate) fn job(id: u64, key: &str) -> FinalJob {
    FinalJob {
        id,
        key: key.to_owned(),
        state: SUCCEEDED.to_owned(),
        generation: 1,
        reason: String::new(),
    }
}

/// Node `node`'s replica at `index` with digest `sha256`.
pub(crate) fn replica(node: u64, index: u64, sha256: &str) -> ReplicaDigest {
    ReplicaDigest {
        node,
        applied_index: Some(index),
        sha256: Some(sha256.to_owned()),
        error: None,
    }
}

/// The kinds of the violations found, in order.
pub(crate) fn kinds(v: &[Violation]) -> Vec<&'static str> {
    v.iter().map(|v| v.kind).collect()
}
