//! Alert rules on one GPU's history: the pure verdict of a rule (`evaluate`), and `FlatRule`,
//! the one flat form that the config file, the API and `gpuctl alert rule set` share.
//!
//! Hysteresis comes from the history itself: a rule fires when its condition holds over its
//! window, and clears only when the condition has been false for the rule's `clear_after`
//! (`Undecided` while the history is too short to say either).

use std::time::Duration;

use gpu_raft_store::alert::{AlertRule, Condition, Metric, Number, Remediation, Severity};
use serde::Deserialize;

use super::Reading;
use crate::gpu::GpuSample;

/// A rule's verdict on one GPU now.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Verdict {
    /// The condition holds; what was seen, for humans.
    Firing(String),
    /// The condition has been false for `clear_after`.
    Clear,
    /// Neither (too little history, or between firing and clear).
    Undecided,
}

/// The metric's value in one sample (`None`: the GPU could not be read).
pub(crate) fn value(metric: Metric, s: &GpuSample) -> Option<f64> {
    if !s.healthy {
        return None;
    }
    Some(match metric {
        Metric::TemperatureC => f64::from(s.temperature_c),
        Metric::MemoryTemperatureC => f64::from(s.memory_temperature_c),
        Metric::PowerW => f64::from(s.power_w),
        Metric::UtilizationPct => f64::from(s.utilization_pct),
        Metric::MemoryUsedPct if s.memory_total_mib > 0 => {
            s.memory_used_mib as f64 * 100.0 / s.memory_total_mib as f64
        }
        Metric::MemoryUsedPct => 0.0,
        Metric::EccSingleBit => s.ecc_single_bit as f64,
        Metric::EccDoubleBit => s.ecc_double_bit as f64,
        Metric::RetiredPages => s.retired_pages as f64,
        Metric::PcieReplays => s.pcie_replays as f64,
        Metric::NvlinkErrors => s.nvlink_errors as f64,
        Metric::Xids => s.xid_events.len() as f64,
    })
}

/// How much history `rule` needs to decide, in milliseconds.
pub(crate) fn lookback_ms(rule: &AlertRule) -> u64 {
    let window = match &rule.condition {
        Condition::Above { for_ms, .. } => *for_ms,
        Condition::Rate { window_ms, .. } | Condition::Predict { window_ms, .. } => *window_ms,
        Condition::Health { .. } => 0,
    };
    window.max(rule.clear_after_ms)
}

/// `rule` on `readings` (one GPU, oldest first), as of the newest reading.
pub(crate) fn evaluate(rule: &AlertRule, readings: &[Reading]) -> Verdict {
    let Some(now) = readings.last().map(|r| r.at_ms) else {
        return Verdict::Undecided;
    };
    if let Some(seen) = fires(rule, readings, now) {
        return Verdict::Firing(seen);
    }
    let from = now.saturating_sub(rule.clear_after_ms);
    let covered = spans(readings, now, rule.clear_after_ms);
    let recent = window(readings, from);
    let quiet = match &rule.condition {
        Condition::Above {
            metric, threshold, ..
        } => recent
            .iter()
            .all(|r| value(*metric, &r.sample).is_none_or(|v| v <= threshold.0)),
        Condition::Predict { metric, limit, .. } => recent
            .iter()
            .all(|r| value(*metric, &r.sample).is_none_or(|v| v < limit.0)),
        Condition::Rate {
            metric, per_minute, ..
        } => {
            let allowed = per_minute.0 * rule.clear_after_ms as f64 / 60_000.0;
            increase(*metric, recent).is_none_or(|(grew, _)| grew <= allowed)
        }
        Condition::Health { fatal_xids } => health_event(fatal_xids, readings, from).is_none(),
    };
    if covered && quiet {
        Verdict::Clear
    } else {
        Verdict::Undecided
    }
}

