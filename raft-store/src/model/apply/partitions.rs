//! Applying GPU partitioning: mode and MIG layout changes (at once on an idle GPU, else after
//! its drain; never stopping a job), slice placements re-checked, and slices given back when a
//! run ends.

use crate::model::mig::{self, Instance};
use crate::model::node::{GpuRecord, NodeRecord};
use crate::model::outcome::{ApplyResult, Rejection, invalid};
use crate::model::partition::{
    FULL_SHARE, GpuMode, GpuPartition, PartitionSpec, Slice, SliceBind, SliceRequest,
};
use crate::model::state::ClusterState;
use crate::{JobId, NodeId};

impl ClusterState {
    /// `SetGpuPartition`: validate, then take effect now (an idle GPU, or a MIG layout that
    /// keeps every instance in use) or wait for the drain. With `if_idle` (the leader's
    /// re-slicing) a GPU that is busy refuses the change instead of draining.
    pub(crate) fn set_partition(
        &mut self,
        node: NodeId,
        gpu: u32,
        spec: &PartitionSpec,
        if_idle: bool,
    ) -> Result<ApplyResult, Rejection> {
        let record = self
            .nodes
            .get_mut(&node)
            .ok_or(Rejection::UnknownNode { node })?;
        let g = record
            .gpu(gpu)
            .ok_or_else(|| invalid(format!("node n{node} has no GPU {gpu}")))?;
        validate_partition(g, spec).map_err(|e| invalid(format!("GPU n{node}/{gpu}: {e}")))?;
        let current = record.partition(gpu);
        let keeps_held = current.mode == GpuMode::Mig
            && spec.mode == GpuMode::Mig
            && record.mig_held(gpu).iter().all(|start| {
                let held = current.mig.iter().find(|i| i.start == *start);
                held.is_some_and(|h| spec.mig.contains(h))
            });
        let now = !record.gpu_busy(gpu) || keeps_held;
        if !now && if_idle {
            return Err(invalid(format!(
                "GPU n{node}/{gpu} is busy; the re-slicing waits"
            )));
        }
        let entry = record.partitions.entry(gpu).or_default();
        if now {
            entry.current = spec.clone();
            entry.pending = None;
        } else {
            entry.pending = Some(spec.clone());
        }
        if *entry == GpuPartition::default() {
            record.partitions.remove(&gpu);
        }
        Ok(ApplyResult::Ok)
    }

