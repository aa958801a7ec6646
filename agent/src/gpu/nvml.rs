//! The real GPU backend, on NVML (`libnvidia-ml.so.1`, loaded at run time, so the agent builds
//! and runs on hosts without a driver). Devices are enumerated once at open; each sample reads
//! every GPU afresh, and a GPU that fails to read never hides the others.

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, P2pCapabilitiesIndex, P2pStatus, PcieUtilCounter,
    RetirementCause, TemperatureSensor,
};
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::PciInfo;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id as fi;
use tracing::{error, info, warn};

use super::models;
use super::{DeviceNode, Fault, GpuBackend, GpuDevice, GpuError, GpuProcess, GpuSample};

/// The NVML library as the driver installs it.
pub(crate) const NVML_LIBRARY: &str = "libnvidia-ml.so.1";
/// `NVML_NVLINK_MAX_LINKS` in nvml.h (18 since Hopper); the walk stops at the first link the
/// device does not have.
const NVLINK_MAX_LINKS: u32 = 18;
const MIB: u64 = 1024 * 1024;

/// The fields read in one `nvmlDeviceGetFieldValues` call per sample.
const FIELDS: [u32; 9] = [
    fi::NVML_FI_DEV_MEMORY_TEMP,
    fi::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    fi::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
    fi::NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
    fi::NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    fi::NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
    fi::NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
    fi::NVML_FI_DEV_REMAPPED_COR,
    fi::NVML_FI_DEV_REMAPPED_UNC,
];
/// How long the XID watcher blocks in one `nvmlEventSetWait` (and so how long it may take to
/// notice that the backend is gone).
const XID_WAIT_MS: u32 = 500;

pub struct NvmlBackend {
    nvml: Arc<Nvml>,
    devices: Vec<GpuDevice>,
    /// XIDs the watcher thread saw since the last sample, by GPU index.
    xids: Arc<Mutex<HashMap<u32, Vec<u32>>>>,
    /// Tells the watcher thread to end (set on drop).
    stop: Arc<AtomicBool>,
}

impl Drop for NvmlBackend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl NvmlBackend {
    /// Loads the driver's NVML and enumerates the GPUs.
    pub fn open() -> Result<Self, GpuError> {
        Self::open_library(OsStr::new(NVML_LIBRARY))
    }

    /// As `open`, with the NVML library at `library` (a file name or a path).
    pub fn open_library(library: &OsStr) -> Result<Self, GpuError> {
        let nvml = Nvml::builder()
            .lib_path(library)
            .init()
            .map_err(|e| init_error(library, e))?;
        let devices = enumerate(&nvml)?;
        let backend = Self {
            nvml: Arc::new(nvml),
            devices,
            xids: Arc::default(),
            stop: Arc::default(),
        };
        let (nvml, xids, stop) = (
            backend.nvml.clone(),
            backend.xids.clone(),
            backend.stop.clone(),
        );
        std::thread::Builder::new()
            .name("nvml-xid".to_owned())
            .spawn(move || watch_xids(&nvml, &xids, &stop))
            .map_err(|e| GpuError::Nvml(format!("starting the XID watcher: {e}")))?;
        Ok(backend)
    }

