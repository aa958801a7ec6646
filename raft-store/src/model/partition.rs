//! GPU partitioning in the replicated state: each GPU's mode (whole, MIG, shared, pass-through)
//! and MIG layout, what a job asks for (a MIG profile or a shared slice), which slices live jobs
//! hold, and the `apply` rules: a layout or mode change takes effect at once on an idle GPU
//! (or when it keeps every instance in use) and otherwise waits, recorded as `pending`, until
//! the GPU has drained; no change ever stops a job. The scheduler places nothing new on a GPU
//! with a pending change.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::NodeId;
use crate::model::command::{ApplyResult, Rejection};
use crate::model::job::{JobId, JobSpec};
use crate::model::mig::{self, Instance};
use crate::model::node::{GpuRecord, NodeRecord};
use crate::model::state::ClusterState;

/// How a GPU is offered.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum GpuMode {
    /// One job holds the whole GPU (the default).
    #[default]
    Whole,
    /// Split into MIG instances; each job holds one instance.
    Mig,
    /// Shared by several jobs, each with a memory limit and a compute share (MPS).
    Shared,
    /// Handed whole to a virtual machine (jobs of kind `vm`), never to a process.
    Passthrough,
}

impl GpuMode {
    pub fn name(self) -> &'static str {
        match self {
            GpuMode::Whole => "whole",
            GpuMode::Mig => "mig",
            GpuMode::Shared => "shared",
            GpuMode::Passthrough => "passthrough",
        }
    }

    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "whole" => Ok(GpuMode::Whole),
            "mig" => Ok(GpuMode::Mig),
            "shared" => Ok(GpuMode::Shared),
            "passthrough" => Ok(GpuMode::Passthrough),
            _ => Err(format!(
                "unknown GPU mode {s:?} (whole, mig, shared, passthrough)"
            )),
        }
    }
}

/// A GPU's partitioning: its mode and, in MIG mode, its GPU instances.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionSpec {
    pub mode: GpuMode,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<Instance>,
}

impl std::fmt::Display for PartitionSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.mode.name())?;
        if !self.mig.is_empty() {
            let list: Vec<String> = self.mig.iter().map(Instance::to_string).collect();
            write!(f, "[{}]", list.join(","))?;
        }
        Ok(())
    }
}

/// A GPU's partitioning in force, and a requested one waiting for the GPU to drain.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuPartition {
    #[serde(flatten)]
    pub current: PartitionSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<PartitionSpec>,
}

/// A fraction of one GPU, as a job asks for it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SliceRequest {
    /// One MIG instance of this profile.
    Mig { profile: String },
    /// Part of a GPU in shared mode: a memory limit and a percentage of its compute.
    Shared { memory_mib: u64, share: u32 },
}

/// The fraction of one GPU a live job holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Slice {
    Mig { profile: String, start: u8 },
    Shared { memory_mib: u64, share: u32 },
}

impl std::fmt::Display for Slice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Slice::Mig { profile, start } => write!(f, "mig {profile}@{start}"),
            Slice::Shared { memory_mib, share } => write!(f, "shared {memory_mib}MiB/{share}%"),
        }
    }
}

/// One slice placement: `job` onto a slice of GPU `gpu` of `node`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliceBind {
    pub job: JobId,
    pub node: NodeId,
    pub gpu: u32,
    pub slice: Slice,
}

/// Largest share of a shared GPU's compute.
pub const FULL_SHARE: u32 = 100;

/// Context-free checks of a slice request (at the API edge and in `apply`).
pub fn validate_request(spec: &JobSpec) -> Result<(), String> {
    let Some(req) = &spec.slice else {
        return Ok(());
    };
    if spec.gpus != 1 || spec.nodes > 1 {
        return Err("a MIG or shared slice is one slice of one GPU: gpus must be 1".into());
    }
    if spec.kind == crate::model::job::JobKind::Vm {
        return Err("a vm job takes whole pass-through GPUs, not slices".into());
    }
    match req {
        SliceRequest::Mig { profile } => {
            mig::known_profile(profile)?;
            if !spec.gpu_types.is_empty() {
                let types = types_supporting(profile);
                if !spec.gpu_types.iter().any(|t| types.contains(&t.as_str())) {
                    return Err(format!(
                        "MIG profile {profile} is not supported by GPU type {} (only by {})",
                        join(spec.gpu_types.iter().map(String::as_str)),
                        join(mig::models_supporting(profile).into_iter())
                    ));
                }
            }
        }
        SliceRequest::Shared { memory_mib, share } => {
            if *share == 0 || *share > FULL_SHARE {
                return Err(format!(
                    "GPU share must be 1..={FULL_SHARE} percent, got {share}"
                ));
            }
            if *memory_mib == 0 {
                return Err("a shared slice needs its GPU memory (--gpu-mem)".into());
            }
            let most = largest_memory(&spec.gpu_types);
            if *memory_mib > most {
                return Err(format!(
                    "GPU memory {memory_mib} MiB is more than any {} has ({most} MiB)",
                    if spec.gpu_types.is_empty() {
                        "GPU".to_owned()
                    } else {
                        format!("{} GPU", join(spec.gpu_types.iter().map(String::as_str)))
                    }
                ));
            }
        }
    }
    Ok(())
}

fn join<'a>(it: impl Iterator<Item = &'a str>) -> String {
    it.collect::<Vec<_>>().join("|")
}

