//! The simulated GPU backend: devices from a spec like `4xA100-80GB,2xT4-16GB`, a first-order
//! power and thermal model driven by `set_busy`, and injectable faults. Deterministic for a given
//! spec, seed and sequence of sample instants.

use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use gpu_raft_store::mig::{self, Instance};
use sha2::Digest;

use super::models::{self, GpuModel};
use super::{
    DeviceNode, Fault, GpuBackend, GpuDevice, GpuError, GpuProcess, GpuSample, MigDevice,
    sim_nodes, throttle,
};

/// Most GPUs one simulated node may have (per spec entry and in total).
pub(crate) const MAX_GPUS: u32 = 64;
// Each of them gets a device node minor of its own.
const _: () = assert!(sim_nodes::MINORS_PER_NODE >= MAX_GPUS);
/// Air temperature the GPUs cool towards.
pub(crate) const AMBIENT_C: f64 = 30.0;
/// Time constant of the temperature's lag behind its steady state.
pub(crate) const THERMAL_TAU_S: f64 = 20.0;
/// Time constant of the power draw's approach to its target.
pub(crate) const POWER_TAU_S: f64 = 2.0;
/// GPU utilization while a job runs.
pub(crate) const BUSY_UTILIZATION_PCT: f64 = 95.0;
/// Fraction of memory a running job holds.
pub(crate) const BUSY_MEMORY_FRACTION: f64 = 0.8;
/// Steady-state temperature at full power sits this far below the slowdown threshold.
const FULL_LOAD_MARGIN_C: f64 = 15.0;
/// Memory-controller utilization while a job runs.
const BUSY_MEMORY_UTILIZATION_PCT: f64 = 60.0;
/// PCIe traffic at full utilization (host to device, device to host).
const BUSY_PCIE_RX_KIB_S: f64 = 6_000_000.0;
const BUSY_PCIE_TX_KIB_S: f64 = 1_500_000.0;
/// NVLink traffic each way at full utilization, on SXM parts.
const BUSY_NVLINK_KIB_S: f64 = 50_000_000.0;
/// How much warmer the HBM runs than the GPU die.
const HBM_ABOVE_DIE_C: f64 = 6.0;
/// With a cooling failure (Overheat) full power heats the GPU this far above the slowdown
/// threshold; less power, less heat.
const OVERHEAT_EXCESS_C: f64 = 5.0;
/// The XID a GPU that falls off the bus reports.
const XID_FALLEN_OFF_BUS: u32 = 79;

/// Parses a spec into (model, count) entries: comma-separated `<count>x<model>` or `<model>`
/// (count 1); model names ignore case. Refuses empty specs and entries, unknown models, counts
/// of 0 and more than `MAX_GPUS` GPUs.
pub(crate) fn parse_spec(spec: &str) -> Result<Vec<(&'static GpuModel, u32)>, GpuError> {
    let invalid = |reason: String| GpuError::InvalidSimSpec {
        spec: spec.to_owned(),
        reason,
    };
    if spec.trim().is_empty() {
        return Err(invalid(format!(
            "empty; expected e.g. \"4xA100-80GB,2xT4-16GB\" (known models: {})",
            models::known_names()
        )));
    }
    let mut entries = Vec::new();
    let mut total: u32 = 0;
    for (position, entry) in spec.split(',').map(str::trim).enumerate() {
        if entry.is_empty() {
            return Err(invalid(format!("entry {} is empty", position + 1)));
        }
        let (count, name) = match entry.split_once('x') {
            Some((digits, name))
                if !digits.trim().is_empty()
                    && digits.trim().bytes().all(|b| b.is_ascii_digit()) =>
            {
                (digits.trim(), name.trim())
            }
            _ => ("1", entry),
        };
        // Digits only, so a failed parse means too many of them.
        let count = match count.parse::<u32>() {
            Ok(0) => {
                return Err(invalid(format!(
                    "count 0 in {entry:?}; remove the entry instead"
                )));
            }
            Ok(n) if n <= MAX_GPUS => n,
            _ => {
                return Err(invalid(format!(
                    "count {count} in {entry:?} is more than {MAX_GPUS} GPUs per node"
                )));
            }
        };
        let Some(model) = models::find(name) else {
            return Err(invalid(format!(
                "unknown GPU model {name:?} (known models: {})",
                models::known_names()
            )));
        };
        total += count;
        if total > MAX_GPUS {
            return Err(invalid(format!(
                "{total} GPUs in all is more than {MAX_GPUS} per node"
            )));
        }
        entries.push((model, count));
    }
    Ok(entries)
}

