//! Power management of one agent's GPUs, pure: which power limit each GPU should have (the
//! lowest a throttling alert asks for, else the green-mode cap once it has been idle long
//! enough, else its full limit), and the energy meter that attributes the GPUs' energy counters
//! to the jobs bound to them between reports.

use std::collections::{BTreeMap, BTreeSet};

use gpu_raft_store::JobId;
use gpu_raft_store::energy::EnergyReport;

use super::Reading;

/// Green mode: an idle GPU's power limit is lowered to `power_pct` of its maximum once it has
/// had no job and no load for `idle_after_ms`, and restored as soon as a job is bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Green {
    pub idle_after_ms: u64,
    pub power_pct: u32,
}

/// The limit (watts) a GPU with board maximum `max_w` should have now.
pub(crate) fn wanted_limit(
    max_w: u32,
    throttles: impl IntoIterator<Item = u32>,
    green: Option<Green>,
    idle_for_ms: Option<u64>,
) -> u32 {
    let throttle = throttles.into_iter().min().map(|pct| max_w * pct / 100);
    let green = green
        .filter(|g| idle_for_ms.is_some_and(|idle| idle >= g.idle_after_ms))
        .map(|g| max_w * g.power_pct / 100);
    throttle.into_iter().chain(green).min().unwrap_or(max_w)
}

/// Since when each GPU has been idle: no job bound and no utilization in its latest reading.
#[derive(Default)]
pub(crate) struct IdleClock {
    since: BTreeMap<u32, u64>,
}

impl IdleClock {
    /// Update from the latest readings and the GPUs jobs hold; returns each GPU's idle time.
    pub(crate) fn observe(
        &mut self,
        latest: &[Reading],
        held: &BTreeSet<u32>,
    ) -> BTreeMap<u32, u64> {
        let mut idle = BTreeMap::new();
        for r in latest {
            let index = r.sample.index;
            if held.contains(&index) || r.sample.utilization_pct > 0.0 || !r.sample.healthy {
                self.since.remove(&index);
                continue;
            }
            let since = *self.since.entry(index).or_insert(r.at_ms);
            idle.insert(index, r.at_ms.saturating_sub(since));
        }
        idle
    }
}

/// Energy not yet reported: the node's total, per job, and green-capped GPU time.
#[derive(Default)]
pub(crate) struct EnergyMeter {
    /// Each GPU's counter at its previous reading.
    last: BTreeMap<u32, (u64, u64)>,
    gpu_mj: u64,
    green_capped_ms: u64,
    jobs: BTreeMap<JobId, u64>,
}

impl EnergyMeter {
    /// Count the energy each GPU used since its previous reading, for the node and for the job
    /// holding it (`holders`), and the time the `capped` GPUs spent under a green cap. A counter
    /// that went backwards (a driver reload) counts nothing for that step.
    pub(crate) fn observe(
        &mut self,
        latest: &[Reading],
        holders: &BTreeMap<u32, JobId>,
        capped: &BTreeSet<u32>,
    ) {
        for r in latest.iter().filter(|r| r.sample.healthy) {
            let index = r.sample.index;
            let now = (r.at_ms, r.sample.energy_mj);
            let Some((at, mj)) = self.last.insert(index, now) else {
                continue;
            };
            if now.0 <= at {
                continue;
            }
            let used = now.1.saturating_sub(mj);
            self.gpu_mj += used;
            if let Some(job) = holders.get(&index) {
                *self.jobs.entry(*job).or_default() += used;
            }
            if capped.contains(&index) {
                self.green_capped_ms += now.0 - at;
            }
        }
    }

    /// The report of everything counted so far (and a fresh start), or `None` if there is
    /// nothing to say.
    pub(crate) fn report(&mut self, node: u64, seq: u64) -> Option<EnergyReport> {
        if self.gpu_mj == 0 && self.green_capped_ms == 0 && self.jobs.is_empty() {
            return None;
        }
        Some(EnergyReport {
            node,
            seq,
            gpu_mj: std::mem::take(&mut self.gpu_mj),
            green_capped_ms: std::mem::take(&mut self.green_capped_ms),
            jobs: std::mem::take(&mut self.jobs).into_iter().collect(),
        })
    }