/// What makes the condition hold now, if it does. A health event counts while it is less than
/// `clear_after` old, so no evaluation can miss it.
fn fires(rule: &AlertRule, readings: &[Reading], now: u64) -> Option<String> {
    match &rule.condition {
        Condition::Above {
            metric,
            threshold,
            for_ms,
        } => {
            let from = now.saturating_sub(*for_ms);
            let covered = spans(readings, now, *for_ms);
            let recent = window(readings, from);
            let values: Vec<f64> = recent
                .iter()
                .map(|r| value(*metric, &r.sample))
                .collect::<Option<_>>()?;
            let lowest = values.iter().copied().fold(f64::INFINITY, f64::min);
            (covered && lowest > threshold.0).then(|| {
                let last = values.last().copied().unwrap_or(lowest);
                format!(
                    "{} {last:.1} above {threshold} for {}",
                    metric.name(),
                    humantime::format_duration(Duration::from_millis(*for_ms))
                )
            })
        }
        Condition::Rate {
            metric,
            per_minute,
            window_ms,
        } => {
            let (grew, over_ms) =
                increase(*metric, window(readings, now.saturating_sub(*window_ms)))?;
            let rate = grew * 60_000.0 / over_ms.max(1) as f64;
            (grew > 0.0 && rate > per_minute.0).then(|| {
                format!(
                    "{} rising {rate:.1}/min (more than {per_minute}/min)",
                    metric.name()
                )
            })
        }
        Condition::Predict {
            metric,
            limit,
            window_ms,
            within_ms,
        } => {
            let points: Vec<(f64, f64)> = window(readings, now.saturating_sub(*window_ms))
                .iter()
                .filter_map(|r| Some((r.at_ms as f64, value(*metric, &r.sample)?)))
                .collect();
            let span = points.last()?.0 - points.first()?.0;
            if points.len() < 3 || span < *window_ms as f64 / 2.0 {
                return None;
            }
            let latest = points.last()?.1;
            if latest >= limit.0 {
                return Some(format!("{} at {latest:.1}, past {limit}", metric.name()));
            }
            // Both the whole window's trend and its second half's must reach the limit in
            // time, so a single step (a job allocating its memory at start) is no trend.
            let half = &points[points.partition_point(|p| p.0 < now as f64 - span / 2.0)..];
            let eta_ms = |points: &[(f64, f64)]| {
                let (slope, at_now) = fit(points, now as f64)?;
                (slope > 0.0).then(|| (limit.0 - at_now.max(latest)) / slope)
            };
            let (whole, recent) = (eta_ms(&points)?, eta_ms(half)?);
            let eta = whole.max(recent);
            (eta <= *within_ms as f64).then(|| {
                format!(
                    "{} {latest:.1} trending to {limit} in {}",
                    metric.name(),
                    humantime::format_duration(Duration::from_secs((eta / 1000.0) as u64))
                )
            })
        }
        Condition::Health { fatal_xids } => health_event(
            fatal_xids,
            readings,
            now.saturating_sub(rule.clear_after_ms),
        ),
    }
}

/// Whether the history reaches back `ms` before `now`.
fn spans(readings: &[Reading], now: u64, ms: u64) -> bool {
    readings
        .first()
        .is_some_and(|r| r.at_ms.saturating_add(ms) <= now)
}

/// Readings at or after `from_ms`.
fn window(readings: &[Reading], from_ms: u64) -> &[Reading] {
    let start = readings.partition_point(|r| r.at_ms < from_ms);
    &readings[start..]
}

/// How much a counter grew across `readings` and over how many milliseconds; for XIDs, how
/// many were seen. `None` with fewer than two readable samples.
fn increase(metric: Metric, readings: &[Reading]) -> Option<(f64, u64)> {
    let readable: Vec<(u64, f64)> = readings
        .iter()
        .filter_map(|r| Some((r.at_ms, value(metric, &r.sample)?)))
        .collect();
    let (first, last) = (readable.first()?, readable.last()?);
    if readable.len() < 2 {
        return None;
    }
    let grew = if metric == Metric::Xids {
        readable.iter().map(|(_, n)| n).sum()
    } else {
        (last.1 - first.1).max(0.0)
    };
    Some((grew, last.0 - first.0))
}

