//! EASY backfill: the first job that cannot start gets a reservation — the earliest time
//! enough matching GPUs are expected to be free (from the running jobs' estimated ends) — and a
//! later job may start now only if it cannot delay that reservation: it ends before the
//! reserved start, or it runs elsewhere, or it only uses GPUs the reserved job will not need.

use gpu_raft_store::{JobId, JobSpec, NodeId, gpu_fits};

use super::placement::{Nodes, Placement, is_plain, matching, selector_matches};

/// A run holding GPUs during the pass (running before it, or started by it).
#[derive(Clone, Debug)]
pub(crate) struct Holding {
    pub slot: usize,
    pub gpus: Vec<u32>,
    /// Expected end; `None` when nothing estimates it (it may never end).
    pub end_ms: Option<u64>,
}

/// The head job's reservation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub job: JobId,
    /// When it is expected to start.
    pub start_ms: u64,
    /// The node it will start on; `None` for a multi-node gang (any nodes).
    pub node: Option<NodeId>,
    /// That node's slot in the pass.
    pub(crate) slot: Option<usize>,
    /// Matching GPUs expected to be free at `start_ms` beyond what it needs (on its node, or
    /// cluster-wide for a gang): later jobs may use that many without delaying it.
    pub spare: usize,
}

/// The earliest start of `spec` given the GPUs free now and the runs in `holdings`.
pub(crate) fn reserve(
    job: JobId,
    spec: &JobSpec,
    nodes: &Nodes<'_>,
    holdings: &[Holding],
    gangs: bool,
    now_ms: u64,
) -> Option<Reservation> {
    let want = spec.gpus as usize;
    // Per eligible slot: matching GPUs free now, and (end, matching GPUs released) events.
    let mut best: Option<Reservation> = None;
    let mut cluster_events: Vec<(u64, usize)> = Vec::new();
    let mut cluster_free = 0;
    for (i, slot) in nodes.slots.iter().enumerate() {
        if !selector_matches(spec, &slot.labels) {
            continue;
        }
        let free_now = if is_plain(spec) {
            slot.free.len()
        } else {
            slot.free.iter().filter(|g| gpu_fits(g, spec)).count()
        };
        let mut events: Vec<(u64, usize)> = holdings
            .iter()
            .filter(|h| h.slot == i)
            .filter_map(|h| Some((h.end_ms?, matching(slot, &h.gpus, spec))))
            .collect();
        events.sort_unstable();
        cluster_free += free_now;
        cluster_events.extend(events.iter().copied());
        if let Some((start, free)) = earliest(free_now, &events, want, now_ms) {
            let better = best.as_ref().is_none_or(|b| {
                start < b.start_ms || (start == b.start_ms && free < b.spare + want)
            });
            if better {
                best = Some(Reservation {
                    job,
                    start_ms: start,
                    node: Some(slot.id),
                    slot: Some(i),
                    spare: free - want,
                });
            }
        }
    }
    if best.is_some() || !gangs {
        return best;
    }
    cluster_events.sort_unstable();
    earliest(cluster_free, &cluster_events, want, now_ms).map(|(start, free)| Reservation {
        job,
        start_ms: start,
        node: None,
        slot: None,
        spare: free - want,
    })
}

/// The first time at which `free` plus the GPUs released by then reaches `want`, and the GPUs
/// free at that time.
fn earliest(
    free: usize,
    events: &[(u64, usize)],
    want: usize,
    now_ms: u64,
) -> Option<(u64, usize)> {
    if free >= want {
        return Some((now_ms, free));
    }
    let mut free = free;
    let mut k = 0;
    while k < events.len() {
        let t = events[k].0;
        while k < events.len() && events[k].0 == t {
            free += events[k].1;
            k += 1;
        }
        if free >= want {
            return Some((t, free));
        }
    }
    None
}

/// Whether starting `spec` now at `placement`, expected to end at `end_ms`, leaves the
/// reservation intact; if it does by using spare GPUs, they are used up.
pub(crate) fn admit(
    reservation: &mut Reservation,
    head: &JobSpec,
    nodes: &Nodes<'_>,
    placement: &Placement,
    end_ms: Option<u64>,
) -> bool {
    if end_ms.is_some_and(|end| end <= reservation.start_ms) {
        return true;
    }
    let taken: usize = placement
        .iter()
        .filter(|(slot, _)| reservation.slot.is_none_or(|r| r == *slot))
        .map(|(slot, gpus)| matching(&nodes.slots[*slot], gpus, head))
        .sum();
    if taken <= reservation.spare {
        reservation.spare -= taken;
        true
    } else {
        false
    }
}
