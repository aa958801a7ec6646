//! The pending jobs in classes: jobs with identical specs, each class in the order its
//! members keep under every ordering — submission then id (id alone for FCFS, whose order is
//! the log's). Every decision a pass makes about a job depends on its spec and its place in
//! the queue, not on which member of its class it is, so the queue is a merge of a few class
//! heads instead of a sort of every pending job, and a class whose job found no room can be
//! passed over whole.
//!
//! The leader builds one from the state on every pass; the simulator keeps one up to date as
//! jobs arrive and start, so a pass costs O(classes) rather than O(pending jobs).

use std::collections::{BTreeSet, HashMap};

use gpu_raft_store::{ClusterState, Job, JobId, JobSpec, JobState};

use super::policy::Ordering;

/// Where a member sits in its class: its submission time (0 under FCFS), then its id.
pub(crate) type Rank = (u64, JobId);

#[derive(Clone, Debug)]
pub struct PendingIndex {
    ordering: Ordering,
    class_of: HashMap<JobSpec, usize>,
    classes: Vec<Class>,
    cpu_only: usize,
}

#[derive(Clone, Debug)]
pub(crate) struct Class {
    pub spec: JobSpec,
    pub members: BTreeSet<Rank>,
}

impl PendingIndex {
    /// An empty index for a policy with this ordering.
    pub fn new(ordering: Ordering) -> Self {
        Self {
            ordering,
            class_of: HashMap::new(),
            classes: Vec::new(),
            cpu_only: 0,
        }
    }

    /// The pending jobs of `state`.
    pub fn of(state: &ClusterState, ordering: Ordering) -> Self {
        let mut index = Self::new(ordering);
        for j in state.jobs.values().filter(|j| j.state == JobState::Pending) {
            index.insert(j);
        }
        index
    }

    pub fn ordering(&self) -> Ordering {
        self.ordering
    }

    /// A job became pending.
    pub fn insert(&mut self, job: &Job) {
        let rank = self.rank(job);
        let slot = match self.class_of.get(&job.spec) {
            Some(&slot) => slot,
            None => {
                self.class_of.insert(job.spec.clone(), self.classes.len());
                self.classes.push(Class {
                    spec: job.spec.clone(),
                    members: BTreeSet::new(),
                });
                self.classes.len() - 1
            }
        };
        if self.classes[slot].members.insert(rank) && job.spec.gpus == 0 {
            self.cpu_only += 1;
        }
    }

    /// A job is no longer pending (it was bound, cancelled, …). `job` as it was inserted.
    pub fn remove(&mut self, job: &Job) {
        let rank = self.rank(job);
        let Some(&slot) = self.class_of.get(&job.spec) else {
            return;
        };
        if !self.classes[slot].members.remove(&rank) {
            return;
        }
        if job.spec.gpus == 0 {
            self.cpu_only -= 1;
        }
        if self.classes[slot].members.is_empty() {
            let gone = self.classes.swap_remove(slot);
            self.class_of.remove(&gone.spec);
            if let Some(moved) = self.classes.get(slot) {
                self.class_of.insert(moved.spec.clone(), slot);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.classes.iter().map(|c| c.members.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.classes.is_empty()
    }

    /// Whether any pending job asks for no GPUs.
    pub fn has_cpu_only(&self) -> bool {
        self.cpu_only > 0
    }

    pub(crate) fn classes(&self) -> &[Class] {
        &self.classes
    }

    fn rank(&self, job: &Job) -> Rank {
        match self.ordering {
            Ordering::Fcfs => (0, job.id),
            _ => (job.submitted_at_ms, job.id),
        }
    }
}

impl Class {
    /// The member after `rank` (the first with `None`).
    pub fn after(&self, rank: Option<Rank>) -> Option<Rank> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::testkit::{gpu, node, spec, submit};

    #[test]
    fn kept_up_to_date_it_equals_one_built_from_the_state() {
        let mut state = ClusterState::new();
        node(&mut state, 1, (0..4).map(|i| gpu(i, "A100", 0)).collect());
        for gpus in [1, 2, 1, 0, 2] {
            submit(&mut state, spec(gpus, 0));
        }
        let mut kept = PendingIndex::new(Ordering::Sjf);
        for j in state.jobs.values() {
            kept.insert(j);
        }
        assert_eq!((kept.len(), kept.classes().len()), (5, 3));
        assert!(kept.has_cpu_only());
        for id in [2, 4] {
            let j = state.jobs.get_mut(&id).expect("job");
            kept.remove(j);
            j.state = JobState::Running;
        }
        let built = PendingIndex::of(&state, Ordering::Sjf);
        assert_eq!(members(&kept), members(&built));
        assert!(!kept.has_cpu_only());
        assert_eq!(kept.classes().len(), 2, "an emptied class is dropped");
    }

    fn members(index: &PendingIndex) -> BTreeSet<(u32, Rank)> {
        index
            .classes()
            .iter()
            .flat_map(|c| c.members.iter().map(|r| (c.spec.gpus, *r)))
            .collect()
    }
}