/// The first failure sign in readings since `from_ms`: a fatal XID, a new double-bit ECC error
/// (against the reading before it), or a GPU that cannot be read.
fn health_event(fatal_xids: &[u32], readings: &[Reading], from_ms: u64) -> Option<String> {
    let start = readings.partition_point(|r| r.at_ms < from_ms);
    for (i, r) in readings.iter().enumerate().skip(start) {
        let s = &r.sample;
        if !s.healthy {
            return Some(format!(
                "GPU cannot be read ({})",
                s.error.as_deref().unwrap_or("lost")
            ));
        }
        if let Some(xid) = s.xid_events.iter().find(|x| fatal_xids.contains(x)) {
            return Some(format!("fatal XID {xid}"));
        }
        let before = i
            .checked_sub(1)
            .map_or(0, |p| readings[p].sample.ecc_double_bit);
        if s.ecc_double_bit > before {
            return Some(format!(
                "double-bit ECC errors {before} -> {}",
                s.ecc_double_bit
            ));
        }
    }
    None
}

/// Least-squares line through `points`: (slope per x unit, value at `x`).
fn fit(points: &[(f64, f64)], x: f64) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    if sxx == 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    let slope = sxy / sxx;
    Some((slope, mean_y + slope * (x - mean_x)))
}

/// A rule as people write it: in the config file (`[[monitor.rules]]`), and field for field in
/// the API's `AlertRule` and `gpuctl alert rule set`. Exactly one of `above`,
/// `rate_per_minute`, `predict_limit` and `fatal_xids` says what kind of rule it is.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlatRule {
    pub name: String,
    /// Required except for health rules (`fatal_xids`).
    #[serde(default)]
    pub metric: Option<String>,
    #[serde(default)]
    pub above: Option<f64>,
    #[serde(default)]
    pub rate_per_minute: Option<f64>,
    #[serde(default)]
    pub predict_limit: Option<f64>,
    #[serde(default)]
    pub fatal_xids: Option<Vec<u32>>,
    /// `above`: how long the metric must stay above.
    #[serde(default, rename = "for", with = "humantime_serde")]
    pub for_: Option<Duration>,
    /// `rate_per_minute` and `predict_limit`: the history they look at.
    #[serde(default, with = "humantime_serde")]
    pub window: Option<Duration>,
    /// `predict_limit`: how far ahead a crossing counts.
    #[serde(default, with = "humantime_serde")]
    pub within: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub clear_after: Option<Duration>,
    /// `warning` (default) or `critical`.
    #[serde(default)]
    pub severity: Option<String>,
    /// `none` (default), `throttle:PCT`, `quarantine` or `migrate`.
    #[serde(default)]
    pub action: Option<String>,
    #[serde(default)]
    pub enabled: Option<bool>,
}

