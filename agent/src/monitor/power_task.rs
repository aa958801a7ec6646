//! The power task of every agent, at each sampling interval: hold each GPU at the limit
//! `power::wanted_limit` gives (throttling alerts open in the replicated state, green mode for
//! idle GPUs), level-triggered, so a restarted agent re-applies what is still wanted (the agent
//! owns its GPUs' power limits: a limit set by hand is reset at start); and meter
//! the GPUs' energy into jobs and the node, reported through Raft every `report_every`, and as soon as a
//! job it counted has ended.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_raft_store::alert::Remediation;
use gpu_raft_store::{Command, JobId};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Telemetry;
use super::power::{EnergyMeter, Green, IdleClock, wanted_limit};
use crate::clock::now_ms;
use crate::gpu::GpuBackend;
use crate::raft::Cluster;

pub(crate) struct PowerTask {
    pub cluster: Cluster,
    pub telemetry: Telemetry,
    pub gpus: Arc<dyn GpuBackend>,
    pub green: Option<Green>,
    pub interval: Duration,
    /// How often measured energy is reported through Raft.
    pub report_every: Duration,
}

impl PowerTask {
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let node = self.cluster.id;
        let devices = self.gpus.devices();
        // The limit this task last set per GPU; empty at start, so the first pass sets every
        // GPU to what is wanted now (undoing a throttle an earlier run of the agent left).
        let mut set: BTreeMap<u32, u32> = BTreeMap::new();
        let mut idle = IdleClock::default();
        let mut meter = EnergyMeter::default();
        let mut reported = Instant::now();
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(self.interval) => {}
            }
            let (holders, throttles) = self.cluster.state.read(|s| {
                let holders: BTreeMap<u32, JobId> = s
                    .nodes
                    .get(&node)
                    .map(|n| n.allocations.clone())
                    .unwrap_or_default();
                let mut throttles: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
                for a in s.alerts.values().filter(|a| a.is_open() && a.node == node) {
                    if let Remediation::Throttle { power_pct } = a.remediation {
                        throttles.entry(a.gpu).or_default().push(power_pct);
                    }
                }
                (holders, throttles)
            });
            let latest = self.telemetry.latest();
            let held: BTreeSet<u32> = holders.keys().copied().collect();
            let idle_for = idle.observe(&latest, &held);
            let mut capped = BTreeSet::new();
            for d in &devices {
                let wanted = wanted_limit(
                    d.max_power_w,
                    throttles.get(&d.index).into_iter().flatten().copied(),
                    self.green,
                    idle_for.get(&d.index).copied(),
                );
                let green_only = wanted_limit(
                    d.max_power_w,
                    [],
                    self.green,
                    idle_for.get(&d.index).copied(),
                );
                if green_only < d.max_power_w {
                    capped.insert(d.index);
                }
                if set.get(&d.index) == Some(&wanted) {
                    continue;
                }
                match self.gpus.set_power_limit(d.index, wanted) {
                    Ok(()) => {
                        info!(gpu = d.index, watts = wanted, "power limit changed");
                        set.insert(d.index, wanted);
                    }
                    Err(e) => {
                        warn!(gpu = d.index, watts = wanted, error = %e, "setting the power limit failed");
                        // Not retried every tick: the next change of wish tries again.
                        set.insert(d.index, wanted);
                    }
                }
            }
            meter.observe(&latest, &holders, &capped);
            if reported.elapsed() < self.report_every && !meter.holds_a_gone_job(&holders) {
                continue;
            }
            reported = Instant::now();
            let Some(report) = meter.report(node, now_ms()) else {
                continue;
            };
            let cmd = Command::RecordEnergy {
                report: report.clone(),
            };
            if let Err(e) = self.cluster.write(cmd).await {
                warn!(error = %e, "reporting energy failed; it goes out with the next report");
                meter.restore(report);
            }
        }
    }
}
