//! Backfill reservations. EASY: the first job that cannot start gets a reservation — the
//! earliest time enough matching GPUs are expected to be free (from the running jobs'
//! estimated ends) for as long as it is expected to run. Conservative: every job that cannot
//! start gets one, in queue order, each counting on the GPUs those before it booked. A later
//! job may start now only if it delays none of them: it ends before a reservation's start, or
//! it runs elsewhere, or it only uses GPUs the reserved job will not need.

use gpu_raft_store::{JobId, JobSpec, NodeId, gpu_fits};

use super::placement::{
    Nodes, Placement, Slot, gang_domains, is_plain, matching, selector_matches,
};

/// A run holding GPUs during the pass (running before it, or started by it).
#[derive(Clone, Debug)]
pub(crate) struct Holding {
    pub slot: usize,
    pub gpus: Vec<u32>,
    /// Expected end; `None` when nothing estimates it (it may never end).
    pub end_ms: Option<u64>,
}

impl Holding {
    /// (its expected end, the GPUs it gives back then) for a plain job; none without an end.
    fn end_event(&self) -> Option<(u64, isize)> {
        Some((self.end_ms?, self.gpus.len() as isize))
    }
}

/// A job's reservation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub job: JobId,
    /// When it is expected to start.
    pub start_ms: u64,
    /// When it is expected to end; `None` without an estimate (it books its GPUs for good).
    pub end_ms: Option<u64>,
    /// The nodes it will start on: one for a single-node job, K for a gang asked for
    /// (`JobSpec::nodes`); none for a gang split however the free GPUs allow (any nodes).
    pub nodes: Vec<NodeId>,
    /// Those nodes' slots in the pass, each with the matching GPUs expected to be free there
    /// from `start_ms` to `end_ms` beyond what the job needs there: later jobs may use that
    /// many without delaying it.
    pub(crate) slots: Vec<(usize, usize)>,
    /// Matching GPUs expected to be free from `start_ms` to `end_ms` beyond what it needs: on
    /// its nodes, or cluster-wide without nodes.
    pub spare: usize,
    /// GPUs it takes on each of its nodes (all it asks for without nodes).
    pub(crate) need: usize,
}

impl Reservation {
    /// The slots of its nodes.
    pub(crate) fn held_slots(&self) -> impl Iterator<Item = usize> + '_ {
        self.slots.iter().map(|(slot, _)| *slot)
    }
}

/// The free GPUs of each node over time as the reservations of one pass see them: the runs
/// holding GPUs (running before the pass or started by it) with their expected ends, and the
/// GPUs each reservation books from its start to its end. Built once a pass first reserves,
/// then kept up to date.
pub(crate) struct Timeline {
    runs: Vec<Holding>,
    bookings: Vec<Booking>,
    /// Per slot, (time, change in free GPUs) for a plain job (any GPU will do): the runs'
    /// ends, the bookings' starts and ends, in time order.
    plain: Vec<Vec<(u64, isize)>>,
}

/// GPUs a reservation books on one node.
struct Booking {
    slot: usize,
    gpus: usize,
    start_ms: u64,
    end_ms: Option<u64>,
}

impl Booking {
    /// (time, change in free GPUs): its start takes them, its end (if any) gives them back.
    fn events(&self) -> impl Iterator<Item = (u64, isize)> + use<> {
        let gpus = self.gpus as isize;
        std::iter::once((self.start_ms, -gpus)).chain(self.end_ms.map(|end| (end, gpus)))
    }
}

impl Timeline {
    pub(crate) fn new(slots: usize, runs: Vec<Holding>) -> Self {
        let mut plain = vec![Vec::new(); slots];
        for run in &runs {
            plain[run.slot].extend(run.end_event());
        }
        for events in &mut plain {
            events.sort_unstable();
        }
        Self {
            runs,
            bookings: Vec::new(),
            plain,
        }
    }

    /// A run started by the pass.
    pub(crate) fn add_run(&mut self, run: Holding) {
        if let Some(event) = run.end_event() {
            insert(&mut self.plain[run.slot], event);
        }
        self.runs.push(run);
    }

    /// A reservation taken: later ones count on its GPUs being taken.
    pub(crate) fn book(&mut self, r: &Reservation) {
        for slot in r.held_slots() {
            let booking = Booking {
                slot,
                gpus: r.need,
                start_ms: r.start_ms,
                end_ms: r.end_ms,
            };
            for event in booking.events() {
                insert(&mut self.plain[slot], event);
            }
            self.bookings.push(booking);
        }
    }

