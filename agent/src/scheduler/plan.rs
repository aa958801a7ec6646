//! `plan`: placements for pending jobs, computed from the applied state, a `Policy` and a
//! `PlanEnv` (which carries "now") alone — no I/O, no clock. The leader and the simulator both
//! call it. The queue order comes from `order.rs`, where a job goes from `placement.rs`, and
//! what a job that does not fit does to the ones behind it from the policy's `Backfill`.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use gpu_raft_store::{Bind, ClusterState, Job, JobId, JobSpec, SliceBind, gpu_fits};

use super::backfill::{self, Holding, Reservation, Timeline};
use super::env::PlanEnv;
use super::order::Queue;
use super::pending::PendingIndex;
use super::placement::{Nodes, Placement, is_plain, selector_matches};
use super::policy::{Backfill, Policy};
use super::quota::{Admission, QuotaBook, restrict};
use super::slices::{self, SliceBook, SlicePlace};

/// One pass's result: placements to propose, and new reasons for jobs that stay pending.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// One bind per placed job; a multi-node gang has one bind per node, all in this pass.
    pub binds: Vec<Bind>,
    /// One slice bind per placed MIG or shared job (proposed as `BindSlices`).
    pub slice_binds: Vec<SliceBind>,
    /// Only reasons that differ from what the state already says.
    pub unschedulable: Vec<(JobId, String)>,
    /// The reservations of jobs that could not start, in queue order: under EASY backfill the
    /// first such job's (or a starving gang's, in any mode), under conservative backfill each
    /// one's, up to `CONSERVATIVE_DEPTH`.
    pub reservations: Vec<Reservation>,
}

/// How many jobs a pass under conservative backfill reserves for; the jobs behind the last of
/// them wait for a later pass (as Slurm's `bf_max_job_test` bounds the jobs its backfill
/// looks at).
pub(super) const CONSERVATIVE_DEPTH: usize = 100;

/// Plan one pass. Jobs are taken in the policy's order; each goes where `placement` puts it
/// now, unless the backfill mode holds it back for a job ahead of it.
pub fn plan(state: &ClusterState, policy: &Policy, env: &PlanEnv) -> Plan {
    let pending = PendingIndex::of(state, policy.ordering);
    plan_pending(state, policy, env, &pending)
}

/// `plan` with the pending jobs of `state` already indexed (kept up to date by the
/// simulator, for the policy's ordering).
pub fn plan_pending(
    state: &ClusterState,
    policy: &Policy,
    env: &PlanEnv,
    pending: &PendingIndex,
) -> Plan {
    plan_queue(state, policy, Queue::new(state, policy, env, pending), env)
}

fn plan_queue<'a>(
    state: &'a ClusterState,
    policy: &'a Policy,
    mut queue: Queue<'a>,
    env: &'a PlanEnv,
) -> Plan {
    let mut pass = Pass::new(state, policy, env);
    while let Some(job) = queue.next() {
        if pass.out.binds.len() + pass.out.slice_binds.len() >= policy.max_binds_per_pass {
            break;
        }
        if pass.consider(job, &mut queue) == Flow::Stop {
            break;
        }
    }
    pass.out.reservations = pass.reservations.into_iter().map(|(r, _)| r).collect();
    pass.out
}

/// Whether the pass goes on to the next job of the queue.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flow {
    Next,
    Stop,
}

/// What one pass has decided so far, and what it has learnt about the jobs still to come.
struct Pass<'a> {
    state: &'a ClusterState,
    policy: &'a Policy,
    env: &'a PlanEnv,
    nodes: Nodes<'a>,
    sliced: SliceBook,
    quotas: QuotaBook<'a>,
    /// Computed once: what plain jobs could ever get.
    capacity: Capacity,
    gangs: bool,
    /// The runs this pass started before its first reservation, with their expected ends
    /// (when it may reserve).
    started: Vec<Holding>,
    /// The free GPUs over time, from the first reservation on.
    timeline: Option<Timeline>,
    /// The reservations taken, each with its job's spec.
    reservations: Vec<(Reservation, JobSpec)>,
    /// The job that holds the strict queue behind it.
    blocked_by: Option<JobId>,
    /// Free GPUs only shrink during a pass, so for plain single-node jobs (no GPU type, memory
    /// or node selector) failure is monotone in size: once a size finds no room, or is held
    /// back by a plain head's reservation, every larger one is too. These skip the search.
    no_room_from: usize,
    held_from: usize,
    /// The singleton groups (tenant, name) this pass placed a job of.
    singletons: BTreeSet<(&'a str, &'a str)>,
    /// Tasks this pass placed, by array.
    array_starts: BTreeMap<JobId, usize>,
    out: Plan,
}