    fn sample_one(&self, index: u32) -> GpuSample {
        let mut sample = GpuSample::empty(index);
        let mut read = Reader::default();
        if let Some(device) = read.get("device handle", || self.nvml.device_by_index(index)) {
            if let Some(u) = read.get("utilization", || device.utilization_rates()) {
                sample.utilization_pct = u.gpu as f32;
            }
            if let Some(u) = read.get("utilization", || device.utilization_rates()) {
                sample.memory_utilization_pct = u.memory as f32;
            }
            if let Some(m) = read.get("memory", || device.memory_info()) {
                sample.memory_used_mib = m.used / MIB;
            }
            if let Some(t) = read.get("temperature", || device.temperature(TemperatureSensor::Gpu))
            {
                sample.temperature_c = t as f32;
            }
            if let Some(mw) = read.get("power usage", || device.power_usage()) {
                sample.power_w = mw as f32 / 1000.0;
            }
            if let Some(mw) = read.get("power limit", || device.enforced_power_limit()) {
                sample.power_limit_w = mw as f32 / 1000.0;
            }
            if let Some(mhz) = read.get("SM clock", || device.clock_info(Clock::SM)) {
                sample.sm_clock_mhz = mhz;
            }
            if let Some(mhz) = read.get("memory clock", || device.clock_info(Clock::Memory)) {
                sample.memory_clock_mhz = mhz;
            }
            if let Some(mj) = read.get("energy", || device.total_energy_consumption()) {
                sample.energy_mj = mj;
            }
            if let Some(r) = read.get("throttle reasons", || device.current_throttle_reasons()) {
                sample.throttle_reasons = r.bits();
            }
            if let Some(kib) = read.get("PCIe TX", || device.pcie_throughput(PcieUtilCounter::Send))
            {
                sample.pcie_tx_kib_s = kib;
            }
            if let Some(kib) = read.get("PCIe RX", || {
                device.pcie_throughput(PcieUtilCounter::Receive)
            }) {
                sample.pcie_rx_kib_s = kib;
            }
            if let Some(n) = read.get("PCIe replays", || device.pcie_replay_counter()) {
                sample.pcie_replays = u64::from(n);
            }
            if let Some(n) = read.get("ECC errors", || {
                device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            }) {
                sample.ecc_double_bit = n;
            }
            if let Some(n) = read.get("corrected ECC errors", || {
                device.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
            }) {
                sample.ecc_single_bit = n;
            }
            for cause in [
                RetirementCause::MultipleSingleBitEccErrors,
                RetirementCause::DoubleBitEccError,
            ] {
                if let Some(pages) = read.get("retired pages", || device.retired_pages(cause)) {
                    sample.retired_pages += pages.len() as u64;
                }
            }
            if let Some(processes) = read.get("processes", || device.running_compute_processes()) {
                sample.processes = processes
                    .into_iter()
                    .map(|p| GpuProcess {
                        pid: p.pid,
                        used_mib: match p.used_gpu_memory {
                            UsedGpuMemory::Used(bytes) => bytes / MIB,
                            UsedGpuMemory::Unavailable => 0,
                        },
                    })
                    .collect();
            }
            let ids: Vec<FieldId> = FIELDS.iter().map(|&id| FieldId(id)).collect();
            if let Some(values) = read.get("field values", || device.field_values_for(&ids)) {
                for value in values.into_iter().flatten() {
                    let Ok(v) = value.value else { continue };
                    let n = match v {
                        SampleValue::U32(n) => u64::from(n),
                        SampleValue::U64(n) => n,
                        SampleValue::I64(n) => n.max(0) as u64,
                        SampleValue::F64(n) => n.max(0.0) as u64,
                    };
                    match value.field.0 {
                        fi::NVML_FI_DEV_MEMORY_TEMP => sample.memory_temperature_c = n as f32,
                        fi::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX => sample.nvlink_tx_kib = n,
                        fi::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX => sample.nvlink_rx_kib = n,
                        fi::NVML_FI_DEV_REMAPPED_COR | fi::NVML_FI_DEV_REMAPPED_UNC => {
                            sample.retired_pages += n
                        }
                        _ => sample.nvlink_errors += n,
                    }
                }
            }
        }
        sample.memory_total_mib = self
            .devices
            .iter()
            .find(|d| d.index == index)
            .map_or(0, |d| d.memory_mib);
        sample.xid_events = self
            .xids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&index)
            .unwrap_or_default();
        sample.healthy = !read.lost;
        if !read.errors.is_empty() {
            sample.error = Some(read.errors.join("; "));
        }
        sample
    }
}

impl GpuBackend for NvmlBackend {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn devices(&self) -> Vec<GpuDevice> {
        self.devices.clone()
    }

    fn sample(&self) -> Vec<GpuSample> {
        self.devices
            .iter()
            .map(|d| self.sample_one(d.index))
            .collect()
    }

    fn set_busy(&self, _index: u32, _busy: bool) {
        // Real GPUs are loaded by real jobs.
    }

    fn set_power_limit(&self, index: u32, watts: u32) -> Result<(), GpuError> {
        let nvml_error = |e: NvmlError| GpuError::Nvml(format!("GPU {index}: {e}"));
        let mut device = self.nvml.device_by_index(index).map_err(nvml_error)?;
        let range = device
            .power_management_limit_constraints()
            .map_err(nvml_error)?;
        let (min, max) = (range.min_limit / 1000, range.max_limit / 1000);
        if !(min..=max).contains(&watts) {
            return Err(GpuError::PowerLimitOutOfRange {
                index,
                watts,
                min,
                max,
            });
        }
        device
            .set_power_management_limit(watts * 1000)
            .map_err(nvml_error)?;
        info!(gpu = index, watts, "power limit set");
        Ok(())
    }

