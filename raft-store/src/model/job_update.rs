//! `JobUpdate`: what may change in a pending job's spec (Slurm's `scontrol update`): its
//! priority, a shorter time limit, its GPU count. Everything else a spec says stays as it was
//! submitted.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::model::job::JobSpec;
use crate::model::validate;

/// The changes one `job update` asks for; `None` leaves that part as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobUpdate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// A time limit no longer than the job's current one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_time_limit_s: Option<u64>,
    /// Whole GPUs in all (split evenly over a gang's nodes, as at submission).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
}

impl JobUpdate {
    pub fn is_empty(&self) -> bool {
        *self == JobUpdate::default()
    }

    /// `spec` with the update made, checked as a submission's spec is. A longer time limit
    /// is refused: the limit is what the scheduler's backfill and the tenant's plans rely on,
    /// so a user may only promise less (an admin who wants more resubmits).
    pub fn applied_to(&self, spec: &JobSpec) -> Result<JobSpec, String> {
        if self.is_empty() {
            return Err(
                "an update must change the priority, the time limit or the GPU count".into(),
            );
        }
        let mut updated = spec.clone();
        if let Some(priority) = self.priority {
            updated.priority = priority;
        }
        if let Some(limit) = self.wall_time_limit_s {
            if let Some(current) = spec.wall_time_limit_s
                && limit > current
            {
                return Err(format!(
                    "the time limit can only be shortened: {limit} s is longer than the job's {current} s"
                ));
            }
            updated.wall_time_limit_s = Some(limit);
        }
        if let Some(gpus) = self.gpus {
            if spec.gpus == 0 && gpus > 0 || spec.gpus > 0 && gpus == 0 {
                return Err(
                    "a CPU-only job stays CPU-only and a GPU job keeps at least one GPU".into(),
                );
            }
            updated.gpus = gpus;
        }
        validate::job_spec(&updated)?;
        Ok(updated)
    }
}

impl fmt::Display for JobUpdate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(p) = self.priority {
            parts.push(format!("priority={p}"));
        }
        if let Some(t) = self.wall_time_limit_s {
            parts.push(format!("time={t}s"));
        }
        if let Some(g) = self.gpus {
            parts.push(format!("gpus={g}"));
        }
        f.write_str(&parts.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(gpus: u32, limit: Option<u64>) -> JobSpec {
        JobSpec {
            name: "train".into(),
            command: vec!["true".into()],
            gpus,
            wall_time_limit_s: limit,
            ..JobSpec::default()
        }
    }

    #[test]
    fn it_changes_only_what_it_names() {
        let update = JobUpdate {
            priority: Some(5),
            ..JobUpdate::default()
        };
        let updated = update.applied_to(&spec(2, Some(60))).expect("applies");
        assert_eq!(updated.priority, 5);
        assert_eq!((updated.gpus, updated.wall_time_limit_s), (2, Some(60)));
    }

    #[test]
    fn a_time_limit_only_shrinks_and_any_limit_is_shorter_than_none() {
        let shorter = |s| JobUpdate {
            wall_time_limit_s: Some(s),
            ..JobUpdate::default()
        };
        assert_eq!(
            shorter(30)
                .applied_to(&spec(1, Some(60)))
                .expect("applies")
                .wall_time_limit_s,
            Some(30)
        );
        let longer = shorter(61)
            .applied_to(&spec(1, Some(60)))
            .expect_err("refused");
        assert!(longer.contains("only be shortened"), "{longer}");
        assert!(shorter(10_000).applied_to(&spec(1, None)).is_ok());
    }

    #[test]
    fn a_gpu_count_is_checked_as_at_submission() {
        let gpus = |g| JobUpdate {
            gpus: Some(g),
            ..JobUpdate::default()
        };
        assert_eq!(gpus(4).applied_to(&spec(1, None)).expect("applies").gpus, 4);
        assert!(gpus(0).applied_to(&spec(1, None)).is_err());
        assert!(gpus(1).applied_to(&spec(0, None)).is_err());
        let gang = JobSpec {
            nodes: 2,
            ..spec(4, None)
        };
        let uneven = gpus(3).applied_to(&gang).expect_err("refused");
        assert!(!uneven.is_empty());
        assert!(JobUpdate::default().applied_to(&spec(1, None)).is_err());
    }
}