    /// Whether `b` may be applied now: the slice's GPU is in the right mode, the MIG
    /// instance is in the layout and free, or the share fits what is left.
    pub fn check_slice_bind(&self, b: &SliceBind) -> Result<(), String> {
        let (job, node) = self.placement_target(b.job, b.node)?;
        let g = node
            .gpu(b.gpu)
            .ok_or_else(|| format!("node n{} has no GPU {}", b.node, b.gpu))?;
        let at = format!("GPU n{}/{}", b.node, b.gpu);
        if !g.healthy {
            return Err(format!("{at} is unhealthy"));
        }
        if let Some(rule) = node.quarantined.get(&b.gpu) {
            return Err(format!("{at} is quarantined ({rule})"));
        }
        if node.draining(b.gpu) {
            return Err(format!("{at} is draining for a partition change"));
        }
        if !job.spec.gpu_types.is_empty() && !job.spec.gpu_types.contains(&g.gpu_type) {
            return Err(format!(
                "{at} ({}) does not match the job's selector",
                g.model
            ));
        }
        let mode = node.mode(b.gpu);
        match (&job.spec.slice, &b.slice) {
            (Some(SliceRequest::Mig { profile }), Slice::Mig { profile: p, start }) => {
                if mode != GpuMode::Mig {
                    return Err(format!("{at} is in {} mode, not mig", mode.name()));
                }
                if p != profile {
                    return Err(format!("j-{} asks for {profile}, bind gives {p}", b.job));
                }
                let instance = Instance {
                    profile: p.clone(),
                    start: *start,
                };
                if !node.partition(b.gpu).mig.contains(&instance) {
                    return Err(format!("{at} has no MIG instance {instance}"));
                }
                if let Some(holder) = node.slices.get(&b.gpu).and_then(|h| {
                    h.iter()
                        .find(|(_, s)| matches!(s, Slice::Mig { start: s0, .. } if s0 == start))
                }) {
                    return Err(format!(
                        "{at} instance {instance} is held by j-{}",
                        holder.0
                    ));
                }
            }
            (
                Some(SliceRequest::Shared { memory_mib, share }),
                Slice::Shared {
                    memory_mib: m,
                    share: s,
                },
            ) => {
                if mode != GpuMode::Shared {
                    return Err(format!("{at} is in {} mode, not shared", mode.name()));
                }
                if (m, s) != (memory_mib, share) {
                    return Err(format!(
                        "j-{} asks for {memory_mib} MiB/{share}%, bind gives {m} MiB/{s}%",
                        b.job
                    ));
                }
                check_share_left(b, node, g, &at, *m, *s)?;
            }
            _ => {
                return Err(format!(
                    "j-{} did not ask for a slice like {}",
                    b.job, b.slice
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn bind_slices(&mut self, binds: &[SliceBind], now: u64) -> ApplyResult {
        let mut bound = Vec::new();
        let mut rejected = Vec::new();
        for b in binds {
            match self.due(b.job, now).and_then(|()| self.check_slice_bind(b)) {
                Ok(()) => {
                    if let Some(node) = self.nodes.get_mut(&b.node) {
                        node.slices
                            .entry(b.gpu)
                            .or_default()
                            .insert(b.job, b.slice.clone());
                    }
                    self.mark_bound(b.job, b.node, vec![b.gpu], Some(b.slice.clone()), now);
                    bound.push(b.job);
                }
                Err(reason) => rejected.push((b.job, reason)),
            }
        }
        ApplyResult::Bound { bound, rejected }
    }

    /// A run ended: give back its slices, and let changes waiting on now idle GPUs of
    /// `node` take effect.
    pub(crate) fn release_slices(&mut self, node: NodeId, job: JobId) {
        let Some(record) = self.nodes.get_mut(&node) else {
            return;
        };
        for holds in record.slices.values_mut() {
            holds.remove(&job);
        }
        record.slices.retain(|_, h| !h.is_empty());
        let waiting: Vec<u32> = record
            .partitions
            .iter()
            .filter(|(_, p)| p.pending.is_some())
            .map(|(i, _)| *i)
            .collect();
        for gpu in waiting {
            if !record.gpu_busy(gpu)
                && let Some(p) = record.partitions.get_mut(&gpu)
                && let Some(next) = p.pending.take()
            {
                p.current = next;
                if *p == GpuPartition::default() {
                    record.partitions.remove(&gpu);
                }
            }
        }
    }
}

/// A partition's own rules on one GPU: MIG only on MIG-capable models with a valid layout.
fn validate_partition(gpu: &GpuRecord, p: &PartitionSpec) -> Result<(), String> {
    match p.mode {
        GpuMode::Mig => {
            let m = mig::model(&gpu.model)
                .ok_or_else(|| format!("{} is not MIG-capable", gpu.model))?;
            m.check(&p.mig)
        }
        _ if !p.mig.is_empty() => Err(format!(
            "a MIG layout needs mode mig, not {}",
            p.mode.name()
        )),
        _ => Ok(()),
    }
}

/// Whether a shared slice of `m` MiB and `s`% fits what the other slices leave of GPU `g`.
fn check_share_left(
    b: &SliceBind,
    node: &NodeRecord,
    g: &GpuRecord,
    at: &str,
    m: u64,
    s: u32,
) -> Result<(), String> {
    let (used_mem, used_share) = node.shared_used(b.gpu);
    if used_mem + m > g.memory_mib {
        return Err(format!(
            "{at} has {} MiB of {} MiB left, j-{} needs {m} MiB",
            g.memory_mib.saturating_sub(used_mem),
            g.memory_mib,
            b.job
        ));
    }
    if used_share + s > FULL_SHARE {
        return Err(format!(
            "{at} has {}% of its compute left, j-{} needs {s}%",
            FULL_SHARE - used_share.min(FULL_SHARE),
            b.job
        ));
    }
    Ok(())
}
