//! The queue order of pending jobs under each `Ordering`, drawn lazily from a `PendingIndex`.
//! Jobs of one class share every key but their submission time and id, and a class keeps its
//! members in that order, so a heap of class heads yields the whole queue: a pass pays per
//! class and per job it takes, not per pending job, and may pass over the rest of a class.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::BuildHasherDefault;

use gpu_raft_store::{ClusterState, Job, JobId, JobSpec};

use super::env::PlanEnv;
use super::history::Fnv;
use super::learned::LearnedWeights;
use super::pending::{PendingIndex, Rank};
use super::policy::{Ordering, Policy};
use super::usage::live_jobs;

const HOUR_MS: f64 = 3_600_000.0;

/// Per-tenant figures for one pass: FNV keeps the lookups cheap.
type TenantMap<'a> = HashMap<&'a str, f64, BuildHasherDefault<Fnv>>;

/// Pending jobs in the order the policy considers them if each were placed in turn (for
/// callers that only walk it: queue positions, preemption candidates).
pub(crate) fn queue<'a>(
    state: &'a ClusterState,
    policy: &Policy,
    env: &PlanEnv,
    pending: &'a PendingIndex,
) -> impl Iterator<Item = &'a Job> + 'a {
    let mut q = Queue::new(state, policy, env, pending);
    std::iter::from_fn(move || {
        let job = q.next()?;
        q.placed();
        Some(job)
    })
}

/// One pass's queue.
pub(crate) struct Queue<'a> {
    state: &'a ClusterState,
    index: &'a PendingIndex,
    draw: Draw<'a>,
    /// Whether `pass_over_class` may act: not when every job must be looked at (a pass that
    /// explains).
    may_pass_over: bool,
    /// The class of the job `next` returned last.
    last: Option<usize>,
    passed_over: Vec<bool>,
    /// Gangs past the starvation guard's limit (class, id), drawn before anything else in
    /// submission order; sorted by id, to leave them out when the ordering draws them again.
    overdue: std::collections::VecDeque<(usize, JobId)>,
    overdue_ids: Vec<JobId>,
}

/// FCFS merges class heads instead of walking every pending job when there are at least this
/// many jobs per class.
const FEW_CLASSES: usize = 8;

/// A class head's place in the queue: least first.
type Head = Reverse<(Key, Rank, usize)>;

/// The ordering's key, shared by a class except for what depends on submission time.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    /// FCFS: nothing but the rank (the id) orders the heads.
    Arrival,
    /// SJF: the estimate (`u64::MAX` without one).
    Shortest(u64),
    /// Dynamic priority, negated so the highest comes first.
    Highest(Load),
    /// Inside a tenant under fair share: base priority, highest first.
    Base(Reverse<i32>),
    /// The learned priority function's score, lowest first.
    Score(Load),
}

enum Draw<'a> {
    /// FCFS: pending jobs in id order (with their classes), straight from the index.
    Arrivals(std::collections::btree_set::Iter<'a, (JobId, usize)>),
    /// SJF, priority, learned, and FCFS where classes are few: one heap of class heads.
    Heads { heap: BinaryHeap<Head>, keys: Keys },
    /// Fair share: tenants take turns, least loaded first; inside a tenant, its class heads.
    Turns(Turns),
}

/// What the key of a class head is computed from, per class, once a pass.
enum Keys {
    Arrival,
    Shortest(Vec<u64>),
    Highest {
        /// Per class: base priority, and the fair-share term's tenant share.
        base: Vec<(i32, f64)>,
        aging_per_hour: f64,
        fairshare_weight: f64,
        now_ms: u64,
    },
    Learned {
        /// Per class: the score's terms that do not depend on the wait.
        base: Vec<f64>,
        weights: LearnedWeights,
        now_ms: u64,
    },
}

