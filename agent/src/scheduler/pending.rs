//! The pending jobs in classes: jobs with identical specs, each class in the order its
//! members keep under every ordering — submission then id (id alone for FCFS, whose order is
//! the log's). Every decision a pass makes about a job depends on its spec and its place in
//! the queue, not on which member of its class it is, so the queue is a merge of a few class
//! heads instead of a sort of every pending job, and a class whose job found no room can be
//! passed over whole.
//!
//! The leader keeps one up to date from the state's `JobLog` (`PendingCache`), the
//! simulator as jobs arrive and start, so a pass costs O(classes) rather than O(pending jobs).

use std::collections::{BTreeSet, HashMap};
use std::hash::BuildHasherDefault;

use gpu_raft_store::KeptIndex;
use gpu_raft_store::{ClusterState, Job, JobId, JobSpec, JobState};

use super::history::Fnv;
use super::policy::Ordering;

/// Where a member sits in its class: its submission time (0 under FCFS), then its id.
pub(crate) type Rank = (u64, JobId);

#[derive(Clone, Debug)]
pub struct PendingIndex {
    ordering: Ordering,
    /// The classes of jobs outside arrays, by spec.
    class_of: HashMap<JobSpec, usize>,
    /// The classes of arrays' tasks, by array: an array's tasks share its spec, and the tasks
    /// of two arrays of one spec have limits of their own.
    class_of_array: HashMap<JobId, usize>,
    /// Each member's class slot and rank.
    member_of: HashMap<JobId, (usize, Rank), BuildHasherDefault<Fnv>>,
    /// Classes by slot; a slot stays put while its class has members, then is reused.
    slots: Vec<Option<Class>>,
    free: Vec<usize>,
    /// FCFS only: every pending job with its class's slot, in id order. Under FCFS a class
    /// is ordered by nothing but ids, so the queue walks this instead of merging heads (with
    /// exact estimates nearly every job is a class of its own).
    arrivals: BTreeSet<(JobId, usize)>,
    cpu_only: usize,
}

#[derive(Clone, Debug)]
pub(crate) struct Class {
    pub spec: JobSpec,
    /// The array its members are tasks of, if any.
    pub array: Option<JobId>,
    pub members: BTreeSet<Rank>,
}

impl PendingIndex {
    /// An empty index for a policy with this ordering.
    pub fn new(ordering: Ordering) -> Self {
        Self {
            ordering,
            class_of: HashMap::new(),
            class_of_array: HashMap::new(),
            member_of: HashMap::default(),
            slots: Vec::new(),
            free: Vec::new(),
            arrivals: BTreeSet::new(),
            cpu_only: 0,
        }
    }

    /// The pending jobs of `state`.
    pub fn of(state: &ClusterState, ordering: Ordering) -> Self {
        let mut index = Self::new(ordering);
        for j in state.jobs.values().filter(|j| is_queued(j)) {
            index.insert(j);
        }
        index
    }

    pub fn ordering(&self) -> Ordering {
        self.ordering
    }

    /// A job became pending (again, if it is already indexed: then nothing changes).
    pub fn insert(&mut self, job: &Job) {
        if self.member_of.contains_key(&job.id) {
            return;
        }
        let array = job.array_task.map(|t| t.array);
        let found = match array {
            Some(a) => self.class_of_array.get(&a),
            None => self.class_of.get(&job.spec),
        };
        let slot = match found {
            Some(&slot) => slot,
            None => {
                let class = Class {
                    spec: job.spec.clone(),
                    array,
                    members: BTreeSet::new(),
                };
                let slot = match self.free.pop() {
                    Some(slot) => {
                        self.slots[slot] = Some(class);
                        slot
                    }
                    None => {
                        self.slots.push(Some(class));
                        self.slots.len() - 1
                    }
                };
                match array {
                    Some(a) => self.class_of_array.insert(a, slot),
                    None => self.class_of.insert(job.spec.clone(), slot),
                };
                slot
            }
        };
        let rank = self.rank(job);
        self.member_of.insert(job.id, (slot, rank));
        self.class_mut(slot).members.insert(rank);
        if self.ordering == Ordering::Fcfs {
            self.arrivals.insert((job.id, slot));
        }
        if job.spec.gpus == 0 {
            self.cpu_only += 1;
        }
    }

