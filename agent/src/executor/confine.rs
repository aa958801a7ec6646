//! What confines one run, decided by the executor and carried out by its supervisor: its
//! limits (`limits`), its device fence (`device_fence`) and the job cgroups they go in
//! (`cgroups`).

use std::ffi::OsString;

use super::cgroups::CgroupLayout;
use super::device_fence::DeviceRule;
use super::limits::Limits;

/// Everything the supervisor needs to confine one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Confinement {
    /// Where the run's cgroups go (this node's layout).
    pub cgroups: CgroupLayout,
    pub limits: Limits,
    /// The device fence (see `device_fence`): what the job may open.
    pub devices: Vec<DeviceRule>,
}

impl Confinement {
    /// The supervisor's flags for it.
    pub fn flags(&self) -> Vec<OsString> {
        let mut flags = self.cgroups.flags();
        let mut flag = |name: &str, value: String| {
            flags.push(name.into());
            flags.push(value.into());
        };
        if let Some(m) = self.limits.cpu_millis {
            flag("--cpu-millis", m.to_string());
        }
        if let Some(m) = self.limits.memory_mib {
            flag("--memory-mib", m.to_string());
        }
        if let Some(n) = self.limits.tasks_max {
            flag("--tasks-max", n.to_string());
        }
        for rule in &self.devices {
            flag("--allow-device", rule.to_string());
        }
        flags
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_supervisor_flags_carry_the_plan() {
        let plan = Confinement {
            cgroups: CgroupLayout::None {
                reason: "none".into(),
            },
            limits: Limits {
                cpu_millis: Some(500),
                memory_mib: None,
                tasks_max: Some(64),
            },
            devices: vec![DeviceRule::char(1, 3), DeviceRule::char_major(136)],
        };
        let flags: Vec<String> = plan
            .flags()
            .iter()
            .map(|f| f.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            flags.join(" "),
            "--cpu-millis 500 --tasks-max 64 --allow-device c 1:3 rwm --allow-device c 136:* rwm"
        );
    }
}
