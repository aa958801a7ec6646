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

/// The leader's last `PlanEnv`, reused between ticks with only "now" moved on: usage and
/// history are rebuilt when asked to (on the tick) or when the settings they depend on
/// changed.
#[derive(Default)]
pub(crate) struct EnvCache {
    cached: Option<(EnvKey, PlanEnv)>,
}

/// The policy knobs a `PlanEnv` is built with.
type EnvKey = (u64, bool);

impl EnvCache {
    pub(crate) fn get(
        &mut self,
        state: &ClusterState,
        policy: &Policy,
        now_ms: u64,
        rebuild: bool,
    ) -> &PlanEnv {
        let key = (policy.usage_half_life_ms, policy.predict);
        let (_, env) = match self.cached.take() {
            Some((k, mut env)) if k == key && !rebuild => {
                env.now_ms = now_ms;
                self.cached.insert((k, env))
            }
            _ => self
                .cached
                .insert((key, PlanEnv::from_state(state, policy, now_ms))),
        };
        env
    }
}

#[cfg(test)]
mod tests {
    use gpu_raft_store::{ClusterState, JobState};

    use super::*;
    use crate::scheduler::testkit::{spec, submit};

    /// A state whose one job ran from 0 to 1,000 ms.
    fn one_finished_run() -> ClusterState {
        let mut s = ClusterState::default();
        submit(&mut s, spec(1, 0));
        let job = s.jobs.values_mut().next().expect("submitted");
        job.state = JobState::Succeeded;
        job.started_at_ms = Some(0);
        job.finished_at_ms = Some(1_000);
        s
    }

    #[test]
    fn usage_is_rebuilt_on_request_or_when_its_knobs_change() {
        let policy = Policy::default();
        let mut cache = EnvCache::default();
        let empty = ClusterState::default();
        let used = |env: &PlanEnv| env.usage.at(&[], env.now_ms).get("default").copied();

        assert_eq!(used(cache.get(&empty, &policy, 2_000, false)), None);
        let s = one_finished_run();
        // Between ticks: the same terms, a later "now".
        let reused = cache.get(&s, &policy, 3_000, false);
        assert_eq!((used(reused), reused.now_ms), (None, 3_000));
        // The tick rebuilds them.
        assert!(used(cache.get(&s, &policy, 3_000, true)).is_some());

        let mut cache = EnvCache::default();
        cache.get(&empty, &policy, 2_000, false);
        let other = Policy {
            usage_half_life_ms: policy.usage_half_life_ms / 2,
            ..policy
        };
        assert!(used(cache.get(&s, &other, 3_000, false)).is_some());
    }
}