    /// A job is no longer pending (it was bound, cancelled, …); nothing if it was not indexed.
    pub fn remove(&mut self, job: JobId) {
        let Some((slot, rank)) = self.member_of.remove(&job) else {
            return;
        };
        self.arrivals.remove(&(job, slot));
        let class = self.class_mut(slot);
        class.members.remove(&rank);
        let (cpu_only, emptied) = (class.spec.gpus == 0, class.members.is_empty());
        if cpu_only {
            self.cpu_only -= 1;
        }
        if emptied {
            let class = self.slots[slot].take().expect("a class in use");
            self.free.push(slot);
            match class.array {
                Some(a) => self.class_of_array.remove(&a),
                None => self.class_of.remove(&class.spec),
            };
        }
    }

    /// Bring the index up to date with `state` for `job`: indexed if and only if it is
    /// pending and not held now.
    pub fn update(&mut self, state: &ClusterState, job: JobId) {
        match state.jobs.get(&job) {
            Some(j) if is_queued(j) => {
                self.respec(state, j);
                self.insert(j);
            }
            _ => self.remove(job),
        }
    }

    /// A pending job whose spec was updated (`job update`) leaves its class for its new one;
    /// an array's pending tasks are updated together, so its whole class moves.
    fn respec(&mut self, state: &ClusterState, job: &Job) {
        let Some(&(slot, _)) = self.member_of.get(&job.id) else {
            return;
        };
        let class = self.class(slot);
        if class.spec == job.spec {
            return;
        }
        let moved: Vec<JobId> = match class.array {
            Some(_) => class.members.iter().map(|&(_, id)| id).collect(),
            None => vec![job.id],
        };
        for &id in &moved {
            self.remove(id);
        }
        for id in moved {
            if let Some(j) = state.jobs.get(&id).filter(|j| is_queued(j)) {
                self.insert(j);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.member_of.len()
    }

    pub fn is_empty(&self) -> bool {
        self.member_of.is_empty()
    }

    /// Whether any pending job asks for no GPUs.
    pub fn has_cpu_only(&self) -> bool {
        self.cpu_only > 0
    }

    /// How many classes have members.
    pub(crate) fn class_count(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// How many slots there are (classes are numbered below this).
    pub(crate) fn slots(&self) -> usize {
        self.slots.len()
    }

    /// The class in `slot`, which has members.
    pub(crate) fn class(&self, slot: usize) -> &Class {
        self.slot(slot).expect("a class in use")
    }

    /// The class in `slot`, if it is in use.
    pub(crate) fn slot(&self, slot: usize) -> Option<&Class> {
        self.slots[slot].as_ref()
    }

    fn class_mut(&mut self, slot: usize) -> &mut Class {
        self.slots[slot].as_mut().expect("a class in use")
    }

    /// The classes with their slots.
    pub(crate) fn classes(&self) -> impl Iterator<Item = (usize, &Class)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(slot, c)| c.as_ref().map(|c| (slot, c)))
    }

    /// FCFS: the pending jobs in id order, each with its class.
    pub(crate) fn arrivals(&self) -> std::collections::btree_set::Iter<'_, (JobId, usize)> {
        self.arrivals.iter()
    }

    fn rank(&self, job: &Job) -> Rank {
        match self.ordering {
            Ordering::Fcfs => (0, job.id),
            _ => (job.submitted_at_ms, job.id),
        }
    }
}

/// Whether the job is in the scheduler's queue: pending and not held.
fn is_queued(job: &Job) -> bool {
    job.state == JobState::Pending && !job.held
}

impl Class {
    /// The member after `rank` (the first with `None`).
    pub(crate) fn after(&self, rank: Option<Rank>) -> Option<Rank> {
        match rank {
            None => self.members.first().copied(),
            Some(r) => self
                .members
                .range((std::ops::Bound::Excluded(r), std::ops::Bound::Unbounded))
                .next()
                .copied(),
        }
    }
}

/// The leader's index of the pending jobs, brought up to date before each pass from the
/// state's `JobLog`, and rebuilt only when the log cannot say what changed (the state was
/// replaced by a snapshot, the log moved on too far) or the ordering changed.
#[derive(Default)]
pub(crate) struct PendingCache(KeptIndex<PendingIndex>);

impl PendingCache {
    pub(crate) fn get(&mut self, state: &ClusterState, ordering: Ordering) -> &PendingIndex {
        self.0.get(
            state,
            |index| index.ordering() == ordering,
            |state| PendingIndex::of(state, ordering),
            |index, state, job| index.update(state, job),
        )
    }
}