    /// Per slot, (time, change in GPUs that could serve `spec`), in time order. (A booking
    /// counts whole, whatever its GPUs' type.)
    fn events_for(&self, spec: &JobSpec, nodes: &Nodes<'_>) -> Vec<Vec<(u64, isize)>> {
        let mut events: Vec<Vec<(u64, isize)>> = vec![Vec::new(); nodes.slots.len()];
        for h in &self.runs {
            if let Some(end) = h.end_ms {
                let released = matching(&nodes.slots[h.slot], &h.gpus, spec);
                events[h.slot].push((end, released as isize));
            }
        }
        for b in &self.bookings {
            events[b.slot].extend(b.events());
        }
        for e in &mut events {
            e.sort_unstable();
        }
        events
    }

    /// The earliest start of `spec`, expected to run `duration_ms` (for good without one),
    /// given the GPUs free now, the runs holding the others and the reservations booked.
    pub(crate) fn reserve(
        &self,
        job: JobId,
        spec: &JobSpec,
        duration_ms: Option<u64>,
        nodes: &Nodes<'_>,
        gangs: bool,
        now_ms: u64,
    ) -> Option<Reservation> {
        let plain = is_plain(spec);
        let computed;
        let events: &[Vec<(u64, isize)>] = if plain {
            &self.plain
        } else {
            computed = self.events_for(spec, nodes);
            &computed
        };
        // The eligible slots, with the GPUs that could serve it free now.
        let may_run_on = |slot: &Slot<'_>| plain || selector_matches(spec, &slot.labels);
        let eligible = nodes.slots.iter().enumerate().filter_map(|(i, slot)| {
            if plain {
                return Some((i, slot.free.len()));
            }
            may_run_on(slot).then(|| (i, slot.free.iter().filter(|g| gpu_fits(g, spec)).count()))
        });
        let window = Window { duration_ms };
        if spec.nodes > 1 {
            let profiles: Vec<Profile> = eligible
                .map(|(slot, free_now)| Profile {
                    slot,
                    steps: steps(free_now, &events[slot], now_ms),
                })
                .collect();
            return reserve_even_gang(job, spec, nodes, &profiles, window);
        }
        let want = spec.gpus as usize;
        let mut best: Option<(u64, usize, usize)> = None;
        let mut cluster_free = 0;
        let mut scratch = Vec::new();
        for (slot, free_now) in eligible {
            cluster_free += free_now;
            fill_steps(&mut scratch, free_now, &events[slot], now_ms);
            if let Some((start, low)) = window.earliest(&scratch, want) {
                let candidate = (start, low - want, slot);
                best = Some(best.map_or(candidate, |b| b.min(candidate)));
            }
        }
        if let Some((start, spare, slot)) = best {
            return Some(window.reservation(job, start, nodes, vec![(slot, spare)], want));
        }
        if !gangs {
            return None;
        }
        // A gang on any nodes: the cluster's GPUs as one.
        let mut cluster_events: Vec<(u64, isize)> = nodes
            .slots
            .iter()
            .enumerate()
            .filter(|(_, slot)| may_run_on(slot))
            .flat_map(|(i, _)| events[i].iter().copied())
            .collect();
        cluster_events.sort_unstable();
        let (start, low) = window.earliest(&steps(cluster_free, &cluster_events, now_ms), want)?;
        Some(Reservation {
            spare: low - want,
            ..window.reservation(job, start, nodes, Vec::new(), want)
        })
    }
}

/// Insert `event` into `events`, kept in time order.
fn insert(events: &mut Vec<(u64, isize)>, event: (u64, isize)) {
    let at = events.partition_point(|e| *e <= event);
    events.insert(at, event);
}

/// One eligible slot as a reservation sees it.
struct Profile {
    slot: usize,
    /// (from, matching GPUs free from then on), in time order, the first at now.
    steps: Vec<(u64, usize)>,
}

impl Profile {
    /// Whether its free GPUs never fall (nothing booked on it).
    fn rises_only(&self) -> bool {
        self.steps.windows(2).all(|w| w[0].1 <= w[1].1)
    }
}

