//! The learned queue order (`Ordering::Learned`): a priority function of what the planner knows
//! about a pending job, with weights fitted in the simulator on one part of the Philly trace
//! (`scripts/learn-policy.py`, docs/scheduling.md). The shipped weights are the committed file
//! `learned_weights.json`; the simulator can try others (`gpu-agent simulate --weights FILE`).
//!
//! A job's score, lowest first:
//! `runtime × ln(1 + expected runtime in s) + gpus × ln(GPUs) + usage × tenant's share of
//! recent usage − wait × ln(1 + hours waited)`. With `runtime` 1 and the rest 0 it is SJF.
//! Every term but the wait is the same for a class of identical specs, and the wait only
//! favours the earlier of two jobs, so the queue keeps drawing class heads (`order.rs`).

use std::sync::LazyLock;

use serde::{Deserialize, Serialize};

const HOUR_MS: f64 = 3_600_000.0;

/// The weights of the learned priority function.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LearnedWeights {
    /// Per unit of ln(1 + expected runtime in seconds).
    pub runtime: f64,
    /// Per unit of ln(GPUs asked for).
    pub gpus: f64,
    /// Per unit of the tenant's share (0..=1) of all recent, decayed usage.
    pub usage: f64,
    /// Per unit of ln(1 + hours waited), taken off.
    pub wait: f64,
    /// The runtime assumed for a job with no estimate, prediction or time limit, seconds.
    pub unknown_runtime_s: f64,
}

/// The committed weights file: what it was fitted on, and the weights.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WeightsFile {
    /// Read so that a file without it is refused; shown by nothing.
    #[allow(dead_code)]
    about: String,
    weights: LearnedWeights,
}

/// The shipped weights, read once from the committed file.
static SHIPPED: LazyLock<LearnedWeights> = LazyLock::new(|| {
    parse(include_str!("learned_weights.json")).expect("the committed learned_weights.json reads")
});

impl LearnedWeights {
    /// The weights that ship with this build.
    pub fn shipped() -> Self {
        *SHIPPED
    }

    /// The score of a job that waited since `submitted_ms`, its class's terms being `base`
    /// (`class_term`). Lower goes first.
    pub(crate) fn score(&self, base: f64, submitted_ms: u64, now_ms: u64) -> f64 {
        let waited_h = now_ms.saturating_sub(submitted_ms) as f64 / HOUR_MS;
        base - self.wait * waited_h.ln_1p()
    }

    /// The terms that are the same for every job of a class: its expected runtime (if any),
    /// its GPU count and its tenant's usage share.
    pub(crate) fn class_term(&self, expected_ms: Option<u64>, gpus: u32, usage_share: f64) -> f64 {
        let runtime_s = expected_ms.map_or(self.unknown_runtime_s, |ms| ms as f64 / 1000.0);
        self.runtime * runtime_s.max(0.0).ln_1p()
            + self.gpus * f64::from(gpus.max(1)).ln()
            + self.usage * usage_share
    }
}

/// Read a weights file (JSON: `about` and `weights`); every weight must be finite.
pub fn parse(text: &str) -> Result<LearnedWeights, String> {
    let file: WeightsFile = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let w = file.weights;
    let all = [w.runtime, w.gpus, w.usage, w.wait, w.unknown_runtime_s];
    if all.iter().any(|v| !v.is_finite()) {
        return Err("every weight must be a finite number".into());
    }
    if w.unknown_runtime_s < 0.0 {
        return Err("unknown_runtime_s must not be negative".into());
    }
    // A negative wait weight would favour later jobs, and the queue could no longer draw a
    // class's jobs in submission order.
    if w.wait < 0.0 {
        return Err("wait must not be negative".into());
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_weights_read() {
        let w = LearnedWeights::shipped();
        assert!(w.runtime.is_finite());
    }

    #[test]
    fn bad_weights_files_are_refused() {
        for bad in [
            "{}",
            r#"{"about":"x","weights":{"runtime":1}}"#,
            r#"{"about":"x","weights":{"runtime":1,"gpus":0,"usage":0,"wait":0,"unknown_runtime_s":-1}}"#,
            r#"{"about":"x","weights":{"runtime":1,"gpus":0,"usage":0,"wait":-1,"unknown_runtime_s":1}}"#,
            r#"{"about":"x","weights":{"runtime":1,"gpus":0,"usage":0,"wait":0,"unknown_runtime_s":1,"extra":2}}"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn runtime_alone_orders_like_sjf_and_waiting_moves_a_job_up() {
        let sjf = LearnedWeights {
            runtime: 1.0,
            gpus: 0.0,
            usage: 0.0,
            wait: 0.5,
            unknown_runtime_s: 1e9,
        };
        let short = sjf.class_term(Some(60_000), 8, 0.0);
        let long = sjf.class_term(Some(3_600_000), 1, 0.0);
        let unknown = sjf.class_term(None, 1, 0.0);
        assert!(short < long && long < unknown);
        assert!(sjf.score(long, 0, 10 * 3_600_000) < sjf.score(long, 0, 0));
    }
}