/// Simulated GPUs. All state sits behind one mutex; every method is cheap (but `sample`,
/// which scans `/proc` for the processes holding the GPUs' device nodes when there are any).
pub struct SimBackend {
    devices: Vec<GpuDevice>,
    models: Vec<&'static GpuModel>,
    state: Mutex<SimState>,
    /// Each GPU's device node (see `sim_nodes`); all `None` without `with_device_nodes`.
    nodes: Vec<Option<DeviceNode>>,
}

struct SimState {
    /// When the model was last advanced.
    last: Instant,
    gpus: Vec<SimGpu>,
    /// GPU instances created so far (each new one gets a UUID never used before).
    mig_created: u64,
}

impl SimState {
    fn gpu_mut(&mut self, index: u32) -> Result<&mut SimGpu, GpuError> {
        let count = self.gpus.len();
        self.gpus
            .get_mut(index as usize)
            .ok_or(GpuError::NoSuchGpu { index, count })
    }
}

struct SimGpu {
    busy: bool,
    power_w: f64,
    /// The board power limit in force (`set_power_limit`), at most the model's TDP.
    power_limit_w: f64,
    temperature_c: f64,
    energy_mj: f64,
    nvlink_kib: f64,
    overheat: bool,
    lost: bool,
    pending_xids: Vec<u32>,
    ecc_double_bit: u64,
    /// MIG mode and its devices (in memory only: like a real GPU after a reboot, a restarted
    /// agent's simulated GPUs come back with MIG off, and the agent re-applies the layout).
    mig: Option<Vec<MigDevice>>,
}

impl SimBackend {
    /// GPUs from `spec` (see `parse_spec`); `seed` (the node id) makes the UUIDs unique to
    /// the node. The thermal model starts at idle steady state, now.
    pub fn from_spec(spec: &str, seed: u64) -> Result<Self, GpuError> {
        let models: Vec<&'static GpuModel> = parse_spec(spec)?
            .into_iter()
            .flat_map(|(model, count)| std::iter::repeat_n(model, count as usize))
            .collect();
        let devices = build_devices(&models, seed);
        let gpus = models
            .iter()
            .map(|m| SimGpu {
                busy: false,
                power_w: f64::from(m.idle_power_w),
                power_limit_w: f64::from(m.max_power_w),
                temperature_c: steady_temperature(m, f64::from(m.idle_power_w)),
                energy_mj: 0.0,
                nvlink_kib: 0.0,
                overheat: false,
                lost: false,
                pending_xids: Vec::new(),
                ecc_double_bit: 0,
                mig: None,
            })
            .collect();
        Ok(Self {
            nodes: vec![None; devices.len()],
            devices,
            models,
            state: Mutex::new(SimState {
                last: Instant::now(),
                gpus,
                mig_created: 0,
            }),
        })
    }

    /// Give every GPU a real device node in `dir` (see `sim_nodes`), so the executor can fence
    /// it and `sample` reports the processes holding it. Needs root; without, the GPUs stay
    /// without nodes and the log says so once.
    pub fn with_device_nodes(mut self, dir: &Path, node_id: u64) -> Self {
        match sim_nodes::create(dir, node_id, self.devices.len() as u32) {
            Ok(nodes) => {
                if sim_nodes::on_nodev_mount(dir) {
                    tracing::warn!(dir = %dir.display(), "the simulated GPUs' device nodes are on a nodev mount: opening them fails with EACCES whatever the fence says");
                }
                tracing::info!(dir = %dir.display(), first_minor = nodes.first().map(|n| n.minor), "simulated GPUs have device nodes (major 195)");
                for (device, node) in self.devices.iter_mut().zip(&nodes) {
                    device.device_node = Some(node.clone());
                }
                self.nodes = nodes.into_iter().map(Some).collect();
            }
            Err(e) => tracing::warn!(
                error = %e,
                "simulated GPUs without device nodes (making them needs root): their device fence and foreign-process detection are not exercised"
            ),
        }
        self
    }

