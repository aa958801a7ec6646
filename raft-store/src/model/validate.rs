//! Domain input rules shared by the API edge (early, friendly errors) and `apply` (authoritative).

use std::collections::BTreeMap;

use crate::model::account::Account;
use crate::model::job::{JobKind, JobSpec};
use crate::model::mig;
use crate::model::partition::{FULL_SHARE, SliceRequest};

/// Most labels one node may carry.
pub const MAX_LABELS: usize = 64;
const MAX_KEY_LEN: usize = 63;
const MAX_VALUE_LEN: usize = 255;
/// Longest advertised address accepted (`host:port`).
pub const MAX_ADDR_LEN: usize = 255;

/// A label key: 1–63 characters of `[A-Za-z0-9._/-]`, starting with an alphanumeric, no `..`.
pub fn label_key(key: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-');
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(format!("label key must be 1..={MAX_KEY_LEN} characters"));
    }
    if !key.starts_with(|c: char| c.is_ascii_alphanumeric()) || !key.chars().all(ok_char) {
        return Err(format!(
            "label key {key:?} must match [A-Za-z0-9][A-Za-z0-9._/-]*"
        ));
    }
    if key.contains("..") {
        return Err(format!("label key {key:?} must not contain '..'"));
    }
    Ok(())
}

/// A label value: at most 255 characters, printable, no control characters.
pub fn label_value(value: &str) -> Result<(), String> {
    if value.len() > MAX_VALUE_LEN {
        return Err(format!("label value must be at most {MAX_VALUE_LEN} bytes"));
    }
    if value.chars().any(char::is_control) {
        return Err(format!("label value {value:?} contains control characters"));
    }
    Ok(())
}

/// A whole label map, including its size.
pub fn labels(labels: &BTreeMap<String, String>) -> Result<(), String> {
    if labels.len() > MAX_LABELS {
        return Err(format!(
            "at most {MAX_LABELS} labels per node, got {}",
            labels.len()
        ));
    }
    for (k, v) in labels {
        label_key(k)?;
        label_value(v)?;
    }
    Ok(())
}

/// Label keys under this prefix are the agents' own (`CONTAINER_RUNTIME_LABEL`).
pub const AGENT_LABEL_PREFIX: &str = "gpumesh.io/";

/// A label key a person sets (an agent's configuration, an operator's `node label`): a label
/// key outside the agents' own prefix.
pub fn user_label_key(key: &str) -> Result<(), String> {
    label_key(key)?;
    if key.starts_with(AGENT_LABEL_PREFIX) {
        return Err(format!(
            "label key {key:?}: keys under {AGENT_LABEL_PREFIX} are set by the agents themselves"
        ));
    }
    Ok(())
}

/// Labels a person gives a node: `labels`' rules, with user keys, and room left for the
/// agent's own.
pub fn user_labels(labels: &BTreeMap<String, String>) -> Result<(), String> {
    if labels.len() >= MAX_LABELS {
        return Err(format!(
            "at most {} labels per node (one is kept for the agent's own), got {}",
            MAX_LABELS - 1,
            labels.len()
        ));
    }
    labels.keys().try_for_each(|k| user_label_key(k))?;
    self::labels(labels)
}