impl<'a> Pass<'a> {
    fn new(state: &'a ClusterState, policy: &'a Policy, env: &'a PlanEnv) -> Self {
        let nodes = Nodes::new(state, policy.image_locality);
        Self {
            state,
            policy,
            env,
            capacity: Capacity::of(&nodes),
            nodes,
            sliced: SliceBook::new(state, policy.slice_best_fit),
            quotas: QuotaBook::new(state),
            gangs: policy.multi_node_gangs,
            started: Vec::new(),
            timeline: None,
            reservations: Vec::new(),
            blocked_by: None,
            no_room_from: usize::MAX,
            held_from: usize::MAX,
            singletons: BTreeSet::new(),
            array_starts: BTreeMap::new(),
            out: Plan::default(),
        }
    }

    /// Record why `job` stays pending, when explaining and the reason is new.
    fn note(&mut self, job: &Job, reason: String) {
        if self.policy.explain && job.reason.as_deref() != Some(reason.as_str()) {
            self.out.unschedulable.push((job.id, reason));
        }
    }

    /// Place `job` if it may start now, or learn from why it cannot.
    fn consider(&mut self, job: &'a Job, queue: &mut Queue<'a>) -> Flow {
        // Dependencies and singleton groups are the spec's, the same for the whole class.
        if let Some(reason) = self.gate(job) {
            self.note(job, reason);
            queue.pass_over_class();
            return Flow::Next;
        }
        // Not the class: its other members have their own times (or none).
        if let Some(reason) = super::retry::waiting_reason(job, self.env.now_ms) {
            self.note(job, reason);
            return Flow::Next;
        }
        if super::preempt::waits_for_beneficiary(self.state, job) {
            let by = job.preempted_for.unwrap_or_default();
            self.note(
                job,
                format!("preempted for j-{by}: waits until j-{by} has started"),
            );
            return Flow::Next;
        }
        if let Some(head) = self.blocked_by {
            if !self.policy.explain {
                return Flow::Stop;
            }
            let reason = format!("queued behind j-{head} ({} queue)", self.policy.spec());
            self.note(job, reason);
            return Flow::Next;
        }
        // A tenant at its quota for some GPU types may only use the others; at its quota for
        // all it waits, without holding up the queue behind it.
        let spec: Cow<'_, JobSpec> = match self.quotas.admit(&job.spec) {
            Admission::Unlimited => Cow::Borrowed(&job.spec),
            Admission::Only(types) => Cow::Owned(restrict(&job.spec, types)),
            Admission::OverQuota(reason) => {
                self.note(job, reason);
                queue.pass_over_class();
                return Flow::Next;
            }
        };
        // MIG instances, shared slices and pass-through GPUs: their own book, no reservation
        // (a slice does not hold the queue behind it).
        if slices::is_sliced(&spec) {
            self.place_sliced(job, &spec, queue);
            return Flow::Next;
        }
        self.place_whole(job, &spec, queue)
    }

    /// Why the job may not start yet whatever room there is: the state's gate (a hold, a
    /// dependency, a live namesake of a singleton, its array at its limit), or what this pass
    /// placed (a namesake, its array's tasks up to the limit).
    fn gate(&self, job: &Job) -> Option<String> {
        if let Some(reason) = self.state.gate(job) {
            return Some(reason);
        }
        let (tenant, name) = (&job.spec.tenant, &job.spec.name);
        let placed =
            job.spec.singleton && self.singletons.contains(&(tenant.as_str(), name.as_str()));
        if placed {
            return Some(format!("singleton: another job named {name:?} starts now"));
        }
        // The state's gate has counted the array's live tasks; these are this pass's.
        let starting = *self.array_starts.get(&job.array_task?.array)?;
        self.state.array_throttle(job, starting)
    }

    /// A job just placed: a singleton's namesakes wait for it, and it counts against its
    /// array's limit.
    fn placed(&mut self, job: &'a Job) {
        if job.spec.singleton {
            self.singletons
                .insert((job.spec.tenant.as_str(), job.spec.name.as_str()));
        }
        if let Some(task) = job.array_task {
            *self.array_starts.entry(task.array).or_default() += 1;
        }
    }

    fn place_sliced(&mut self, job: &'a Job, spec: &JobSpec, queue: &mut Queue<'a>) {
        let Some(place) = self.sliced.place(spec) else {
            let reason = self.sliced.why(spec);
            self.note(job, reason);
            queue.pass_over_class();
            return;
        };
        let (node, gpus) = match &place {
            SlicePlace::Slice { node, gpu, .. } => (*node, vec![*gpu]),
            SlicePlace::Passthrough { node, gpus } => (*node, gpus.clone()),
        };
        if let Some(n) = self.state.nodes.get(&node) {
            let types = gpus
                .iter()
                .filter_map(|i| n.gpu(*i))
                .map(|g| g.gpu_type.as_str());
            self.quotas.take(&job.spec.tenant, types);
        }
        match place {
            SlicePlace::Slice { node, gpu, slice } => self.out.slice_binds.push(SliceBind {
                job: job.id,
                node,
                gpu,
                slice,
            }),
            SlicePlace::Passthrough { node, gpus } => self.out.binds.push(Bind {
                job: job.id,
                node,
                gpus,
            }),
        }
        self.placed(job);
        queue.placed();
    }

    /// A job of whole GPUs (or none): placed where `placement` puts it unless the backfill
    /// mode holds it back; when it finds no room, it may take the EASY reservation or hold
    /// the strict queue.
    fn place_whole(&mut self, job: &'a Job, spec: &JobSpec, queue: &mut Queue<'a>) -> Flow {
        let want = spec.gpus as usize;
        if self.nothing_more_starts(job, want, queue) {
            return Flow::Stop;
        }
        // A gang the job asked for (`nodes` > 1) has its own shape: no size memo, and it
        // needs its per-node share on enough nodes.
        let asked_gang = spec.nodes > 1;
        let memo = !asked_gang && is_plain(spec) && want <= self.capacity.largest;
        let Some(placement) = self.find(job, spec, asked_gang, memo) else {
            self.no_room(job, spec, queue);
            return Flow::Next;
        };
        let end_ms = self
            .env
            .estimate_ms(spec, self.policy)
            .map(|e| self.env.now_ms.saturating_add(e));
        let Some(placement) = self.backfill(job, spec, placement, end_ms, memo, queue) else {
            return Flow::Next;
        };
        self.take(job, placement, end_ms);
        self.placed(job);
        queue.placed();
        Flow::Next
    }

    /// Nothing with GPUs can start any more and no CPU-only job waits: the pass is over, once
    /// the first job that cannot start (or a starving gang) has its reservation. (Otherwise the
    /// job goes on to find no room, which under a strict queue holds every job behind it,
    /// CPU-only ones included.
    /// Starving gangs are drawn first: once `job` is not one, none is left.)
    fn nothing_more_starts(&self, job: &Job, want: usize, queue: &Queue<'a>) -> bool {
        !self.policy.explain
            && want > 0
            && self.nodes.total_free() == 0
            && !queue.has_cpu_only_pending()
            && !self.sliced.has_room()
            && (!self.reservations.is_empty()
                || (!self.policy.backfill.reserves()
                    && !self.policy.is_starving_gang(job, self.env.now_ms)))
    }

    /// Where the job fits now, skipping the search when the size memo says it cannot.
    fn find(
        &mut self,
        job: &Job,
        spec: &JobSpec,
        asked_gang: bool,
        memo: bool,
    ) -> Option<Placement> {
        let want = spec.gpus as usize;
        let nodes = &self.nodes;
        let may_fit = if asked_gang {
            spec.gpus_per_node() as usize <= nodes.max_free() && want <= nodes.total_free()
        } else {
            want <= nodes.max_free() || (self.gangs && want <= nodes.total_free())
        };
        let found = if may_fit && !(memo && want >= self.no_room_from) {
            nodes.find_preferring(spec, &job.spec.gpu_types, self.gangs, &[])
        } else {
            None
        };
        if found.is_none() && memo {
            self.no_room_from = self.no_room_from.min(want);
        }
        found
    }

    /// The job found no room: the rest of its class finds none either (passed over, unless
    /// each of them may still take a reservation). It may take a reservation or hold the queue.
    fn no_room(&mut self, job: &'a Job, spec: &JobSpec, queue: &mut Queue<'a>) {
        let starving = self.policy.is_starving_gang(job, self.env.now_ms);
        let holds_queue = self.holds_queue(starving);
        if !self.reserves_every_job() {
            queue.pass_over_class();
        }
        if !(self.policy.explain || holds_queue) {
            return;
        }
        if !self.capacity.could_ever_fit(&self.nodes, spec, self.gangs) {
            let reason = why_unplaceable(spec, &self.nodes);
            self.note(job, reason);
            return;
        }
        if holds_queue {
            self.reserve(job, spec, starving);
        }
        let reason = why_unplaceable(spec, &self.nodes);
        self.note(job, reason);
    }

    /// Whether a job that cannot start now takes a reservation, or else holds the queue
    /// behind it: the first such job unless greedy (a starving gang in every mode), and under
    /// conservative backfill each one up to the depth.
    fn holds_queue(&self, starving: bool) -> bool {
        self.reserves_every_job()
            || (self.reservations.is_empty()
                && (starving || self.policy.backfill != Backfill::Greedy))
    }

    /// Conservative backfill with reservations left to take: every job that cannot start now
    /// gets one (a gang on any nodes, whose GPUs no node books, is the last; nothing behind
    /// the last starts).
    fn reserves_every_job(&self) -> bool {
        self.policy.backfill == Backfill::Conservative
            && self.blocked_by.is_none()
            && self.reservations.len() < CONSERVATIVE_DEPTH
            && self
                .reservations
                .last()
                .is_none_or(|(r, _)| !r.slots.is_empty())
    }

    /// Take the job's reservation; without one (what it waits for has no expected end), it
    /// holds the queue behind it.
    fn reserve(&mut self, job: &'a Job, spec: &JobSpec, starving: bool) {
        let reserved = (self.policy.backfill.reserves() || starving)
            .then(|| {
                let timeline = self.timeline.get_or_insert_with(|| {
                    let mut runs = holdings(self.state, &self.nodes, self.policy, self.env);
                    runs.append(&mut self.started);
                    Timeline::new(self.nodes.slots.len(), runs)
                });
                let duration = self.env.estimate_ms(spec, self.policy);
                let now_ms = self.env.now_ms;
                let r =
                    timeline.reserve(job.id, spec, duration, &self.nodes, self.gangs, now_ms)?;
                timeline.book(&r);
                Some(r)
            })
            .flatten();
        match reserved {
            Some(r) => {
                self.reservations.push((r, spec.clone()));
                // Conservative backfill looks no further than its last reservation.
                if self.policy.backfill == Backfill::Conservative && !self.reserves_every_job() {
                    self.blocked_by = Some(job.id);
                }
            }
            None => self.blocked_by = Some(job.id),
        }
    }

    /// With reservations in force, the job starts only where it delays none of them (here,
    /// or on other nodes). `None`: held back.
    fn backfill(
        &mut self,
        job: &'a Job,
        spec: &JobSpec,
        placement: Placement,
        end_ms: Option<u64>,
        memo: bool,
        queue: &mut Queue<'a>,
    ) -> Option<Placement> {
        if self.reservations.is_empty() {
            return Some(placement);
        }
        let want = spec.gpus as usize;
        // Its end does not let it pass any reservation, every reserved job is plain and no
        // more reservations are taken: a larger job like it is held back too.
        let outlasts = |r: &Reservation| end_ms.is_none_or(|end| end > r.start_ms);
        let memo = memo
            && !self.reserves_every_job()
            && self
                .reservations
                .iter()
                .all(|(r, head)| outlasts(r) && is_plain(head));
        let delayed = if memo && want >= self.held_from {
            self.reservations[0].0.job
        } else {
            match backfill::admit(&mut self.reservations, &self.nodes, &placement, end_ms) {
                Ok(()) => return Some(placement),
                Err(delayed) => delayed,
            }
        };
        // The nodes of the reservations it would overlap.
        let mut reserved: Vec<usize> = self
            .reservations
            .iter()
            .filter(|(r, _)| outlasts(r))
            .flat_map(|(r, _)| r.held_slots())
            .collect();
        reserved.sort_unstable();
        reserved.dedup();
        let elsewhere = (!reserved.is_empty())
            .then(|| {
                self.nodes
                    .find_preferring(spec, &job.spec.gpu_types, self.gangs, &reserved)
            })
            .flatten();
        if let Some(elsewhere) = elsewhere
            && backfill::admit(&mut self.reservations, &self.nodes, &elsewhere, end_ms).is_ok()
        {
            return Some(elsewhere);
        }
        // A reserved node may have the spare GPUs its best fit lacked. (Tried last, so that a
        // job held back is one no node can take: failure stays monotone in size, as the size
        // memo needs.)
        for &slot in &reserved {
            if let Some(there) = self.nodes.place_on(slot, spec)
                && backfill::admit(&mut self.reservations, &self.nodes, &there, end_ms).is_ok()
            {
                return Some(there);
            }
        }
        if memo {
            self.held_from = self.held_from.min(want);
        }
        // Its class (the same spec: the same placements, the same end) is held back too,
        // unless each of them is to take a reservation of its own.
        if !self.reserves_every_job() {
            queue.pass_over_class();
        }
        let mode = match self.policy.backfill {
            Backfill::Conservative => "conservative",
            _ => "EASY",
        };
        self.note(
            job,
            format!(
                "held back: starting it would delay j-{delayed}, which has a reservation ({mode} backfill)"
            ),
        );
        if self.reserves_every_job() {
            self.reserve(job, spec, false);
        }
        None
    }

    /// Bind the job where it was placed, counting its GPUs against its tenant's quota.
    fn take(&mut self, job: &'a Job, placement: Placement, end_ms: Option<u64>) {
        self.nodes.take(&placement);
        for (slot, gpus) in &placement {
            let all = &self.nodes.slots[*slot].all;
            let types = gpus
                .iter()
                .filter_map(|i| all.iter().find(|g| g.index == *i))
                .map(|g| g.gpu_type.as_str());
            self.quotas.take(&job.spec.tenant, types);
        }
        let may_reserve =
            self.policy.backfill.reserves() || self.policy.gang_wait_limit_ms.is_some();
        for (slot, gpus) in placement {
            let run = || Holding {
                slot,
                gpus: gpus.clone(),
                end_ms,
            };
            match &mut self.timeline {
                Some(timeline) => timeline.add_run(run()),
                None if may_reserve => self.started.push(run()),
                None => {}
            }
            self.out.binds.push(Bind {
                job: job.id,
                node: self.nodes.slots[slot].id,
                gpus,
            });
        }
    }
}

