//! Applying alerts: replicated rules set and deleted, alerts raised (deduplicated: one open
//! alert per rule and GPU) and resolved, and the replicated part of their remediation
//! (quarantine, migration).

use crate::NodeId;
use crate::model::alert::{
    Alert, AlertRule, KEEP_RESOLVED, MAX_MESSAGE, Remediation, Severity, validate_rule,
};
use crate::model::outcome::{ApplyResult, Rejection, invalid};
use crate::model::state::ClusterState;
use crate::model::validate;

impl ClusterState {
    pub(crate) fn set_alert_rule(&mut self, rule: &AlertRule) -> Result<ApplyResult, Rejection> {
        validate_rule(rule).map_err(invalid)?;
        self.alert_rules.insert(rule.name.clone(), rule.clone());
        Ok(ApplyResult::Ok)
    }

    pub(crate) fn delete_alert_rule(&mut self, name: &str) -> Result<ApplyResult, Rejection> {
        match self.alert_rules.remove(name) {
            Some(_) => Ok(ApplyResult::Ok),
            None => Err(invalid(format!("no replicated alert rule {name:?}"))),
        }
    }

    /// The open alert of `rule` on a GPU, if any.
    pub fn open_alert(&self, node: NodeId, gpu: u32, rule: &str) -> Option<&Alert> {
        self.alerts
            .values()
            .find(|a| a.is_open() && a.node == node && a.gpu == gpu && a.rule == rule)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn raise_alert(
        &mut self,
        node: NodeId,
        gpu: u32,
        rule: &str,
        severity: Severity,
        remediation: Remediation,
        message: &str,
        now: u64,
    ) -> Result<ApplyResult, Rejection> {
        validate::name("alert rule", rule).map_err(invalid)?;
        let record = self
            .nodes
            .get(&node)
            .ok_or(Rejection::UnknownNode { node })?;
        if record.gpu(gpu).is_none() {
            return Err(invalid(format!("node n{node} has no GPU {gpu}")));
        }
        if let Some(open) = self.open_alert(node, gpu, rule) {
            return Ok(ApplyResult::AlertRaised {
                alert: open.id,
                existing: true,
            });
        }
        let holder = record.allocations.get(&gpu).copied();
        let mut migrated_job = None;
        if matches!(remediation, Remediation::Quarantine | Remediation::Migrate)
            && let Some(record) = self.nodes.get_mut(&node)
        {
            record.quarantined.insert(gpu, rule.to_owned());
            record.updated_at_ms = now;
        }
        if remediation == Remediation::Migrate
            && let Some(job) = holder.and_then(|id| self.jobs.get_mut(&id))
            && job.state.is_live()
        {
            job.evict_requested = true;
            migrated_job = Some(job.id);
        }
        self.next_alert_id += 1;
        let id = self.next_alert_id;
        // At most MAX_MESSAGE bytes, cut on a character boundary (apply must never panic).
        let cut = (0..=message.len().min(MAX_MESSAGE))
            .rev()
            .find(|&i| message.is_char_boundary(i))
            .unwrap_or(0);
        let message = message[..cut].to_owned();
        self.alerts.insert(
            id,
            Alert {
                id,
                rule: rule.to_owned(),
                node,
                gpu,
                severity,
                remediation,
                message,
                raised_at_ms: now,
                resolved_at_ms: None,
                migrated_job,
            },
        );
        Ok(ApplyResult::AlertRaised {
            alert: id,
            existing: false,
        })
    }

    pub(crate) fn resolve_alert(
        &mut self,
        node: NodeId,
        gpu: u32,
        rule: &str,
        now: u64,
    ) -> Result<ApplyResult, Rejection> {
        let Some(id) = self.open_alert(node, gpu, rule).map(|a| a.id) else {
            // Already resolved (a retry, or a second agent's view): nothing to do.
            return Ok(ApplyResult::Ok);
        };
        if let Some(alert) = self.alerts.get_mut(&id) {
            alert.resolved_at_ms = Some(now);
        }
        let still_held = self.alerts.values().any(|a| {
            a.is_open()
                && a.node == node
                && a.gpu == gpu
                && matches!(
                    a.remediation,
                    Remediation::Quarantine | Remediation::Migrate
                )
        });
        if !still_held && let Some(record) = self.nodes.get_mut(&node) {
            record.quarantined.remove(&gpu);
            record.updated_at_ms = now;
        }
        let resolved: Vec<u64> = self
            .alerts
            .values()
            .filter(|a| !a.is_open())
            .map(|a| a.id)
            .collect();
        for old in resolved
            .iter()
            .take(resolved.len().saturating_sub(KEEP_RESOLVED))
        {
            self.alerts.remove(old);
        }
        Ok(ApplyResult::AlertResolved { alert: id })
    }
}
