//! `plan`: placements for pending jobs, computed from the applied state, a `Policy` and a
//! `PlanEnv` (which carries "now") alone — no I/O, no clock. The leader and the simulator both
//! call it. The queue order comes from `order.rs`, where a job goes from `placement.rs`, and
//! what a job that does not fit does to the ones behind it from the policy's `Backfill`.

use std::borrow::Cow;
use std::collections::BTreeMap;

use gpu_raft_store::{Bind, ClusterState, JobId, JobSpec, SliceBind, gpu_fits};

use super::backfill::{self, Holding, Reservation};
use super::env::PlanEnv;
use super::order::Queue;
use super::pending::PendingIndex;
use super::placement::{Nodes, is_plain, selector_matches};
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
    /// The EASY reservation of the first job that could not start, if any.
    pub reservation: Option<Reservation>,
}

/// Plan one pass. Jobs are taken in the policy's order; each goes where `placement` puts it
/// now, unless the backfill mode holds it back for a job ahead of it.
pub fn plan(state: &ClusterState, policy: &Policy, env: &PlanEnv) -> Plan {
    let pending = PendingIndex::of(state, policy.ordering);
    plan_queue(
        state,
        policy,
        Queue::new(state, policy, env, Cow::Owned(pending)),
        env,
    )
}

/// `plan` with the pending jobs of `state` already indexed (kept up to date by the
/// simulator, for the policy's ordering).
pub fn plan_pending(
    state: &ClusterState,
    policy: &Policy,
    env: &PlanEnv,
    pending: &PendingIndex,
) -> Plan {
    plan_queue(
        state,
        policy,
        Queue::new(state, policy, env, Cow::Borrowed(pending)),
        env,
    )
}