impl Keys {
    fn of(&self, class: usize, (submitted_ms, _): Rank) -> Key {
        match self {
            Keys::Arrival => Key::Arrival,
            Keys::Shortest(est) => Key::Shortest(est[class]),
            Keys::Highest {
                base,
                aging_per_hour,
                fairshare_weight,
                now_ms,
            } => {
                // Base priority, plus `aging_per_hour` for each hour waited, minus
                // `fairshare_weight` times the tenant's share (0..=1) of all recent usage.
                let (priority, share) = base[class];
                let waited_h = now_ms.saturating_sub(submitted_ms) as f64 / HOUR_MS;
                let score =
                    f64::from(priority) + aging_per_hour * waited_h - fairshare_weight * share;
                Key::Highest(Load(-score))
            }
            Keys::Learned {
                base,
                weights,
                now_ms,
            } => Key::Score(Load(weights.score(base[class], submitted_ms, *now_ms))),
        }
    }
}

/// Fair share: the tenant with the least load (GPUs it holds, counting the jobs placed for it
/// earlier in this pass, plus its decayed past usage in GPU-equivalents, per unit of weight)
/// goes next; inside a tenant, priority then submission order. A job that is not placed does
/// not move its tenant's turn: queued work is not usage, and the least-loaded tenant keeps the
/// first pick of what is free until it gets something.
struct Turns {
    turns: BinaryHeap<Reverse<(Load, usize)>>,
    /// Per tenant (sorted by name, so ties go to the lesser name): its class heads, and its
    /// weight.
    tenants: Vec<(BinaryHeap<Head>, f64)>,
    /// The tenant whose job was drawn last, its load then, and what that job adds to it.
    taking: Option<(usize, f64, f64)>,
    /// Whether that job was placed: only placed jobs count against their tenant's turn.
    placed: bool,
}

impl<'a> Queue<'a> {
    pub(super) fn new(
        state: &'a ClusterState,
        policy: &Policy,
        env: &PlanEnv,
        index: &'a PendingIndex,
    ) -> Self {
        debug_assert_eq!(index.ordering(), policy.ordering);
        let heads = |key: &dyn Fn(usize, Rank) -> Key| -> Vec<Head> {
            index
                .classes()
                .filter_map(|(i, c)| c.after(None).map(|r| Reverse((key(i, r), r, i))))
                .collect()
        };
        let draw = match policy.ordering {
            // Both draw in id order. Where classes are few (predicted runtimes) the heap
            // leaves a class passed over behind at once, where the walk would step over each
            // of its members; where nearly every job is a class of its own (exact runtimes)
            // building the heap would cost a pass what the walk costs at most.
            Ordering::Fcfs if index.class_count() * FEW_CLASSES <= index.len() => Draw::Heads {
                heap: heads(&|_, _| Key::Arrival).into(),
                keys: Keys::Arrival,
            },
            Ordering::Fcfs => Draw::Arrivals(index.arrivals()),
            Ordering::FairShare => {
                let by_base = |i: usize, _: Rank| Key::Base(Reverse(index.class(i).spec.priority));
                Draw::Turns(Turns::new(state, env, index, heads(&by_base)))
            }
            ordering => {
                // Per slot; an empty slot's key is never read.
                let slots = || (0..index.slots()).map(|i| index.slot(i));
                // Each tenant's share of recent usage, where the ordering's key weighs it.
                let weighs_usage = match ordering {
                    Ordering::Learned => policy.learned.usage != 0.0,
                    _ => policy.fairshare_weight != 0.0,
                };
                let usage = if weighs_usage {
                    usage_shares(state, env)
                } else {
                    HashMap::new()
                };
                let share = |spec: &JobSpec| usage.get(&spec.tenant).copied().unwrap_or(0.0);
                let keys = if ordering == Ordering::Sjf {
                    Keys::Shortest(
                        slots()
                            .map(|c| {
                                c.and_then(|c| env.estimate_ms(&c.spec, policy))
                                    .unwrap_or(u64::MAX)
                            })
                            .collect(),
                    )
                } else if ordering == Ordering::Learned {
                    let weights = policy.learned;
                    Keys::Learned {
                        base: slots()
                            .map(|c| {
                                c.map_or(0.0, |c| {
                                    let expected = env.estimate_ms(&c.spec, policy);
                                    weights.class_term(expected, c.spec.gpus, share(&c.spec))
                                })
                            })
                            .collect(),
                        weights,
                        now_ms: env.now_ms,
                    }
                } else {
                    Keys::Highest {
                        base: slots()
                            .map(|c| c.map_or((0, 0.0), |c| (c.spec.priority, share(&c.spec))))
                            .collect(),
                        aging_per_hour: policy.aging_per_hour,
                        fairshare_weight: policy.fairshare_weight,
                        now_ms: env.now_ms,
                    }
                };
                let heap = heads(&|i, r| keys.of(i, r)).into();
                Draw::Heads { heap, keys }
            }
        };
        let may_pass_over = !policy.explain;
        let overdue = if policy.gang_wait_limit_ms.is_some() {
            overdue_gangs(state, index, policy, env.now_ms)
        } else {
            Vec::new()
        };
        let mut overdue_ids: Vec<JobId> = overdue.iter().map(|(_, id)| *id).collect();
        overdue_ids.sort_unstable();
        Self {
            state,
            passed_over: vec![false; index.slots()],
            index,
            draw,
            may_pass_over,
            last: None,
            overdue: overdue.into(),
            overdue_ids,
        }
    }

