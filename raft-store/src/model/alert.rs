//! Alerts in the replicated state: the rules agents evaluate on their own GPUs (the built-in
//! ones, the config file's, and operators' replicated overrides by name), the alerts raised and
//! resolved through Raft, and the remediation a rule asks for.
//!
//! Agents raise and resolve; `apply` (`apply/alerts.rs`) deduplicates (one open alert per rule
//! and GPU) and carries out the replicated part of a remediation (quarantine, migration).
//! Telemetry never enters the log: only the verdicts do.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::NodeId;

/// A finite number in a rule (thresholds, limits, rates). Finite by validation, so equality is
/// total.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Number(pub f64);

impl Eq for Number {}

impl fmt::Display for Number {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What a rule watches, per GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    TemperatureC,
    MemoryTemperatureC,
    PowerW,
    UtilizationPct,
    /// Memory used as a percentage of the GPU's memory.
    MemoryUsedPct,
    /// Cumulative counts (rules on them usually use `rate`).
    EccSingleBit,
    EccDoubleBit,
    RetiredPages,
    PcieReplays,
    NvlinkErrors,
    /// XID events seen in a sample.
    Xids,
}

impl Metric {
    pub const ALL: [Metric; 11] = [
        Metric::TemperatureC,
        Metric::MemoryTemperatureC,
        Metric::PowerW,
        Metric::UtilizationPct,
        Metric::MemoryUsedPct,
        Metric::EccSingleBit,
        Metric::EccDoubleBit,
        Metric::RetiredPages,
        Metric::PcieReplays,
        Metric::NvlinkErrors,
        Metric::Xids,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Metric::TemperatureC => "temperature_c",
            Metric::MemoryTemperatureC => "memory_temperature_c",
            Metric::PowerW => "power_w",
            Metric::UtilizationPct => "utilization_pct",
            Metric::MemoryUsedPct => "memory_used_pct",
            Metric::EccSingleBit => "ecc_single_bit",
            Metric::EccDoubleBit => "ecc_double_bit",
            Metric::RetiredPages => "retired_pages",
            Metric::PcieReplays => "pcie_replays",
            Metric::NvlinkErrors => "nvlink_errors",
            Metric::Xids => "xids",
        }
    }

    /// The metric called `name`, or an error listing the known ones.
    pub fn parse(name: &str) -> Result<Metric, String> {
        Metric::ALL
            .into_iter()
            .find(|m| m.name() == name)
            .ok_or_else(|| {
                let known: Vec<&str> = Metric::ALL.iter().map(|m| m.name()).collect();
                format!("unknown metric {name:?} (known: {})", known.join(", "))
            })
    }
}

/// When a rule fires. Every duration is in milliseconds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Condition {
    /// The metric stays above `threshold` for `for_ms` (every sample in that window).
    Above {
        metric: Metric,
        threshold: Number,
        for_ms: u64,
    },
    /// The metric grows faster than `per_minute` over the last `window_ms` (for counters).
    Rate {
        metric: Metric,
        per_minute: Number,
        window_ms: u64,
    },
    /// A straight-line fit of the last `window_ms` reaches `limit` within `within_ms`.
    Predict {
        metric: Metric,
        limit: Number,
        window_ms: u64,
        within_ms: u64,
    },
    /// The GPU is failing: an XID in `fatal_xids`, a new double-bit ECC error, or it fell off
    /// the bus. Fires on the first such sample.
    Health { fatal_xids: Vec<u32> },
}

/// What the cluster does about a firing rule, besides listing the alert and notifying.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Remediation {
    #[default]
    None,
    /// The GPU's agent lowers its power limit to `power_pct` of the board's maximum until the
    /// alert resolves.
    Throttle { power_pct: u32 },
    /// No new work on the GPU until the alert resolves; the job on it keeps running.
    Quarantine,
    /// Quarantine, and move the job on the GPU elsewhere: it is asked to stop (SIGTERM, its
    /// grace period, then SIGKILL) and requeued without using up an attempt.
    Migrate,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    #[default]
    Warning,
    Critical,
}

impl Severity {
    /// As the API, the CLI and the metrics spell it.
    pub fn name(self) -> &'static str {
        match self {
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

/// One alert rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlertRule {
    /// Unique; a replicated rule replaces a built-in or configured rule of the same name.
    pub name: String,
    pub condition: Condition,
    #[serde(default)]
    pub severity: Severity,
    #[serde(default)]
    pub remediation: Remediation,
    /// Hysteresis: the alert resolves (and a quarantined GPU returns to service) only after the
    /// condition has been false this long.
    pub clear_after_ms: u64,
    /// A replicated override with `enabled = false` switches a rule off.
    #[serde(default = "enabled")]
    pub enabled: bool,
}

fn enabled() -> bool {
    true
}

/// An alert: raised by the GPU's agent when a rule fires, resolved when it clears.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alert {
    pub id: u64,
    pub rule: String,
    pub node: NodeId,
    pub gpu: u32,
    pub severity: Severity,
    pub remediation: Remediation,
    /// What the agent saw, for humans.
    pub message: String,
    pub raised_at_ms: u64,
    #[serde(default)]
    pub resolved_at_ms: Option<u64>,
    /// The job `Migrate` moved off the GPU, if any.
    #[serde(default)]
    pub migrated_job: Option<crate::JobId>,
}