fn plan_queue(state: &ClusterState, policy: &Policy, mut queue: Queue<'_>, env: &PlanEnv) -> Plan {
    let mut nodes = Nodes::new(state);
    let mut sliced = SliceBook::new(state, policy.slice_best_fit);
    let gangs = policy.multi_node_gangs;
    let unconstrained_capacity = Capacity::of(&nodes);
    let mut started: Vec<Holding> = Vec::new();
    let mut reservation: Option<(Reservation, Cow<'_, JobSpec>)> = None;
    let mut quotas = QuotaBook::new(state);
    let mut blocked_by: Option<JobId> = None;
    // Free GPUs only shrink during a pass, so for plain single-node jobs (no GPU type, memory
    // or node selector) failure is monotone in size: once a size finds no room, or is held
    // back by a plain head's reservation, every larger one is too. These skip the search.
    let mut no_room_from = usize::MAX;
    let mut held_from = usize::MAX;
    let mut out = Plan::default();
    while let Some(job) = queue.next() {
        if out.binds.len() + out.slice_binds.len() >= policy.max_binds_per_pass {
            break;
        }
        let note = |out: &mut Plan, reason: String| {
            if policy.explain && job.reason.as_deref() != Some(reason.as_str()) {
                out.unschedulable.push((job.id, reason));
            }
        };
        if super::preempt::waits_for_beneficiary(state, job) {
            let by = job.preempted_for.unwrap_or_default();
            note(
                &mut out,
                format!("preempted for j-{by}: waits until j-{by} has started"),
            );
            continue;
        }
        if let Some(head) = blocked_by {
            if !policy.explain {
                break;
            }
            note(
                &mut out,
                format!("queued behind j-{head} ({} queue)", policy.spec()),
            );
            continue;
        }
        // A tenant at its quota for some GPU types may only use the others; at its quota for
        // all it waits, without holding up the queue behind it.
        let spec: Cow<'_, JobSpec> = match quotas.admit(&job.spec) {
            Admission::Unlimited => Cow::Borrowed(&job.spec),
            Admission::Only(types) => Cow::Owned(restrict(&job.spec, types)),
            Admission::OverQuota(reason) => {
                note(&mut out, reason);
                queue.pass_over_class();
                continue;
            }
        };
        let spec = spec.as_ref();
        // MIG instances, shared slices and pass-through GPUs: their own book, no reservation
        // (a slice does not hold the queue behind it).
        if slices::is_sliced(spec) {
            let Some(place) = sliced.place(spec) else {
                note(&mut out, sliced.why(spec));
                queue.pass_over_class();
                continue;
            };
            let (node, gpus) = match &place {
                SlicePlace::Slice { node, gpu, .. } => (*node, vec![*gpu]),
                SlicePlace::Passthrough { node, gpus } => (*node, gpus.clone()),
            };
            if let Some(n) = state.nodes.get(&node) {
                let types = gpus
                    .iter()
                    .filter_map(|i| n.gpu(*i))
                    .map(|g| g.gpu_type.as_str());
                quotas.take(&job.spec.tenant, types);
            }
            match place {
                SlicePlace::Slice { node, gpu, slice } => out.slice_binds.push(SliceBind {
                    job: job.id,
                    node,
                    gpu,
                    slice,
                }),
                SlicePlace::Passthrough { node, gpus } => out.binds.push(Bind {
                    job: job.id,
                    node,
                    gpus,
                }),
            }
            queue.placed();
            continue;
        }
        let want = spec.gpus as usize;
        // Nothing with GPUs can start any more and no CPU-only job waits: the pass is over,
        // once an EASY head has its reservation. (Otherwise the job goes on to find no room,
        // which under a strict queue holds every job behind it, CPU-only ones included.)
        if !policy.explain
            && want > 0
            && nodes.total_free() == 0
            && !queue.has_cpu_only_pending()
            && !sliced.has_room()
            && (reservation.is_some() || policy.backfill != Backfill::Easy)
        {
            break;
        }
        // A gang the job asked for (`nodes` > 1) has its own shape: no size memo, and it
        // needs its per-node share on enough nodes.
        let asked_gang = spec.nodes > 1;
        let memo = !asked_gang && is_plain(spec) && want <= unconstrained_capacity.largest;
        let may_fit = if asked_gang {
            spec.gpus_per_node() as usize <= nodes.max_free() && want <= nodes.total_free()
        } else {
            want <= nodes.max_free() || (gangs && want <= nodes.total_free())
        };
        let found = if may_fit && !(memo && want >= no_room_from) {
            nodes.find_preferring(spec, &job.spec.gpu_types, gangs, None)
        } else {
            None
        };
        if found.is_none() && memo {
            no_room_from = no_room_from.min(want);
        }
        let Some(mut placement) = found else {
            // Free GPUs only shrink during a pass: the rest of its class finds no room either.
            queue.pass_over_class();
            // A gang asked for does not hold the queue (no reservation is computed for its
            // shape): it starts when enough nodes are free at once.
            let holds_queue =
                !asked_gang && policy.backfill != Backfill::Greedy && reservation.is_none();
            if !(policy.explain || holds_queue) {
                continue;
            }
            if !unconstrained_capacity.could_ever_fit(&nodes, spec, gangs) {
                note(&mut out, why_unplaceable(spec, &nodes));
                continue;
            }
            if holds_queue {
                let reserved = (policy.backfill == Backfill::Easy)
                    .then(|| {
                        let holdings = holdings(state, &nodes, policy, env, &started);
                        backfill::reserve(job.id, spec, &nodes, &holdings, gangs, env.now_ms)
                    })
                    .flatten();
                match reserved {
                    Some(r) => reservation = Some((r, Cow::Owned(spec.clone()))),
                    None => blocked_by = Some(job.id),
                }
            }
            note(&mut out, why_unplaceable(spec, &nodes));
            continue;
        };
        let end_ms = env
            .estimate_ms(spec, policy)
            .map(|e| env.now_ms.saturating_add(e));
        if let Some((r, head)) = reservation.as_mut() {
            let outlasts = end_ms.is_none_or(|end| end > r.start_ms);
            let head: &JobSpec = head;
            let memo = memo && outlasts && is_plain(head);
            let admitted = !(memo && want >= held_from)
                && backfill::admit(r, head, &nodes, &placement, end_ms)
                || match r.slot.and_then(|avoid| {
                    nodes.find_preferring(spec, &job.spec.gpu_types, gangs, Some(avoid))
                }) {
                    Some(elsewhere) if backfill::admit(r, head, &nodes, &elsewhere, end_ms) => {
                        placement = elsewhere;
                        true
                    }
                    _ => false,
                };
            if !admitted {
                if memo {
                    held_from = held_from.min(want);
                    queue.pass_over_class();
                }
                let head = r.job;
                note(
                    &mut out,
                    format!(
                        "held back: starting it would delay j-{head}, which has a reservation (EASY backfill)"
                    ),
                );
                continue;
            }
        }
        nodes.take(&placement);
        for (slot, gpus) in &placement {
            let all = &nodes.slots[*slot].all;
            let types = gpus
                .iter()
                .filter_map(|i| all.iter().find(|g| g.index == *i))
                .map(|g| g.gpu_type.as_str());
            quotas.take(&job.spec.tenant, types);
        }
        for (slot, gpus) in placement {
            if policy.backfill == Backfill::Easy {
                started.push(Holding {
                    slot,
                    gpus: gpus.clone(),
                    end_ms,
                });
            }
            out.binds.push(Bind {
                job: job.id,
                node: nodes.slots[slot].id,
                gpus,
            });
        }
        queue.placed();
    }
    out.reservation = reservation.map(|(r, _)| r);
    out
}

/// GPUs held by live runs (from the nodes' allocations, so gangs count on every node) and by
/// the runs this pass started, with their expected ends.
fn holdings(
    state: &ClusterState,
    nodes: &Nodes<'_>,
    policy: &Policy,
    env: &PlanEnv,
    started: &[Holding],
) -> Vec<Holding> {
    let mut out = started.to_vec();
    for (slot, s) in nodes.slots.iter().enumerate() {
        let Some(node) = state.nodes.get(&s.id) else {
            continue;
        };
        let mut by_job: BTreeMap<JobId, Vec<u32>> = BTreeMap::new();
        for (&gpu, &job) in &node.allocations {
            by_job.entry(job).or_default().push(gpu);
        }
        for (job, gpus) in by_job {
            let end_ms = state
                .jobs
                .get(&job)
                .and_then(|j| env.expected_end_ms(j, policy));
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
        return if spec.node_selector.is_empty() {
            "no node accepts work".to_owned()
        } else {
            "no schedulable node matches the node selector".to_owned()
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
        return if able < k as usize {
            format!("gang of {k} nodes: only {able} schedulable nodes have {each} each")
        } else {
            format!(
                "gang of {k} nodes not yet satisfiable: waiting for {k} nodes with {each} free at once"
            )
        };
    }
    let largest = nodes.largest_capacity(spec);
    let want = spec.gpus as usize;
    if largest < want {
        return format!("no schedulable node has {what} (the most any has is {largest})");
    }
    let free: usize = nodes
        .slots
        .iter()
        .filter(|n| selector_matches(spec, &n.labels))
        .map(|n| n.free.iter().filter(|g| gpu_fits(g, spec)).count())
        .sum();
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