    /// Whether any pending job asks for no GPUs.
    pub(super) fn has_cpu_only_pending(&self) -> bool {
        self.index.has_cpu_only()
    }

    /// Leave out the rest of the class of the job `next` returned last: the caller knows none
    /// of them can be placed in this pass (a no-op where every job must be looked at).
    pub(super) fn pass_over_class(&mut self) {
        if self.may_pass_over
            && let Some(c) = self.last
        {
            self.passed_over[c] = true;
        }
    }

    /// The job `next` returned last was placed (under fair share it moves its tenant's turn).
    pub(super) fn placed(&mut self) {
        if let Draw::Turns(turns) = &mut self.draw {
            turns.placed = true;
        }
    }

    pub(super) fn next(&mut self) -> Option<&'a Job> {
        loop {
            let (class, id) = match self.overdue.pop_front() {
                Some(overdue) => overdue,
                None => match self.draw()? {
                    // Drawn already, ahead of the rest.
                    (_, id) if self.overdue_ids.binary_search(&id).is_ok() => continue,
                    drawn => drawn,
                },
            };
            if self.passed_over[class] {
                continue;
            }
            self.last = Some(class);
            match self.state.jobs.get(&id) {
                Some(job) => return Some(job),
                None => debug_assert!(false, "the pending index names j-{id}, not in the state"),
            }
        }
    }

    /// The ordering's next job (class, id), leaving out classes passed over.
    fn draw(&mut self) -> Option<(usize, JobId)> {
        let index = self.index;
        loop {
            match &mut self.draw {
                Draw::Arrivals(arrivals) => {
                    let &(id, class) = arrivals.next()?;
                    if !self.passed_over[class] {
                        return Some((class, id));
                    }
                }
                Draw::Heads { heap, keys } => {
                    let Reverse((_, rank, class)) = heap.pop()?;
                    if self.passed_over[class] {
                        continue;
                    }
                    if let Some(r) = index.class(class).after(Some(rank)) {
                        heap.push(Reverse((keys.of(class, r), r, class)));
                    }
                    return Some((class, rank.1));
                }
                Draw::Turns(turns) => {
                    let (class, rank) = turns.next(index, &self.passed_over)?;
                    return Some((class, rank.1));
                }
            }
        }
    }
}

