//! The queue order of pending jobs under each `Ordering`, drawn lazily from a `PendingIndex`.
//! Jobs of one class share every key but their submission time and id, and a class keeps its
//! members in that order, so a heap of class heads yields the whole queue: a pass pays per
//! class and per job it takes, not per pending job, and may pass over the rest of a class.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::BuildHasherDefault;

use gpu_raft_store::{ClusterState, Job};

use super::env::PlanEnv;
use super::history::Fnv;
use super::pending::{Class, PendingIndex, Rank};
use super::policy::{Ordering, Policy};
use super::usage::live_jobs;

const HOUR_MS: f64 = 3_600_000.0;

/// Per-tenant figures for one pass: FNV keeps the lookups cheap.
type TenantMap<'a> = HashMap<&'a str, f64, BuildHasherDefault<Fnv>>;

/// Pending jobs in the order the policy considers them (for callers that only walk it).
pub(crate) fn queue<'a>(
    state: &'a ClusterState,
    policy: &Policy,
    env: &PlanEnv,
) -> impl Iterator<Item = &'a Job> + 'a {
    let index = Cow::Owned(PendingIndex::of(state, policy.ordering));
    let mut q = Queue::new(state, policy, env, index);
    std::iter::from_fn(move || q.next())
}

/// One pass's queue.
pub(crate) struct Queue<'a> {
    state: &'a ClusterState,
    index: Cow<'a, PendingIndex>,
    draw: Draw,
    /// Whether `pass_over_class` may act: not when every job must be looked at (a pass that
    /// explains), nor under fair share, where each job taken moves its tenant's turn.
    may_pass_over: bool,
    /// The class of the job `next` returned last.
    last: Option<usize>,
    passed_over: Vec<bool>,
}

/// A class head's place in the queue: least first.
type Head = Reverse<(Key, Rank, usize)>;

/// The ordering's key, shared by a class except for what depends on submission time.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    /// FCFS: the rank (id) alone.
    Arrival,
    /// SJF: the estimate (`u64::MAX` without one).
    Shortest(u64),
    /// Dynamic priority, negated so the highest comes first.
    Highest(Load),
    /// Inside a tenant under fair share: base priority, highest first.
    Base(Reverse<i32>),
}

enum Draw {
    /// FCFS, SJF, priority: one heap of class heads.
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
        }
    }
}

/// Fair share: the tenant with the least load (GPUs it holds, counting the jobs already ahead
/// of it in this queue, plus its decayed past usage in GPU-equivalents, per unit of weight)
/// goes next; inside a tenant, priority then submission order.
struct Turns {
    turns: BinaryHeap<Reverse<(Load, usize)>>,
    /// Per tenant (sorted by name, so ties go to the lesser name): its class heads, and its
    /// weight.
    tenants: Vec<(BinaryHeap<Head>, f64)>,
}

impl<'a> Queue<'a> {
    pub fn new(
        state: &'a ClusterState,
        policy: &Policy,
        env: &PlanEnv,
        index: Cow<'a, PendingIndex>,
    ) -> Self {
        debug_assert_eq!(index.ordering(), policy.ordering);
        let classes = index.classes();
        let heads = |key: &dyn Fn(usize, Rank) -> Key| -> Vec<(usize, Head)> {
            classes
                .iter()
                .enumerate()
                .filter_map(|(i, c)| c.after(None).map(|r| (i, Reverse((key(i, r), r, i)))))
                .collect()
        };
        let draw = match policy.ordering {
            Ordering::FairShare => {
                let by_base = |i: usize, _| Key::Base(Reverse(classes[i].spec.priority));
                Draw::Turns(Turns::new(state, env, &index, heads(&by_base)))
            }
            ordering => {
                let keys = match ordering {
                    Ordering::Fcfs => Keys::Arrival,
                    Ordering::Sjf => Keys::Shortest(
                        classes
                            .iter()
                            .map(|c| env.estimate_ms(&c.spec, policy).unwrap_or(u64::MAX))
                            .collect(),
                    ),
                    _ => {
                        let usage = if policy.fairshare_weight == 0.0 {
                            HashMap::new()
                        } else {
                            usage_shares(state, env)
                        };
                        Keys::Highest {
                            base: classes
                                .iter()
                                .map(|c| {
                                    let share = usage.get(&c.spec.tenant).copied();
                                    (c.spec.priority, share.unwrap_or(0.0))
                                })
                                .collect(),
                            aging_per_hour: policy.aging_per_hour,
                            fairshare_weight: policy.fairshare_weight,
                            now_ms: env.now_ms,
                        }
                    }
                };
                let heap = heads(&|i, r| keys.of(i, r))
                    .into_iter()
                    .map(|(_, h)| h)
                    .collect();
                Draw::Heads { heap, keys }
            }
        };
        let may_pass_over = !policy.explain && policy.ordering != Ordering::FairShare;
        Self {
            state,
            passed_over: vec![false; classes.len()],
            index,
            draw,
            may_pass_over,
            last: None,
        }
    }