    /// Advances the model to `now` and reads every GPU. `sample()` is `sample_at(Instant::now())`;
    /// tests pass instants of their own instead of sleeping. An instant earlier than the last
    /// one advances nothing.
    pub fn sample_at(&self, now: Instant) -> Vec<GpuSample> {
        let mut state = self.lock();
        let dt = now.saturating_duration_since(state.last).as_secs_f64();
        state.last = state.last.max(now);
        let power_step = 1.0 - (-dt / POWER_TAU_S).exp();
        let thermal_step = 1.0 - (-dt / THERMAL_TAU_S).exp();
        let mut samples = Vec::with_capacity(self.models.len());
        for (index, (gpu, model)) in state.gpus.iter_mut().zip(&self.models).enumerate() {
            let mut sample = GpuSample::empty(index as u32);
            sample.xid_events = std::mem::take(&mut gpu.pending_xids);
            sample.ecc_double_bit = gpu.ecc_double_bit;
            sample.memory_total_mib = model.memory_mib;
            if gpu.lost {
                sample.healthy = false;
                sample.error = Some("GPU is lost (simulated fault)".to_owned());
                samples.push(sample);
                continue;
            }
            let idle = f64::from(model.idle_power_w);
            let max = f64::from(model.max_power_w);
            let utilization = if gpu.busy { BUSY_UTILIZATION_PCT } else { 0.0 };
            let wanted_power = idle + utilization / 100.0 * (max - idle);
            let capped = wanted_power > gpu.power_limit_w;
            let target_power = wanted_power.min(gpu.power_limit_w);
            gpu.power_w += (target_power - gpu.power_w) * power_step;
            gpu.energy_mj += gpu.power_w * dt * 1000.0;
            let slowdown = f64::from(model.slowdown_temp_c);
            if gpu.overheat {
                gpu.temperature_c = overheated_temperature(model, gpu.power_w);
            } else {
                let target = steady_temperature(model, gpu.power_w);
                gpu.temperature_c += (target - gpu.temperature_c) * thermal_step;
            }
            let load = utilization / 100.0;
            if model.nvlink {
                gpu.nvlink_kib += BUSY_NVLINK_KIB_S * load * dt;
            }

            sample.utilization_pct = utilization as f32;
            sample.memory_utilization_pct = (BUSY_MEMORY_UTILIZATION_PCT * load) as f32;
            sample.memory_used_mib = if gpu.busy {
                (model.memory_mib as f64 * BUSY_MEMORY_FRACTION) as u64
            } else {
                0
            };
            sample.temperature_c = gpu.temperature_c as f32;
            if model.hbm {
                sample.memory_temperature_c = (gpu.temperature_c + HBM_ABOVE_DIE_C) as f32;
            }
            sample.power_w = gpu.power_w as f32;
            sample.power_limit_w = gpu.power_limit_w as f32;
            sample.energy_mj = gpu.energy_mj as u64;
            let hot = gpu.temperature_c >= slowdown;
            sample.sm_clock_mhz = if !gpu.busy {
                models::IDLE_SM_CLOCK_MHZ
            } else {
                // Clocks scale with the power the cap leaves over idle; heat halves them.
                let cap = ((target_power - idle) / (wanted_power - idle)).clamp(0.0, 1.0);
                let clock = f64::from(model.max_sm_clock_mhz) * cap / if hot { 2.0 } else { 1.0 };
                (clock as u32).max(models::IDLE_SM_CLOCK_MHZ)
            };
            sample.memory_clock_mhz = if gpu.busy {
                model.memory_clock_mhz
            } else {
                models::IDLE_MEMORY_CLOCK_MHZ
            };
            sample.throttle_reasons = [
                (!gpu.busy, throttle::GPU_IDLE),
                (gpu.busy && capped, throttle::SW_POWER_CAP),
                (
                    gpu.busy && hot,
                    throttle::HW_SLOWDOWN | throttle::HW_THERMAL,
                ),
            ]
            .iter()
            .filter(|(on, _)| *on)
            .fold(0, |mask, (_, bit)| mask | bit);
            sample.pcie_rx_kib_s = (BUSY_PCIE_RX_KIB_S * load) as u32;
            sample.pcie_tx_kib_s = (BUSY_PCIE_TX_KIB_S * load) as u32;
            sample.nvlink_tx_kib = gpu.nvlink_kib as u64;
            sample.nvlink_rx_kib = gpu.nvlink_kib as u64;
            samples.push(sample);
        }
        samples
    }

