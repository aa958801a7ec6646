//! What happened: the alerts the monitors raised, and (for admins and operators) the audit
//! log of every write and refusal.

use axum::extract::{Query, State};
use gpu_proto::v1 as pb;
use gpu_proto::v1::alert_service_server::AlertService;
use gpu_proto::v1::audit_service_server::AuditService;
use maud::html;
use serde::Deserialize;

use super::Shared;
use super::failure::Page;
use super::session::Session;
use super::view::{self, Section, when};

pub(super) async fn alerts(State(apis): State<Shared>, session: Session) -> Page {
    let req = pb::ListAlertsRequest {
        include_resolved: true,
        stale: true,
    };
    let mut alerts = apis
        .alert
        .list_alerts(session.request(req))
        .await?
        .into_inner()
        .alerts;
    alerts.sort_by_key(|a| {
        (
            a.resolved_at_ms.is_some(),
            std::cmp::Reverse(a.raised_at_ms),
        )
    });
    let body = html! {
        table.alerts {
            thead { tr { th { "Raised" } th { "Rule" } th { "GPU" } th { "Severity" } th { "Action" } th { "Message" } th { "Resolved" } } }
            tbody {
                @if alerts.is_empty() { tr { td colspan="7" .empty { "No alerts." } } }
                @for a in &alerts { tr class=[a.resolved_at_ms.is_none().then_some("open")] {
                    td { (when(a.raised_at_ms)) }
                    td { (a.rule) }
                    td { "n" (a.node_id) "/" (a.gpu_index) }
                    td { span class={ "severity " (a.severity) } { (a.severity) } }
                    td { (a.action) @if let Some(j) = a.migrated_job_id { " (j-" (j) " moved)" } }
                    td { (a.message) }
                    td { @if let Some(r) = a.resolved_at_ms { (when(r)) } @else { "open" } }
                } }
            }
        }
    };
    Ok(view::page(&session, Section::Alerts, "Alerts", body))
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct AuditQuery {
    after: u64,
}

/// Entries per page of the audit log.
const AUDIT_PAGE: u32 = 100;

pub(super) async fn audit(
    State(apis): State<Shared>,
    session: Session,
    Query(q): Query<AuditQuery>,
) -> Page {
    let req = pb::ListAuditRequest {
        after: q.after,
        limit: AUDIT_PAGE,
    };
    let entries = apis
        .audit
        .list_audit(session.request(req))
        .await?
        .into_inner()
        .entries;
    let next = (entries.len() == AUDIT_PAGE as usize)
        .then(|| entries.last().map(|e| e.seq))
        .flatten();
    let body = html! {
        table.audit {
            thead { tr { th { "#" } th { "Time" } th { "Actor" } th { "Verb" } th { "Object" } th { "Outcome" } th { "Source" } } }
            tbody { @for e in &entries { tr {
                td { (e.seq) } td { (when(e.time_ms)) } td { (e.actor) } td { (e.verb) }
                td { (e.object) } td.outcome { (e.outcome) } td { (e.source) }
            } } }
        }
        @if let Some(after) = next { p.pager { a href={ "/console/audit?after=" (after) } { "Next page" } } }
    };
    Ok(view::page(&session, Section::Audit, "Audit log", body))
}