impl FlatRule {
    /// The rule, validated as `apply` will; the error says what is wrong.
    pub fn to_rule(&self) -> Result<AlertRule, String> {
        let ms = |d: Option<Duration>, default: u64| {
            d.map_or(default, |d| {
                u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
            })
        };
        let metric = || Metric::parse(self.metric.as_deref().ok_or("a metric is required")?);
        let kinds = [
            self.above.is_some(),
            self.rate_per_minute.is_some(),
            self.predict_limit.is_some(),
            self.fatal_xids.is_some(),
        ];
        if kinds.iter().filter(|k| **k).count() != 1 {
            return Err(format!(
                "rule {:?}: give exactly one of above, rate_per_minute, predict_limit, fatal_xids",
                self.name
            ));
        }
        let condition = if let Some(threshold) = self.above {
            Condition::Above {
                metric: metric()?,
                threshold: Number(threshold),
                for_ms: ms(self.for_, 0),
            }
        } else if let Some(per_minute) = self.rate_per_minute {
            Condition::Rate {
                metric: metric()?,
                per_minute: Number(per_minute),
                window_ms: ms(self.window, 60_000),
            }
        } else if let Some(limit) = self.predict_limit {
            Condition::Predict {
                metric: metric()?,
                limit: Number(limit),
                window_ms: ms(self.window, 60_000),
                within_ms: ms(self.within, 120_000),
            }
        } else {
            Condition::Health {
                fatal_xids: self.fatal_xids.clone().unwrap_or_default(),
            }
        };
        let severity = match self.severity.as_deref().unwrap_or("warning") {
            "warning" => Severity::Warning,
            "critical" => Severity::Critical,
            other => return Err(format!("unknown severity {other:?} (warning or critical)")),
        };
        let rule = AlertRule {
            name: self.name.clone(),
            condition,
            severity,
            remediation: parse_action(self.action.as_deref().unwrap_or("none"))?,
            clear_after_ms: ms(self.clear_after, 60_000),
            enabled: self.enabled.unwrap_or(true),
        };
        gpu_raft_store::alert::validate_rule(&rule)
            .map_err(|e| format!("rule {:?}: {e}", rule.name))?;
        Ok(rule)
    }

    /// The flat form of `rule` (for listing).
    pub fn from_rule(rule: &AlertRule) -> FlatRule {
        let d = |ms: u64| Some(Duration::from_millis(ms));
        let mut flat = FlatRule {
            name: rule.name.clone(),
            clear_after: d(rule.clear_after_ms),
            severity: Some(rule.severity.name().into()),
            action: Some(action_name(rule.remediation)),
            enabled: Some(rule.enabled),
            ..FlatRule::default()
        };
        match &rule.condition {
            Condition::Above {
                metric,
                threshold,
                for_ms,
            } => {
                flat.metric = Some(metric.name().into());
                flat.above = Some(threshold.0);
                flat.for_ = d(*for_ms);
            }
            Condition::Rate {
                metric,
                per_minute,
                window_ms,
            } => {
                flat.metric = Some(metric.name().into());
                flat.rate_per_minute = Some(per_minute.0);
                flat.window = d(*window_ms);
            }
            Condition::Predict {
                metric,
                limit,
                window_ms,
                within_ms,
            } => {
                flat.metric = Some(metric.name().into());
                flat.predict_limit = Some(limit.0);
                flat.window = d(*window_ms);
                flat.within = d(*within_ms);
            }
            Condition::Health { fatal_xids } => flat.fatal_xids = Some(fatal_xids.clone()),
        }
        flat
    }
}

/// `none`, `throttle:PCT`, `quarantine` or `migrate`.
pub(crate) fn parse_action(s: &str) -> Result<Remediation, String> {
    match s {
        "none" => Ok(Remediation::None),
        "quarantine" => Ok(Remediation::Quarantine),
        "migrate" => Ok(Remediation::Migrate),
        other => match other.strip_prefix("throttle:").map(str::parse) {
            Some(Ok(power_pct)) => Ok(Remediation::Throttle { power_pct }),
            _ => Err(format!(
                "unknown action {other:?} (none, throttle:PCT, quarantine or migrate)"
            )),
        },
    }
}