impl Alert {
    pub fn is_open(&self) -> bool {
        self.resolved_at_ms.is_none()
    }
}

/// The rules every agent starts with (config rules and replicated ones replace them by name).
pub fn builtin_rules() -> Vec<AlertRule> {
    vec![
        AlertRule {
            name: "gpu-overheat".into(),
            condition: Condition::Above {
                metric: Metric::TemperatureC,
                threshold: Number(85.0),
                for_ms: 30_000,
            },
            severity: Severity::Warning,
            remediation: Remediation::Throttle { power_pct: 70 },
            clear_after_ms: 60_000,
            enabled: true,
        },
        AlertRule {
            name: "gpu-failing".into(),
            condition: Condition::Health {
                // Graphics engine exception, uncontained ECC error, fallen off the bus, and
                // the row-remapping and GSP failures NVIDIA lists as needing a reset.
                fatal_xids: vec![48, 63, 64, 74, 79, 94, 95, 119, 120],
            },
            severity: Severity::Critical,
            remediation: Remediation::Migrate,
            clear_after_ms: 300_000,
            enabled: true,
        },
        AlertRule {
            name: "gpu-memory-will-fill".into(),
            condition: Condition::Predict {
                metric: Metric::MemoryUsedPct,
                limit: Number(100.0),
                window_ms: 60_000,
                within_ms: 120_000,
            },
            severity: Severity::Warning,
            remediation: Remediation::None,
            clear_after_ms: 60_000,
            enabled: true,
        },
    ]
}

/// `builtin` then `configured`, replaced by name by `replicated` (disabled ones dropped).
pub fn effective_rules<'a>(
    configured: &'a [AlertRule],
    replicated: impl IntoIterator<Item = &'a AlertRule>,
) -> Vec<AlertRule> {
    let mut rules: std::collections::BTreeMap<String, AlertRule> = builtin_rules()
        .into_iter()
        .chain(configured.iter().cloned())
        .map(|r| (r.name.clone(), r))
        .collect();
    for r in replicated {
        rules.insert(r.name.clone(), r.clone());
    }
    rules.into_values().filter(|r| r.enabled).collect()
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Condition::Above {
                metric,
                threshold,
                for_ms,
            } => write!(f, "{} > {threshold} for {for_ms}ms", metric.name()),
            Condition::Rate {
                metric,
                per_minute,
                window_ms,
            } => write!(
                f,
                "{} rate > {per_minute}/min over {window_ms}ms",
                metric.name()
            ),
            Condition::Predict {
                metric,
                limit,
                window_ms,
                within_ms,
            } => write!(
                f,
                "{} trend over {window_ms}ms reaches {limit} within {within_ms}ms",
                metric.name()
            ),
            Condition::Health { fatal_xids } => write!(f, "health (fatal XIDs {fatal_xids:?})"),
        }
    }
}

/// Longest alert message kept, in bytes.
pub const MAX_MESSAGE: usize = 1024;

/// Resolved alerts kept in the state (the oldest beyond this are dropped at apply).
pub const KEEP_RESOLVED: usize = 1000;

/// Limits of a rule, shared by the API edge and `apply`.
pub fn validate_rule(rule: &AlertRule) -> Result<(), String> {
    const DAY_MS: u64 = 86_400_000;
    crate::model::validate::name("alert rule", &rule.name)?;
    let finite = |what: &str, n: Number| {
        if n.0.is_finite() {
            Ok(())
        } else {
            Err(format!("{what} must be a finite number, got {}", n.0))
        }
    };
    let duration = |what: &str, ms: u64, min: u64| {
        if (min..=DAY_MS).contains(&ms) {
            Ok(())
        } else {
            Err(format!(
                "{what} must be between {min}ms and one day, got {ms}ms"
            ))
        }
    };
    match &rule.condition {
        Condition::Above {
            threshold, for_ms, ..
        } => {
            finite("threshold", *threshold)?;
            duration("for", *for_ms, 0)?;
        }
        Condition::Rate {
            per_minute,
            window_ms,
            ..
        } => {
            finite("rate", *per_minute)?;
            if per_minute.0 < 0.0 {
                return Err(format!("rate must not be negative, got {per_minute}"));
            }
            duration("window", *window_ms, 1000)?;
        }
        Condition::Predict {
            limit,
            window_ms,
            within_ms,
            ..
        } => {
            finite("limit", *limit)?;
            duration("window", *window_ms, 1000)?;
            duration("within", *within_ms, 1)?;
        }
        Condition::Health { fatal_xids } => {
            if fatal_xids.len() > 256 {
                return Err(format!("at most 256 fatal XIDs, got {}", fatal_xids.len()));
            }
        }
    }
    if let Remediation::Throttle { power_pct } = rule.remediation
        && !(10..=100).contains(&power_pct)
    {
        return Err(format!(
            "throttle power must be 10-100% of the board's maximum, got {power_pct}%"
        ));
    }
    duration("clear_after", rule.clear_after_ms, 0)
}
