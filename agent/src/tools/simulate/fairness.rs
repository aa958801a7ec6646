//! Finish-time fairness (Themis, NSDI '20): a tenant's mean JCT in the shared cluster over its
//! mean JCT in the ideal fair share, where every tenant with work gets its weighted share of
//! the GPUs. A tenant with ρ ≤ 1 did as well as the ideal promises; ρ = 3 means its jobs took
//! three times as long as its share of the cluster would have taken.
//!
//! The ideal is a fluid one: at every moment the tenants with jobs submitted and not done
//! split the cluster's GPUs by weight (weighted max-min: a tenant asking for less than its
//! share gets what it asks, the rest goes to the others), and each tenant runs its own jobs in
//! arrival order on what it gets, each job up to its GPU count (a job given fewer GPUs than it
//! asks for runs proportionally slower). It is the same for every policy, so ρ compares
//! policies directly, and it has no fragmentation and no waiting for whole GPUs, so a real
//! scheduler is rarely below 1 for long.

use serde::Serialize;

use super::engine::{Replay, tenant_indices};
use super::trace::TraceJob;

const HOUR_MS: f64 = 3_600_000.0;

/// One job as the ideal sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FluidJob {
    pub submit_ms: u64,
    pub duration_ms: u64,
    pub gpus: u32,
    pub tenant: usize,
}

/// How one tenant fared against its ideal share.
#[derive(Clone, Debug, Serialize)]
pub struct TenantFairness {
    pub tenant: String,
    pub jobs: usize,
    pub avg_jct_h: f64,
    /// Mean JCT of the same jobs in the ideal fair share.
    pub ideal_avg_jct_h: f64,
    /// `avg_jct_h / ideal_avg_jct_h`.
    pub finish_time_fairness: f64,
}

/// Each job's completion time (end − submit, milliseconds) in the ideal fair share of
/// `capacity` GPUs among tenants weighted by `weights` (indexed by `FluidJob::tenant`).
/// `jobs` must be sorted by submission time.
pub(crate) fn ideal_jct_ms(jobs: &[FluidJob], capacity: f64, weights: &[f64]) -> Vec<f64> {
    let mut jct = vec![0.0; jobs.len()];
    // Per tenant, its jobs present, in arrival order.
    let mut present: Vec<Vec<usize>> = vec![Vec::new(); weights.len()];
    // Per job, the work left in full-speed milliseconds.
    let mut left: Vec<f64> = jobs.iter().map(|j| j.duration_ms as f64).collect();
    let mut rate = vec![0.0; jobs.len()];
    let mut running: Vec<usize> = Vec::new();
    let mut next = 0;
    let mut now = jobs.first().map_or(0.0, |j| j.submit_ms as f64);
    let mut share = vec![0.0; weights.len()];
    loop {
        while let Some(j) = jobs.get(next).filter(|j| j.submit_ms as f64 <= now) {
            if j.duration_ms == 0 || j.gpus == 0 {
                jct[next] = j.duration_ms as f64;
            } else {
                present[j.tenant].push(next);
            }
            next += 1;
        }
        allocate(jobs, &present, capacity, weights, &mut share);
        running.clear();
        for (t, list) in present.iter().enumerate() {
            let mut gpus = share[t];
            for &i in list {
                if gpus <= 0.0 {
                    break;
                }
                let asked = f64::from(jobs[i].gpus);
                rate[i] = gpus.min(asked) / asked;
                gpus -= asked;
                running.push(i);
            }
        }
        let arrival = jobs.get(next).map(|j| j.submit_ms as f64);
        let finish = running
            .iter()
            .map(|&i| now + left[i] / rate[i])
            .min_by(f64::total_cmp);
        let until = match (arrival, finish) {
            (None, None) => break,
            (Some(a), Some(f)) => a.min(f),
            (Some(a), None) => a,
            (None, Some(f)) => f,
        };
        let dt = until - now;
        let mut done = vec![false; present.len()];
        for &i in &running {
            left[i] -= rate[i] * dt;
            // Relative to the job's size: the float error of many small steps.
            if left[i] <= 1e-9 * jobs[i].duration_ms as f64 + 1e-6 {
                jct[i] = until - jobs[i].submit_ms as f64;
                left[i] = 0.0;
                done[jobs[i].tenant] = true;
            }
            rate[i] = 0.0;
        }
        for (list, _) in present.iter_mut().zip(&done).filter(|(_, d)| **d) {
            list.retain(|&i| left[i] > 0.0);
        }
        now = until;
    }
    jct
}