/// GPUs held by live runs (from the nodes' allocations, so gangs count on every node), with
/// their expected ends.
fn holdings(
    state: &ClusterState,
    nodes: &Nodes<'_>,
    policy: &Policy,
    env: &PlanEnv,
) -> Vec<Holding> {
    // At most one run per GPU.
    let mut out = Vec::with_capacity(nodes.slots.iter().map(|s| s.all.len()).sum());
    // (job, GPU) pairs of one node, grouped by job with each job's GPUs in index order.
    let mut held: Vec<(JobId, u32)> = Vec::new();
    for (slot, s) in nodes.slots.iter().enumerate() {
        let Some(node) = state.nodes.get(&s.id) else {
            continue;
        };
        held.clear();
        held.extend(node.allocations.iter().map(|(&gpu, &job)| (job, gpu)));
        held.sort_unstable();
        for run in held.chunk_by(|a, b| a.0 == b.0) {
            let job = run[0].0;
            let end_ms = state
                .jobs
                .get(&job)
                .and_then(|j| env.expected_end_ms(j, policy));
            let gpus = run.iter().map(|&(_, gpu)| gpu).collect();
            out.push(Holding { slot, gpus, end_ms });
        }
    }
    out
}

/// The cluster's capacity for jobs with no GPU type, memory or node selector, computed once a
/// pass so the common case needs no scan.
struct Capacity {
    largest: usize,
    total: usize,
}

