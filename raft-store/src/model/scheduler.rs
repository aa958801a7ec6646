//! The replicated scheduler settings: which queue order and backfill mode the leader plans
//! with, and their knobs. Changed at runtime with `Command::SetSchedulerPolicy`; `apply`
//! validates every value and a rejected change leaves the settings untouched.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The order in which pending jobs are considered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ordering {
    /// Arrival order: the order the cluster accepted the jobs (job ids).
    Fcfs,
    /// Shortest (estimated or predicted) runtime first; jobs with no estimate go last.
    Sjf,
    /// Base priority, plus aging while the job waits, minus its tenant's share of recent usage.
    Priority,
    /// The tenant with the smallest share (GPUs held now plus decayed past usage, per weight)
    /// goes next; inside a tenant, priority then submission order.
    #[serde(rename = "fairshare")]
    FairShare,
    /// A learned priority function of the job's expected runtime, GPU count, its tenant's
    /// recent usage and its wait (the weights ship with the agent).
    Learned,
}

/// What a job that cannot be placed now does to the jobs queued behind it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backfill {
    /// A strict queue: nothing behind the first job that does not fit is started.
    Strict,
    /// EASY backfill: the first job that does not fit gets a reservation (the earliest time
    /// enough GPUs free up on one node); later jobs start only if they cannot delay it.
    Easy,
    /// Every job that fits starts now, whatever waits ahead of it (big jobs can starve).
    Greedy,
    /// Conservative backfill: every job that does not fit gets a reservation, in queue order,
    /// each counting on those before it; a later job starts only if it delays none of them.
    Conservative,
}

/// Whether the leader stops running jobs to make room.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Preemption {
    /// Never (v1's behaviour).
    #[default]
    Off,
    /// Quota reclaim only: a tenant within its guarantee may take GPUs back from borrowers.
    Reclaim,
    /// Reclaim, and a job may stop strictly lower-priority jobs (never to let a borrower run).
    Priority,
}

impl Preemption {
    pub fn is_off(&self) -> bool {
        *self == Self::Off
    }
}

impl FromStr for Preemption {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" => Ok(Self::Off),
            "reclaim" => Ok(Self::Reclaim),
            "priority" => Ok(Self::Priority),
            _ => Err(format!(
                "unknown preemption mode {s:?}: expected off, reclaim or priority"
            )),
        }
    }
}

impl fmt::Display for Preemption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Off => "off",
            Self::Reclaim => "reclaim",
            Self::Priority => "priority",
        })
    }
}

/// Most aging or fair-share points accepted.
pub const MAX_POINTS: u32 = 10_000;
/// Shortest and longest usage half-life accepted, in seconds (a minute to a year).
pub const HALF_LIFE_RANGE_S: std::ops::RangeInclusive<u64> = 60..=365 * 86_400;

/// The scheduler policy the cluster agreed on. The default is v1's behaviour: priority then
/// submission order, greedy, no aging, no fair-share term.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchedulerSettings {
    pub ordering: Ordering,
    pub backfill: Backfill,
    /// Priority points a waiting job gains per hour (`priority` ordering).
    #[serde(default)]
    pub aging_per_hour: u32,
    /// Points taken from a job whose tenant holds all recent usage (`priority` ordering).
    #[serde(default)]
    pub fairshare_weight: u32,
    /// Half-life of past usage in the fair-share terms.
    #[serde(default = "one_day")]
    pub usage_half_life_s: u64,
    /// When the leader preempts running jobs. Not written when off, so entries from before it
    /// existed keep their bytes.
    #[serde(default, skip_serializing_if = "Preemption::is_off")]
    pub preemption: Preemption,
    /// The starvation guard: a gang (a job on several nodes) pending this long goes to the
    /// head of the queue and holds it with a reservation in any backfill mode, and with
    /// preemption on it may stop runs of no higher priority. 0: off. Not written when off.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gang_wait_limit_s: u64,
    /// A run placed less than this long ago is never preempted (Slurm's `PreemptExemptTime`):
    /// it damps a borrower stopped, placed again and stopped again. 0: off. Not written when
    /// off.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub preempt_exempt_s: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn one_day() -> u64 {
    86_400
}

impl Default for SchedulerSettings {
    fn default() -> Self {
        Self {
            ordering: Ordering::Priority,
            backfill: Backfill::Greedy,
            aging_per_hour: 0,
            fairshare_weight: 0,
            usage_half_life_s: one_day(),
            preemption: Preemption::Off,
            gang_wait_limit_s: 0,
            preempt_exempt_s: 0,
        }
    }
}