pub(crate) fn action_name(r: Remediation) -> String {
    match r {
        Remediation::None => "none".into(),
        Remediation::Throttle { power_pct } => format!("throttle:{power_pct}"),
        Remediation::Quarantine => "quarantine".into(),
        Remediation::Migrate => "migrate".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One reading per second from t = 0, each made by `at(t)`.
    fn history(seconds: u64, at: impl Fn(u64) -> GpuSample) -> Vec<Reading> {
        (0..seconds)
            .map(|t| Reading {
                at_ms: t * 1000,
                sample: at(t),
            })
            .collect()
    }

    fn temperature(t: f32) -> GpuSample {
        GpuSample {
            temperature_c: t,
            ..GpuSample::empty(0)
        }
    }

    fn flat(toml_text: &str) -> Result<AlertRule, String> {
        let flat: FlatRule = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        flat.to_rule()
    }

    fn overheat() -> AlertRule {
        flat("name = \"hot\"\nmetric = \"temperature_c\"\nabove = 85\nfor = \"30s\"\nclear_after = \"20s\"")
            .expect("a valid rule")
    }

    #[test]
    fn above_fires_only_after_its_duration_and_clears_after_its_hysteresis() {
        let rule = overheat();
        // Hot from t = 10 on.
        let hot = |t| temperature(if t >= 10 { 90.0 } else { 60.0 });
        assert_eq!(
            evaluate(&rule, &history(25, |_| temperature(60.0))),
            Verdict::Clear
        );
        assert_eq!(
            evaluate(&rule, &history(10, hot)),
            Verdict::Undecided,
            "9 s of history"
        );
        assert_eq!(evaluate(&rule, &history(30, hot)), Verdict::Undecided);
        assert_eq!(
            evaluate(&rule, &history(40, hot)),
            Verdict::Undecided,
            "29 s hot"
        );
        assert_eq!(
            evaluate(&rule, &history(41, hot)),
            Verdict::Firing("temperature_c 90.0 above 85 for 30s".into())
        );
        // Cooled at t = 50: undecided until it has been cool for 20 s.
        let cooled = |t| temperature(if (10..50).contains(&t) { 90.0 } else { 70.0 });
        assert_eq!(evaluate(&rule, &history(55, cooled)), Verdict::Undecided);
        assert_eq!(evaluate(&rule, &history(71, cooled)), Verdict::Clear);
        assert_eq!(evaluate(&rule, &[]), Verdict::Undecided);
        assert_eq!(
            evaluate(&rule, &history(5, |_| temperature(99.0))),
            Verdict::Undecided,
            "too little history to fire for 30 s"
        );
    }

    #[test]
    fn rate_fires_on_a_fast_rising_counter() {
        let rule = flat(
            "name = \"ecc\"\nmetric = \"ecc_single_bit\"\nrate_per_minute = 10\nwindow = \"1m\"",
        )
        .expect("a valid rule");
        let slow = |t: u64| GpuSample {
            ecc_single_bit: t / 10,
            ..GpuSample::empty(0)
        };
        assert_eq!(
            evaluate(&rule, &history(120, slow)),
            Verdict::Clear,
            "6/min"
        );
        let fast = |t: u64| GpuSample {
            ecc_single_bit: t,
            ..GpuSample::empty(0)
        };
        assert!(
            matches!(evaluate(&rule, &history(120, fast)), Verdict::Firing(m) if m.contains("60.0/min"))
        );
    }

    #[test]
    fn predict_fires_before_the_limit_is_crossed() {
        let rule = flat(
            "name = \"fill\"\nmetric = \"memory_used_pct\"\npredict_limit = 100\nwindow = \"1m\"\nwithin = \"2m\"",
        )
        .expect("a valid rule");
        let filling = |per_s: u64| {
            move |t: u64| GpuSample {
                memory_used_mib: 100 + t * per_s,
                memory_total_mib: 10_000,
                ..GpuSample::empty(0)
            }
        };
        // 0.5 %/s at 31.5 % after 61 s: 137 s to go, later than 2 minutes.
        assert_eq!(evaluate(&rule, &history(62, filling(50))), Verdict::Clear);
        // 0.8 %/s at 48 %: 65 s to go.
        // A step (memory taken at a job's start, then flat) is no trend.
        let step = |t: u64| GpuSample {
            memory_used_mib: if t < 30 { 0 } else { 8_000 },
            memory_total_mib: 10_000,
            ..GpuSample::empty(0)
        };
        assert_eq!(evaluate(&rule, &history(60, step)), Verdict::Undecided);
        assert_eq!(evaluate(&rule, &history(95, step)), Verdict::Clear);
        match evaluate(&rule, &history(60, filling(80))) {
            Verdict::Firing(m) => assert!(
                m.starts_with("memory_used_pct 48.2 trending to 100 in 1m"),
                "{m}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn health_fires_on_a_fatal_xid_a_new_double_bit_error_or_a_lost_gpu() {
        let rule = flat("name = \"failing\"\nfatal_xids = [79, 48]\nclear_after = \"10s\"")
            .expect("a valid rule");
        let quiet = |_| GpuSample::empty(0);
        assert_eq!(evaluate(&rule, &history(20, quiet)), Verdict::Clear);
        let xid = |t| GpuSample {
            xid_events: if t == 15 { vec![13, 48] } else { vec![] },
            ..GpuSample::empty(0)
        };
        assert_eq!(
            evaluate(&rule, &history(20, xid)),
            Verdict::Firing("fatal XID 48".into())
        );
        assert_eq!(
            evaluate(&rule, &history(27, xid)),
            Verdict::Clear,
            "over 10 s after it"
        );
        let harmless = |t| GpuSample {
            xid_events: if t == 15 { vec![13] } else { vec![] },
            ..GpuSample::empty(0)
        };
        assert_eq!(evaluate(&rule, &history(20, harmless)), Verdict::Clear);
        let dbe = |t| GpuSample {
            ecc_double_bit: if t >= 18 { 3 } else { 2 },
            ..GpuSample::empty(0)
        };
        assert_eq!(
            evaluate(&rule, &history(20, dbe)),
            Verdict::Firing("double-bit ECC errors 2 -> 3".into())
        );
        let lost = |t| GpuSample {
            healthy: t < 19,
            error: (t >= 19).then(|| "GPU is lost".to_owned()),
            ..GpuSample::empty(0)
        };
        assert_eq!(
            evaluate(&rule, &history(20, lost)),
            Verdict::Firing("GPU cannot be read (GPU is lost)".into())
        );
    }

    #[test]
    fn bad_rules_are_refused_with_the_reason() {
        for (text, why) in [
            (
                "name = \"x\"\nmetric = \"tempreature\"\nabove = 1",
                "unknown metric \"tempreature\"",
            ),
            (
                "name = \"x\"\nmetric = \"power_w\"\nabove = 1\nfor = \"-5s\"",
                "for",
            ),
            ("name = \"x\"\nmetric = \"power_w\"", "exactly one of"),
            (
                "name = \"x\"\nmetric = \"power_w\"\nabove = 1\nrate_per_minute = 2",
                "exactly one of",
            ),
            ("name = \"x\"\nabove = 1", "a metric is required"),
            (
                "name = \"x\"\nmetric = \"power_w\"\nabove = 1\naction = \"reboot\"",
                "unknown action",
            ),
            (
                "name = \"x\"\nmetric = \"power_w\"\nabove = 1\naction = \"throttle:5\"",
                "10-100%",
            ),
            (
                "name = \"x\"\nmetric = \"power_w\"\nabove = 1\nseverity = \"meh\"",
                "unknown severity",
            ),
            ("name = \"x\"\nmetric = \"power_w\"\nabove = nan", "finite"),
            (
                "name = \"a/b\"\nmetric = \"power_w\"\nabove = 1",
                "alert rule",
            ),
            (
                "name = \"x\"\nmetric = \"power_w\"\nabove = 1\nfour = \"5s\"",
                "unknown field",
            ),
        ] {
            match flat(text) {
                Err(e) => assert!(e.contains(why), "{text:?}: {e:?} lacks {why:?}"),
                Ok(rule) => panic!("{text:?} was accepted: {rule:?}"),
            }
        }
    }

    #[test]
    fn flat_rules_round_trip() {
        for rule in gpu_raft_store::alert::builtin_rules() {
            assert_eq!(FlatRule::from_rule(&rule).to_rule(), Ok(rule));
        }
    }
}