    /// Whether any pending job asks for no GPUs.
    pub fn has_cpu_only_pending(&self) -> bool {
        self.index.has_cpu_only()
    }

    /// Leave out the rest of the class of the job `next` returned last: the caller knows none
    /// of them can be placed in this pass (a no-op where every job must be looked at).
    pub fn pass_over_class(&mut self) {
        if self.may_pass_over
            && let Some(c) = self.last
        {
            self.passed_over[c] = true;
        }
    }

    pub fn next(&mut self) -> Option<&'a Job> {
        let classes = self.index.classes();
        loop {
            let (class, (_, id)) = match &mut self.draw {
                Draw::Heads { heap, keys } => {
                    let Reverse((_, rank, class)) = heap.pop()?;
                    if self.passed_over[class] {
                        continue;
                    }
                    if let Some(r) = classes[class].after(Some(rank)) {
                        heap.push(Reverse((keys.of(class, r), r, class)));
                    }
                    (class, rank)
                }
                Draw::Turns(turns) => turns.next(classes)?,
            };
            self.last = Some(class);
            match self.state.jobs.get(&id) {
                Some(job) => return Some(job),
                None => debug_assert!(false, "the pending index names j-{id}, not in the state"),
            }
        }
    }
}

impl Turns {
    fn new(
        state: &ClusterState,
        env: &PlanEnv,
        index: &PendingIndex,
        heads: Vec<(usize, Head)>,
    ) -> Self {
        let usage = env.usage.at(state, env.now_ms);
        let mut held: TenantMap<'_> = HashMap::default();
        for j in live_jobs(state) {
            *held.entry(j.spec.tenant.as_str()).or_insert(0.0) += f64::from(j.spec.gpus);
        }
        let classes = index.classes();
        let mut names: Vec<&str> = classes.iter().map(|c| c.spec.tenant.as_str()).collect();
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
        for (class, head) in heads {
            let t = names
                .binary_search(&classes[class].spec.tenant.as_str())
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
        Self { turns, tenants }
    }

    fn next(&mut self, classes: &[Class]) -> Option<(usize, Rank)> {
        loop {
            let Reverse((Load(load), t)) = self.turns.pop()?;
            let (heads, weight) = &mut self.tenants[t];
            let Some(Reverse((key, rank, class))) = heads.pop() else {
                continue;
            };
            if let Some(r) = classes[class].after(Some(rank)) {
                heads.push(Reverse((key, r, class)));
            }
            if !heads.is_empty() {
                let step = f64::from(classes[class].spec.gpus.max(1)) / *weight;
                self.turns.push(Reverse((Load(load + step), t)));
            }
            return Some((class, rank));
        }
    }
}

/// Each tenant's fraction of all recent (decayed) usage.
fn usage_shares(state: &ClusterState, env: &PlanEnv) -> HashMap<String, f64> {
    let mut usage = env.usage.at(state, env.now_ms);
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
