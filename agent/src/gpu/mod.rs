//! The agent's view of its GPUs: the `GpuBackend` trait, the device and sample types it reports,
//! and `open`, which picks the real NVML backend or the simulator.
//!
//! Architecture invariant: nothing outside this module names NVML; the rest of the agent sees
//! only `GpuBackend`, `GpuDevice` and `GpuSample`, whichever backend is behind them.

pub(crate) mod dev_number;
pub(crate) mod models;
pub(crate) mod nvml;
mod nvml_mig;
pub(crate) mod sim;
pub(crate) mod sim_nodes;

use gpu_raft_store::mig::Instance;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use tracing::info;

pub use nvml::NvmlBackend;
pub use sim::SimBackend;

/// One GPU as enumerated at start-up. Static for the life of the backend.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuDevice {
    /// The driver's index (NVML / `nvidia-smi` order), 0-based.
    pub index: u32,
    pub uuid: String,
    /// e.g. `A100-80GB`; the driver's product name when it is not in `models::MODELS`.
    pub model: String,
    /// The family label used for scheduling, e.g. `A100`.
    pub gpu_type: String,
    pub memory_mib: u64,
    /// `DDDDDDDD:BB:DD.F`, hex digits upper case, as `nvidia-smi` prints it.
    pub pci_bus_id: String,
    pub numa_node: Option<u32>,
    /// Indexes of the GPUs on this node reachable over NVLink, ascending.
    pub nvlink_peers: Vec<u32>,
    pub mig_capable: bool,
    /// Default board power limit (TDP).
    pub max_power_w: u32,
    /// The character device a process opens to use this GPU (`/dev/nvidia<minor>`; the
    /// simulator's own nodes under its data directory). `None`: unknown, or the simulator
    /// could not create one (that needs root); such a GPU cannot be fenced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_node: Option<DeviceNode>,
}

/// NVIDIA's character device major: `/dev/nvidia<N>` is `195:N`, `/dev/nvidiactl` `195:255`.
pub const NVIDIA_MAJOR: u32 = 195;
/// `/dev/nvidiactl`'s minor (every CUDA process opens it).
pub const NVIDIACTL_MINOR: u32 = 255;

/// A GPU's device node: its path and device number.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceNode {
    pub path: PathBuf,
    pub major: u32,
    pub minor: u32,
}

impl DeviceNode {
    /// The real driver's node for minor `minor`: `/dev/nvidia<minor>`, `195:<minor>`.
    pub fn nvidia(minor: u32) -> Self {
        Self {
            path: PathBuf::from(format!("/dev/nvidia{minor}")),
            major: NVIDIA_MAJOR,
            minor,
        }
    }
}

/// One reading of one GPU. Both backends fill the same fields; a field the GPU does not support
/// stays at zero.
///
/// `healthy` is false only when the GPU cannot be read at all (lost, fallen off the bus); what
/// to make of temperatures, XIDs and ECC counts is the caller's policy. A reading that failed for
/// another reason leaves its field at zero and is described in `error`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuSample {
    pub index: u32,
    pub healthy: bool,
    pub utilization_pct: f32,
    /// How busy the memory controller was (DCGM's `MEM_COPY_UTIL`).
    pub memory_utilization_pct: f32,
    pub memory_used_mib: u64,
    pub memory_total_mib: u64,
    pub temperature_c: f32,
    /// HBM temperature; zero on boards without a memory sensor.
    pub memory_temperature_c: f32,
    pub power_w: f32,
    pub power_limit_w: f32,
    /// Energy used since the driver loaded, in millijoules.
    pub energy_mj: u64,
    pub sm_clock_mhz: u32,
    pub memory_clock_mhz: u32,
    /// Why the clocks are held down: NVML's bit mask (see `throttle`).
    pub throttle_reasons: u64,
    pub pcie_tx_kib_s: u32,
    pub pcie_rx_kib_s: u32,
    /// PCIe replays since the driver loaded (a rising count means a bad link).
    pub pcie_replays: u64,
    /// NVLink data sent and received since the driver loaded, summed over links.
    pub nvlink_tx_kib: u64,
    pub nvlink_rx_kib: u64,
    /// NVLink CRC, replay and recovery errors, summed over links.
    pub nvlink_errors: u64,
    /// XID errors reported since the previous sample.
    pub xid_events: Vec<u32>,
    /// Corrected (single-bit) ECC errors since the driver loaded.
    pub ecc_single_bit: u64,
    /// Uncorrected (double-bit) ECC errors since the driver loaded.
    pub ecc_double_bit: u64,
    /// Memory pages retired (before Ampere) or rows remapped (Ampere on) for ECC errors.
    pub retired_pages: u64,
    /// The processes holding GPU memory, by pid.
    pub processes: Vec<GpuProcess>,
    pub error: Option<String>,
}

/// A process with memory on a GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcess {
    pub pid: u32,
    pub used_mib: u64,
}

impl GpuSample {
    /// A sample with every reading at zero, healthy and without error.
    pub fn empty(index: u32) -> Self {
        Self {
            index,
            healthy: true,
            ..Self::default()
        }
    }
}