/// A gang asked for: the K nodes that each have its per-node share of matching GPUs free
/// soonest for the whole run (the smaller hole first on equal times), inside one domain of the
/// topology level it requires, if any; it starts when the last of them has.
fn reserve_even_gang(
    job: JobId,
    spec: &JobSpec,
    nodes: &Nodes<'_>,
    profiles: &[Profile],
    window: Window,
) -> Option<Reservation> {
    let per = spec.gpus_per_node() as usize;
    let k = spec.node_count() as usize;
    let labelled: Vec<_> = profiles
        .iter()
        .enumerate()
        .map(|(i, p)| (&*nodes.slots[p.slot].labels, i))
        .collect();
    let groups = gang_domains(spec.topology.as_deref(), &labelled);
    let (start_ms, chosen) = groups
        .iter()
        .filter_map(|group| window.soonest(group, profiles, per, k))
        .min_by_key(|(start, _)| *start)?;
    let slots: Vec<(usize, usize)> = chosen
        .iter()
        .map(|&(i, spare)| (profiles[i].slot, spare))
        .collect();
    Some(window.reservation(job, start_ms, nodes, slots, per))
}

/// The free GPUs from now on, as steps: (from, free) at now and at each later change.
fn steps(free_now: usize, events: &[(u64, isize)], now_ms: u64) -> Vec<(u64, usize)> {
    let mut out = Vec::with_capacity(events.len() + 1);
    fill_steps(&mut out, free_now, events, now_ms);
    out
}

/// `steps` into a buffer that is reused.
fn fill_steps(out: &mut Vec<(u64, usize)>, free_now: usize, events: &[(u64, isize)], now_ms: u64) {
    out.clear();
    let mut free = free_now as isize;
    let mut k = 0;
    // Runs past their expected end are expected to end now.
    while k < events.len() && events[k].0 <= now_ms {
        free += events[k].1;
        k += 1;
    }
    out.push((now_ms, free.max(0) as usize));
    while k < events.len() {
        let t = events[k].0;
        while k < events.len() && events[k].0 == t {
            free += events[k].1;
            k += 1;
        }
        out.push((t, free.max(0) as usize));
    }
}

/// How long a reservation holds its GPUs, from when.
#[derive(Clone, Copy)]
struct Window {
    duration_ms: Option<u64>,
}

impl Window {
    fn end(self, start_ms: u64) -> Option<u64> {
        self.duration_ms.map(|d| start_ms.saturating_add(d))
    }

    /// `job`'s reservation from `start_ms` on `slots` (each with its spare GPUs then), taking
    /// `need` GPUs on each.
    fn reservation(
        self,
        job: JobId,
        start_ms: u64,
        nodes: &Nodes<'_>,
        slots: Vec<(usize, usize)>,
        need: usize,
    ) -> Reservation {
        Reservation {
            job,
            start_ms,
            end_ms: self.end(start_ms),
            nodes: slots
                .iter()
                .map(|(slot, _)| nodes.slots[*slot].id)
                .collect(),
            spare: slots.iter().map(|(_, spare)| spare).sum(),
            slots,
            need,
        }
    }

    /// The fewest GPUs free from `start_ms` to its end.
    fn lowest(self, steps: &[(u64, usize)], start_ms: u64) -> usize {
        let end = self.end(start_ms);
        let first = steps.partition_point(|(t, _)| *t <= start_ms).max(1) - 1;
        steps[first..]
            .iter()
            .take_while(|(t, _)| *t == steps[first].0 || end.is_none_or(|end| *t < end))
            .map(|(_, free)| *free)
            .min()
            .unwrap_or(0)
    }

