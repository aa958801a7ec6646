//! The figures of one replay: job completion time, queueing delay, makespan, utilization,
//! bounded slowdown, Jain's fairness index across tenants, finish-time fairness, GPU-hours
//! lost to fragmentation, and how good the runtime predictions were.

use serde::Serialize;

use super::engine::Replay;
use super::fairness::{Ideal, TenantFairness};

const HOUR_MS: f64 = 3_600_000.0;
/// Bounded slowdown does not let jobs shorter than this inflate the figure.
const SLOWDOWN_FLOOR_MS: u64 = 10_000;

/// One policy's results. Times are in hours. This is the stable `-o json` shape.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub policy: String,
    pub jobs: usize,
    pub never_placed: usize,
    pub avg_jct_h: f64,
    pub p50_jct_h: f64,
    pub p99_jct_h: f64,
    pub avg_queue_h: f64,
    pub p99_queue_h: f64,
    pub makespan_h: f64,
    /// Busy GPU-time over (GPUs × makespan).
    pub utilization: f64,
    pub avg_bounded_slowdown: f64,
    /// Jain's index over tenants of 1 / (the tenant's mean bounded slowdown): 1 when every
    /// tenant is slowed down alike, 1/n when one tenant gets all the service.
    pub jain_fairness: f64,
    pub fragmentation_gpu_h: f64,
    /// The largest finish-time fairness of any tenant (`fairness.rs`): its mean JCT over its
    /// mean JCT in the ideal weighted fair share. 1 or less: as good as its share promises.
    pub max_finish_time_fairness: f64,
    /// The tenant with the largest finish-time fairness.
    pub least_fairly_served: String,
    /// Jain's index over the tenants' finish-time fairness.
    pub finish_time_fairness_jain: f64,
    /// Runs the replay's preemption pass stopped (0 with preemption off).
    pub preemptions: u64,
    /// Gangs (jobs run evenly over several nodes) that ran.
    pub gangs: usize,
    /// The longest and the mean time a gang waited before its first start.
    pub max_gang_queue_h: f64,
    pub avg_gang_queue_h: f64,
    /// Jobs for which history had a prediction when they started.
    pub prediction_coverage: f64,
    /// Median of |predicted − actual| / actual over predicted jobs.
    pub prediction_median_rel_error: f64,
    /// Share of predicted jobs whose prediction was within a factor of 2.
    pub prediction_within_2x: f64,
    pub scheduler_passes: u64,
    /// Wall time of the replay, seconds.
    pub replay_s: f64,
    /// Per tenant, how it fared against the ideal share.
    pub tenants: Vec<TenantFairness>,
}

/// Summarise a replay; `ideal` is the trace's fluid fair share (`fairness::Ideal`).
pub(crate) fn summarize(policy: &str, r: &Replay, ideal: &Ideal) -> Summary {
    let n = r.records.len().max(1) as f64;
    let mut jct: Vec<u64> = r.records.iter().map(|j| j.end_ms - j.submit_ms).collect();
    let mut queue: Vec<u64> = r.records.iter().map(|j| j.start_ms - j.submit_ms).collect();
    jct.sort_unstable();
    queue.sort_unstable();
    let first = r.records.iter().map(|j| j.submit_ms).min().unwrap_or(0);
    let last = r.records.iter().map(|j| j.end_ms).max().unwrap_or(0);
    let makespan = last.saturating_sub(first);
    let busy: f64 = r.records.iter().map(|j| j.gpu_ms as f64).sum();
    let slowdown = |j: &super::engine::JobRecord| {
        let run = (j.end_ms - j.start_ms).max(SLOWDOWN_FLOOR_MS) as f64;
        ((j.end_ms - j.submit_ms) as f64 / run).max(1.0)
    };
    let mut per_tenant = vec![(0.0, 0usize); r.tenants.len()];
    for j in &r.records {
        per_tenant[j.tenant].0 += slowdown(j);
        per_tenant[j.tenant].1 += 1;
    }
    let service: Vec<f64> = per_tenant
        .iter()
        .filter(|(_, count)| *count > 0)
        .map(|(sum, count)| *count as f64 / sum)
        .collect();
    let (mut errors, mut within) = (Vec::new(), 0usize);
    for j in &r.records {
        if let Some(p) = j.predicted_ms {
            let actual = (j.end_ms - j.start_ms).max(1) as f64;
            let p = (p.max(1)) as f64;
            errors.push((p - actual).abs() / actual);
            if p <= 2.0 * actual && actual <= 2.0 * p {
                within += 1;
            }
        }
    }
    errors.sort_by(f64::total_cmp);
    let tenants = ideal.judge(r);
    let ftf: Vec<f64> = tenants.iter().map(|t| t.finish_time_fairness).collect();
    let worst = tenants
        .iter()
        .max_by(|a, b| a.finish_time_fairness.total_cmp(&b.finish_time_fairness));
    let predicted = errors.len().max(1) as f64;
    let gang_waits: Vec<u64> = r
        .records
        .iter()
        .filter(|j| j.gang)
        .map(|j| j.start_ms - j.submit_ms)
        .collect();
    Summary {
        policy: policy.to_owned(),
        jobs: r.records.len(),
        never_placed: r.never_placed,
        avg_jct_h: jct.iter().sum::<u64>() as f64 / n / HOUR_MS,
        p50_jct_h: percentile(&jct, 0.50) / HOUR_MS,
        p99_jct_h: percentile(&jct, 0.99) / HOUR_MS,
        avg_queue_h: queue.iter().sum::<u64>() as f64 / n / HOUR_MS,
        p99_queue_h: percentile(&queue, 0.99) / HOUR_MS,
        makespan_h: makespan as f64 / HOUR_MS,
        utilization: if makespan == 0 {
            0.0
        } else {
            busy / (r.total_gpus as f64 * makespan as f64)
        },
        avg_bounded_slowdown: r.records.iter().map(slowdown).sum::<f64>() / n,
        jain_fairness: jain(&service),
        fragmentation_gpu_h: r.fragmented_gpu_ms / HOUR_MS,
        max_finish_time_fairness: worst.map_or(1.0, |t| t.finish_time_fairness),
        least_fairly_served: worst.map(|t| t.tenant.clone()).unwrap_or_default(),
        finish_time_fairness_jain: jain(&ftf),
        preemptions: r.preemptions,
        gangs: gang_waits.len(),
        max_gang_queue_h: gang_waits.iter().max().copied().unwrap_or(0) as f64 / HOUR_MS,
        avg_gang_queue_h: gang_waits.iter().sum::<u64>() as f64
            / gang_waits.len().max(1) as f64
            / HOUR_MS,
        prediction_coverage: errors.len() as f64 / n,
        prediction_median_rel_error: errors.get(errors.len() / 2).copied().unwrap_or(0.0),
        prediction_within_2x: within as f64 / predicted,
        scheduler_passes: r.passes,
        replay_s: r.wall.as_secs_f64(),
        tenants,
    }
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64
}

/// Jain's fairness index: (Σx)² / (n·Σx²).
pub(crate) fn jain(x: &[f64]) -> f64 {
    let sum: f64 = x.iter().sum();
    let squares: f64 = x.iter().map(|v| v * v).sum();
    if x.is_empty() || squares == 0.0 {
        return 1.0;
    }
    sum * sum / (x.len() as f64 * squares)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_is_one_when_equal_and_one_over_n_when_one_takes_all() {
        assert!((jain(&[2.0, 2.0, 2.0]) - 1.0).abs() < 1e-12);
        assert!((jain(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[7], 0.99), 7.0);
    }
}
