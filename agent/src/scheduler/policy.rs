//! `Policy`: which order pending jobs are considered in, how a job that does not fit affects
//! the ones behind it (strict queue, EASY backfill, greedy), and the knobs of each. Written as
//! a short spec string (`sjf+easy`, `priority+greedy`) on the command line and in the API.

use std::str::FromStr;

use gpu_raft_store::Job;
pub use gpu_raft_store::scheduler::{Backfill, BadPolicy, Ordering};
use gpu_raft_store::scheduler::{SchedulerSettings, parse_spec};

use super::learned::LearnedWeights;

/// How the scheduler decides. `Policy::default()` is v1's behaviour: priority then submission
/// order, greedy, no aging, no fair-share term.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    pub ordering: Ordering,
    pub backfill: Backfill,
    /// Priority points a job gains per hour of waiting (`Ordering::Priority`).
    pub aging_per_hour: f64,
    /// Priority points taken from a job whose tenant holds all recent usage
    /// (`Ordering::Priority`; scaled by the tenant's share, 0..=1).
    pub fairshare_weight: f64,
    /// Half-life of past usage in the fair-share terms, in milliseconds.
    pub usage_half_life_ms: u64,
    /// Use runtime predictions from history when a job has no estimate of its own.
    pub predict: bool,
    /// Place jobs larger than any node on several nodes, all or nothing, split however the
    /// free GPUs allow (the trace's jobs name no node count). Off in the agent, where a gang
    /// is asked for (`JobSpec::nodes`) and split evenly; the simulator turns it on.
    pub multi_node_gangs: bool,
    /// Compute user-facing reasons for jobs left pending (the simulator does not need them).
    pub explain: bool,
    /// Most placements proposed in one pass (one Raft entry).
    pub max_binds_per_pass: usize,
    /// Place MIG and shared slices on the most used GPU that fits (fragmentation-aware); off:
    /// the first GPU that fits, in node and GPU order (the simulator's baseline).
    pub slice_best_fit: bool,
    /// What a node lacking a container job's image costs in placement, in GPUs of hole left
    /// idle: a node holding the image wins over one that fits as well or up to this many GPUs
    /// better. 0: image locality off.
    pub image_locality: usize,
    /// The starvation guard (`SchedulerSettings::gang_wait_limit_s`): a gang pending this long
    /// goes first and holds the queue with a reservation in any backfill mode.
    pub gang_wait_limit_ms: Option<u64>,
    /// The weights of the learned ordering (`Ordering::Learned`): the shipped ones unless the
    /// simulator is told otherwise.
    pub learned: LearnedWeights,
}

/// `Policy::image_locality` by default: a node holding the image wins over one whose hole is
/// one GPU smaller (equal cost: the smaller hole). Measured in `image_locality_tests.rs`
/// (docs/scheduling.md).
pub(crate) const DEFAULT_IMAGE_LOCALITY: usize = 2;

/// One day: the default half-life of past usage.
pub const DEFAULT_HALF_LIFE_MS: u64 = 24 * 3600 * 1000;

impl Default for Policy {
    fn default() -> Self {
        Self {
            ordering: Ordering::Priority,
            backfill: Backfill::Greedy,
            aging_per_hour: 0.0,
            fairshare_weight: 0.0,
            usage_half_life_ms: DEFAULT_HALF_LIFE_MS,
            predict: true,
            multi_node_gangs: false,
            explain: true,
            max_binds_per_pass: 1024,
            slice_best_fit: true,
            image_locality: DEFAULT_IMAGE_LOCALITY,
            gang_wait_limit_ms: None,
            learned: LearnedWeights::shipped(),
        }
    }
}

impl Policy {
    /// A policy with this ordering and backfill and the default knobs for them: the dynamic
    /// priority ordering ages jobs by one point an hour and weighs fair share by ten points.
    pub fn new(ordering: Ordering, backfill: Backfill) -> Self {
        let dynamic = ordering == Ordering::Priority;
        Self {
            ordering,
            backfill,
            aging_per_hour: if dynamic { 1.0 } else { 0.0 },
            fairshare_weight: if dynamic { 10.0 } else { 0.0 },
            ..Self::default()
        }
    }

    /// This policy with the cluster's replicated settings applied (what the leader plans with).
    pub fn with_settings(&self, settings: &SchedulerSettings) -> Self {
        Self {
            ordering: settings.ordering,
            backfill: settings.backfill,
            aging_per_hour: f64::from(settings.aging_per_hour),
            fairshare_weight: f64::from(settings.fairshare_weight),
            usage_half_life_ms: settings.usage_half_life_s.saturating_mul(1000),
            gang_wait_limit_ms: settings.gang_wait_limit_ms(),
            ..self.clone()
        }
    }

    /// Whether `job` is a gang asked for (`JobSpec::nodes` > 1) pending for at least the
    /// starvation guard's limit at `now_ms` (what `ClusterState::is_starving_gang` says under
    /// the settings this policy was made from).
    pub(crate) fn is_starving_gang(&self, job: &Job, now_ms: u64) -> bool {
        job.spec.nodes > 1
            && self
                .gang_wait_limit_ms
                .is_some_and(|limit| now_ms.saturating_sub(job.submitted_at_ms) >= limit)
    }

    /// The short spec (`ordering+backfill`) of this policy's ordering and backfill.
    pub fn spec(&self) -> String {
        format!("{}+{}", self.ordering, self.backfill)
    }
}

impl FromStr for Policy {
    type Err = BadPolicy;
    /// `fcfs`, `sjf+easy`, `priority+greedy`, … A missing backfill means `strict`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (ordering, backfill) = parse_spec(s)?;
        Ok(Self::new(ordering, backfill))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_print_back() {
        for (input, shown) in [
            ("fcfs", "fcfs+strict"),
            ("sjf+easy", "sjf+easy"),
            ("sjf+backfill", "sjf+easy"),
            ("priority+greedy", "priority+greedy"),
            ("fairshare+strict", "fairshare+strict"),
        ] {
            let p: Policy = input.parse().expect(input);
            assert_eq!(p.spec(), shown);
        }
        assert_eq!(Policy::default().spec(), "priority+greedy");
        for bad in ["", "lifo", "sjf+", "+easy", "sjf+easy+greedy", "SJF"] {
            assert!(bad.parse::<Policy>().is_err(), "{bad:?} must not parse");
        }
    }
}