impl Capacity {
    fn of(nodes: &Nodes<'_>) -> Self {
        Self {
            largest: nodes.slots.iter().map(|s| s.all.len()).max().unwrap_or(0),
            total: nodes.slots.iter().map(|s| s.all.len()).sum(),
        }
    }

    fn could_ever_fit(&self, nodes: &Nodes<'_>, spec: &JobSpec, gangs: bool) -> bool {
        if !is_plain(spec) || spec.nodes > 1 {
            return nodes.could_ever_fit(spec, gangs);
        }
        let want = spec.gpus as usize;
        !nodes.slots.is_empty() && want <= if gangs { self.total } else { self.largest }
    }
}

/// A user-facing reason: impossible anywhere, or waiting for capacity.
fn why_unplaceable(spec: &JobSpec, nodes: &Nodes<'_>) -> String {
    let what = describe(spec);
    if !nodes
        .slots
        .iter()
        .any(|n| selector_matches(spec, &n.labels))
    {
        return match (spec.container.is_some(), spec.node_selector.is_empty()) {
            (false, true) => "no node accepts work".to_owned(),
            (false, false) => "no schedulable node matches the node selector".to_owned(),
            (true, true) => "no schedulable node has a container runtime".to_owned(),
            (true, false) => {
                "no schedulable node both matches the node selector and has a container runtime"
                    .to_owned()
            }
        };
    }
    if spec.nodes > 1 {
        let (k, per) = (spec.node_count(), spec.gpus_per_node());
        let able = nodes.nodes_with_capacity(spec, per as usize);
        let each = describe(&JobSpec {
            gpus: per,
            nodes: 0,
            ..spec.clone()
        });
        return match (&spec.topology, able < k as usize) {
            (None, true) => {
                format!("gang of {k} nodes: only {able} schedulable nodes have {each} each")
            }
            (None, false) => format!(
                "gang of {k} nodes not yet satisfiable: waiting for {k} nodes with {each} free at once"
            ),
            (Some(level), true) => format!(
                "gang of {k} nodes in one {level}: at most {able} schedulable nodes of one {level} have {each} each"
            ),
            (Some(level), false) => format!(
                "gang of {k} nodes in one {level} not yet satisfiable: waiting for {k} nodes of one {level} with {each} free at once"
            ),
        };
    }
    let largest = nodes.largest_capacity(spec);
    let want = spec.gpus as usize;
    if largest < want {
        let nodes = if spec.container.is_some() {
            "no schedulable node with a container runtime"
        } else {
            "no schedulable node"
        };
        return format!("{nodes} has {what} (the most any has is {largest})");
    }
    let free: usize = if is_plain(spec) {
        nodes.total_free()
    } else {
        nodes
            .slots
            .iter()
            .filter(|n| selector_matches(spec, &n.labels))
            .map(|n| n.free.iter().filter(|g| gpu_fits(g, spec)).count())
            .sum()
    };
    if want > 1 && free >= want {
        format!(
            "waiting for {what} on one node: {free} matching GPUs are free, but spread over several nodes (fragmentation)"
        )
    } else {
        format!("waiting for {what} to be free")
    }
}

fn describe(spec: &JobSpec) -> String {
    let mut s = format!("{} GPU{}", spec.gpus, if spec.gpus == 1 { "" } else { "s" });
    if !spec.gpu_types.is_empty() {
        s.push_str(&format!(" of type {}", spec.gpu_types.join("|")));
    }
    if spec.min_gpu_memory_mib > 0 {
        s.push_str(&format!(" with at least {} MiB", spec.min_gpu_memory_mib));
    }
    s
}

/// A pass at time 1 with no history (tests).
#[cfg(test)]
pub(crate) fn plan_default(s: &ClusterState) -> Plan {
    let policy = Policy::default();
    plan(s, &policy, &PlanEnv::new(1, &policy))
}