/// An advertised address: `host:port`, printable, bounded.
pub fn addr(addr: &str) -> Result<(), String> {
    if addr.is_empty() || addr.len() > MAX_ADDR_LEN || addr.chars().any(|c| c.is_control()) {
        return Err(format!(
            "address {addr:?} must be 1..={MAX_ADDR_LEN} printable characters"
        ));
    }
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
        _ => Err(format!("address {addr:?} must be host:port")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_keys() {
        for good in [
            "gpu_type",
            "site",
            "topology.kubernetes.io/zone",
            "a",
            "A-1",
        ] {
            assert_eq!(label_key(good), Ok(()), "{good}");
        }
        let long = "k".repeat(64);
        for bad in [
            "",
            "-a",
            "/etc",
            "../x",
            "a..b",
            "a b",
            "a\nb",
            "\u{1b}[31m",
            long.as_str(),
        ] {
            assert!(label_key(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn agent_label_keys_are_not_set_by_people() {
        let agents_own = format!("{AGENT_LABEL_PREFIX}container-runtime");
        assert!(label_key(&agents_own).is_ok());
        let e = user_label_key(&agents_own).expect_err("reserved");
        assert!(e.contains("set by the agents"), "{e}");
        assert_eq!(user_label_key("gpumesh.io.x/y"), Ok(()));
        let full: BTreeMap<String, String> = (0..MAX_LABELS)
            .map(|i| (format!("k{i}"), String::new()))
            .collect();
        assert!(labels(&full).is_ok());
        assert!(
            user_labels(&full)
                .expect_err("no room")
                .contains("agent's own")
        );
    }

    #[test]
    fn label_values() {
        assert_eq!(label_value(""), Ok(()));
        assert_eq!(label_value("A100 80GB"), Ok(()));
        assert!(label_value("a\0b").is_err());
        assert!(label_value("\u{1b}[2J").is_err());
        assert!(label_value(&"v".repeat(1 << 20)).is_err());
    }

    #[test]
    fn label_maps_are_bounded() {
        let many: BTreeMap<String, String> = (0..100_000)
            .map(|i| (format!("k{i}"), String::new()))
            .collect();
        assert!(labels(&many).is_err());
    }

    #[test]
    fn addrs() {
        assert_eq!(addr("127.0.0.1:7070"), Ok(()));
        assert_eq!(addr("[::1]:7070"), Ok(()));
        for bad in ["", "host", ":80", "h:99999", "h:p", "a\n:1"] {
            assert!(addr(bad).is_err(), "{bad:?}");
        }
    }
}

/// Limits on what one job spec may carry.
pub mod limits {
    pub const NAME_LEN: usize = 128;
    pub const ARGS: usize = 1024;
    pub const COMMAND_BYTES: usize = 256 * 1024;
    pub const ENV_VARS: usize = 256;
    pub const ENV_BYTES: usize = 256 * 1024;
    pub const PATH_LEN: usize = 4096;
    pub const GPUS: u32 = 64;
    pub const GPU_TYPES: usize = 32;
    pub const MAX_ATTEMPTS: u32 = 100;
    pub const GANG_NODES: u32 = 64;
    pub const IDEMPOTENCY_KEY_LEN: usize = 128;
    pub const CPU_MILLIS: u32 = 1024 * 1000;
    pub const MEMORY_MIB: u64 = 64 * 1024 * 1024;
    /// The smallest memory limit a job may ask for: below it not even a shell and the
    /// runtime's libraries fit, so the job could only die at once "out of memory".
    pub const MIN_MEMORY_MIB: u64 = 16;
    /// The longest time limit (a leap year): anything longer is a typo (`--time-limit 30000d`)
    /// rather than a wish, and would overflow the deadline arithmetic downstream.
    pub const WALL_TIME_S: u64 = 366 * 24 * 3600;
    /// Most supplementary groups one account may list (NSS adds a named user's own).
    pub const ACCOUNT_GROUPS: usize = 64;
}

/// An account a token, a tenant or a job carries: `Account::validate` (names, ids, never
/// root), and a bounded list of distinct supplementary groups.
pub fn account(a: &Account) -> Result<(), String> {
    a.validate()?;
    if a.groups.len() > limits::ACCOUNT_GROUPS {
        return Err(format!(
            "account {}: at most {} supplementary groups, got {}",
            a.user,
            limits::ACCOUNT_GROUPS,
            a.groups.len()
        ));
    }
    for (i, g) in a.groups.iter().enumerate() {
        if a.groups[..i].contains(g) {
            return Err(format!(
                "account {}: supplementary group {g} is listed twice",
                a.user
            ));
        }
    }
    Ok(())
}

/// Environment variables the executor sets itself; a job may not override them.
pub const RESERVED_ENV: &[&str] = &[
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
];
const RESERVED_ENV_PREFIX: &str = "GPUMESH_";

/// A name (job, tenant): 1–128 characters of `[A-Za-z0-9._-]`, starting with an alphanumeric.
pub fn name(what: &str, value: &str) -> Result<(), String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if value.is_empty() || value.len() > limits::NAME_LEN {
        return Err(format!(
            "{what} must be 1..={} characters",
            limits::NAME_LEN
        ));
    }
    if !value.starts_with(|c: char| c.is_ascii_alphanumeric()) || !value.chars().all(ok) {
        return Err(format!(
            "{what} {value:?} must match [A-Za-z0-9][A-Za-z0-9._-]*"
        ));
    }
    Ok(())
}

/// A free-text note (a token description, a revocation reason): at most 256 characters, none
/// of them control characters (no newlines or terminal escapes in logs and listings).
pub fn free_text(what: &str, text: &str) -> Result<(), String> {
    if text.chars().count() > 256 || text.chars().any(char::is_control) {
        return Err(format!("{what} must be at most 256 printable characters"));
    }
    Ok(())
}

/// A run's phase as its node reports it: 1..=`MAX_PHASE_LEN` bytes, no control characters.
pub fn run_phase(text: &str) -> Result<(), String> {
    let max = crate::model::job::MAX_PHASE_LEN;
    if text.is_empty() || text.len() > max || text.chars().any(char::is_control) {
        return Err(format!(
            "a run's phase must be 1..={max} bytes of printable characters"
        ));
    }
    Ok(())
}

/// A client idempotency key: 1–128 printable characters.
pub fn idempotency_key(key: &str) -> Result<(), String> {
    if key.is_empty()
        || key.len() > limits::IDEMPOTENCY_KEY_LEN
        || key.chars().any(char::is_control)
    {
        return Err(format!(
            "idempotency key must be 1..={} printable characters",
            limits::IDEMPOTENCY_KEY_LEN
        ));
    }
    Ok(())
}

/// Everything a job spec must satisfy before it can be queued.
pub fn job_spec(spec: &JobSpec) -> Result<(), String> {
    process(spec)?;
    placement(spec)?;
    resource_limits(spec)?;
    retry_backoff(spec)?;
    dependencies(spec)?;
    labels(&spec.labels).map_err(|e| format!("job labels: {e}"))?;
    if let Some(hook) = &spec.notify {
        hook.validate()?;
    }
    if let Some(array) = &spec.array {
        array.validate(crate::model::array::MAX_ARRAY_TASKS)?;
    }
    if let Some(a) = &spec.account {
        account(a)?;
    }
    if let Some(c) = &spec.container {
        if !spec.kind.is_process() {
            return Err("a vm job cannot run in a container image".into());
        }
        crate::model::container::validate(c)?;
    }
    Ok(())
}

/// At most `MAX_DEPENDENCIES` dependencies, each listed once.
fn dependencies(spec: &JobSpec) -> Result<(), String> {
    use crate::model::dependency::MAX_DEPENDENCIES;
    if spec.after.len() > MAX_DEPENDENCIES {
        return Err(format!("at most {MAX_DEPENDENCIES} dependencies"));
    }
    for (i, d) in spec.after.iter().enumerate() {
        if spec.after[..i].contains(d) {
            return Err(format!("dependency {d} is listed twice"));
        }
    }
    Ok(())
}

/// What the job runs: its name and tenant, command, environment and working directory.
fn process(spec: &JobSpec) -> Result<(), String> {
    name("job name", &spec.name)?;
    name("tenant", &spec.tenant)?;
    let Some(program) = spec.command.first() else {
        return Err("command must not be empty".into());
    };
    if program.is_empty() {
        return Err("command must name a program".into());
    }
    if spec.command.len() > limits::ARGS {
        return Err(format!("at most {} command arguments", limits::ARGS));
    }
    if spec.command.iter().map(String::len).sum::<usize>() > limits::COMMAND_BYTES {
        return Err(format!(
            "command must be at most {} bytes",
            limits::COMMAND_BYTES
        ));
    }
    if spec.command.iter().any(|a| a.contains('\0')) {
        return Err("command arguments must not contain NUL".into());
    }
    if spec.env.len() > limits::ENV_VARS {
        return Err(format!(
            "at most {} environment variables",
            limits::ENV_VARS
        ));
    }
    if spec
        .env
        .iter()
        .map(|(k, v)| k.len() + v.len())
        .sum::<usize>()
        > limits::ENV_BYTES
    {
        return Err(format!(
            "environment must be at most {} bytes",
            limits::ENV_BYTES
        ));
    }
    for (k, v) in &spec.env {
        let ok_start = k.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_');
        if !ok_start || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!(
                "environment variable name {k:?} must match [A-Za-z_][A-Za-z0-9_]*"
            ));
        }
        if RESERVED_ENV.contains(&k.as_str()) || k.starts_with(RESERVED_ENV_PREFIX) {
            return Err(format!(
                "environment variable {k} is set by gpumesh and cannot be overridden"
            ));
        }
        if v.contains('\0') {
            return Err(format!("environment variable {k} must not contain NUL"));
        }
    }
    if let Some(dir) = &spec.workdir {
        workdir(dir)?;
    }
    Ok(())
}

/// A working directory: absolute (the node resolves nothing against its own current
/// directory), without `..`, bounded. Whether it exists only the node can tell.
fn workdir(dir: &str) -> Result<(), String> {
    if !dir.starts_with('/') {
        return Err(format!(
            "workdir {dir:?} is a relative path: give an absolute one (e.g. /home/alice/run)"
        ));
    }
    let bad_component = std::path::Path::new(dir)
        .components()
        .any(|c| matches!(c, std::path::Component::ParentDir));
    if dir.len() > limits::PATH_LEN || dir.contains('\0') || bad_component {
        return Err(format!(
            "workdir {dir:?} must be an absolute path without '..', NUL, at most {} bytes",
            limits::PATH_LEN
        ));
    }
    Ok(())
}

/// Where it may run: GPUs (whole, a gang's share per node, or one slice), their types, the
/// node selector, and the vm kind's pass-through GPUs.
fn placement(spec: &JobSpec) -> Result<(), String> {
    if spec.gpus > limits::GPUS {
        return Err(format!(
            "at most {} GPUs per job, asked for {}",
            limits::GPUS,
            spec.gpus
        ));
    }
    if spec.nodes > limits::GANG_NODES {
        return Err(format!(
            "a gang spans at most {} nodes, asked for {}",
            limits::GANG_NODES,
            spec.nodes
        ));
    }
    if spec.nodes > 1 && (spec.gpus < spec.nodes || !spec.gpus.is_multiple_of(spec.nodes)) {
        return Err(format!(
            "a gang of {} nodes needs the same number of GPUs (at least 1) on each: {} GPUs do not divide evenly",
            spec.nodes, spec.gpus
        ));
    }
    if let Some(level) = &spec.topology {
        if !crate::model::topology::TOPOLOGY_LABELS.contains(&level.as_str()) {
            return Err(format!(
                "unknown topology level {level:?}: expected one of {}",
                crate::model::topology::TOPOLOGY_LABELS.join(", ")
            ));
        }
        if spec.nodes <= 1 {
            return Err(format!(
                "a topology level ({level}) is for gangs: the job asks for one node"
            ));
        }
    }
    if spec.gpu_types.len() > limits::GPU_TYPES {
        return Err(format!("at most {} GPU types", limits::GPU_TYPES));
    }
    for (i, t) in spec.gpu_types.iter().enumerate() {
        name("GPU type", t)?;
        if spec.gpu_types[..i].contains(t) {
            return Err(format!("GPU type {t:?} is listed twice"));
        }
    }
    labels(&spec.node_selector).map_err(|e| format!("node selector: {e}"))?;
    slice_request(spec)?;
    if spec.kind == JobKind::Vm && (spec.gpus == 0 || spec.nodes > 1) {
        return Err("a vm job needs at least one pass-through GPU on one node".into());
    }
    Ok(())
}

/// Its limits: attempts, wall time, CPU and memory.
fn resource_limits(spec: &JobSpec) -> Result<(), String> {
    if spec.max_attempts == 0 || spec.max_attempts > limits::MAX_ATTEMPTS {
        return Err(format!("max attempts must be 1..={}", limits::MAX_ATTEMPTS));
    }
    match spec.wall_time_limit_s {
        Some(0) => return Err("time limit must be more than zero".into()),
        Some(s) if s > limits::WALL_TIME_S => {
            return Err(format!(
                "time limit of {s} s is more than {} days (at most {} s)",
                limits::WALL_TIME_S / 86_400,
                limits::WALL_TIME_S
            ));
        }
        _ => {}
    }
    match spec.cpu_millis {
        Some(0) => return Err("CPU limit must be more than zero".into()),
        Some(m) if m > limits::CPU_MILLIS => {
            return Err(format!(
                "CPU limit of {m} millicores is more than {} cores",
                limits::CPU_MILLIS / 1000
            ));
        }
        _ => {}
    }
    match spec.memory_mib {
        Some(m) if m < limits::MIN_MEMORY_MIB => {
            return Err(format!(
                "memory limit of {m} MiB is below the minimum of {} MiB",
                limits::MIN_MEMORY_MIB
            ));
        }
        Some(m) if m > limits::MEMORY_MIB => {
            return Err(format!(
                "memory limit of {m} MiB is more than {} TiB",
                limits::MEMORY_MIB / (1024 * 1024)
            ));
        }
        _ => {}
    }
    Ok(())
}

/// A retry backoff: only for a job that may be tried more than once, at most the longest
/// wait before a retry. Zero retries at once.
fn retry_backoff(spec: &JobSpec) -> Result<(), String> {
    let Some(backoff) = spec.retry_backoff_s else {
        return Ok(());
    };
    if spec.max_attempts < 2 {
        return Err("a retry backoff needs max attempts of 2 or more".into());
    }
    if backoff > crate::model::job::MAX_RETRY_DELAY_S {
        return Err(format!(
            "retry backoff must be at most {} s",
            crate::model::job::MAX_RETRY_DELAY_S
        ));
    }
    Ok(())
}

/// Context-free checks of a slice request (at the API edge and in `apply`).
pub fn slice_request(spec: &JobSpec) -> Result<(), String> {
    let Some(req) = &spec.slice else {
        return Ok(());
    };
    if spec.gpus != 1 || spec.nodes > 1 {
        return Err("a MIG or shared slice is one slice of one GPU: gpus must be 1".into());
    }
    if spec.kind == JobKind::Vm {
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

#[cfg(test)]
pub(crate) mod job_tests {
    use super::*;

    pub(crate) fn spec() -> JobSpec {
        JobSpec {
            name: "train".into(),
            command: vec!["python".into(), "train.py".into()],
            gpus: 2,
            ..JobSpec::default()
        }
    }

    #[test]
    fn slice_requests_are_checked_with_reasons() {
        use SliceRequest::{Mig, Shared};
        let with = |slice, gpus: u32, types: &[&str]| JobSpec {
            gpus,
            slice: Some(slice),
            gpu_types: types.iter().map(|t| (*t).to_owned()).collect(),
            ..spec()
        };
        let mig = |p: &str| Mig { profile: p.into() };
        let shared = |memory_mib, share| Shared { memory_mib, share };
        assert_eq!(job_spec(&with(mig("1g.10gb"), 1, &[])), Ok(()));
        assert_eq!(job_spec(&with(mig("1g.5gb"), 1, &["A100"])), Ok(()));
        assert_eq!(job_spec(&with(shared(10_240, 25), 1, &["T4"])), Ok(()));
        // An unknown GPU type is not limited by the catalog (newer hardware).
        assert_eq!(job_spec(&with(shared(200_000, 25), 1, &["B300"])), Ok(()));
        let cases = [
            (with(mig("1g.10gb"), 2, &[]), "gpus must be 1"),
            (
                with(mig("9g.80gb"), 1, &[]),
                "unknown MIG profile \"9g.80gb\"",
            ),
            (
                with(mig("1g.10gb"), 1, &["H200"]),
                "MIG profile 1g.10gb is not supported by GPU type H200 (only by A100-40GB|A100-80GB|H100-80GB)",
            ),
            (
                with(shared(1024, 101), 1, &[]),
                "GPU share must be 1..=100 percent, got 101",
            ),
            (
                with(shared(1024, 0), 1, &[]),
                "GPU share must be 1..=100 percent, got 0",
            ),
            (with(shared(0, 10), 1, &[]), "needs its GPU memory"),
            (
                with(shared(20_000, 10), 1, &["T4"]),
                "GPU memory 20000 MiB is more than any T4 GPU has (15360 MiB)",
            ),
            (
                with(shared(u64::MAX, 10), 1, &[]),
                "is more than any GPU has (144384 MiB)",
            ),
        ];
        for (s, why) in cases {
            let err = job_spec(&s).expect_err(why);
            assert!(err.contains(why), "{err} should say {why}");
        }
        let vm = JobSpec {
            kind: JobKind::Vm,
            ..with(mig("1g.10gb"), 1, &[])
        };
        assert!(job_spec(&vm).expect_err("vm slice").contains("vm job"));
        let vm0 = JobSpec {
            kind: JobKind::Vm,
            gpus: 0,
            ..spec()
        };
        assert!(job_spec(&vm0).expect_err("vm 0").contains("at least one"));
    }

    /// Each resource limit at, just inside and just outside its bounds, with the reason.
    #[test]
    fn resource_limits_are_bounded_with_reasons() {
        type Mutation = fn(&mut JobSpec);
        let accepted: [(&str, Mutation); 6] = [
            ("1 s", |s| s.wall_time_limit_s = Some(1)),
            ("366 days", |s| {
                s.wall_time_limit_s = Some(limits::WALL_TIME_S)
            }),
            ("16 MiB", |s| s.memory_mib = Some(limits::MIN_MEMORY_MIB)),
            ("64 TiB", |s| s.memory_mib = Some(limits::MEMORY_MIB)),
            ("1 millicore", |s| s.cpu_millis = Some(1)),
            ("1024 cores", |s| s.cpu_millis = Some(limits::CPU_MILLIS)),
        ];
        for (what, mutate) in accepted {
            let mut s = spec();
            mutate(&mut s);
            assert_eq!(job_spec(&s), Ok(()), "{what}");
        }
        let refused: [(Mutation, &str); 8] = [
            (
                |s| s.wall_time_limit_s = Some(0),
                "time limit must be more than zero",
            ),
            (
                |s| s.wall_time_limit_s = Some(limits::WALL_TIME_S + 1),
                "time limit of 31622401 s is more than 366 days",
            ),
            (
                |s| s.wall_time_limit_s = Some(u64::MAX),
                "is more than 366 days",
            ),
            (
                |s| s.memory_mib = Some(15),
                "memory limit of 15 MiB is below the minimum of 16 MiB",
            ),
            (
                |s| s.memory_mib = Some(0),
                "memory limit of 0 MiB is below the minimum of 16 MiB",
            ),
            (
                |s| s.memory_mib = Some(limits::MEMORY_MIB + 1),
                "is more than 64 TiB",
            ),
            (
                |s| s.cpu_millis = Some(0),
                "CPU limit must be more than zero",
            ),
            (
                |s| s.cpu_millis = Some(limits::CPU_MILLIS + 1),
                "is more than 1024 cores",
            ),
        ];
        for (mutate, why) in refused {
            let mut s = spec();
            mutate(&mut s);
            let err = job_spec(&s).expect_err(why);
            assert!(err.contains(why), "{err} should say {why}");
        }
    }

    #[test]
    fn workdirs_must_be_absolute() {
        let with = |dir: &str| JobSpec {
            workdir: Some(dir.into()),
            ..spec()
        };
        assert_eq!(job_spec(&with("/home/alice/run")), Ok(()));
        for (dir, why) in [
            ("run", "\"run\" is a relative path: give an absolute one"),
            ("./run", "is a relative path"),
            ("", "is a relative path"),
            ("/srv/../etc", "without '..'"),
            ("/a\0b", "without '..', NUL"),
        ] {
            let err = job_spec(&with(dir)).expect_err(dir);
            assert!(err.contains(why), "{dir:?}: {err}");
        }
        let long = format!("/{}", "d".repeat(limits::PATH_LEN));
        assert!(job_spec(&with(&long)).is_err());
    }

    #[test]
    fn accounts_follow_the_shared_rules() {
        let a = |user: &str, group: Option<&str>, groups: &[&str]| Account {
            user: user.into(),
            group: group.map(str::to_owned),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        };
        assert_eq!(account(&a("alice", None, &[])), Ok(()));
        assert_eq!(
            account(&a("bob", Some("research"), &["video", "1007"])),
            Ok(())
        );
        assert_eq!(account(&a("1001", Some("1001"), &[])), Ok(()));
        let many: Vec<String> = (0..=limits::ACCOUNT_GROUPS)
            .map(|i| format!("g{i}"))
            .collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        for (bad, why) in [
            (a("root", None, &[]), "never run as root"),
            (a("0", Some("100"), &[]), "never run as root"),
            (a("", None, &[]), "must not be empty"),
            (a("al ice", None, &[]), "not a valid user or group name"),
            (a("alice", Some("a:b"), &[]), "not a valid"),
            (
                a("alice", None, &["video", "video"]),
                "video is listed twice",
            ),
            (a("alice", None, &many), "at most 64 supplementary groups"),
            (a("alice", None, &["4294967295"]), "out of range"),
        ] {
            let err = account(&bad).expect_err(why);
            assert!(err.contains(why), "{bad:?}: {err}");
            // A job carrying it is refused for the same reason.
            let job = JobSpec {
                account: Some(bad.clone()),
                ..spec()
            };
            assert_eq!(job_spec(&job), Err(err));
        }
        let mapped = JobSpec {
            account: Some(a("alice", Some("research"), &[])),
            ..spec()
        };
        assert_eq!(job_spec(&mapped), Ok(()));
    }

    #[test]
    fn a_plain_spec_is_valid() {
        assert_eq!(job_spec(&spec()), Ok(()));
    }

    #[test]
    fn hostile_specs_are_rejected() {
        type Mutation = Box<dyn Fn(&mut JobSpec)>;
        let cases: Vec<(&str, Mutation)> = vec![
            ("empty command", Box::new(|s| s.command.clear())),
            (
                "empty program",
                Box::new(|s| s.command = vec![String::new()]),
            ),
            ("NUL in arg", Box::new(|s| s.command.push("a\0b".into()))),
            ("traversal name", Box::new(|s| s.name = "../etc".into())),
            ("newline name", Box::new(|s| s.name = "a\nb".into())),
            ("ANSI name", Box::new(|s| s.name = "\u{1b}[31mred".into())),
            ("huge name", Box::new(|s| s.name = "a".repeat(1 << 20))),
            ("too many GPUs", Box::new(|s| s.gpus = u32::MAX)),
            (
                "reserved env",
                Box::new(|s| {
                    s.env.insert("CUDA_VISIBLE_DEVICES".into(), "0".into());
                }),
            ),
            (
                "gpumesh env",
                Box::new(|s| {
                    s.env.insert("GPUMESH_JOB_ID".into(), "1".into());
                }),
            ),
            (
                "bad env name",
                Box::new(|s| {
                    s.env.insert("A=B".into(), "1".into());
                }),
            ),
            (
                "relative workdir",
                Box::new(|s| s.workdir = Some("tmp".into())),
            ),
            (
                "dotdot workdir",
                Box::new(|s| s.workdir = Some("/srv/../etc".into())),
            ),
            ("zero attempts", Box::new(|s| s.max_attempts = 0)),
            (
                "retry backoff with one attempt",
                Box::new(|s| {
                    s.max_attempts = 1;
                    s.retry_backoff_s = Some(10);
                }),
            ),
            (
                "retry backoff over an hour",
                Box::new(|s| {
                    s.max_attempts = 3;
                    s.retry_backoff_s = Some(3601);
                }),
            ),
            (
                "zero wall time",
                Box::new(|s| s.wall_time_limit_s = Some(0)),
            ),
            (
                "bad type",
                Box::new(|s| {
                    s.gpu_types.push("A100/../x".into());
                }),
            ),
            (
                "type listed twice",
                Box::new(|s| s.gpu_types = vec!["A100".into(), "V100".into(), "A100".into()]),
            ),
        ];
        for (what, mutate) in cases {
            let mut s = spec();
            mutate(&mut s);
            assert!(job_spec(&s).is_err(), "{what} should be rejected");
        }
    }
}
