//! The GPU models the simulator can impersonate, with the figures that drive its power and
//! thermal model; also used to give real GPUs the same model names as simulated ones.
//!
//! Sources: memory, TDP and max SM clock are vendor datasheet / `nvidia-smi -q` values (A100
//! 1410 MHz at 400 W and H100 1980 MHz seen in `nvidia-smi -q` output; T4 1590 MHz in its
//! supported-clocks list). Idle power and the slowdown temperature are *approximate*: typical
//! `nvidia-smi -q` readings ("GPU Slowdown Temp") that vary with VBIOS and cooling. The simulator
//! only needs them to be plausible; nothing outside it relies on them.

/// One GPU product as the simulator models it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct GpuModel {
    /// The spec name, e.g. `A100-80GB`; also reported as `GpuDevice::model`.
    pub name: &'static str,
    /// The family label used for scheduling, e.g. `A100`.
    pub gpu_type: &'static str,
    pub memory_mib: u64,
    /// Board power limit (TDP) in watts.
    pub max_power_w: u32,
    pub idle_power_w: u32,
    pub max_sm_clock_mhz: u32,
    /// Memory clock under load.
    pub memory_clock_mhz: u32,
    /// HBM parts report a memory temperature; GDDR boards do not.
    pub hbm: bool,
    pub mig_capable: bool,
    /// SXM parts: every GPU of this model on a node is an NVLink (NVSwitch) peer of the others.
    pub nvlink: bool,
    /// Hardware slowdown threshold ("GPU Slowdown Temp").
    pub slowdown_temp_c: u32,
}

/// SM clock an idle GPU drops to (P8), for every model.
pub(crate) const IDLE_SM_CLOCK_MHZ: u32 = 210;
/// Memory clock of an idle GPU (P8), for every model.
pub(crate) const IDLE_MEMORY_CLOCK_MHZ: u32 = 405;

impl GpuModel {
    /// The lowest power limit the board accepts: NVIDIA boards allow about a third of TDP.
    pub(crate) fn min_power_limit_w(&self) -> u32 {
        (self.max_power_w / 3).max(self.idle_power_w + 1)
    }
}

/// The known models, in the order they are listed in error messages.
pub(crate) const MODELS: &[GpuModel] = &[
    // A100 SXM4 40 GB.
    GpuModel {
        name: "A100-40GB",
        gpu_type: "A100",
        memory_mib: 40_960,
        max_power_w: 400,
        idle_power_w: 55,
        max_sm_clock_mhz: 1410,
        memory_clock_mhz: 1215,
        hbm: true,
        mig_capable: true,
        nvlink: true,
        slowdown_temp_c: 89,
    },
    // A100 SXM4 80 GB.
    GpuModel {
        name: "A100-80GB",
        gpu_type: "A100",
        memory_mib: 81_920,
        max_power_w: 400,
        idle_power_w: 60,
        max_sm_clock_mhz: 1410,
        memory_clock_mhz: 1593,
        hbm: true,
        mig_capable: true,
        nvlink: true,
        slowdown_temp_c: 89,
    },
    // H100 SXM5 80 GB (the driver reports 81559 MiB; the simulator uses the nominal 80 GiB).
    GpuModel {
        name: "H100-80GB",
        gpu_type: "H100",
        memory_mib: 81_920,
        max_power_w: 700,
        idle_power_w: 70,
        max_sm_clock_mhz: 1980,
        memory_clock_mhz: 2619,
        hbm: true,
        mig_capable: true,
        nvlink: true,
        slowdown_temp_c: 89,
    },
    // H200 SXM 141 GB.
    GpuModel {
        name: "H200-141GB",
        gpu_type: "H200",
        memory_mib: 144_384,
        max_power_w: 700,
        idle_power_w: 75,
        max_sm_clock_mhz: 1980,
        memory_clock_mhz: 3201,
        hbm: true,
        mig_capable: true,
        nvlink: true,
        slowdown_temp_c: 89,
    },
    // V100 32 GB, modelled as a PCIe card (no NVLink). Note: 300 W is the SXM2 board's TDP; the
    // PCIe card is 250 W. Kept at 300 W as specified for the simulator.
    GpuModel {
        name: "V100-32GB",
        gpu_type: "V100",
        memory_mib: 32_768,
        max_power_w: 300,
        idle_power_w: 40,
        max_sm_clock_mhz: 1530,
        memory_clock_mhz: 877,
        hbm: true,
        mig_capable: false,
        nvlink: false,
        slowdown_temp_c: 87,
    },
    // T4 16 GB, PCIe, 70 W.
    GpuModel {
        name: "T4-16GB",
        gpu_type: "T4",
        memory_mib: 15_360,
        max_power_w: 70,
        idle_power_w: 10,
        max_sm_clock_mhz: 1590,
        memory_clock_mhz: 5001,
        hbm: false,
        mig_capable: false,
        nvlink: false,
        slowdown_temp_c: 93,
    },
    // L4 24 GB, PCIe, 72 W.
    GpuModel {
        name: "L4-24GB",
        gpu_type: "L4",
        memory_mib: 23_034,
        max_power_w: 72,
        idle_power_w: 16,
        max_sm_clock_mhz: 2040,
        memory_clock_mhz: 6251,
        hbm: false,
        mig_capable: false,
        nvlink: false,
        slowdown_temp_c: 92,
    },
];

/// The model with this spec name, ignoring ASCII case.
pub(crate) fn find(name: &str) -> Option<&'static GpuModel> {
    MODELS.iter().find(|m| m.name.eq_ignore_ascii_case(name))
}

/// The known spec names, comma-separated, for error messages.
pub(crate) fn known_names() -> String {
    MODELS.iter().map(|m| m.name).collect::<Vec<_>>().join(", ")
}

/// The model a real GPU corresponds to: same family and memory within 5 % (drivers report a
/// little less than the nominal size, e.g. 81559 MiB for an 80 GB H100).
pub(crate) fn match_real(gpu_type: &str, memory_mib: u64) -> Option<&'static GpuModel> {
    MODELS
        .iter()
        .filter(|m| m.gpu_type.eq_ignore_ascii_case(gpu_type))
        .find(|m| m.memory_mib.abs_diff(memory_mib) * 20 <= m.memory_mib)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_consistent() {
        for (i, m) in MODELS.iter().enumerate() {
            assert!(
                MODELS[..i].iter().all(|o| o.name != m.name),
                "duplicate {}",
                m.name
            );
            assert!(m.name.starts_with(m.gpu_type), "{}", m.name);
            assert!(m.idle_power_w < m.max_power_w, "{}", m.name);
            assert!(IDLE_SM_CLOCK_MHZ < m.max_sm_clock_mhz, "{}", m.name);
            assert!((80..100).contains(&m.slowdown_temp_c), "{}", m.name);
            assert!(
                !m.mig_capable || m.nvlink,
                "MIG-capable models here are all SXM"
            );
        }
    }

    #[test]
    fn find_ignores_case_and_matches_real_gpus() {
        assert_eq!(find("a100-80gb").map(|m| m.name), Some("A100-80GB"));
        assert_eq!(find("A100"), None);
        assert_eq!(
            match_real("H100", 81_559).map(|m| m.name),
            Some("H100-80GB")
        );
        assert_eq!(
            match_real("A100", 40_536).map(|m| m.name),
            Some("A100-40GB")
        );
        assert_eq!(
            match_real("H200", 143_771).map(|m| m.name),
            Some("H200-141GB")
        );
        assert_eq!(match_real("H100", 95_830), None);
        assert_eq!(match_real("RTX4090", 24_564), None);
    }
}