    /// Whether a job counted here holds none of `holders`' GPUs any more (it ended or moved):
    /// its energy is then reported at once rather than at the next interval, so a short job
    /// shows its energy as soon as it ends.
    pub(crate) fn holds_a_gone_job(&self, holders: &BTreeMap<u32, JobId>) -> bool {
        self.jobs
            .keys()
            .any(|job| !holders.values().any(|held| held == job))
    }

    /// Put back a report that could not be delivered, to go out with the next one.
    pub(crate) fn restore(&mut self, r: EnergyReport) {
        self.gpu_mj += r.gpu_mj;
        self.green_capped_ms += r.green_capped_ms;
        for (job, mj) in r.jobs {
            *self.jobs.entry(job).or_default() += mj;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::GpuSample;

    fn reading(index: u32, at_ms: u64, energy_mj: u64, utilization_pct: f32) -> Reading {
        Reading {
            at_ms,
            sample: GpuSample {
                energy_mj,
                utilization_pct,
                ..GpuSample::empty(index)
            },
        }
    }

    #[test]
    fn the_lowest_wish_wins_and_green_waits_for_the_idle_time() {
        let green = Some(Green {
            idle_after_ms: 60_000,
            power_pct: 50,
        });
        assert_eq!(wanted_limit(400, [], None, None), 400);
        assert_eq!(wanted_limit(400, [70], None, None), 280);
        assert_eq!(wanted_limit(400, [70, 60], None, None), 240);
        assert_eq!(
            wanted_limit(400, [], green, Some(59_999)),
            400,
            "not idle long enough"
        );
        assert_eq!(wanted_limit(400, [], green, Some(60_000)), 200);
        assert_eq!(wanted_limit(400, [40], green, Some(60_000)), 160);
        assert_eq!(wanted_limit(400, [], green, None), 400, "busy");
    }

    #[test]
    fn idle_time_restarts_when_a_job_is_bound_or_the_gpu_works() {
        let mut clock = IdleClock::default();
        let none = BTreeSet::new();
        assert_eq!(clock.observe(&[reading(0, 1_000, 0, 0.0)], &none)[&0], 0);
        assert_eq!(
            clock.observe(&[reading(0, 61_000, 0, 0.0)], &none)[&0],
            60_000
        );
        let held = BTreeSet::from([0]);
        assert!(
            clock
                .observe(&[reading(0, 62_000, 0, 0.0)], &held)
                .is_empty()
        );
        assert_eq!(clock.observe(&[reading(0, 63_000, 0, 0.0)], &none)[&0], 0);
        assert!(
            clock
                .observe(&[reading(0, 64_000, 0, 35.0)], &none)
                .is_empty()
        );
    }

    #[test]
    fn energy_goes_to_the_node_and_the_job_holding_the_gpu() {
        let mut meter = EnergyMeter::default();
        let holders = BTreeMap::from([(0, 42)]);
        let capped = BTreeSet::from([1]);
        meter.observe(
            &[reading(0, 0, 1_000, 95.0), reading(1, 0, 500, 0.0)],
            &holders,
            &capped,
        );
        assert_eq!(meter.report(3, 1), None, "a first reading is only a base");
        meter.observe(
            &[
                reading(0, 1_000, 301_000, 95.0),
                reading(1, 1_000, 560, 0.0),
            ],
            &holders,
            &capped,
        );
        let report = meter.report(3, 2).expect("something to report");
        assert_eq!(report.gpu_mj, 300_060);
        assert_eq!(report.jobs, [(42, 300_000)]);
        assert_eq!(report.green_capped_ms, 1_000);
        assert_eq!(meter.report(3, 3), None, "taken");
        meter.restore(report.clone());
        assert!(!meter.holds_a_gone_job(&holders), "j-42 still holds GPU 0");
        assert!(
            meter.holds_a_gone_job(&BTreeMap::new()),
            "j-42 ended: report now"
        );
        let again = EnergyReport {
            seq: 3,
            ..report.clone()
        };
        assert_eq!(meter.report(3, 3), Some(again));
        meter.restore(report);
        meter.observe(&[reading(0, 2_000, 100, 95.0)], &holders, &capped);
        let report = meter.report(3, 4).expect("restored");
        assert_eq!(
            report.jobs,
            [(42, 300_000)],
            "a counter reset counts nothing"
        );
    }
}
