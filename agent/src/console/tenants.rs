//! The tenants page: each tenant the session may read, with its quotas, the GPUs it holds
//! (beyond its guarantee: borrowed), its queue and its GPU time.

use axum::extract::State;
use gpu_proto::v1 as pb;
use gpu_proto::v1::tenant_service_server::TenantService;
use maud::html;

use super::Shared;
use super::failure::Page;
use super::session::Session;
use super::view::{self, Section};

pub(super) async fn page(State(apis): State<Shared>, session: Session) -> Page {
    let tenants = apis
        .tenant
        .list_tenants(session.request(pb::ListTenantsRequest { stale: true }))
        .await?
        .into_inner()
        .tenants;
    let body = html! {
        @if tenants.is_empty() { p.empty { "No tenants visible to this token." } }
        @for t in &tenants {
            section.tenant {
                h2 { (t.name) }
                p { (t.pending_jobs) " pending, " (t.live_jobs) " live; weight " (t.weight) }
                table {
                    thead { tr { th { "GPU type" } th { "Guaranteed" } th { "May borrow" } th { "Held" } th { "Borrowed" } th { "GPU hours" } } }
                    tbody { @for u in &t.usage {
                        @let quota = t.quotas.iter().find(|q| q.gpu_type == u.gpu_type);
                        @let guaranteed = quota.map_or(0, |q| q.guaranteed);
                        tr {
                            td { (u.gpu_type) }
                            td { @if let Some(q) = quota { (q.guaranteed) } @else { "—" } }
                            td { @if let Some(q) = quota { (q.borrow) } @else { "—" } }
                            td { (u.gpus_held) " of " (u.cluster_gpus) }
                            td { (u.gpus_held.saturating_sub(guaranteed)) }
                            td { (format!("{:.2}", u.gpu_ms as f64 / 3_600_000.0)) }
                        }
                    } }
                }
                @for w in &t.warnings { p.refusal { (w) } }
            }
        }
    };
    Ok(view::page(&session, Section::Tenants, "Tenants", body))
}
