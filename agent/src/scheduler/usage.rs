//! Fair-share accounting: each tenant's GPU usage with exponential decay (a half-life), so
//! recent use counts fully and old use fades. The core reads it; the leader rebuilds it from
//! the state, the simulator keeps one up to date as jobs finish.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasherDefault;

use gpu_raft_store::{ClusterState, Job, JobId, USAGE_BUCKET_MS};

use super::history::Fnv;

/// Decayed GPU-milliseconds per tenant for finished runs, each valued as of `as_of_ms`.
#[derive(Clone, Debug)]
pub struct TenantUsage {
    half_life_ms: f64,
    as_of_ms: u64,
    finished: HashMap<String, f64>,
}

impl TenantUsage {
    pub fn new(half_life_ms: u64) -> Self {
        Self {
            half_life_ms: half_life_ms.max(1) as f64,
            as_of_ms: 0,
            finished: HashMap::new(),
        }
    }

    /// The usage of every finished run in `state`, valued at `now_ms`.
    pub fn from_state(state: &ClusterState, half_life_ms: u64, now_ms: u64) -> Self {
        let mut usage = Self::new(half_life_ms);
        usage.as_of_ms = now_ms;
        for j in state.jobs.values().filter(|j| j.state.is_terminal()) {
            let (Some(start), Some(end)) = (j.started_at_ms.or(j.bound_at_ms), j.finished_at_ms)
            else {
                continue;
            };
            usage.add(&j.spec.tenant, j.spec.gpus, start, end.min(now_ms));
        }
        // Archived runs, kept by the hour they ended: spread evenly over that hour.
        for (tenant, hours) in &state.archived_usage {
            for (&hour, &gpu_ms) in hours {
                let end = (hour + USAGE_BUCKET_MS).min(now_ms);
                usage.add_spread(tenant, gpu_ms, hour.min(end), end);
            }
        }
        usage
    }

    /// Record a finished run of `gpus` GPUs from `start_ms` to `end_ms` (≤ the current time of
    /// this ledger, which moves forward to `end_ms` if it is later).
    pub fn record(&mut self, tenant: &str, gpus: u32, start_ms: u64, end_ms: u64) {
        if end_ms > self.as_of_ms {
            let factor = self.decay(end_ms - self.as_of_ms);
            for v in self.finished.values_mut() {
                *v *= factor;
            }
            self.as_of_ms = end_ms;
        }
        self.add(tenant, gpus, start_ms, end_ms);
    }

    fn add(&mut self, tenant: &str, gpus: u32, start_ms: u64, end_ms: u64) {
        let value = self.integral(gpus, start_ms, end_ms, self.as_of_ms);
        if value > 0.0 {
            add_to(&mut self.finished, tenant, value);
        }
    }

    /// `gpu_ms` GPU-milliseconds used at an even rate from `start_ms` to `end_ms`.
    fn add_spread(&mut self, tenant: &str, gpu_ms: u64, start_ms: u64, end_ms: u64) {
        let span = end_ms.saturating_sub(start_ms);
        if span == 0 {
            return;
        }
        let value = gpu_ms as f64 / span as f64 * self.integral(1, start_ms, end_ms, self.as_of_ms);
        if value > 0.0 {
            add_to(&mut self.finished, tenant, value);
        }
    }

    /// ∫ gpus · 2^(-(at - t)/h) dt over [start, end]: the decayed value at `at` of a run.
    fn integral(&self, gpus: u32, start_ms: u64, end_ms: u64, at_ms: u64) -> f64 {
        if end_ms <= start_ms {
            return 0.0;
        }
        let h = self.half_life_ms / std::f64::consts::LN_2;
        let age_end = at_ms.saturating_sub(end_ms);
        let age_start = at_ms.saturating_sub(start_ms);
        f64::from(gpus) * h * (self.decay(age_end) - self.decay(age_start))
    }

    fn decay(&self, age_ms: u64) -> f64 {
        (-(age_ms as f64) / self.half_life_ms).exp2()
    }

