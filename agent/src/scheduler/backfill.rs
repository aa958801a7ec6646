//! EASY backfill: the first job that cannot start gets a reservation — the earliest time
//! enough matching GPUs are expected to be free (from the running jobs' estimated ends) — and a
//! later job may start now only if it cannot delay that reservation: it ends before the
//! reserved start, or it runs elsewhere, or it only uses GPUs the reserved job will not need.

use gpu_raft_store::{JobId, JobSpec, NodeId, gpu_fits};

use super::placement::{Nodes, Placement, gang_domains, is_plain, matching, selector_matches};

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
    /// The nodes it will start on: one for a single-node job, K for a gang asked for
    /// (`JobSpec::nodes`); none for a gang split however the free GPUs allow (any nodes).
    pub nodes: Vec<NodeId>,
    /// Those nodes' slots in the pass, each with the matching GPUs expected to be free there
    /// at `start_ms` beyond what the job needs there: later jobs may use that many without
    /// delaying it.
    pub(crate) slots: Vec<(usize, usize)>,
    /// Matching GPUs expected to be free at `start_ms` beyond what it needs: on its nodes,
    /// or cluster-wide without nodes.
    pub spare: usize,
}

impl Reservation {
    /// The slots of its nodes.
    pub(crate) fn held_slots(&self) -> Vec<usize> {
        self.slots.iter().map(|(slot, _)| *slot).collect()
    }
}

/// One eligible slot as a reservation sees it.
struct Profile {
    slot: usize,
    /// Matching GPUs free now.
    free_now: usize,
    /// (end, matching GPUs released) of the runs holding its GPUs, in time order.
    events: Vec<(u64, usize)>,
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
    // Per eligible slot: matching GPUs free now, and (end, matching GPUs released) events.
    let mut events_of: Vec<Vec<(u64, usize)>> = vec![Vec::new(); nodes.slots.len()];
    for h in holdings {
        if let Some(end) = h.end_ms {
            events_of[h.slot].push((end, matching(&nodes.slots[h.slot], &h.gpus, spec)));
        }
    }
    let mut profiles: Vec<Profile> = Vec::new();
    for ((i, slot), mut events) in nodes.slots.iter().enumerate().zip(events_of) {
        if !selector_matches(spec, &slot.labels) {
            continue;
        }
        let free_now = if is_plain(spec) {
            slot.free.len()
        } else {
            slot.free.iter().filter(|g| gpu_fits(g, spec)).count()
        };
        events.sort_unstable();
        profiles.push(Profile {
            slot: i,
            free_now,
            events,
        });
    }
    if spec.nodes > 1 {
        return reserve_even_gang(job, spec, nodes, &profiles, now_ms);
    }
    let want = spec.gpus as usize;
    let mut best: Option<Reservation> = None;
    for p in &profiles {
        let Some((start, free)) = earliest(p.free_now, &p.events, want, now_ms) else {
            continue;
        };
        let better = best
            .as_ref()
            .is_none_or(|b| start < b.start_ms || (start == b.start_ms && free < b.spare + want));
        if better {
            best = Some(Reservation {
                job,
                start_ms: start,
                nodes: vec![nodes.slots[p.slot].id],
                slots: vec![(p.slot, free - want)],
                spare: free - want,
            });
        }
    }
    if best.is_some() || !gangs {
        return best;
    }
    let cluster_free = profiles.iter().map(|p| p.free_now).sum();
    let mut cluster_events: Vec<(u64, usize)> = profiles
        .iter()
        .flat_map(|p| p.events.iter().copied())
        .collect();
    cluster_events.sort_unstable();
    earliest(cluster_free, &cluster_events, want, now_ms).map(|(start, free)| Reservation {
        job,
        start_ms: start,
        nodes: Vec::new(),
        slots: Vec::new(),
        spare: free - want,
    })
}

/// A gang asked for: the K nodes that each have its per-node share of matching GPUs free
/// soonest (the smaller hole first on equal times), inside one domain of the topology level it
/// requires, if any; it starts when the last of them does.
fn reserve_even_gang(
    job: JobId,
    spec: &JobSpec,
    nodes: &Nodes<'_>,
    profiles: &[Profile],
    now_ms: u64,
) -> Option<Reservation> {
    let per = spec.gpus_per_node() as usize;
    let k = spec.node_count() as usize;
    let labelled: Vec<_> = profiles
        .iter()
        .enumerate()
        .map(|(i, p)| (&nodes.slots[p.slot].labels, i))
        .collect();
    let groups = gang_domains(spec.topology.as_deref(), &labelled);
    let (start_ms, chosen) = groups
        .iter()
        .filter_map(|group| soonest(group, profiles, per, k, now_ms))
        .min_by_key(|(start, _)| *start)?;
    let slots: Vec<(usize, usize)> = chosen
        .iter()
        .map(|&i| {
            let p = &profiles[i];
            (p.slot, free_at(p.free_now, &p.events, start_ms) - per)
        })
        .collect();
    Some(Reservation {
        job,
        start_ms,
        nodes: slots
            .iter()
            .map(|(slot, _)| nodes.slots[*slot].id)
            .collect(),
        spare: slots.iter().map(|(_, spare)| spare).sum(),
        slots,
    })
}

/// The `k` of `group` (indexes into `profiles`) that have `per` GPUs free soonest (the
/// smaller hole first on equal times), in index order, and when the last of them has.
fn soonest(
    group: &[usize],
    profiles: &[Profile],
    per: usize,
    k: usize,
    now_ms: u64,
) -> Option<(u64, Vec<usize>)> {
    let mut ready: Vec<(u64, usize, usize)> = group
        .iter()
        .filter_map(|&i| {
            let p = &profiles[i];
            let (start, free) = earliest(p.free_now, &p.events, per, now_ms)?;
            Some((start, free - per, i))
        })
        .collect();
    if ready.len() < k {
        return None;
    }
    ready.sort_unstable();
    ready.truncate(k);
    let start = ready.iter().map(|(start, ..)| *start).max()?;
    let mut chosen: Vec<usize> = ready.into_iter().map(|(.., p)| p).collect();
    chosen.sort_unstable();
    Some((start, chosen))
}

/// GPUs free at `at_ms`: `free` now plus those released by then.
fn free_at(free: usize, events: &[(u64, usize)], at_ms: u64) -> usize {
    free + events
        .iter()
        .take_while(|(t, _)| *t <= at_ms)
        .map(|(_, n)| n)
        .sum::<usize>()
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
    let taken = |slot: usize, gpus: &[u32]| matching(&nodes.slots[slot], gpus, head);
    if reservation.slots.is_empty() {
        // A gang on any nodes: its spare GPUs are counted cluster-wide.
        let taken: usize = placement
            .iter()
            .map(|(slot, gpus)| taken(*slot, gpus))
            .sum();
        if taken > reservation.spare {
            return false;
        }
        reservation.spare -= taken;
        return true;
    }
    let mut spares = reservation.slots.clone();
    for (slot, gpus) in placement {
        if let Some((_, spare)) = spares.iter_mut().find(|(s, _)| s == slot) {
            let taken = taken(*slot, gpus);
            if taken > *spare {
                return false;
            }
            *spare -= taken;
        }
    }
    reservation.spare = spares.iter().map(|(_, spare)| spare).sum();
    reservation.slots = spares;
    true
}