/// Weighted max-min shares of `capacity` among the tenants with jobs present: a tenant asking
/// for less than its weighted share gets what it asks, and what it leaves is shared again.
fn allocate(
    jobs: &[FluidJob],
    present: &[Vec<usize>],
    capacity: f64,
    weights: &[f64],
    share: &mut [f64],
) {
    // What a tenant asks for beyond the whole cluster makes no difference.
    let demand: Vec<f64> = present
        .iter()
        .map(|list| {
            let mut sum = 0.0;
            for &i in list {
                sum += f64::from(jobs[i].gpus);
                if sum >= capacity {
                    break;
                }
            }
            sum
        })
        .collect();
    share.fill(0.0);
    let mut open: Vec<usize> = (0..present.len()).filter(|&t| demand[t] > 0.0).collect();
    let mut left = capacity;
    while !open.is_empty() && left > 0.0 {
        let weight: f64 = open.iter().map(|&t| weights[t]).sum();
        let per_weight = left / weight;
        let satisfied: Vec<usize> = open
            .iter()
            .copied()
            .filter(|&t| demand[t] <= per_weight * weights[t])
            .collect();
        if satisfied.is_empty() {
            for &t in &open {
                share[t] = per_weight * weights[t];
            }
            return;
        }
        for &t in &satisfied {
            share[t] = demand[t];
            left -= demand[t];
        }
        open.retain(|t| !satisfied.contains(t));
    }
}

/// The ideal fair share of one trace, computed once and held against every replay of it.
pub(crate) struct Ideal {
    tenants: Vec<String>,
    jobs: Vec<FluidJob>,
    jct_ms: Vec<f64>,
}

impl Ideal {
    /// The ideal of `jobs` (sorted by submission) on `capacity` GPUs; `weight` gives each
    /// tenant's weight by name.
    pub(crate) fn new(jobs: &[TraceJob], capacity: u64, weight: impl Fn(&str) -> f64) -> Self {
        let (tenants, job_tenant) = tenant_indices(jobs);
        let fluid: Vec<FluidJob> = jobs
            .iter()
            .zip(job_tenant)
            .map(|(j, tenant)| FluidJob {
                submit_ms: j.submit_ms,
                duration_ms: j.duration_ms,
                gpus: j.gpus,
                tenant,
            })
            .collect();
        let weights: Vec<f64> = tenants.iter().map(|t| weight(t)).collect();
        let jct_ms = ideal_jct_ms(&fluid, capacity as f64, &weights);
        Self {
            tenants,
            jobs: fluid,
            jct_ms,
        }
    }