    fn inject(&self, _index: u32, _fault: Fault) -> Result<(), GpuError> {
        Err(GpuError::Unsupported {
            backend: "nvml",
            what: "inject faults",
        })
    }

    fn mig_devices(&self, index: u32) -> Result<Option<Vec<super::MigDevice>>, GpuError> {
        let model = self.model_of(index)?;
        super::nvml_mig::devices(&self.nvml, index, &model)
    }

    fn apply_mig(
        &self,
        index: u32,
        layout: Option<&[gpu_raft_store::mig::Instance]>,
    ) -> Result<Vec<super::MigDevice>, GpuError> {
        let model = self.model_of(index)?;
        super::nvml_mig::apply(&self.nvml, index, &model, layout)
    }
}

impl NvmlBackend {
    fn model_of(&self, index: u32) -> Result<String, GpuError> {
        self.devices
            .iter()
            .find(|d| d.index == index)
            .map(|d| d.model.clone())
            .ok_or(GpuError::NoSuchGpu {
                index,
                count: self.devices.len(),
            })
    }
}

/// The XID watcher thread: waits on one NVML event set for critical XID errors of every GPU and
/// queues them for the next sample, until `stop`. A failure is logged once; the watcher then
/// keeps trying at a slower pace.
fn watch_xids(nvml: &Nvml, xids: &Mutex<HashMap<u32, Vec<u32>>>, stop: &AtomicBool) {
    let registered = nvml
        .create_event_set()
        .map_err(|e| e.to_string())
        .and_then(|mut set| {
            for index in 0..nvml.device_count().map_err(|e| e.to_string())? {
                let device = nvml.device_by_index(index).map_err(|e| e.to_string())?;
                set = device
                    .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                    .map_err(|e| e.error.to_string())?;
            }
            Ok(set)
        });
    let set = match registered {
        Ok(set) => set,
        Err(e) => {
            warn!(error = %e, "cannot watch XID errors; samples will show none");
            return;
        }
    };
    let mut complained = false;
    while !stop.load(Ordering::Relaxed) {
        match set.wait(XID_WAIT_MS) {
            Ok(event) => {
                let xid = match event.event_data {
                    Some(XidError::Value(xid)) => u32::try_from(xid).unwrap_or(u32::MAX),
                    _ => continue,
                };
                let Ok(index) = event.device.index() else {
                    continue;
                };
                warn!(gpu = index, xid, "XID error");
                xids.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry(index)
                    .or_default()
                    .push(xid);
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => {
                if !complained {
                    warn!(error = %e, "waiting for XID events failed; retrying");
                    complained = true;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

/// Collects the failures of one GPU's reads. `NotSupported` is no failure (the field keeps its
/// zero); after `GpuLost` nothing more is read.
#[derive(Default)]
struct Reader {
    errors: Vec<String>,
    lost: bool,
}

impl Reader {
    fn get<T>(&mut self, what: &str, read: impl FnOnce() -> Result<T, NvmlError>) -> Option<T> {
        if self.lost {
            return None;
        }
        match read() {
            Ok(value) => Some(value),
            Err(NvmlError::NotSupported) => None,
            Err(NvmlError::GpuLost) => {
                self.lost = true;
                self.errors
                    .push(format!("{what}: GPU is lost (fallen off the bus)"));
                None
            }
            Err(e) => {
                self.errors.push(format!("{what}: {e}"));
                None
            }
        }
    }
}

/// A failure to start NVML: no usable driver (`DriverUnavailable`, which `BackendKind::Auto`
/// answers with the simulator) or a driver that refuses us (`Nvml`).
fn init_error(library: &OsStr, e: NvmlError) -> GpuError {
    let library = library.to_string_lossy();
    match e {
        NvmlError::LibloadingError(e) => {
            GpuError::DriverUnavailable(format!("{library} could not be loaded: {e}"))
        }
        NvmlError::FailedToLoadSymbol(symbol) => GpuError::DriverUnavailable(format!(
            "{library} lacks {symbol}; the NVIDIA driver is too old"
        )),
        NvmlError::DriverNotLoaded => GpuError::DriverUnavailable(format!(
            "{library} loaded, but the NVIDIA kernel driver is not running"
        )),
        NvmlError::LibraryNotFound => GpuError::DriverUnavailable(format!(
            "{library} loaded, but NVML could not find its driver libraries"
        )),
        e => GpuError::Nvml(format!("initialising NVML from {library}: {e}")),
    }
}

/// Bus address key used to match NVLink remotes to local GPUs.
type PciKey = (u32, u32, u32);

fn pci_key(pci: &PciInfo) -> PciKey {
    (pci.domain, pci.bus, pci.device)
}

fn enumerate(nvml: &Nvml) -> Result<Vec<GpuDevice>, GpuError> {
    let count = nvml
        .device_count()
        .map_err(|e| GpuError::Nvml(format!("counting GPUs: {e}")))?;
    let mut devices = Vec::new();
    let mut keys = Vec::new();
    for index in 0..count {
        match describe(nvml, index) {
            Ok((device, key)) => {
                devices.push(device);
                keys.push(key);
            }
            // One broken GPU must not keep the node's healthy ones from being used.
            Err(e) => error!(gpu = index, error = %e, "GPU cannot be read; leaving it out"),
        }
    }
    link_peers(nvml, &mut devices, &keys);
    Ok(devices)
}

/// Everything but the NVLink peers.
fn describe(nvml: &Nvml, index: u32) -> Result<(GpuDevice, PciKey), NvmlError> {
    let device = nvml.device_by_index(index)?;
    let uuid = device.uuid()?;
    let name = device.name()?;
    let memory_mib = device.memory_info()?.total / MIB;
    let pci = device.pci_info()?;
    let gpu_type = gpu_type_from_name(&name);
    let known = models::match_real(&gpu_type, memory_mib);
    let numa_node = device
        .numa_node_id()
        .ok()
        .or_else(|| numa_node_from_sysfs(&pci));
    let mig_capable = match device.mig_mode() {
        Ok(mode) => {
            info!(
                gpu = index,
                mig_enabled = mode.current == 1,
                "GPU is MIG capable"
            );
            true
        }
        Err(_) => false,
    };
    let max_power_w = device
        .power_management_limit_default()
        .or_else(|_| device.enforced_power_limit())
        .map(|mw| mw / 1000)
        .unwrap_or_else(|_| known.map_or(0, |m| m.max_power_w));
    let gpu = GpuDevice {
        index,
        uuid,
        model: known.map_or(name, |m| m.name.to_owned()),
        gpu_type,
        memory_mib,
        pci_bus_id: format_bus_id(&pci),
        numa_node,
        nvlink_peers: Vec::new(),
        mig_capable,
        max_power_w,
        // The driver names each GPU's node after its minor number, not its index.
        device_node: match device.minor_number() {
            Ok(minor) => Some(DeviceNode::nvidia(minor)),
            Err(e) => {
                warn!(gpu = index, error = %e, "cannot read the GPU's device minor: it cannot be fenced");
                None
            }
        },
    };
    Ok((gpu, pci_key(&pci)))
}

/// Fills `nvlink_peers`. A GPU's active links either end at another local GPU (a direct peer)
/// or, on HGX boards, at an NVSwitch; GPUs that both reach the switch fabric are peers unless
/// NVML's P2P status says otherwise. Links NVML cannot read count as absent.
fn link_peers(nvml: &Nvml, devices: &mut [GpuDevice], keys: &[PciKey]) {
    let local: HashMap<PciKey, usize> = keys.iter().enumerate().map(|(i, k)| (*k, i)).collect();
    let mut peers = vec![BTreeSet::new(); devices.len()];
    let mut on_fabric = vec![false; devices.len()];
    for (slot, gpu) in devices.iter().enumerate() {
        let Ok(device) = nvml.device_by_index(gpu.index) else {
            continue;
        };
        for link in 0..NVLINK_MAX_LINKS {
            let link = device.link_wrapper_for(link);
            match link.is_active() {
                Ok(true) => {}
                Ok(false) => continue,
                // NotSupported (no NVLink) or InvalidArg (past the device's last link).
                Err(_) => break,
            }
            match link.remote_pci_info().map(|pci| local.get(&pci_key(&pci))) {
                Ok(Some(&other)) if other != slot => {
                    peers[slot].insert(other);
                }
                Ok(Some(_)) => {}
                Ok(None) => on_fabric[slot] = true,
                Err(_) => {}
            }
        }
    }
    for a in 0..devices.len() {
        for b in a + 1..devices.len() {
            if on_fabric[a] && on_fabric[b] && p2p_over_nvlink(nvml, &devices[a], &devices[b]) {
                peers[a].insert(b);
                peers[b].insert(a);
            }
        }
    }
    for slot in 0..devices.len() {
        let mine: Vec<usize> = peers[slot].iter().copied().collect();
        for other in mine {
            peers[other].insert(slot);
        }
    }
    for (gpu, peers) in devices.iter_mut().zip(&peers) {
        gpu.nvlink_peers = peers.iter().map(|&slot| slot as u32).collect();
    }
    // Slots and indexes differ only when a GPU was left out; map slots back to indexes.
    let index_of: Vec<u32> = devices.iter().map(|d| d.index).collect();
    for gpu in devices.iter_mut() {
        for peer in &mut gpu.nvlink_peers {
            *peer = index_of[*peer as usize];
        }
    }
}

/// NVML's verdict on P2P over NVLink; when it cannot say, trust the switch fabric.
fn p2p_over_nvlink(nvml: &Nvml, a: &GpuDevice, b: &GpuDevice) -> bool {
    let (Ok(da), Ok(db)) = (nvml.device_by_index(a.index), nvml.device_by_index(b.index)) else {
        return false;
    };
    match da.p2p_status(&db, P2pCapabilitiesIndex::NvLink) {
        Ok(status) => status == P2pStatus::Ok,
        Err(_) => true,
    }
}

/// `DDDDDDDD:BB:DD.0` as `nvidia-smi` prints it (GPUs are function 0).
fn format_bus_id(pci: &PciInfo) -> String {
    format!("{:08X}:{:02X}:{:02X}.0", pci.domain, pci.bus, pci.device)
}

/// The kernel's idea of the device's NUMA node, for drivers without `nvmlDeviceGetNumaNodeId`.
fn numa_node_from_sysfs(pci: &PciInfo) -> Option<u32> {
    let path = format!(
        "/sys/bus/pci/devices/{:04x}:{:02x}:{:02x}.0/numa_node",
        pci.domain, pci.bus, pci.device
    );
    // "-1" means the platform does not say; it fails the parse and gives `None`.
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The family label from NVML's product name: `NVIDIA A100-SXM4-80GB` → `A100`,
/// `Tesla T4` → `T4`, `NVIDIA GeForce RTX 4090` → `RTX4090`.
pub(crate) fn gpu_type_from_name(name: &str) -> String {
    let mut tokens = name
        .split(|c: char| c.is_whitespace() || c == '-')
        .filter(|t| !t.is_empty())
        .filter(|t| !matches!(*t, "NVIDIA" | "Tesla" | "GeForce" | "Quadro"));
    match (tokens.next(), tokens.next()) {
        (Some(series @ ("RTX" | "GTX")), Some(number)) => format!("{series}{number}"),
        (Some(first), _) => first.to_owned(),
        (None, _) => name.trim().to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_driver_unavailable() {
        let missing = OsStr::new("/nonexistent/libnvidia-ml.so.1");
        let err = NvmlBackend::open_library(missing)
            .err()
            .expect("no library at that path");
        let GpuError::DriverUnavailable(why) = &err else {
            panic!("expected DriverUnavailable, got {err:?}");
        };
        assert!(
            why.starts_with("/nonexistent/libnvidia-ml.so.1 could not be loaded: "),
            "{why}"
        );
        assert!(why.contains("No such file or directory"), "{why}");
        assert!(err.to_string().contains("use --gpu-backend sim"), "{err}");
    }

    #[test]
    fn gpu_types_from_product_names() {
        for (name, gpu_type) in [
            ("NVIDIA A100-SXM4-80GB", "A100"),
            ("NVIDIA A100-PCIE-40GB", "A100"),
            ("NVIDIA H100 80GB HBM3", "H100"),
            ("NVIDIA H100 NVL", "H100"),
            ("NVIDIA H200", "H200"),
            ("Tesla V100-SXM2-32GB", "V100"),
            ("Tesla T4", "T4"),
            ("NVIDIA L4", "L4"),
            ("NVIDIA GeForce RTX 4090", "RTX4090"),
            ("NVIDIA RTX A6000", "RTXA6000"),
            ("NVIDIA", "NVIDIA"),
        ] {
            assert_eq!(gpu_type_from_name(name), gpu_type, "{name}");
        }
    }

    #[test]
    fn bus_ids_print_like_nvidia_smi() {
        let pci = PciInfo {
            bus: 0xb7,
            bus_id: "00000000:B7:00.0".to_owned(),
            device: 0,
            domain: 0,
            pci_device_id: 0x20b2_10de,
            pci_sub_system_id: None,
        };
        assert_eq!(format_bus_id(&pci), "00000000:B7:00.0");
    }
}