/// The GPU models gpumesh knows (name, `gpu_type`, memory), for the context-free limits of
/// shared requests. Kept beside the MIG tables; the agent's `gpu::models` has the same names.
pub const KNOWN_MODELS: &[(&str, &str, u64)] = &[
    ("A100-40GB", "A100", 40_960),
    ("A100-80GB", "A100", 81_920),
    ("H100-80GB", "H100", 81_920),
    ("H200-141GB", "H200", 144_384),
    ("V100-32GB", "V100", 32_768),
    ("T4-16GB", "T4", 15_360),
    ("L4-24GB", "L4", 23_034),
];

/// The most memory a GPU of one of `types` (any type when empty) has. A type gpumesh does
/// not know is not limited here (it may be newer hardware): the bind check still applies.
fn largest_memory(types: &[String]) -> u64 {
    if types.is_empty()
        || types
            .iter()
            .any(|t| !KNOWN_MODELS.iter().any(|(_, ty, _)| ty == t))
    {
        return if types.is_empty() {
            KNOWN_MODELS.iter().map(|m| m.2).max().unwrap_or(0)
        } else {
            u64::MAX
        };
    }
    KNOWN_MODELS
        .iter()
        .filter(|(_, ty, _)| types.iter().any(|t| t == ty))
        .map(|m| m.2)
        .max()
        .unwrap_or(0)
}

fn types_supporting(profile: &str) -> Vec<&'static str> {
    let models = mig::models_supporting(profile);
    KNOWN_MODELS
        .iter()
        .filter(|(m, _, _)| models.contains(m))
        .map(|(_, t, _)| *t)
        .collect()
}

/// A partition's own rules on one GPU: MIG only on MIG-capable models with a valid layout.
pub fn validate_partition(gpu: &GpuRecord, p: &PartitionSpec) -> Result<(), String> {
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

impl NodeRecord {
    /// The partitioning in force on GPU `index` (whole when none is recorded).
    pub fn partition(&self, index: u32) -> PartitionSpec {
        self.partitions
            .get(&index)
            .map(|p| p.current.clone())
            .unwrap_or_default()
    }

    pub fn mode(&self, index: u32) -> GpuMode {
        self.partitions
            .get(&index)
            .map_or(GpuMode::Whole, |p| p.current.mode)
    }

    /// A change is waiting for this GPU to drain: nothing new goes on it.
    pub fn draining(&self, index: u32) -> bool {
        self.partitions
            .get(&index)
            .is_some_and(|p| p.pending.is_some())
    }

    /// Whether any live job holds the GPU or a slice of it.
    pub fn gpu_busy(&self, index: u32) -> bool {
        self.allocations.contains_key(&index)
            || self.slices.get(&index).is_some_and(|s| !s.is_empty())
    }

    /// Whether new work of any kind may go on this GPU (healthy, not quarantined, not
    /// draining for a partition change).
    pub fn gpu_usable(&self, g: &GpuRecord) -> bool {
        g.healthy && !self.quarantined.contains_key(&g.index) && !self.draining(g.index)
    }

    /// Memory and compute share already held on a shared GPU.
    pub fn shared_used(&self, index: u32) -> (u64, u32) {
        self.slices.get(&index).map_or((0, 0), |holds| {
            holds.values().fold((0, 0), |(m, s), slice| match slice {
                Slice::Shared { memory_mib, share } => (m + memory_mib, s + share),
                Slice::Mig { .. } => (m, s),
            })
        })
    }

    /// Start slices of the MIG instances live jobs hold on this GPU.
    pub fn mig_held(&self, index: u32) -> Vec<u8> {
        self.slices.get(&index).map_or_else(Vec::new, |holds| {
            holds
                .values()
                .filter_map(|s| match s {
                    Slice::Mig { start, .. } => Some(*start),
                    Slice::Shared { .. } => None,
                })
                .collect()
        })
    }
}

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
        let job = self
            .jobs
            .get(&b.job)
            .ok_or_else(|| format!("job j-{} does not exist", b.job))?;
        if job.state != crate::JobState::Pending {
            return Err(format!("job j-{} is {}, not Pending", b.job, job.state));
        }
        let node = self
            .nodes
            .get(&b.node)
            .ok_or_else(|| format!("node n{} is not registered", b.node))?;
        if !node.accepts_work() {
            return Err(format!("node n{} does not accept work", b.node));
        }
        let labels = node.effective_labels();
        if let Some((k, v)) = job
            .spec
            .node_selector
            .iter()
            .find(|(k, v)| labels.get(*k) != Some(*v))
        {
            return Err(format!("node n{} does not have label {k}={v}", b.node));
        }
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
            match self.check_slice_bind(b) {
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

/// A run's normalized GPU use of each GPU it holds, as a fraction `(numerator,
/// denominator)`: 1 for a whole GPU, compute slices / 7 for a MIG instance, share / 100 for a
/// shared slice.
pub fn normalized(slice: Option<&Slice>, model: &str) -> (u64, u64) {
    match slice {
        None => (1, 1),
        Some(Slice::Shared { share, .. }) => (u64::from(*share), u64::from(FULL_SHARE)),
        Some(Slice::Mig { profile, .. }) => mig::model(model)
            .and_then(|m| m.profile(profile))
            .map_or((1, 1), |p| {
                (u64::from(p.compute_slices), u64::from(mig::COMPUTE_SLICES))
            }),
    }
}

fn invalid(message: String) -> Rejection {
    Rejection::Invalid { message }
}

/// `job → slice` for the live slices on one GPU.
pub type Holds = BTreeMap<JobId, Slice>;
