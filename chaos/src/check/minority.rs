//! A minority acknowledges nothing: no submission (`minority-ack`) and no read
//! (`minority-read`) sent to an agent that was cut off on a minority side for the whole
//! operation (from its invocation to its answer) succeeded. Cut-offs come from nemesis events'
//! `minority` field (the cut-off set from then on; empty when healed).

use std::collections::BTreeMap;

use crate::history::{Event, OpKind, Phase};
use crate::model::Violation;

const NAME: &str = "minority";

/// Operations answered by an agent that was cut off for their whole duration.
pub fn check(history: &[Event]) -> Vec<Violation> {
    let mut out = Vec::new();
    // The cut-off set in force, and since when each member has been in it.
    let mut cut: BTreeMap<u64, u64> = BTreeMap::new();
    // Each process's open invocation: (time, via).
    let mut open: BTreeMap<&str, (u64, Option<u64>)> = BTreeMap::new();
    for e in history {
        if e.op == OpKind::Nemesis
            && let Some(minority) = &e.minority
        {
            cut.retain(|n, _| minority.contains(n));
            for n in minority {
                cut.entry(*n).or_insert(e.time_ns);
            }
            continue;
        }
        if !matches!(e.op, OpKind::Submit | OpKind::Read) {
            continue;
        }
        match e.phase {
            Phase::Invoke => {
                open.insert(e.process.as_str(), (e.time_ns, e.via));
            }
            Phase::Ok => {
                let Some((invoked, via)) = open.remove(e.process.as_str()) else {
                    continue;
                };
                if let Some(via) = via
                    && cut.get(&via).is_some_and(|since| *since <= invoked)
                {
                    let kind = if e.op == OpKind::Submit {
                        "minority-ack"
                    } else {
                        "minority-read"
                    };
                    out.push(Violation::new(
                        NAME,
                        kind,
                        format!(
                            "{} through cut-off n{via} succeeded ({:?} key {:?} job {:?} value {:?})",
                            e.process, e.op, e.key, e.job_id, e.value
                        ),
                    ));
                }
            }
            Phase::Fail | Phase::Info => {
                open.remove(e.process.as_str());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(time_ns: u64, e: Event) -> Event {
        Event { time_ns, ..e }
    }

    fn op(process: &str, phase: Phase, op: OpKind, via: u64) -> Event {
        Event {
            via: Some(via),
            ..Event::new(process, phase, op)
        }
    }

    fn cut(nodes: &[u64]) -> Event {
        Event {
            minority: Some(nodes.to_vec()),
            ..Event::new("nemesis", Phase::Ok, OpKind::Nemesis)
        }
    }

    #[test]
    fn the_majority_answers_and_the_minority_fails() {
        let h = [
            at(1, cut(&[1])),
            at(2, op("w0", Phase::Invoke, OpKind::Submit, 2)),
            at(3, op("w0", Phase::Ok, OpKind::Submit, 2)),
            at(4, op("w1", Phase::Invoke, OpKind::Read, 1)),
            at(5, op("w1", Phase::Info, OpKind::Read, 1)),
            // Invoked before the cut: it may have been answered legitimately.
            at(6, op("w2", Phase::Invoke, OpKind::Submit, 3)),
            at(7, cut(&[3])),
            at(8, op("w2", Phase::Ok, OpKind::Submit, 3)),
            // After the heal, n3 answers again.
            at(9, cut(&[])),
            at(10, op("w2", Phase::Invoke, OpKind::Read, 3)),
            at(11, op("w2", Phase::Ok, OpKind::Read, 3)),
        ];
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn finds_an_ack_and_a_read_from_the_minority() {
        let h = [
            at(1, cut(&[1])),
            at(2, op("w0", Phase::Invoke, OpKind::Submit, 1)),
            at(3, op("w1", Phase::Invoke, OpKind::Read, 1)),
            at(4, op("w0", Phase::Ok, OpKind::Submit, 1)),
            at(5, op("w1", Phase::Ok, OpKind::Read, 1)),
        ];
        let kinds: Vec<&str> = check(&h).iter().map(|v| v.kind).collect();
        assert_eq!(kinds, ["minority-ack", "minority-read"]);
    }
}