    fn lock(&self) -> MutexGuard<'_, SimState> {
        // The state is plain numbers, consistent after any panic; keep going with it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl GpuBackend for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn devices(&self) -> Vec<GpuDevice> {
        self.devices.clone()
    }

    fn sample(&self) -> Vec<GpuSample> {
        let mut samples = self.sample_at(Instant::now());
        if self.nodes.iter().any(Option::is_some) {
            let held = sim_nodes::holders(&self.nodes);
            for (sample, pids) in samples.iter_mut().zip(held) {
                sample.processes = pids
                    .into_iter()
                    .map(|pid| GpuProcess { pid, used_mib: 0 })
                    .collect();
            }
        }
        samples
    }

    fn set_busy(&self, index: u32, busy: bool) {
        match self.lock().gpus.get_mut(index as usize) {
            Some(gpu) => gpu.busy = busy,
            None => tracing::warn!(gpu = index, busy, "set_busy for a GPU this node lacks"),
        }
    }

    fn set_power_limit(&self, index: u32, watts: u32) -> Result<(), GpuError> {
        let mut state = self.lock();
        let gpu = state.gpu_mut(index)?;
        let model = self.models[index as usize];
        let range = model.min_power_limit_w()..=model.max_power_w;
        if !range.contains(&watts) {
            return Err(GpuError::PowerLimitOutOfRange {
                index,
                watts,
                min: *range.start(),
                max: *range.end(),
            });
        }
        gpu.power_limit_w = f64::from(watts);
        tracing::info!(gpu = index, watts, "simulated power limit set");
        Ok(())
    }

    fn inject(&self, index: u32, fault: Fault) -> Result<(), GpuError> {
        let mut state = self.lock();
        let gpu = state.gpu_mut(index)?;
        match fault {
            Fault::Overheat => gpu.overheat = true,
            Fault::Xid(xid) => gpu.pending_xids.push(xid),
            Fault::EccError => gpu.ecc_double_bit += 1,
            Fault::Lost => {
                if !gpu.lost {
                    gpu.lost = true;
                    gpu.pending_xids.push(XID_FALLEN_OFF_BUS);
                }
            }
            Fault::Clear => {
                gpu.overheat = false;
                gpu.lost = false;
                gpu.pending_xids.clear();
                gpu.ecc_double_bit = 0;
            }
        }
        tracing::info!(gpu = index, ?fault, "simulated GPU fault injected");
        Ok(())
    }

    fn mig_devices(&self, index: u32) -> Result<Option<Vec<MigDevice>>, GpuError> {
        let mut state = self.lock();
        Ok(state.gpu_mut(index)?.mig.clone())
    }

    fn apply_mig(
        &self,
        index: u32,
        layout: Option<&[Instance]>,
    ) -> Result<Vec<MigDevice>, GpuError> {
        let model = self.models.get(index as usize).copied();
        let uuid = self
            .devices
            .get(index as usize)
            .map(|d| d.uuid.clone())
            .unwrap_or_default();
        let mut state = self.lock();
        state.gpu_mut(index)?;
        let Some(layout) = layout else {
            state.gpus[index as usize].mig = None;
            return Ok(Vec::new());
        };
        let rules =
            model
                .and_then(|m| mig::model(m.name))
                .ok_or_else(|| GpuError::BadMigLayout {
                    index,
                    reason: format!("{} is not MIG-capable", model.map_or("?", |m| m.name)),
                })?;
        rules
            .check(layout)
            .map_err(|reason| GpuError::BadMigLayout { index, reason })?;
        let old = state.gpus[index as usize].mig.take().unwrap_or_default();
        let mut devices = Vec::with_capacity(layout.len());
        for i in layout {
            match old
                .iter()
                .find(|d| d.start == i.start && d.profile == i.profile)
            {
                Some(kept) => devices.push(kept.clone()),
                None => {
                    state.mig_created += 1;
                    devices.push(MigDevice {
                        profile: i.profile.clone(),
                        start: i.start,
                        uuid: sim_mig_uuid(&uuid, state.mig_created),
                    });
                }
            }
        }
        state.gpus[index as usize].mig = Some(devices.clone());
        Ok(devices)
    }
}