/// NVML's clock throttle reasons (`nvmlClocksEventReasons`), the bits of
/// `GpuSample::throttle_reasons`.
pub mod throttle {
    pub const GPU_IDLE: u64 = 0x1;
    pub const APPLICATIONS_CLOCKS: u64 = 0x2;
    pub const SW_POWER_CAP: u64 = 0x4;
    pub const HW_SLOWDOWN: u64 = 0x8;
    pub const SYNC_BOOST: u64 = 0x10;
    pub const SW_THERMAL: u64 = 0x20;
    pub const HW_THERMAL: u64 = 0x40;
    pub const HW_POWER_BRAKE: u64 = 0x80;
    pub const DISPLAY_CLOCKS: u64 = 0x100;

    const NAMES: &[(u64, &str)] = &[
        (GPU_IDLE, "idle"),
        (APPLICATIONS_CLOCKS, "app_clocks"),
        (SW_POWER_CAP, "sw_power_cap"),
        (HW_SLOWDOWN, "hw_slowdown"),
        (SYNC_BOOST, "sync_boost"),
        (SW_THERMAL, "sw_thermal"),
        (HW_THERMAL, "hw_thermal"),
        (HW_POWER_BRAKE, "hw_power_brake"),
        (DISPLAY_CLOCKS, "display_clocks"),
    ];

    /// The reasons set in `mask`, by name, in bit order (unknown bits are left out).
    pub fn names(mask: u64) -> Vec<&'static str> {
        NAMES
            .iter()
            .filter(|(bit, _)| mask & bit != 0)
            .map(|(_, name)| *name)
            .collect()
    }
}

/// A fault the simulator can be told to show (the real backend refuses them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// Pin the temperature 5 °C above the model's slowdown threshold (clocks halve).
    Overheat,
    /// Report this XID once, in the next sample.
    Xid(u32),
    /// Count one more uncorrected (double-bit) ECC error.
    EccError,
    /// The GPU falls off the bus: samples report it unhealthy (and XID 79 once).
    Lost,
    /// Undo every fault above, as a GPU reset would; the temperature then cools normally.
    Clear,
}

/// A source of GPU facts: NVML on a real host, the simulator elsewhere.
pub trait GpuBackend: Send + Sync {
    /// `"nvml"` or `"sim"`.
    fn name(&self) -> &'static str;
    fn devices(&self) -> Vec<GpuDevice>;
    /// One sample per device, in index order. A GPU that cannot be read gets a sample with
    /// `error` set; it never hides the others.
    fn sample(&self) -> Vec<GpuSample>;
    /// Tell the backend whether a job is running on the GPU (drives the simulator's load;
    /// the real backend ignores it).
    fn set_busy(&self, index: u32, busy: bool);
    /// Set the board power limit (remediation and green mode); the simulator obeys it.
    fn set_power_limit(&self, index: u32, watts: u32) -> Result<(), GpuError>;
    fn inject(&self, index: u32, fault: Fault) -> Result<(), GpuError>;
    /// GPU `index`'s MIG devices as they are now; `None` while MIG mode is off (or the GPU
    /// cannot do MIG).
    fn mig_devices(&self, index: u32) -> Result<Option<Vec<MigDevice>>, GpuError> {
        let _ = index;
        Ok(None)
    }
    /// Make GPU `index` hold exactly `layout` (MIG mode on, one GPU instance per entry with
    /// one compute instance of its full size), or turn MIG mode off for `None`. Instances
    /// already in place are kept (their UUIDs too); only the others are destroyed or created.
    /// The caller changes only what no job uses (the replicated layout guarantees it).
    fn apply_mig(
        &self,
        index: u32,
        layout: Option<&[Instance]>,
    ) -> Result<Vec<MigDevice>, GpuError> {
        let _ = (index, layout);
        Err(GpuError::Unsupported {
            backend: self.name(),
            what: "configure MIG",
        })
    }
}

/// One MIG device: a GPU instance (profile, start slice) and the UUID CUDA knows it by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigDevice {
    pub profile: String,
    pub start: u8,
    /// `MIG-…`, what goes in `CUDA_VISIBLE_DEVICES`.
    pub uuid: String,
}

/// Whether `devices` are exactly the instances of `layout`.
pub fn mig_matches(devices: &[MigDevice], layout: &[Instance]) -> bool {
    devices.len() == layout.len()
        && layout.iter().all(|i| {
            devices
                .iter()
                .any(|d| d.start == i.start && d.profile == i.profile)
        })
}

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No usable NVIDIA driver on this host. `open` with `BackendKind::Auto` falls back to the
    /// simulator on this error, and only on this one.
    #[error("NVIDIA driver not available ({0}); use --gpu-backend sim to run without GPUs")]
    DriverUnavailable(String),
    /// The driver is there but NVML failed (permissions, a broken GPU during enumeration, ...).
    #[error("NVML: {0}")]
    Nvml(String),
    #[error("invalid simulated GPU spec {spec:?}: {reason}")]
    InvalidSimSpec { spec: String, reason: String },
    #[error("no GPU with index {index} (this node has {count})")]
    NoSuchGpu { index: u32, count: usize },
    #[error("power limit {watts} W for GPU {index} is outside its range {min}..={max} W")]
    PowerLimitOutOfRange {
        index: u32,
        watts: u32,
        min: u32,
        max: u32,
    },
    #[error("invalid MIG layout for GPU {index}: {reason}")]
    BadMigLayout { index: u32, reason: String },
    #[error("the {backend} GPU backend cannot {what}")]
    Unsupported {
        backend: &'static str,
        what: &'static str,
    },
}