impl SchedulerSettings {
    /// The rules `apply` enforces.
    pub fn validate(&self) -> Result<(), String> {
        if self.aging_per_hour > MAX_POINTS || self.fairshare_weight > MAX_POINTS {
            return Err(format!(
                "aging and fair-share weight must be at most {MAX_POINTS} points"
            ));
        }
        if !HALF_LIFE_RANGE_S.contains(&self.usage_half_life_s) {
            return Err(format!(
                "usage half-life must be {}..={} seconds, got {}",
                HALF_LIFE_RANGE_S.start(),
                HALF_LIFE_RANGE_S.end(),
                self.usage_half_life_s
            ));
        }
        if self.gang_wait_limit_s != 0 && !GANG_WAIT_LIMIT_RANGE_S.contains(&self.gang_wait_limit_s)
        {
            return Err(format!(
                "gang wait limit must be 0 (off) or {}..={} seconds, got {}",
                GANG_WAIT_LIMIT_RANGE_S.start(),
                GANG_WAIT_LIMIT_RANGE_S.end(),
                self.gang_wait_limit_s
            ));
        }
        if self.preempt_exempt_s != 0 && !PREEMPT_EXEMPT_RANGE_S.contains(&self.preempt_exempt_s) {
            return Err(format!(
                "preempt exempt time must be 0 (off) or {}..={} seconds, got {}",
                PREEMPT_EXEMPT_RANGE_S.start(),
                PREEMPT_EXEMPT_RANGE_S.end(),
                self.preempt_exempt_s
            ));
        }
        Ok(())
    }

    /// When a run placed at `placed_ms` may first be preempted.
    pub fn preemptible_from_ms(&self, placed_ms: u64) -> u64 {
        placed_ms.saturating_add(self.preempt_exempt_s.saturating_mul(1000))
    }

    /// The starvation guard's limit in milliseconds, when it is on.
    pub fn gang_wait_limit_ms(&self) -> Option<u64> {
        (self.gang_wait_limit_s != 0).then(|| self.gang_wait_limit_s.saturating_mul(1000))
    }

    /// `ordering+backfill`, e.g. `sjf+easy`.
    pub fn spec(&self) -> String {
        format!("{}+{}", self.ordering, self.backfill)
    }
}

/// Shortest and longest gang wait limit accepted, in seconds (a minute to 30 days).
pub const GANG_WAIT_LIMIT_RANGE_S: std::ops::RangeInclusive<u64> = 60..=30 * 86_400;
/// Shortest and longest preempt exempt time accepted, in seconds (a minute to 7 days).
pub const PREEMPT_EXEMPT_RANGE_S: std::ops::RangeInclusive<u64> = 60..=7 * 86_400;

/// A policy word that is not known.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "unknown scheduler policy {0:?}: expected ORDERING[+BACKFILL] with ORDERING one of fcfs, sjf, priority, fairshare, learned and BACKFILL one of strict, easy, greedy, conservative"
)]
pub struct BadPolicy(pub String);

/// Parse `ORDERING[+BACKFILL]`; a missing backfill means `strict`.
pub fn parse_spec(s: &str) -> Result<(Ordering, Backfill), BadPolicy> {
    let bad = || BadPolicy(s.to_owned());
    let (ordering, backfill) = s.split_once('+').unwrap_or((s, "strict"));
    Ok((
        ordering.parse().map_err(|_| bad())?,
        backfill.parse().map_err(|_| bad())?,
    ))
}

impl FromStr for Ordering {
    type Err = BadPolicy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fcfs" => Ok(Self::Fcfs),
            "sjf" => Ok(Self::Sjf),
            "priority" => Ok(Self::Priority),
            "fairshare" => Ok(Self::FairShare),
            "learned" => Ok(Self::Learned),
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
            "conservative" => Ok(Self::Conservative),
            _ => Err(BadPolicy(s.to_owned())),
        }
    }
}

impl fmt::Display for Ordering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Fcfs => "fcfs",
            Self::Sjf => "sjf",
            Self::Priority => "priority",
            Self::FairShare => "fairshare",
            Self::Learned => "learned",
        })
    }
}

impl Backfill {
    /// Whether a job that cannot start takes a reservation (EASY, conservative).
    pub fn reserves(self) -> bool {
        matches!(self, Self::Easy | Self::Conservative)
    }
}

impl fmt::Display for Backfill {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Strict => "strict",
            Self::Easy => "easy",
            Self::Greedy => "greedy",
            Self::Conservative => "conservative",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_policy_words_do_not_decode_or_parse() {
        assert!(
            serde_json::from_str::<SchedulerSettings>(r#"{"ordering":"lifo","backfill":"easy"}"#)
                .is_err()
        );
        assert_eq!(
            parse_spec("fairshare+easy"),
            Ok((Ordering::FairShare, Backfill::Easy))
        );
        assert_eq!(parse_spec("sjf"), Ok((Ordering::Sjf, Backfill::Strict)));
        for bad in ["", "lifo", "sjf+", "+easy", "sjf+easy+greedy", "SJF"] {
            assert!(parse_spec(bad).is_err(), "{bad:?}");
        }
        // Old states without settings decode to the default.
        let old: SchedulerSettings =
            serde_json::from_str(r#"{"ordering":"priority","backfill":"greedy"}"#).expect("decode");
        assert_eq!(old, SchedulerSettings::default());
    }
}