/// An index's members by class size and rank, for comparing two indexes (tests).
#[cfg(test)]
pub(super) fn members(index: &PendingIndex) -> BTreeSet<(u32, Rank)> {
    index
        .classes()
        .flat_map(|(_, c)| c.members.iter().map(|r| (c.spec.gpus, *r)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_raft_store::Command;

    use crate::scheduler::testkit::{apply, gpu, node, spec, submit};

    #[test]
    fn kept_up_to_date_it_equals_one_built_from_the_state() {
        let mut state = ClusterState::new();
        node(&mut state, 1, (0..4).map(|i| gpu(i, "A100", 0)).collect());
        for gpus in [1, 2, 1, 0, 2] {
            submit(&mut state, spec(gpus, 0));
        }
        let mut kept = PendingIndex::new(Ordering::Fcfs);
        for j in state.jobs.values() {
            kept.insert(j);
        }
        assert_eq!((kept.len(), kept.classes().count()), (5, 3));
        assert!(kept.has_cpu_only());
        for id in [2, 4] {
            let j = state.jobs.get_mut(&id).expect("job");
            kept.remove(id);
            j.state = JobState::Running;
        }
        let built = PendingIndex::of(&state, Ordering::Fcfs);
        assert_eq!(members(&kept), members(&built));
        assert!(!kept.has_cpu_only());
        assert_eq!(kept.classes().count(), 2, "an emptied class is dropped");
        let arrivals: Vec<u64> = kept.arrivals().map(|(id, _)| *id).collect();
        assert_eq!(arrivals, [1, 3, 5]);
    }

    #[test]
    fn each_array_is_a_class_of_its_own_and_held_jobs_are_not_queued() {
        let mut state = ClusterState::new();
        let array = |text: &str| JobSpec {
            array: Some(text.parse().expect("an array")),
            ..spec(1, 0)
        };
        // Two arrays of one spec, then a plain job of that spec.
        submit(&mut state, array("0-2%1"));
        submit(&mut state, array("0-2%1"));
        submit(&mut state, array("0-2%1"));
        let plain = spec(1, 0);
        submit(&mut state, plain);
        state.jobs.get_mut(&10).expect("job").held = true;
        let mut index = PendingIndex::of(&state, Ordering::Fcfs);
        assert_eq!((index.len(), index.classes().count()), (9, 3));
        for id in 1..=6 {
            index.remove(id);
        }
        assert!(
            !index.is_empty(),
            "the third array's tasks are still queued"
        );
        assert_eq!(index.classes().count(), 1);
        for id in 7..=9 {
            index.remove(id);
        }
        assert!(index.is_empty());
    }

    #[test]
    fn an_updated_job_and_an_updated_array_move_to_their_new_class() {
        let mut state = ClusterState::new();
        submit(&mut state, spec(1, 0));
        submit(&mut state, spec(1, 0));
        submit(
            &mut state,
            JobSpec {
                array: Some("0-2".parse().expect("an array")),
                ..spec(1, 0)
            },
        );
        let mut cache = PendingCache::default();
        assert_eq!(cache.get(&state, Ordering::Sjf).classes().count(), 2);
        let gpus = |gpus| gpu_raft_store::JobUpdate {
            gpus: Some(gpus),
            ..Default::default()
        };
        for (job, array) in [(2, false), (3, true)] {
            let update = Command::UpdateJob {
                job,
                array,
                update: gpus(2),
            };
            assert_eq!(apply(&mut state, update), gpu_raft_store::ApplyResult::Ok);
        }
        let kept = members(cache.get(&state, Ordering::Sjf));
        assert_eq!(kept, members(&PendingIndex::of(&state, Ordering::Sjf)));
        let index = cache.get(&state, Ordering::Sjf);
        let specs: Vec<(u32, Option<JobId>, usize)> = index
            .classes()
            .map(|(_, c)| (c.spec.gpus, c.array, c.members.len()))
            .collect();
        assert_eq!(specs.len(), 3, "{specs:?}");
        assert!(specs.contains(&(2, Some(3), 3)), "{specs:?}");
        assert!(specs.contains(&(2, None, 1)) && specs.contains(&(1, None, 1)));
    }

    #[test]
    fn a_cache_rebuilds_for_another_copy_of_the_state_or_another_ordering() {
        let mut state = ClusterState::new();
        submit(&mut state, spec(1, 0));
        let mut cache = PendingCache::default();
        assert_eq!(cache.get(&state, Ordering::Fcfs).len(), 1);
        let mut copy = state.clone();
        submit(&mut copy, spec(1, 0));
        assert_eq!(cache.get(&copy, Ordering::Fcfs).len(), 2);
        let restored: ClusterState =
            serde_json::from_slice(&serde_json::to_vec(&state).expect("encode")).expect("decode");
        assert_eq!(cache.get(&restored, Ordering::Fcfs).len(), 1);
        let index = cache.get(&restored, Ordering::Sjf);
        assert_eq!((index.ordering(), index.len()), (Ordering::Sjf, 1));
    }
}