impl Turns {
    fn new(state: &ClusterState, env: &PlanEnv, index: &PendingIndex, heads: Vec<Head>) -> Self {
        let live: Vec<&Job> = live_jobs(state).collect();
        let usage = env.usage.at(&live, env.now_ms);
        let mut held: TenantMap<'_> = HashMap::default();
        for j in live {
            *held.entry(j.spec.tenant.as_str()).or_insert(0.0) += f64::from(j.spec.gpus);
        }
        let mut names: Vec<&str> = index
            .classes()
            .map(|(_, c)| c.spec.tenant.as_str())
            .collect();
        names.sort_unstable();
        names.dedup();
        let mut tenants: Vec<(BinaryHeap<Head>, f64)> = names
            .iter()
            .map(|t| {
                // A tenant's load counts per unit of its weight (1 without a record).
                let weight = state.tenants.get(*t).map_or(1, |r| r.weight.max(1));
                (BinaryHeap::new(), f64::from(weight))
            })
            .collect();
        for head in heads {
            let Reverse((_, _, class)) = head;
            let t = names
                .binary_search(&index.class(class).spec.tenant.as_str())
                .expect("every class's tenant is named");
            tenants[t].0.push(head);
        }
        let turns = names
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let load =
                    usage.get(*t).copied().unwrap_or(0.0) + held.get(t).copied().unwrap_or(0.0);
                Reverse((Load(load / tenants[i].1), i))
            })
            .collect();
        Self {
            turns,
            tenants,
            taking: None,
            placed: false,
        }
    }

    /// The next tenant's next job, once the tenant before has its turn back.
    fn next(&mut self, index: &PendingIndex, passed_over: &[bool]) -> Option<(usize, Rank)> {
        if let Some((t, load, step)) = self.taking.take()
            && !self.tenants[t].0.is_empty()
        {
            let load = if self.placed { load + step } else { load };
            self.turns.push(Reverse((Load(load), t)));
        }
        self.placed = false;
        while let Some(Reverse((Load(load), t))) = self.turns.pop() {
            let (heads, weight) = &mut self.tenants[t];
            while let Some(Reverse((key, rank, class))) = heads.pop() {
                if passed_over[class] {
                    continue;
                }
                let c = index.class(class);
                if let Some(r) = c.after(Some(rank)) {
                    heads.push(Reverse((key, r, class)));
                }
                let step = f64::from(c.spec.gpus.max(1)) / *weight;
                self.taking = Some((t, load, step));
                return Some((class, rank));
            }
        }
        None
    }
}

/// The pending gangs past the starvation guard's limit (`Policy::is_starving_gang`), as
/// (class, id) in submission order: the guard puts them first.
fn overdue_gangs(
    state: &ClusterState,
    index: &PendingIndex,
    policy: &Policy,
    now_ms: u64,
) -> Vec<(usize, JobId)> {
    let mut out: Vec<(u64, JobId, usize)> = Vec::new();
    for (class, c) in index.classes().filter(|(_, c)| c.spec.nodes > 1) {
        // A class keeps its members in submission order (ids under FCFS, the log's order).
        for &(_, id) in &c.members {
            let Some(job) = state.jobs.get(&id) else {
                continue;
            };
            if !policy.is_starving_gang(job, now_ms) {
                break;
            }
            out.push((job.submitted_at_ms, id, class));
        }
    }
    out.sort_unstable();
    out.into_iter().map(|(_, id, class)| (class, id)).collect()
}

/// Each tenant's fraction of all recent (decayed) usage.
fn usage_shares(state: &ClusterState, env: &PlanEnv) -> HashMap<String, f64> {
    let live: Vec<&Job> = live_jobs(state).collect();
    let mut usage = env.usage.at(&live, env.now_ms);
    let total: f64 = usage.values().sum();
    if total > 0.0 {
        for v in usage.values_mut() {
            *v /= total;
        }
    }
    usage
}

/// A load value with a total order, for the heaps.
#[derive(Clone, Copy, PartialEq)]
struct Load(f64);

impl Eq for Load {}

impl PartialOrd for Load {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Load {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}
