//! The alerting task of every agent: at each sampling interval, evaluate the effective rules
//! (built-in, configured, replicated) on each of this node's GPUs; raise through Raft what
//! fires and has no open alert, resolve what has cleared; notify the webhooks of each change.
//! Quarantine and migration happen in `apply`; throttling in `power_task`.

use std::sync::Arc;
use std::time::Duration;

use gpu_raft_store::alert::{AlertRule, effective_rules};
use gpu_raft_store::{Alert, ApplyResult, Command, NodeId};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Telemetry;
use super::foreign;
use super::rules::{Verdict, evaluate, lookback_ms};
use super::webhook::{Event, Notice, Notifier};
use crate::clock::now_ms;
use crate::gpu::GpuBackend;
use crate::raft::Cluster;

pub(crate) struct Alerting {
    pub cluster: Cluster,
    pub telemetry: Telemetry,
    pub gpus: Arc<dyn GpuBackend>,
    /// The config file's rules.
    pub configured: Vec<AlertRule>,
    pub interval: Duration,
    pub notifier: Notifier,
}

impl Alerting {
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let node = self.cluster.id;
        let devices = self.gpus.devices();
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(self.interval) => {}
            }
            let (rules, open) = self.cluster.state.read(|s| {
                let rules = effective_rules(&self.configured, s.alert_rules.values());
                let open: Vec<Alert> = s
                    .alerts
                    .values()
                    .filter(|a| a.is_open() && a.node == node)
                    .cloned()
                    .collect();
                (rules, open)
            });
            let lookback = rules.iter().map(lookback_ms).max().unwrap_or(0);
            for device in &devices {
                let readings = self
                    .telemetry
                    .since(device.index, now_ms().saturating_sub(lookback + 1000));
                for rule in &rules {
                    let is_open = open
                        .iter()
                        .any(|a| a.gpu == device.index && a.rule == rule.name);
                    match evaluate(rule, &readings) {
                        Verdict::Firing(seen) if !is_open => {
                            self.raise(node, device.index, rule, seen).await;
                        }
                        Verdict::Clear if is_open => {
                            self.resolve(node, device.index, &rule.name).await;
                        }
                        _ => {}
                    }
                }
            }
            // A rule deleted or switched off resolves its open alerts: nothing would otherwise
            // ever clear them (or return a GPU they quarantined). The foreign-process check
            // raises and resolves its own.
            for a in open
                .iter()
                .filter(|a| !rules.iter().any(|r| r.name == a.rule) && a.rule != foreign::RULE)
            {
                self.resolve(node, a.gpu, &a.rule).await;
            }
        }
    }

    async fn raise(&self, node: NodeId, gpu: u32, rule: &AlertRule, seen: String) {
        let cmd = Command::RaiseAlert {
            node,
            gpu,
            rule: rule.name.clone(),
            severity: rule.severity,
            remediation: rule.remediation,
            message: seen.clone(),
        };
        match self.cluster.write(cmd).await {
            Ok(ApplyResult::AlertRaised {
                alert,
                existing: false,
            }) => {
                warn!(alert, gpu, rule = %rule.name, %seen, "alert raised");
                self.notify(Event::Raised, alert);
            }
            Ok(_) => {}
            Err(e) => {
                warn!(gpu, rule = %rule.name, error = %e, "raising an alert failed; will retry")
            }
        }
    }

    async fn resolve(&self, node: NodeId, gpu: u32, rule: &str) {
        let cmd = Command::ResolveAlert {
            node,
            gpu,
            rule: rule.to_owned(),
        };
        match self.cluster.write(cmd).await {
            Ok(ApplyResult::AlertResolved { alert }) => {
                info!(alert, gpu, rule, "alert resolved");
                self.notify(Event::Resolved, alert);
            }
            Ok(_) => {}
            Err(e) => warn!(gpu, rule, error = %e, "resolving an alert failed; will retry"),
        }
    }

    fn notify(&self, event: Event, id: u64) {
        if let Some(alert) = self.cluster.state.read(|s| s.alerts.get(&id).cloned()) {
            self.notifier.notify(Notice { event, alert });
        }
    }
}