/// Which backend `open` uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Real GPUs through NVML; fails without a driver.
    Nvml,
    /// Simulated GPUs from the spec.
    Sim,
    /// NVML when the NVIDIA driver is available, otherwise the simulator.
    #[default]
    Auto,
}

impl BackendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Nvml => "nvml",
            BackendKind::Sim => "sim",
            BackendKind::Auto => "auto",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BackendKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "nvml" => Ok(BackendKind::Nvml),
            "sim" => Ok(BackendKind::Sim),
            "auto" => Ok(BackendKind::Auto),
            other => Err(format!(
                "unknown GPU backend {other:?} (expected nvml, sim or auto)"
            )),
        }
    }
}

/// Opens the GPU backend. `sim_spec` (e.g. `4xA100-80GB,2xT4-16GB`) is used only by the
/// simulator; `node_id` seeds the simulated UUIDs so that every simulated node's GPUs differ.
/// `sim_dev_dir`: where the simulator creates its GPUs' device nodes (see `sim_nodes`); `None`
/// for none.
pub fn open(
    kind: BackendKind,
    sim_spec: &str,
    node_id: u64,
    sim_dev_dir: Option<&Path>,
) -> Result<Box<dyn GpuBackend>, GpuError> {
    let sim = || -> Result<Box<dyn GpuBackend>, GpuError> {
        let sim = SimBackend::from_spec(sim_spec, node_id)?;
        Ok(Box::new(match sim_dev_dir {
            Some(dir) => sim.with_device_nodes(dir, node_id),
            None => sim,
        }))
    };
    let backend: Box<dyn GpuBackend> = match kind {
        BackendKind::Nvml => Box::new(NvmlBackend::open()?),
        BackendKind::Sim => sim()?,
        BackendKind::Auto => match NvmlBackend::open() {
            Ok(nvml) => Box::new(nvml),
            Err(GpuError::DriverUnavailable(why)) => {
                info!(%why, "NVIDIA driver not available, simulating GPUs");
                sim()?
            }
            Err(e) => return Err(e),
        },
    };
    let devices = backend.devices();
    let models: Vec<&str> = devices.iter().map(|d| d.model.as_str()).collect();
    info!(
        requested = %kind,
        backend = backend.name(),
        gpus = devices.len(),
        models = %models.join(","),
        "GPU backend open"
    );
    Ok(backend)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_kind_parses_and_prints() {
        for kind in [BackendKind::Nvml, BackendKind::Sim, BackendKind::Auto] {
            assert_eq!(kind.to_string().parse::<BackendKind>(), Ok(kind));
        }
        assert_eq!(
            "gpu".parse::<BackendKind>(),
            Err("unknown GPU backend \"gpu\" (expected nvml, sim or auto)".to_owned())
        );
        assert_eq!(BackendKind::default(), BackendKind::Auto);
    }

    #[test]
    fn open_sim_uses_the_spec_and_node_id() {
        let a = open(BackendKind::Sim, "2xT4-16GB", 1, None).expect("sim opens");
        let b = open(BackendKind::Sim, "2xT4-16GB", 2, None).expect("sim opens");
        assert_eq!(a.name(), "sim");
        assert_eq!(a.devices().len(), 2);
        assert_ne!(a.devices()[0].uuid, b.devices()[0].uuid);
        let err = open(BackendKind::Sim, "", 1, None)
            .err()
            .expect("empty spec is refused");
        assert!(matches!(err, GpuError::InvalidSimSpec { .. }), "{err}");
    }

    /// Written for hosts without an NVIDIA driver (developers, CI). On a GPU host the same test
    /// checks the other branch: NVML opens and `Auto` picks it.
    #[test]
    fn nvml_without_driver_is_refused_and_auto_falls_back_to_sim() {
        let auto = open(BackendKind::Auto, "4xA100-80GB", 7, None).expect("auto always opens here");
        match open(BackendKind::Nvml, "4xA100-80GB", 7, None) {
            Err(GpuError::DriverUnavailable(why)) => {
                assert!(why.contains("libnvidia-ml.so.1"), "{why}");
                let shown = GpuError::DriverUnavailable(why).to_string();
                assert!(
                    shown.starts_with("NVIDIA driver not available ("),
                    "{shown}"
                );
                assert!(
                    shown.ends_with("use --gpu-backend sim to run without GPUs"),
                    "{shown}"
                );
                assert_eq!(auto.name(), "sim");
                assert_eq!(auto.devices().len(), 4);
            }
            Ok(nvml) => {
                assert_eq!(nvml.name(), "nvml");
                assert_eq!(auto.name(), "nvml");
            }
            Err(other) => panic!("unexpected NVML error: {other}"),
        }
    }
}