    /// Per tenant: its mean JCT in the replay against its mean in the ideal, over the jobs the
    /// replay placed (a job never placed counts in neither).
    pub(crate) fn judge(&self, replay: &Replay) -> Vec<TenantFairness> {
        let mut sums = vec![(0usize, 0.0, 0.0); self.tenants.len()];
        for r in &replay.records {
            let s = &mut sums[self.jobs[r.job].tenant];
            s.0 += 1;
            s.1 += (r.end_ms - r.submit_ms) as f64;
            s.2 += self.jct_ms[r.job];
        }
        self.tenants
            .iter()
            .zip(sums)
            .filter(|(_, (n, ..))| *n > 0)
            .map(|(name, (n, real, ideal))| TenantFairness {
                tenant: name.clone(),
                jobs: n,
                avg_jct_h: real / n as f64 / HOUR_MS,
                ideal_avg_jct_h: ideal / n as f64 / HOUR_MS,
                finish_time_fairness: if ideal > 0.0 { real / ideal } else { 1.0 },
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(submit_s: u64, duration_s: u64, gpus: u32, tenant: usize) -> FluidJob {
        FluidJob {
            submit_ms: submit_s * 1000,
            duration_ms: duration_s * 1000,
            gpus,
            tenant,
        }
    }

    fn seconds(v: &[f64]) -> Vec<f64> {
        v.iter()
            .map(|ms| (ms / 1000.0 * 1e6).round() / 1e6)
            .collect()
    }

    #[test]
    fn a_tenant_alone_gets_the_whole_cluster_and_queues_in_arrival_order() {
        // 4 GPUs; two 4-GPU jobs of 10 s at once: the second waits for the first.
        let jobs = [job(0, 10, 4, 0), job(0, 10, 4, 0)];
        assert_eq!(seconds(&ideal_jct_ms(&jobs, 4.0, &[1.0])), [10.0, 20.0]);
    }

    #[test]
    fn two_tenants_split_the_cluster_by_weight() {
        // 4 GPUs, both tenants want all 4 for 10 s: equal weights run both at half speed.
        let jobs = [job(0, 10, 4, 0), job(0, 10, 4, 1)];
        assert_eq!(
            seconds(&ideal_jct_ms(&jobs, 4.0, &[1.0, 1.0])),
            [20.0, 20.0]
        );
        // Weight 3 against 1: tenant 0 gets 3 GPUs until it is done at 13.33 s, then tenant
        // 1 runs alone: 2.5 s of work were done, 7.5 s are left.
        let ideal = seconds(&ideal_jct_ms(&jobs, 4.0, &[3.0, 1.0]));
        assert!((ideal[0] - 40.0 / 3.0).abs() < 1e-3, "{ideal:?}");
        assert!(
            (ideal[1] - (40.0 / 3.0 + 20.0 / 3.0)).abs() < 1e-3,
            "{ideal:?}"
        );
    }

    #[test]
    fn a_tenant_asking_less_than_its_share_leaves_the_rest_to_others() {
        // 8 GPUs: tenant 0 wants 2, tenant 1 wants 8; tenant 1 gets the other 6.
        let jobs = [job(0, 10, 2, 0), job(0, 60, 8, 1)];
        let ideal = seconds(&ideal_jct_ms(&jobs, 8.0, &[1.0, 1.0]));
        assert_eq!(ideal[0], 10.0);
        // 10 s at 6/8 speed = 7.5 s of work, then 52.5 s alone.
        assert_eq!(ideal[1], 62.5);
    }

    #[test]
    fn finish_time_fairness_is_the_ratio_of_mean_jcts() {
        // One GPU, two tenants' 10 s jobs at once: the ideal runs both at half speed (20 s
        // each); a strict FCFS replay runs a's first (10 s) and b's after it (20 s).
        let trace = crate::tools::simulate::trace::parse(
            "submit,duration,gpus,tenant\n0,10,1,a\n0,10,1,b\n",
            false,
        )
        .expect("trace");
        let (state, gpus) = crate::tools::simulate::cluster::build("1x1xV100-32GB").expect("c");
        let replay = crate::tools::simulate::engine::replay(
            &trace.jobs,
            &state,
            gpus,
            &"fcfs".parse().expect("policy"),
            crate::tools::simulate::Estimates::Exact,
            0,
        )
        .expect("replay");
        let t = Ideal::new(&trace.jobs, gpus, |_| 1.0).judge(&replay);
        assert_eq!(t[0].finish_time_fairness, 0.5);
        assert_eq!(t[1].finish_time_fairness, 1.0);
    }
}
