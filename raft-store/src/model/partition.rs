//! GPU partitioning in the replicated state: each GPU's mode (whole, MIG, shared, pass-through)
//! and MIG layout, what a job asks for (a MIG profile or a shared slice) and which slices live
//! jobs hold. The `apply` rules are in `apply/partitions.rs`: a layout or mode change takes
//! effect at once on an idle GPU (or when it keeps every instance in use) and otherwise waits,
//! recorded as `pending`, until the GPU has drained; no change ever stops a job. The scheduler
//! places nothing new on a GPU with a pending change.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::mig::{self, Instance};
use crate::{JobId, NodeId};

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

/// `job → slice` for the live slices on one GPU.
pub type Holds = BTreeMap<JobId, Slice>;