    /// The first time at which `want` GPUs are free for the whole window, and the fewest free
    /// during it.
    fn earliest(self, steps: &[(u64, usize)], want: usize) -> Option<(u64, usize)> {
        let mut i = 0;
        'start: while i < steps.len() {
            let (start, free) = steps[i];
            if free < want {
                i += 1;
                continue;
            }
            let end = self.end(start);
            let mut low = free;
            for (j, &(t, free)) in steps.iter().enumerate().skip(i + 1) {
                if end.is_some_and(|end| t >= end) {
                    break;
                }
                if free < want {
                    // Every start up to here has this dip in its window.
                    i = j + 1;
                    continue 'start;
                }
                low = low.min(free);
            }
            return Some((start, low));
        }
        None
    }

    /// The `k` of `group` (indexes into `profiles`) that have `per` GPUs free soonest for the
    /// whole window (the smaller hole first on equal times), in index order with their spare
    /// GPUs, and when the last of them has.
    fn soonest(
        self,
        group: &[usize],
        profiles: &[Profile],
        per: usize,
        k: usize,
    ) -> Option<(u64, Vec<(usize, usize)>)> {
        let ready: Vec<(u64, usize, usize)> = group
            .iter()
            .filter_map(|&i| {
                let (start, low) = self.earliest(&profiles[i].steps, per)?;
                Some((start, low - per, i))
            })
            .collect();
        if ready.len() < k {
            return None;
        }
        // A node whose free GPUs only rise stays ready from its earliest start; one with a
        // booking may be taken back, so it is checked at each time a node may become ready.
        let (rising, falling): (Vec<(u64, usize, usize)>, Vec<_>) =
            ready.iter().partition(|(.., i)| profiles[*i].rises_only());
        let mut rising: Vec<u64> = rising.iter().map(|(start, ..)| *start).collect();
        rising.sort_unstable();
        let mut candidates = rising.clone();
        for &(start, _, i) in &falling {
            candidates.push(start);
            candidates.extend(profiles[i].steps.iter().map(|s| s.0).filter(|t| *t > start));
        }
        candidates.sort_unstable();
        candidates.dedup();
        let start = candidates.into_iter().find(|&t| {
            let rising_ready = rising.partition_point(|start| *start <= t);
            let falling_ready = falling
                .iter()
                .filter(|&&(start, _, i)| start <= t && self.lowest(&profiles[i].steps, t) >= per)
                .count();
            rising_ready + falling_ready >= k
        })?;
        // The soonest ready first, then the smaller hole then; each with its spare GPUs.
        let mut chosen: Vec<((u64, usize, usize), usize)> = ready
            .into_iter()
            .filter(|&(ready_at, ..)| ready_at <= start)
            .filter_map(|r| {
                let low = self.lowest(&profiles[r.2].steps, start);
                (low >= per).then(|| (r, low - per))
            })
            .collect();
        chosen.sort_unstable();
        chosen.truncate(k);
        let mut chosen: Vec<(usize, usize)> = chosen
            .into_iter()
            .map(|((.., i), spare)| (i, spare))
            .collect();
        chosen.sort_unstable();
        Some((start, chosen))
    }
}

/// Whether starting a job now at `placement`, expected to end at `end_ms`, delays none of
/// `reservations`; when it does not, the spare GPUs it uses are used up. `Err`: the first
/// reserved job it would delay.
pub(crate) fn admit(
    reservations: &mut [(Reservation, JobSpec)],
    nodes: &Nodes<'_>,
    placement: &Placement,
    end_ms: Option<u64>,
) -> Result<(), JobId> {
    let mut spent = Vec::new();
    for (i, (r, head)) in reservations.iter().enumerate() {
        match spend(r, head, nodes, placement, end_ms) {
            Spend::Refused => return Err(r.job),
            Spend::Untouched => {}
            Spend::Leaves(slots, spare) => spent.push((i, slots, spare)),
        }
    }
    for (i, slots, spare) in spent {
        reservations[i].0.slots = slots;
        reservations[i].0.spare = spare;
    }
    Ok(())
}

/// What starting a job leaves of one reservation's spare GPUs.
enum Spend {
    Refused,
    Untouched,
    /// Its slots' spares and its spare after.
    Leaves(Vec<(usize, usize)>, usize),
}

fn spend(
    r: &Reservation,
    head: &JobSpec,
    nodes: &Nodes<'_>,
    placement: &Placement,
    end_ms: Option<u64>,
) -> Spend {
    if end_ms.is_some_and(|end| end <= r.start_ms) {
        return Spend::Untouched;
    }
    let taken = |slot: usize, gpus: &[u32]| matching(&nodes.slots[slot], gpus, head);
    if r.slots.is_empty() {
        // A gang on any nodes: its spare GPUs are counted cluster-wide.
        let taken: usize = placement
            .iter()
            .map(|(slot, gpus)| taken(*slot, gpus))
            .sum();
        return match r.spare.checked_sub(taken) {
            None => Spend::Refused,
            Some(spare) => Spend::Leaves(Vec::new(), spare),
        };
    }
    if !placement
        .iter()
        .any(|(slot, _)| r.slots.iter().any(|(s, _)| s == slot))
    {
        return Spend::Untouched;
    }
    let mut spares = r.slots.clone();
    for (slot, gpus) in placement {
        if let Some((_, spare)) = spares.iter_mut().find(|(s, _)| s == slot) {
            match spare.checked_sub(taken(*slot, gpus)) {
                None => return Spend::Refused,
                Some(left) => *spare = left,
            }
        }
    }
    let spare = spares.iter().map(|(_, spare)| spare).sum();
    Spend::Leaves(spares, spare)
}
