//! `[containers]`: which container runtimes run container jobs on this node, in order of
//! preference (the first one installed is used), and how their containers are networked.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, ensure};
use serde::{Deserialize, Serialize};

/// `[containers]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainersSection {
    /// Runtimes in order of preference: `podman`, `apptainer` (or `singularity`), `enroot`.
    pub runtimes: Option<Vec<String>>,
    /// `host` (default: NCCL and torchrun need the host's interfaces) or `none`.
    pub network: Option<String>,
    /// The OCI runtime podman uses (`runc`, `crun`); unset: podman's own choice.
    pub oci_runtime: Option<String>,
    /// How often the node's image list is read and reported when it changed (default 30s;
    /// also at once after `gpuctl image pull`).
    #[serde(default, with = "humantime_serde")]
    pub image_refresh: Option<Duration>,
}

/// A container runtime gpumesh knows how to drive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeKind {
    /// Rootful podman: the supervisor (root) runs `podman run --user …`; the container's
    /// device list and cgroup are the runtime's.
    Podman,
    /// Apptainer (or SingularityCE): unprivileged, started as the job's user in the job's
    /// cgroups like any process.
    Apptainer,
    /// NVIDIA's enroot: unprivileged likewise.
    Enroot,
}

impl RuntimeKind {
    /// The programs that are this runtime, the first one found on `PATH` used.
    pub fn programs(self) -> &'static [&'static str] {
        match self {
            RuntimeKind::Podman => &["podman"],
            RuntimeKind::Apptainer => &["apptainer", "singularity"],
            RuntimeKind::Enroot => &["enroot"],
        }
    }

    /// Whether the runtime is started as root, outside the job's cgroups (it switches user
    /// and makes the container's cgroups itself), rather than as the job's user inside them.
    pub fn is_rootful(self) -> bool {
        self == RuntimeKind::Podman
    }

    fn parse(name: &str) -> anyhow::Result<Self> {
        Ok(match name {
            "podman" => RuntimeKind::Podman,
            "apptainer" | "singularity" => RuntimeKind::Apptainer,
            "enroot" => RuntimeKind::Enroot,
            other => bail!(
                "containers.runtimes: unknown container runtime {other:?} (podman, apptainer, \
                 singularity, enroot)"
            ),
        })
    }
}

impl std::fmt::Display for RuntimeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.programs()[0])
    }
}

/// A container's network.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContainerNetwork {
    /// The host's network namespace (what multi-node training needs).
    #[default]
    Host,
    /// Loopback only.
    None,
}

/// `[containers]`, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerSettings {
    pub runtimes: Vec<RuntimeKind>,
    pub network: ContainerNetwork,
    pub oci_runtime: Option<String>,
    pub image_refresh: Duration,
}

/// `containers.image_refresh` when not set.
pub(super) const DEFAULT_IMAGE_REFRESH: Duration = Duration::from_secs(30);

impl Default for ContainerSettings {
    fn default() -> Self {
        Self {
            runtimes: vec![
                RuntimeKind::Podman,
                RuntimeKind::Apptainer,
                RuntimeKind::Enroot,
            ],
            network: ContainerNetwork::Host,
            oci_runtime: None,
            image_refresh: DEFAULT_IMAGE_REFRESH,
        }
    }
}

impl ContainerSettings {
    /// The first configured runtime installed here, with its program: what container jobs run
    /// on. `None`: this node runs none (and says so in its labels, so none is placed here).
    pub fn installed(&self) -> Option<(RuntimeKind, PathBuf)> {
        self.runtimes.iter().find_map(|kind| {
            kind.programs()
                .iter()
                .find_map(|p| on_path(p))
                .map(|program| (*kind, program))
        })
    }

    /// The programs looked for, in order, for a message that none was found.
    pub fn looked_for(&self) -> String {
        let names: Vec<&str> = self
            .runtimes
            .iter()
            .flat_map(|k| k.programs())
            .copied()
            .collect();
        names.join(", ")
    }
}

/// `program`'s path in the agent's `PATH`, if it is there and executable.
fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

pub(super) fn settings(c: ContainersSection) -> anyhow::Result<ContainerSettings> {
    let defaults = ContainerSettings::default();
    let runtimes = match c.runtimes {
        None => defaults.runtimes,
        Some(names) => {
            ensure!(
                !names.is_empty(),
                "containers.runtimes must name at least one runtime"
            );
            let mut kinds = Vec::new();
            for name in &names {
                let kind = RuntimeKind::parse(name)?;
                ensure!(
                    !kinds.contains(&kind),
                    "containers.runtimes names {kind} twice"
                );
                kinds.push(kind);
            }
            kinds
        }
    };
    let network = match c.network.as_deref() {
        None | Some("host") => ContainerNetwork::Host,
        Some("none") => ContainerNetwork::None,
        Some(other) => bail!("containers.network must be host or none, got {other:?}"),
    };
    if let Some(r) = &c.oci_runtime {
        ensure!(
            !r.is_empty()
                && r.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')),
            "containers.oci_runtime {r:?} is not a runtime name or path"
        );
    }
    let image_refresh = c.image_refresh.unwrap_or(defaults.image_refresh);
    ensure!(
        image_refresh >= Duration::from_secs(1),
        "containers.image_refresh must be at least 1s, got {image_refresh:?}"
    );
    Ok(ContainerSettings {
        runtimes,
        network,
        oci_runtime: c.oci_runtime,
        image_refresh,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> anyhow::Result<ContainerSettings> {
        settings(toml::from_str(text)?)
    }

    #[test]
    fn defaults_and_choices() {
        assert_eq!(parse("").expect("valid"), ContainerSettings::default());
        let c = parse("runtimes = [\"enroot\", \"singularity\"]\nnetwork = \"none\"\noci_runtime = \"runc\"\nimage_refresh = \"2s\"\n")
            .expect("valid");
        assert_eq!(c.image_refresh, Duration::from_secs(2));
        assert_eq!(c.runtimes, [RuntimeKind::Enroot, RuntimeKind::Apptainer]);
        assert_eq!(c.network, ContainerNetwork::None);
        assert_eq!(c.oci_runtime.as_deref(), Some("runc"));
    }

    #[test]
    fn bad_settings_are_refused_with_the_key() {
        for (text, says) in [
            (
                "runtimes = [\"docker\"]",
                "unknown container runtime \"docker\"",
            ),
            ("runtimes = []", "at least one"),
            ("runtimes = [\"podman\", \"podman\"]", "twice"),
            ("network = \"bridge\"", "host or none"),
            ("oci_runtime = \"runc --debug\"", "oci_runtime"),
            ("image_refresh = \"100ms\"", "at least 1s"),
        ] {
            let e = parse(text).expect_err(text).to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
        assert!(parse("runtime = [\"podman\"]").is_err(), "unknown key");
    }
}
