//! Placement of jobs that do not take whole GPUs: one MIG instance of a profile, a shared
//! slice (memory + compute share) of a GPU in shared mode, or whole pass-through GPUs for a
//! `vm` job. One `SliceBook` per pass holds what is left on every GPU in those modes; every
//! placement is taken out of it, so a pass never over-commits (and `apply` re-checks each
//! bind). Best fit packs slices onto the GPUs that are already the most used, keeping empty
//! GPUs whole for big requests and for re-slicing; first fit (`Policy::slice_best_fit` off) is
//! the baseline (`simulate/fragmentation.rs` measures the same two strategies on MIG requests).

use std::collections::BTreeMap;

use gpu_raft_store::mig::{self, Instance};
use gpu_raft_store::partition::FULL_SHARE;
use gpu_raft_store::{
    ClusterState, GpuMode, JobKind, JobSpec, NodeId, NodeRecord, Slice, SliceRequest,
};

use super::placement::selector_matches;

/// What is left on one partitioned GPU.
#[derive(Clone, Debug)]
pub(crate) struct SlicedGpu {
    pub node: NodeId,
    pub index: u32,
    pub model: String,
    pub gpu_type: String,
    pub memory_mib: u64,
    pub mode: GpuMode,
    /// MIG instances of the layout in force that no job holds.
    pub free_instances: Vec<Instance>,
    /// Compute slices of the whole layout not held (for best fit).
    pub free_compute: u8,
    /// Shared mode: memory and share left.
    pub memory_left: u64,
    pub share_left: u32,
    /// Pass-through: free (no job holds it).
    pub free_whole: bool,
}

/// A pass's view of every usable partitioned GPU on nodes that accept work.
pub(crate) struct SliceBook {
    pub gpus: Vec<SlicedGpu>,
    labels: BTreeMap<NodeId, BTreeMap<String, String>>,
    best_fit: bool,
}

/// Where a sliced job goes.
pub(crate) enum SlicePlace {
    /// A MIG instance or a share of one GPU.
    Slice {
        node: NodeId,
        gpu: u32,
        slice: Slice,
    },
    /// Whole pass-through GPUs of one node (a `vm` job).
    Passthrough { node: NodeId, gpus: Vec<u32> },
}

/// Whether the job is placed by this module rather than as whole GPUs.
pub(crate) fn is_sliced(spec: &JobSpec) -> bool {
    spec.slice.is_some() || spec.kind == JobKind::Vm
}

impl SliceBook {
    pub(super) fn new(state: &ClusterState, best_fit: bool) -> Self {
        let mut gpus = Vec::new();
        let mut labels = BTreeMap::new();
        // A node without partitions has only whole GPUs: nothing of it goes in the book.
        let partitioned = |n: &&NodeRecord| n.accepts_work() && !n.partitions.is_empty();
        for n in state.nodes.values().filter(partitioned) {
            labels.insert(n.id, n.effective_labels().into_owned());
            for g in n.inventory.gpus.iter().filter(|g| n.gpu_usable(g)) {
                let mode = n.mode(g.index);
                if mode == GpuMode::Whole {
                    continue;
                }
                let held = n.mig_held(g.index);
                let layout = n.partition(g.index).mig;
                let free_instances: Vec<Instance> = layout
                    .iter()
                    .filter(|i| !held.contains(&i.start))
                    .cloned()
                    .collect();
                let (used_mem, used_share) = n.shared_used(g.index);
                gpus.push(SlicedGpu {
                    node: n.id,
                    index: g.index,
                    model: g.model.clone(),
                    gpu_type: g.gpu_type.clone(),
                    memory_mib: g.memory_mib,
                    mode,
                    free_compute: compute_of(&g.model, &free_instances),
                    free_instances,
                    memory_left: g.memory_mib.saturating_sub(used_mem),
                    share_left: FULL_SHARE.saturating_sub(used_share),
                    free_whole: !n.gpu_busy(g.index),
                });
            }
        }
        Self {
            gpus,
            labels,
            best_fit,
        }
    }

    /// Anything left to place slices on.
    pub(super) fn has_room(&self) -> bool {
        self.gpus.iter().any(|g| match g.mode {
            GpuMode::Mig => !g.free_instances.is_empty(),
            GpuMode::Shared => g.share_left > 0 && g.memory_left > 0,
            GpuMode::Passthrough => g.free_whole,
            GpuMode::Whole => false,
        })
    }

    /// Where `gpu_type` stands in the job's preference order (0 = first choice or no preference).
    fn rank(spec: &JobSpec, gpu_type: &str) -> usize {
        spec.gpu_types
            .iter()
            .position(|t| t == gpu_type)
            .unwrap_or(0)
    }