/// A MIG UUID for the simulator, `MIG-` and a UUID derived from the parent GPU's UUID and a
/// creation counter (a re-created instance gets a new one, as on real GPUs).
fn sim_mig_uuid(gpu_uuid: &str, n: u64) -> String {
    let digest = sha2::Sha256::digest(format!("{gpu_uuid}/{n}").as_bytes());
    let h = |r: std::ops::Range<usize>| {
        digest[r]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    format!(
        "MIG-{}-{}-{}-{}-{}",
        h(0..4),
        h(4..6),
        h(6..8),
        h(8..10),
        h(10..16)
    )
}

/// Where the temperature settles at a constant power draw: linear in power, scaled per model
/// so that full load sits `FULL_LOAD_MARGIN_C` below the slowdown threshold.
/// The temperature of a GPU whose cooling failed: full power reaches `OVERHEAT_EXCESS_C` above
/// the slowdown threshold, and less power proportionally less (so a lower power limit cools it).
fn overheated_temperature(model: &GpuModel, power_w: f64) -> f64 {
    let full_load = f64::from(model.slowdown_temp_c) + OVERHEAT_EXCESS_C;
    AMBIENT_C + (full_load - AMBIENT_C) * power_w / f64::from(model.max_power_w)
}

fn steady_temperature(model: &GpuModel, power_w: f64) -> f64 {
    let full_load = f64::from(model.slowdown_temp_c) - FULL_LOAD_MARGIN_C;
    let per_watt = (full_load - AMBIENT_C) / f64::from(model.max_power_w);
    AMBIENT_C + per_watt * power_w
}

fn build_devices(models: &[&'static GpuModel], seed: u64) -> Vec<GpuDevice> {
    let count = models.len() as u32;
    // First half on NUMA node 0, second half on node 1, each half spread over its own range
    // of PCI buses (0x17.. and 0x97..), as on a two-socket server.
    let first_half = count.div_ceil(2);
    let bus_step = (0x68 / first_half.max(1)).clamp(1, 0x10);
    models
        .iter()
        .enumerate()
        .map(|(i, model)| {
            let index = i as u32;
            let (numa_node, slot) = if index < first_half {
                (0, index)
            } else {
                (1, index - first_half)
            };
            let bus = 0x17 + 0x80 * numa_node + slot * bus_step;
            let nvlink_peers = if model.nvlink {
                (0..count)
                    .filter(|&j| j != index && models[j as usize].name == model.name)
                    .collect()
            } else {
                Vec::new()
            };
            GpuDevice {
                index,
                uuid: sim_uuid(seed, index, model.name),
                model: model.name.to_owned(),
                gpu_type: model.gpu_type.to_owned(),
                memory_mib: model.memory_mib,
                pci_bus_id: format!("00000000:{bus:02X}:00.0"),
                numa_node: Some(numa_node),
                nvlink_peers,
                mig_capable: model.mig_capable,
                max_power_w: model.max_power_w,
                device_node: None,
            }
        })
        .collect()
}

/// `GPU-sim-` and 16 hex digits of a stable hash of (seed, index, model). Stable across Rust
/// versions and platforms, unlike `DefaultHasher`.
fn sim_uuid(seed: u64, index: u32, model: &str) -> String {
    let model_hash = model.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    // Chained, not XORed side by side: (seed 1, GPU 2) must differ from (seed 2, GPU 1).
    let node = splitmix64(splitmix64(seed) ^ model_hash);
    let hash = splitmix64(node ^ u64::from(index));
    format!("GPU-sim-{hash:016x}")
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use expect_test::{Expect, expect};

    use super::*;

    fn check_spec(spec: &str, expect: Expect) {
        let actual = match parse_spec(spec) {
            Ok(entries) => entries
                .iter()
                .map(|(m, n)| format!("{n}x{}", m.name))
                .collect::<Vec<_>>()
                .join(","),
            Err(e) => e.to_string(),
        };
        expect.assert_eq(&actual);
    }

    #[test]
    fn good_specs() {
        check_spec("4xA100-80GB,2xT4-16GB", expect!["4xA100-80GB,2xT4-16GB"]);
        check_spec("A100-80GB", expect!["1xA100-80GB"]);
        check_spec(
            " 2 x h100-80gb , L4-24GB ",
            expect!["2xH100-80GB,1xL4-24GB"],
        );
        check_spec("64xT4-16GB", expect!["64xT4-16GB"]);
        check_spec(
            "1xA100-40GB,1xH200-141GB,1xV100-32GB",
            expect!["1xA100-40GB,1xH200-141GB,1xV100-32GB"],
        );
    }

    #[test]
    fn bad_specs_name_the_bad_part() {
        check_spec(
            "",
            expect![[
                r#"invalid simulated GPU spec "": empty; expected e.g. "4xA100-80GB,2xT4-16GB" (known models: A100-40GB, A100-80GB, H100-80GB, H200-141GB, V100-32GB, T4-16GB, L4-24GB)"#
            ]],
        );
        check_spec(
            "4xA100-90GB",
            expect![[
                r#"invalid simulated GPU spec "4xA100-90GB": unknown GPU model "A100-90GB" (known models: A100-40GB, A100-80GB, H100-80GB, H200-141GB, V100-32GB, T4-16GB, L4-24GB)"#
            ]],
        );
        check_spec(
            "0xT4-16GB",
            expect![[
                r#"invalid simulated GPU spec "0xT4-16GB": count 0 in "0xT4-16GB"; remove the entry instead"#
            ]],
        );
        check_spec(
            "65xT4-16GB",
            expect![[
                r#"invalid simulated GPU spec "65xT4-16GB": count 65 in "65xT4-16GB" is more than 64 GPUs per node"#
            ]],
        );
        check_spec(
            "99999999999xT4-16GB",
            expect![[
                r#"invalid simulated GPU spec "99999999999xT4-16GB": count 99999999999 in "99999999999xT4-16GB" is more than 64 GPUs per node"#
            ]],
        );
        check_spec(
            "40xT4-16GB,40xL4-24GB",
            expect![[
                r#"invalid simulated GPU spec "40xT4-16GB,40xL4-24GB": 80 GPUs in all is more than 64 per node"#
            ]],
        );
        check_spec(
            "2xA100-80GB,,T4-16GB",
            expect![[r#"invalid simulated GPU spec "2xA100-80GB,,T4-16GB": entry 2 is empty"#]],
        );
        check_spec(
            "xT4-16GB",
            expect![[
                r#"invalid simulated GPU spec "xT4-16GB": unknown GPU model "xT4-16GB" (known models: A100-40GB, A100-80GB, H100-80GB, H200-141GB, V100-32GB, T4-16GB, L4-24GB)"#
            ]],
        );
    }

    #[test]
    fn a_process_holding_a_gpu_node_is_reported_on_that_gpu() {
        use std::os::unix::fs::OpenOptionsExt;
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var_os("GPUMESH_REQUIRE_ROOT").is_none(),
                "GPUMESH_REQUIRE_ROOT is set but this test is not root"
            );
            eprintln!("SKIPPED: mknod needs root, and this test is not root");
            return;
        }
        let tmp = tempfile::tempdir().expect("tempdir");
        let sim = SimBackend::from_spec("2xT4-16GB", 9)
            .expect("spec")
            .with_device_nodes(&tmp.path().join("dev"), 9);
        let node = sim.devices()[1]
            .device_node
            .clone()
            .expect("a node as root");
        assert_eq!(node.minor, sim_nodes::sim_minor(9, 1));
        let me = std::process::id();
        let holds =
            |samples: &[GpuSample], gpu: usize| samples[gpu].processes.iter().any(|p| p.pid == me);
        assert!(!holds(&sim.sample(), 1));
        // With no driver only an O_PATH descriptor can be held on the node.
        let held = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_PATH)
            .open(&node.path)
            .expect("O_PATH open");
        let samples = sim.sample();
        assert!(holds(&samples, 1), "{:?}", samples[1].processes);
        assert!(!holds(&samples, 0), "{:?}", samples[0].processes);
        drop(held);
        assert!(!holds(&sim.sample(), 1));
        // Without nodes nothing is scanned.
        let plain = SimBackend::from_spec("2xT4-16GB", 9).expect("spec");
        assert!(plain.devices().iter().all(|d| d.device_node.is_none()));
        assert!(plain.sample().iter().all(|s| s.processes.is_empty()));
    }

    #[test]
    fn devices_layout() {
        let sim = SimBackend::from_spec("4xA100-80GB,2xT4-16GB", 1).expect("valid spec");
        let devices = sim.devices();
        let summary: Vec<String> = devices
            .iter()
            .map(|d| {
                format!(
                    "{} {} {} {}MiB {} numa={:?} peers={:?} mig={} {}W",
                    d.index,
                    d.model,
                    d.gpu_type,
                    d.memory_mib,
                    d.pci_bus_id,
                    d.numa_node,
                    d.nvlink_peers,
                    d.mig_capable,
                    d.max_power_w
                )
            })
            .collect();
        expect![[r#"
            0 A100-80GB A100 81920MiB 00000000:17:00.0 numa=Some(0) peers=[1, 2, 3] mig=true 400W
            1 A100-80GB A100 81920MiB 00000000:27:00.0 numa=Some(0) peers=[0, 2, 3] mig=true 400W
            2 A100-80GB A100 81920MiB 00000000:37:00.0 numa=Some(0) peers=[0, 1, 3] mig=true 400W
            3 A100-80GB A100 81920MiB 00000000:97:00.0 numa=Some(1) peers=[0, 1, 2] mig=true 400W
            4 T4-16GB T4 15360MiB 00000000:A7:00.0 numa=Some(1) peers=[] mig=false 70W
            5 T4-16GB T4 15360MiB 00000000:B7:00.0 numa=Some(1) peers=[] mig=false 70W
        "#]]
        .assert_eq(&(summary.join("\n") + "\n"));
    }

    #[test]
    fn uuids_are_deterministic_and_distinct_across_nodes() {
        let uuids = |seed| -> Vec<String> {
            SimBackend::from_spec("8xH100-80GB", seed)
                .expect("valid spec")
                .devices()
                .into_iter()
                .map(|d| d.uuid)
                .collect()
        };
        let (a, a_again, b) = (uuids(1), uuids(1), uuids(2));
        assert_eq!(a, a_again);
        let mut all: Vec<&String> = a.iter().chain(&b).collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 16, "{a:?} {b:?}");
        assert!(
            a.iter().all(|u| u.starts_with("GPU-sim-") && u.len() == 24),
            "{a:?}"
        );
        expect!["GPU-sim-26433b0cf262f51b"].assert_eq(&a[0]);
    }

    #[test]
    fn busy_gpu_warms_up_and_draws_more_power_than_idle() {
        let sim = SimBackend::from_spec("2xA100-80GB", 1).expect("valid spec");
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let start = sim.sample_at(t0);
        sim.set_busy(0, true);

        let after_10s = sim.sample_at(at(10));
        let (busy, idle) = (&after_10s[0], &after_10s[1]);
        assert_eq!(busy.utilization_pct, 95.0);
        assert_eq!(idle.utilization_pct, 0.0);
        assert!(busy.power_w > 350.0, "{busy:?}");
        assert!((idle.power_w - 60.0).abs() < 0.01, "{idle:?}");
        assert!(
            busy.temperature_c > start[0].temperature_c + 10.0,
            "{busy:?}"
        );
        assert!(busy.temperature_c < 74.0, "still lagging behind: {busy:?}");
        assert_eq!(busy.sm_clock_mhz, 1410);
        assert_eq!(idle.sm_clock_mhz, models::IDLE_SM_CLOCK_MHZ);
        assert_eq!(busy.memory_used_mib, 65_536);
        assert_eq!(idle.memory_used_mib, 0);

        // Ten time constants later it has settled just under 74 °C (89 - 15 at 400 W).
        let settled = sim.sample_at(at(210));
        assert!(
            (70.0..74.0).contains(&settled[0].temperature_c),
            "{:?}",
            settled[0]
        );
        assert!((start[1].temperature_c - settled[1].temperature_c).abs() < 0.01);

        // Idle again: power drops at once, temperature follows within a minute or two.
        sim.set_busy(0, false);
        let cooled = sim.sample_at(at(330));
        assert!(cooled[0].power_w < 61.0, "{:?}", cooled[0]);
        assert!(
            cooled[0].temperature_c < start[0].temperature_c + 1.0,
            "{:?}",
            cooled[0]
        );

        // Time never runs backwards.
        let again = sim.sample_at(at(100));
        assert_eq!(again[0].temperature_c, cooled[0].temperature_c);
    }

    #[test]
    fn faults_show_in_samples_until_cleared() {
        let sim = SimBackend::from_spec("2xH100-80GB", 1).expect("valid spec");
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        sim.set_busy(0, true);

        sim.inject(0, Fault::Overheat).expect("GPU 0 exists");
        sim.inject(0, Fault::Xid(48)).expect("GPU 0 exists");
        sim.inject(0, Fault::EccError).expect("GPU 0 exists");
        sim.inject(0, Fault::EccError).expect("GPU 0 exists");
        let s = sim.sample_at(at(1));
        assert_eq!(s[0].xid_events, vec![48]);
        assert_eq!(s[0].ecc_double_bit, 2);
        assert!(s[0].healthy);
        assert_eq!(s[1].xid_events, Vec::<u32>::new());
        assert_eq!(s[1].ecc_double_bit, 0);
        // Once the power has ramped up, the failed cooling takes it past the slowdown threshold.
        let s = sim.sample_at(at(30));
        assert!((89.0..94.0).contains(&s[0].temperature_c), "{:?}", s[0]);
        assert_eq!(s[0].sm_clock_mhz, 990, "hardware slowdown halves the clock");
        assert_eq!(
            throttle::names(s[0].throttle_reasons),
            ["hw_slowdown", "hw_thermal"]
        );
        let s = sim.sample_at(at(31));
        assert_eq!(
            s[0].xid_events,
            Vec::<u32>::new(),
            "an XID is reported once"
        );
        assert_eq!(s[0].ecc_double_bit, 2, "the ECC count stays");

        sim.inject(1, Fault::Lost).expect("GPU 1 exists");
        let s = sim.sample_at(at(33));
        assert!(!s[1].healthy);
        assert_eq!(s[1].error.as_deref(), Some("GPU is lost (simulated fault)"));
        assert_eq!(s[1].xid_events, vec![79]);
        assert_eq!((s[1].power_w, s[1].temperature_c), (0.0, 0.0));
        assert!(s[0].healthy, "a lost GPU does not hide the others");

        sim.inject(0, Fault::Clear).expect("GPU 0 exists");
        sim.inject(1, Fault::Clear).expect("GPU 1 exists");
        let s = sim.sample_at(at(90));
        assert!(s[1].healthy && s[1].error.is_none(), "{:?}", s[1]);
        assert_eq!(s[0].ecc_double_bit, 0);
        assert!(
            s[0].temperature_c < 89.0,
            "cools after the clear: {:?}",
            s[0]
        );
        assert_eq!(s[0].sm_clock_mhz, 1980);

        let err = sim.inject(2, Fault::Lost).expect_err("only 2 GPUs");
        assert_eq!(err.to_string(), "no GPU with index 2 (this node has 2)");
    }

    #[test]
    fn a_lower_power_limit_caps_power_and_clocks_and_cools_an_overheated_gpu() {
        let sim = SimBackend::from_spec("1xA100-80GB", 1).expect("valid spec");
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        sim.set_busy(0, true);
        sim.inject(0, Fault::Overheat).expect("GPU 0 exists");
        let hot = &sim.sample_at(at(30))[0];
        assert!(hot.temperature_c >= 89.0, "{hot:?}");

        let err = sim
            .set_power_limit(0, 50)
            .expect_err("below the board's minimum");
        assert_eq!(
            err.to_string(),
            "power limit 50 W for GPU 0 is outside its range 133..=400 W"
        );
        sim.set_power_limit(0, 200).expect("in range");
        let capped = &sim.sample_at(at(60))[0];
        assert!((capped.power_w - 200.0).abs() < 0.5, "{capped:?}");
        assert_eq!(capped.power_limit_w, 200.0);
        assert!(
            capped.temperature_c < 70.0,
            "cooler at half power: {capped:?}"
        );
        assert!(
            capped.sm_clock_mhz < 1410 / 2,
            "clocks follow the cap: {capped:?}"
        );
        assert_eq!(throttle::names(capped.throttle_reasons), ["sw_power_cap"]);
        assert!(capped.energy_mj > hot.energy_mj);
        assert_eq!(
            sim.set_power_limit(1, 200)
                .expect_err("one GPU")
                .to_string(),
            "no GPU with index 1 (this node has 1)"
        );
    }

    #[test]
    fn mig_layouts_follow_the_model_rules_and_keep_instances_in_place() {
        let sim = SimBackend::from_spec("1xA100-80GB,1xT4-16GB", 1).expect("spec");
        let l = |items: &[(&str, u8)]| -> Vec<Instance> {
            items
                .iter()
                .map(|(p, s)| Instance {
                    profile: (*p).into(),
                    start: *s,
                })
                .collect()
        };
        assert_eq!(sim.mig_devices(0).expect("read"), None, "MIG starts off");
        let first = sim
            .apply_mig(0, Some(&l(&[("3g.40gb", 0), ("3g.40gb", 4)])))
            .expect("valid layout");
        assert_eq!(first.len(), 2);
        assert!(first.iter().all(|d| d.uuid.starts_with("MIG-")));
        assert_ne!(first[0].uuid, first[1].uuid);
        // Keeping 3g@0 keeps its UUID; the new instances get new ones.
        let second = sim
            .apply_mig(
                0,
                Some(&l(&[("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)])),
            )
            .expect("valid layout");
        assert_eq!(second[0].uuid, first[0].uuid);
        assert!(second[1..].iter().all(|d| d.uuid != first[1].uuid));
        assert_eq!(sim.mig_devices(0).expect("read"), Some(second));
        let bad = sim.apply_mig(0, Some(&l(&[("4g.40gb", 0), ("2g.20gb", 2)])));
        assert!(matches!(bad, Err(GpuError::BadMigLayout { .. })), "{bad:?}");
        let t4 = sim.apply_mig(1, Some(&l(&[("1g.10gb", 0)])));
        assert!(matches!(t4, Err(GpuError::BadMigLayout { .. })), "{t4:?}");
        sim.apply_mig(0, None).expect("MIG off");
        assert_eq!(sim.mig_devices(0).expect("read"), None);
    }
}
