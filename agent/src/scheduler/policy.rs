//! `Policy`: which order pending jobs are considered in, how a job that does not fit affects
//! the ones behind it (strict queue, EASY backfill, greedy), and the knobs of each. Written as
//! a short spec string (`sjf+easy`, `priority+greedy`) on the command line and in the API.

use std::fmt;
use std::str::FromStr;

/// The order in which pending jobs are considered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ordering {
    /// Arrival order: the order the cluster accepted the jobs (job ids).
    Fcfs,
    /// Shortest (estimated or predicted) runtime first; jobs with no estimate go last.
    Sjf,
    /// Base priority, plus aging while the job waits, minus its tenant's share of recent usage.
    Priority,
    /// The tenant with the smallest share (GPUs held now plus decayed past usage, per weight)
    /// goes next; inside a tenant, priority then submission order.
    FairShare,
}

/// What a job that cannot be placed now does to the jobs queued behind it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backfill {
    /// A strict queue: nothing behind the first job that does not fit is started.
    Strict,
    /// EASY backfill: the first job that does not fit gets a reservation (the earliest time
    /// enough GPUs free up on one node); later jobs start only if they cannot delay it.
    Easy,
    /// Every job that fits starts now, whatever waits ahead of it (big jobs can starve).
    Greedy,
}

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
    /// Place jobs larger than any node on several nodes, all or nothing. Off in the agent:
    /// a replicated `Bind` names one node. The simulator turns it on.
    pub multi_node_gangs: bool,
    /// Compute user-facing reasons for jobs left pending (the simulator does not need them).
    pub explain: bool,
    /// Most placements proposed in one pass (one Raft entry).
    pub max_binds_per_pass: usize,
}

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

    /// The short spec (`ordering+backfill`) of this policy's ordering and backfill.
    pub fn spec(&self) -> String {
        format!("{}+{}", self.ordering, self.backfill)
    }
}

/// A policy spec that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "unknown scheduler policy {0:?}: expected ORDERING[+BACKFILL] with ORDERING one of fcfs, sjf, priority, fairshare and BACKFILL one of strict, easy, greedy"
)]
pub struct BadPolicy(pub String);

impl FromStr for Ordering {
    type Err = BadPolicy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fcfs" => Ok(Self::Fcfs),
            "sjf" => Ok(Self::Sjf),
            "priority" => Ok(Self::Priority),
            "fairshare" => Ok(Self::FairShare),
            _ => Err(BadPolicy(s.to_owned())),
        }
    }
}

impl FromStr for Backfill {
    type Err = BadPolicy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "strict" => Ok(Self::Strict),
            "easy" | "backfill" => Ok(Self::Easy),
            "greedy" => Ok(Self::Greedy),
            _ => Err(BadPolicy(s.to_owned())),
        }
    }
}

impl FromStr for Policy {
    type Err = BadPolicy;
    /// `fcfs`, `sjf+easy`, `priority+greedy`, … A missing backfill means `strict`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadPolicy(s.to_owned());
        let (ordering, backfill) = match s.split_once('+') {
            Some((o, b)) => (o, b),
            None => (s, "strict"),
        };
        let ordering = ordering.parse::<Ordering>().map_err(|_| bad())?;
        let backfill = backfill.parse::<Backfill>().map_err(|_| bad())?;
        Ok(Self::new(ordering, backfill))
    }
}

impl fmt::Display for Ordering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Fcfs => "fcfs",
            Self::Sjf => "sjf",
            Self::Priority => "priority",
            Self::FairShare => "fairshare",
        })
    }
}

impl fmt::Display for Backfill {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Strict => "strict",
            Self::Easy => "easy",
            Self::Greedy => "greedy",
        })
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