    /// Each tenant's decayed usage at `now_ms`, finished runs plus the `live` ones (the
    /// state's `live_jobs`), in GPU-equivalents: decayed GPU-milliseconds divided by the
    /// half-life.
    pub fn at(&self, live: &[&Job], now_ms: u64) -> HashMap<String, f64> {
        let factor = self.decay(now_ms.saturating_sub(self.as_of_ms));
        let mut out: HashMap<String, f64> = self
            .finished
            .iter()
            .map(|(t, v)| (t.clone(), v * factor))
            .collect();
        for j in live {
            if let Some(start) = j.started_at_ms.or(j.bound_at_ms) {
                let v = self.integral(j.spec.gpus, start, now_ms, now_ms);
                add_to(&mut out, &j.spec.tenant, v);
            }
        }
        for v in out.values_mut() {
            *v /= self.half_life_ms;
        }
        out
    }
}

/// Add `value` to `tenant`'s sum, copying the name only the first time.
fn add_to(sums: &mut HashMap<String, f64>, tenant: &str, value: f64) {
    match sums.get_mut(tenant) {
        Some(sum) => *sum += value,
        None => {
            sums.insert(tenant.to_owned(), value);
        }
    }
}

/// The live jobs holding GPUs, each once, found through the nodes' allocations: a pass over
/// the GPUs, not over every job (a live job without GPUs has no usage to count).
pub(crate) fn live_jobs(state: &ClusterState) -> impl Iterator<Item = &Job> {
    let mut seen: HashSet<JobId, BuildHasherDefault<Fnv>> = HashSet::default();
    state
        .nodes
        .values()
        .flat_map(|n| n.allocations.values())
        .filter(move |id| seen.insert(**id))
        .filter_map(|id| state.jobs.get(id))
        .filter(|j| j.state.is_live())
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: u64 = 3_600_000;

    #[test]
    fn usage_halves_every_half_life() {
        let mut u = TenantUsage::new(H);
        u.record("a", 2, 0, H);
        let now = u.at(&[], H)["a"];
        let later = u.at(&[], 2 * H)["a"];
        assert!((later / now - 0.5).abs() < 1e-9, "{now} then {later}");
        // Two GPUs for one half-life: 2 · (1 - 1/2) / ln 2 GPU-equivalents.
        let expected = 2.0 * 0.5 / std::f64::consts::LN_2;
        assert!((now - expected).abs() < 1e-9, "{now} vs {expected}");
    }

    #[test]
    fn an_archived_run_counts_as_it_did_in_the_state() {
        use gpu_raft_store::JobState;

        use crate::scheduler::testkit::{spec, submit};
        let mut kept = ClusterState::new();
        submit(&mut kept, spec(2, 0));
        let job = kept.jobs.get_mut(&1).expect("submitted");
        (job.state, job.started_at_ms, job.finished_at_ms) =
            (JobState::Succeeded, Some(0), Some(H));
        let mut archived = ClusterState::new();
        let hours = [(0, 2 * H)].into_iter().collect();
        archived
            .archived_usage
            .insert(job.spec.tenant.clone(), hours);
        let usage = |s: &ClusterState| TenantUsage::from_state(s, H, 3 * H).at(&[], 3 * H);
        let (kept, archived) = (usage(&kept), usage(&archived));
        assert!(kept["default"] > 0.0, "{kept:?}");
        assert!(
            (kept["default"] - archived["default"]).abs() < 1e-9,
            "{kept:?} vs {archived:?}"
        );
    }

    #[test]
    fn recording_later_runs_keeps_older_ones_decayed() {
        let mut a = TenantUsage::new(H);
        a.record("x", 1, 0, H);
        a.record("y", 1, H, 2 * H);
        let at = a.at(&[], 2 * H);
        assert!((at["x"] * 2.0 - at["y"]).abs() < 1e-9, "{at:?}");
    }
}
