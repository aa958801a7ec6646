//! `PlanEnv`: everything a pass needs besides the state and the policy — the time ("now",
//! virtual in the simulator, the proposal time in the leader), past usage for fair share and
//! runtime history for predictions. The core never reads a clock.

use gpu_raft_store::{ClusterState, Job, JobSpec};

use super::history::RuntimeHistory;
use super::policy::Policy;
use super::usage::TenantUsage;

/// The inputs of one pass that are not in the replicated state.
#[derive(Clone, Debug)]
pub struct PlanEnv {
    /// The pass's "now", in milliseconds since the epoch (or since the trace began).
    pub now_ms: u64,
    /// Decayed usage of finished runs per tenant.
    pub usage: TenantUsage,
    /// Recent runtimes, for predictions.
    pub history: RuntimeHistory,
}

impl PlanEnv {
    /// An environment with no history (a fresh cluster, or a test).
    pub fn new(now_ms: u64, policy: &Policy) -> Self {
        Self {
            now_ms,
            usage: TenantUsage::new(policy.usage_half_life_ms),
            history: RuntimeHistory::default(),
        }
    }

    /// The environment the leader plans in: usage and history rebuilt from the jobs the state
    /// still holds.
    pub fn from_state(state: &ClusterState, policy: &Policy, now_ms: u64) -> Self {
        Self {
            now_ms,
            usage: TenantUsage::from_state(state, policy.usage_half_life_ms, now_ms),
            history: if policy.predict {
                RuntimeHistory::from_state(state)
            } else {
                RuntimeHistory::default()
            },
        }
    }

    /// How long a job with `spec` is expected to run: the user's estimate, else a prediction
    /// from history (when the policy uses them), else its wall-time limit.
    pub fn estimate_ms(&self, spec: &JobSpec, policy: &Policy) -> Option<u64> {
        spec.runtime_estimate_s
            .map(|s| s.saturating_mul(1000))
            .or_else(|| {
                policy
                    .predict
                    .then(|| self.history.predict_ms(spec))
                    .flatten()
            })
            .or_else(|| spec.wall_time_limit_s.map(|s| s.saturating_mul(1000)))
    }

    /// When a live job is expected to end (never before now), if it has an estimate.
    pub fn expected_end_ms(&self, job: &Job, policy: &Policy) -> Option<u64> {
        let start = job.started_at_ms.or(job.bound_at_ms)?;
        let estimate = self.estimate_ms(&job.spec, policy)?;
        Some(start.saturating_add(estimate).max(self.now_ms))
    }
}