    fn eligible<'s>(&'s self, spec: &'s JobSpec) -> impl Iterator<Item = (usize, &'s SlicedGpu)> {
        self.gpus.iter().enumerate().filter(move |(_, g)| {
            (spec.gpu_types.is_empty() || spec.gpu_types.contains(&g.gpu_type))
                && self
                    .labels
                    .get(&g.node)
                    .is_some_and(|l| selector_matches(spec, l))
        })
    }

    /// The placement for `spec` now, taken out of the book; `None` when nothing fits.
    pub(super) fn place(&mut self, spec: &JobSpec) -> Option<SlicePlace> {
        if spec.kind == JobKind::Vm {
            return self.place_vm(spec);
        }
        match spec.slice.as_ref()? {
            SliceRequest::Mig { profile } => {
                // Best fit: the GPU with the least compute left that still has the profile.
                let pick = self
                    .eligible(spec)
                    .filter(|(_, g)| g.mode == GpuMode::Mig)
                    .filter_map(|(i, g)| {
                        let inst = g.free_instances.iter().find(|x| &x.profile == profile)?;
                        Some((i, inst.start, g.free_compute, Self::rank(spec, &g.gpu_type)))
                    })
                    .min_by_key(|(i, _, left, rank)| {
                        if self.best_fit {
                            (*rank, *left, *i)
                        } else {
                            (*rank, 0, *i)
                        }
                    })?;
                let (i, start, _, _) = pick;
                let g = &mut self.gpus[i];
                g.free_instances.retain(|x| x.start != start);
                g.free_compute = compute_of(&g.model, &g.free_instances);
                Some(SlicePlace::Slice {
                    node: g.node,
                    gpu: g.index,
                    slice: Slice::Mig {
                        profile: profile.clone(),
                        start,
                    },
                })
            }
            &SliceRequest::Shared { memory_mib, share } => {
                let pick = self
                    .eligible(spec)
                    .filter(|(_, g)| {
                        g.mode == GpuMode::Shared
                            && g.memory_left >= memory_mib
                            && g.share_left >= share
                    })
                    .min_by_key(|(i, g)| {
                        let rank = Self::rank(spec, &g.gpu_type);
                        if self.best_fit {
                            (rank, g.share_left - share, g.memory_left - memory_mib, *i)
                        } else {
                            (rank, 0, 0, *i)
                        }
                    })
                    .map(|(i, _)| i)?;
                let g = &mut self.gpus[pick];
                g.memory_left -= memory_mib;
                g.share_left -= share;
                Some(SlicePlace::Slice {
                    node: g.node,
                    gpu: g.index,
                    slice: Slice::Shared { memory_mib, share },
                })
            }
        }
    }

    fn place_vm(&mut self, spec: &JobSpec) -> Option<SlicePlace> {
        let want = spec.gpus as usize;
        let mut by_node: BTreeMap<NodeId, Vec<usize>> = BTreeMap::new();
        for (i, g) in self.eligible(spec) {
            if g.mode == GpuMode::Passthrough
                && g.free_whole
                && g.memory_mib >= spec.min_gpu_memory_mib
            {
                by_node.entry(g.node).or_default().push(i);
            }
        }
        let (&node, picks) =
            by_node
                .iter()
                .filter(|(_, v)| v.len() >= want)
                .min_by_key(|(n, v)| {
                    if self.best_fit {
                        (v.len(), **n)
                    } else {
                        (0, **n)
                    }
                })?;
        let picks: Vec<usize> = picks.iter().copied().take(want).collect();
        let mut gpus = Vec::new();
        for i in picks {
            self.gpus[i].free_whole = false;
            gpus.push(self.gpus[i].index);
        }
        Some(SlicePlace::Passthrough { node, gpus })
    }

    /// Why `spec` found no room: impossible as the cluster is partitioned now, or waiting.
    pub(super) fn why(&self, spec: &JobSpec) -> String {
        let any = |mode: GpuMode| self.eligible(spec).any(|(_, g)| g.mode == mode);
        if spec.kind == JobKind::Vm {
            return if any(GpuMode::Passthrough) {
                format!(
                    "waiting for {} free pass-through GPU(s) on one node",
                    spec.gpus
                )
            } else {
                "no schedulable GPU is in pass-through mode".to_owned()
            };
        }
        match &spec.slice {
            Some(SliceRequest::Mig { profile }) => {
                let offered = self.eligible(spec).any(|(_, g)| {
                    g.mode == GpuMode::Mig
                        && mig::model(&g.model).is_some_and(|m| m.profile(profile).is_some())
                });
                if offered {
                    format!("waiting for a free MIG instance {profile}")
                } else {
                    format!(
                        "no schedulable GPU in MIG mode supports {profile} (models that do: {})",
                        mig::models_supporting(profile).join(", ")
                    )
                }
            }
            Some(SliceRequest::Shared { memory_mib, share }) => {
                let largest = self
                    .eligible(spec)
                    .filter(|(_, g)| g.mode == GpuMode::Shared)
                    .map(|(_, g)| g.memory_mib)
                    .max();
                match largest {
                    None => "no schedulable GPU is in shared mode".to_owned(),
                    // A GPU in another mode might hold it, but no shared one ever can.
                    Some(most) if most < *memory_mib => format!(
                        "no schedulable GPU in shared mode has {memory_mib} MiB (the largest has \
                         {most} MiB)"
                    ),
                    Some(_) => format!("waiting for {memory_mib} MiB and {share}% of a shared GPU"),
                }
            }
            None => "not a sliced job".to_owned(),
        }
    }
}

fn compute_of(model: &str, instances: &[Instance]) -> u8 {
    let Some(m) = mig::model(model) else {
        return 0;
    };
    instances
        .iter()
        .filter_map(|i| m.profile(&i.profile))
        .map(|p| p.compute_slices)
        .sum()
}
