//! `gpuctl alert list [--all]` and `gpuctl alert rule list|set|delete`.
//!
//! JSON of `alert list` (stable): an array of `{"id", "rule", "node_id", "gpu_index",
//! "severity", "action", "message", "raised_at_ms", "resolved_at_ms" (null while open),
//! "migrated_job_id" (null unless a migrate action moved a job)}`.
//!
//! JSON of `alert rule list` (stable): an array of `{"name", "kind" ("above", "rate",
//! "predict", "health"), "metric" (null for health rules), "above", "rate_per_minute",
//! "predict_limit" (each null unless it is the rule's kind), "fatal_xids", "for_ms",
//! "window_ms", "within_ms", "clear_after_ms", "severity", "action", "enabled", "source"
//! ("builtin", "config", "replicated")}`; `rule set` prints the one rule it stored.

use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_proto::v1::alert_service_client::AlertServiceClient;
use serde_json::{Value, json};

use super::{Answer, Ctx, Failure};
use crate::cli::{AlertRuleArgs, AlertRuleVerb, AlertVerb};
use crate::output::{self, table_of};

pub(crate) async fn run(ctx: &Ctx, verb: AlertVerb) -> Result<Answer, Failure> {
    let new = AlertServiceClient::new;
    match verb {
        AlertVerb::List { all, stale } => {
            let req = pb::ListAlertsRequest {
                include_resolved: all,
                stale,
            };
            let alerts = ctx
                .call(new, req, async |mut c, r| c.list_alerts(r).await)
                .await?
                .alerts;
            Ok(ctx.answer_list(&alerts, alert_json, alerts_table))
        }
        AlertVerb::Rule(AlertRuleVerb::List) => {
            let req = pb::ListAlertRulesRequest {};
            let rules = ctx
                .call(new, req, async |mut c, r| c.list_alert_rules(r).await)
                .await?
                .rules;
            Ok(rules_out(ctx, &rules))
        }
        AlertVerb::Rule(AlertRuleVerb::Set(args)) => {
            let stored = ctx
                .call(new, rule_from(*args), async |mut c, r| {
                    c.set_alert_rule(r).await
                })
                .await?;
            Ok(rules_out(ctx, &[stored]))
        }
        AlertVerb::Rule(AlertRuleVerb::Delete { name }) => {
            let req = pb::DeleteAlertRuleRequest { name };
            ctx.call(new, req, async |mut c, r| c.delete_alert_rule(r).await)
                .await?;
            Ok(ctx.answer(|| json!({ "deleted": true }), String::new))
        }
    }
}

fn rule_from(a: AlertRuleArgs) -> pb::AlertRule {
    let ms =
        |d: Option<Duration>| d.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    pb::AlertRule {
        name: a.name,
        metric: a.metric.unwrap_or_default(),
        above: a.above,
        rate_per_minute: a.rate_per_minute,
        predict_limit: a.predict_limit,
        health: a.fatal_xids.is_some(),
        fatal_xids: a.fatal_xids.unwrap_or_default(),
        for_ms: ms(a.for_),
        window_ms: ms(a.window),
        within_ms: ms(a.within),
        clear_after_ms: ms(a.clear_after),
        severity: a.severity.unwrap_or_default(),
        action: a.action.unwrap_or_default(),
        enabled: !a.disabled,
        source: String::new(),
    }
}

pub(crate) fn alert_json(a: &pb::Alert) -> Value {
    json!({
        "id": a.id,
        "rule": a.rule,
        "node_id": a.node_id,
        "gpu_index": a.gpu_index,
        "severity": a.severity,
        "action": a.action,
        "message": a.message,
        "raised_at_ms": a.raised_at_ms,
        "resolved_at_ms": a.resolved_at_ms,
        "migrated_job_id": a.migrated_job_id,
    })
}

fn alerts_table(alerts: &[pb::Alert]) -> String {
    table_of(
        &[
            "ID", "GPU", "RULE", "SEVERITY", "ACTION", "STATE", "MOVED", "MESSAGE",
        ],
        alerts,
        |a| {
            vec![
                a.id.to_string(),
                format!("n{}/{}", a.node_id, a.gpu_index),
                a.rule.clone(),
                a.severity.clone(),
                a.action.clone(),
                if a.resolved_at_ms.is_some() {
                    "resolved"
                } else {
                    "open"
                }
                .into(),
                a.migrated_job_id
                    .map_or_else(|| "-".into(), |j| format!("j-{j}")),
                output::truncate(&a.message, 80),
            ]
        },
    )
}

fn kind(r: &pb::AlertRule) -> &'static str {
    if r.health {
        "health"
    } else if r.above.is_some() {
        "above"
    } else if r.rate_per_minute.is_some() {
        "rate"
    } else {
        "predict"
    }
}

fn rules_out(ctx: &Ctx, rules: &[pb::AlertRule]) -> Answer {
    ctx.answer_list(rules, rule_json, rules_table)
}

fn rule_json(r: &pb::AlertRule) -> Value {
    json!({
        "name": r.name,
        "kind": kind(r),
        "metric": (!r.health).then_some(&r.metric),
        "above": r.above,
        "rate_per_minute": r.rate_per_minute,
        "predict_limit": r.predict_limit,
        "fatal_xids": r.fatal_xids,
        "for_ms": r.for_ms,
        "window_ms": r.window_ms,
        "within_ms": r.within_ms,
        "clear_after_ms": r.clear_after_ms,
        "severity": r.severity,
        "action": r.action,
        "enabled": r.enabled,
        "source": r.source,
    })
}

fn rules_table(rules: &[pb::AlertRule]) -> String {
    let secs = |ms: u64| format!("{}s", ms / 1000);
    table_of(
        &[
            "NAME",
            "CONDITION",
            "SEVERITY",
            "ACTION",
            "CLEAR AFTER",
            "ENABLED",
            "SOURCE",
        ],
        rules,
        |r| {
            let condition = match kind(r) {
                "health" => format!("XIDs {:?}, DBE, lost", r.fatal_xids),
                "above" => format!(
                    "{} > {} for {}",
                    r.metric,
                    r.above.unwrap_or_default(),
                    secs(r.for_ms)
                ),
                "rate" => format!(
                    "{} > {}/min over {}",
                    r.metric,
                    r.rate_per_minute.unwrap_or_default(),
                    secs(r.window_ms)
                ),
                _ => format!(
                    "{} reaches {} within {}",
                    r.metric,
                    r.predict_limit.unwrap_or_default(),
                    secs(r.within_ms)
                ),
            };
            vec![
                r.name.clone(),
                condition,
                r.severity.clone(),
                r.action.clone(),
                secs(r.clear_after_ms),
                if r.enabled { "yes" } else { "no" }.into(),
                r.source.clone(),
            ]
        },
    )
}
