//! Per-job linearizability of reads (default reads are linearizable): a job's state only moves
//! forward, so no read may observe a version older than one already observed by a read that
//! completed before it began (`read-regressed`), and no read begun after a submission was
//! acknowledged may find no such job (`stale-not-found`).
//!
//! A version is (generation, phase): `PENDING` at generation 0 comes first; each bind bumps the
//! generation and goes `BOUND` → `RUNNING` → `PENDING` again (requeued) or a final state.

use std::collections::BTreeMap;

use crate::client::NOT_FOUND;
use crate::history::{Event, OpKind, Phase};
use crate::model::Violation;

const NAME: &str = "job-order";

/// The order of a state within one generation; `None` for a name this check does not know.
fn version(state: &str, generation: u64) -> Option<(u64, u8)> {
    let phase = match state {
        "JOB_STATE_PENDING" if generation == 0 => 0,
        "JOB_STATE_BOUND" => 1,
        "JOB_STATE_RUNNING" => 2,
        "JOB_STATE_PENDING" => 3,
        "JOB_STATE_SUCCEEDED" | "JOB_STATE_FAILED" | "JOB_STATE_CANCELLED" => 4,
        _ => return None,
    };
    Some((generation, phase))
}

/// One completed operation on a job: when it began and ended, and what it established.
struct Done<'a> {
    invoked: u64,
    completed: u64,
    process: &'a str,
    /// `None`: a submission acknowledged (the job exists); `Some`: a read of this version, or
    /// of no job at all (`Some(None)`).
    read: Option<Option<(u64, u8)>>,
}

/// Reads that saw a job older than, or absent after, what was already known.
pub fn check(history: &[Event]) -> Vec<Violation> {
    let mut open: BTreeMap<&str, u64> = BTreeMap::new();
    let mut per_job: BTreeMap<u64, Vec<Done>> = BTreeMap::new();
    for e in history {
        if !matches!(e.op, OpKind::Submit | OpKind::Read) {
            continue;
        }
        match e.phase {
            Phase::Invoke => {
                open.insert(e.process.as_str(), e.time_ns);
            }
            Phase::Ok => {
                let (Some(invoked), Some(job)) = (open.remove(e.process.as_str()), e.job_id) else {
                    continue;
                };
                let read = match (e.op, e.value.as_deref()) {
                    (OpKind::Submit, _) => None,
                    (_, Some(NOT_FOUND)) => Some(None),
                    (_, Some(state)) => match version(state, e.generation.unwrap_or(0)) {
                        Some(v) => Some(Some(v)),
                        None => continue,
                    },
                    (_, None) => continue,
                };
                per_job.entry(job).or_default().push(Done {
                    invoked,
                    completed: e.time_ns,
                    process: &e.process,
                    read,
                });
            }
            Phase::Fail | Phase::Info => {
                open.remove(e.process.as_str());
            }
        }
    }
    let mut out = Vec::new();
    for (job, ops) in per_job {
        for b in ops.iter().filter(|b| b.read.is_some()) {
            // What was known to be true before `b` began.
            let before = ops.iter().filter(|a| a.completed < b.invoked);
            let known_exists = before.clone().any(|a| !matches!(a.read, Some(None)));
            let newest = before.filter_map(|a| a.read.flatten()).max();
            match b.read {
                Some(None) if known_exists => out.push(Violation::new(
                    NAME,
                    "stale-not-found",
                    format!(
                        "{} read j-{job} as not found after it was acknowledged or seen",
                        b.process
                    ),
                )),
                Some(Some(v)) if newest.is_some_and(|n| v < n) => out.push(Violation::new(
                    NAME,
                    "read-regressed",
                    format!(
                        "{} read j-{job} at {v:?} after {:?} had been read",
                        b.process, newest
                    ),
                )),
                _ => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(time_ns: u64, process: &str, phase: Phase, op: OpKind, job: u64) -> Event {
        Event {
            time_ns,
            job_id: Some(job),
            ..Event::new(process, phase, op)
        }
    }

    fn read(t: u64, process: &str, job: u64, state: &str, generation: Option<u64>) -> [Event; 2] {
        [
            ev(t, process, Phase::Invoke, OpKind::Read, job),
            Event {
                value: Some(state.to_owned()),
                generation,
                ..ev(t + 1, process, Phase::Ok, OpKind::Read, job)
            },
        ]
    }

    fn acked(t: u64, process: &str, job: u64) -> [Event; 2] {
        [
            ev(t, process, Phase::Invoke, OpKind::Submit, job),
            ev(t + 1, process, Phase::Ok, OpKind::Submit, job),
        ]
    }

    #[test]
    fn forward_moving_reads_pass_including_a_requeue() {
        let h = [
            acked(0, "w0", 1),
            read(10, "w0", 1, "JOB_STATE_PENDING", Some(0)),
            read(20, "w1", 1, "JOB_STATE_RUNNING", Some(1)),
            read(30, "w0", 1, "JOB_STATE_PENDING", Some(1)),
            read(40, "w1", 1, "JOB_STATE_BOUND", Some(2)),
            read(50, "w0", 1, "JOB_STATE_SUCCEEDED", Some(2)),
            // Not found before anyone knew of job 2.
            read(60, "w1", 2, NOT_FOUND, None),
            acked(70, "w0", 2),
        ]
        .concat();
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn concurrent_reads_may_be_ordered_either_way() {
        // Both reads overlap in time: either order is linearizable.
        let h = vec![
            ev(0, "w0", Phase::Invoke, OpKind::Read, 1),
            ev(1, "w1", Phase::Invoke, OpKind::Read, 1),
            Event {
                value: Some("JOB_STATE_RUNNING".into()),
                generation: Some(1),
                ..ev(2, "w1", Phase::Ok, OpKind::Read, 1)
            },
            Event {
                value: Some("JOB_STATE_BOUND".into()),
                generation: Some(1),
                ..ev(3, "w0", Phase::Ok, OpKind::Read, 1)
            },
        ];
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn finds_a_stale_read_and_a_not_found_after_the_ack() {
        let h = [
            acked(0, "w0", 1),
            read(10, "w0", 1, "JOB_STATE_RUNNING", Some(1)),
            read(20, "w1", 1, "JOB_STATE_BOUND", Some(1)),
            read(30, "w2", 1, NOT_FOUND, None),
        ]
        .concat();
        let kinds: Vec<&str> = check(&h).iter().map(|v| v.kind).collect();
        assert_eq!(kinds, ["read-regressed", "stale-not-found"]);
    }
}
