//! The tenants page: each tenant the session may read, with its quotas, the GPUs it holds
//! (beyond its guarantee: borrowed), its queue and its GPU time; and the last day's GPU use
//! and energy per tenant, hour by hour, from the jobs' own records (the live ones, and those
//! finished in the day, archived or not).

use std::collections::BTreeMap;

use axum::extract::State;
use gpu_proto::v1 as pb;
use gpu_proto::v1::job_service_server::JobService;
use gpu_proto::v1::tenant_service_server::TenantService;
use maud::html;

use super::failure::{Failure, Page};
use super::session::Session;
use super::view::{self, Section};
use super::{Shared, chart};

pub(super) async fn page(State(apis): State<Shared>, session: Session) -> Page {
    let tenants = apis
        .tenant
        .list_tenants(session.request(pb::ListTenantsRequest { stale: true }))
        .await?
        .into_inner()
        .tenants;
    let now = crate::clock::now_ms();
    let usage = hourly(&recent_jobs(&apis, &session, now).await?, now);
    let gpu_series: Vec<(String, Vec<(u64, f64)>)> = usage
        .iter()
        .map(|(t, u)| (t.clone(), u.gpu_hours.clone()))
        .collect();
    let energy_series: Vec<(String, Vec<(u64, f64)>)> = usage
        .iter()
        .map(|(t, u)| (t.clone(), u.energy_kj.clone()))
        .collect();
    let peak = |series: &[(String, Vec<(u64, f64)>)]| {
        (series.iter().flat_map(|(_, p)| p.iter().map(|v| v.1))).fold(1.0, f64::max)
    };
    let body = html! {
        @if !usage.is_empty() {
            div.charts {
                (chart::lines(html! { "GPU hours per hour, last day" }, &gpu_series, 0.0, peak(&gpu_series)))
                (chart::lines(html! { "Energy per hour (kJ), last day" }, &energy_series, 0.0, peak(&energy_series)))
            }
        }
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
                            td { @if quota.is_some() { (u.gpus_held.saturating_sub(guaranteed)) } @else { "—" } }
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

const HOUR_MS: u64 = 3_600_000;
const DAY_MS: u64 = 24 * HOUR_MS;

/// The jobs that ran in the last day as far as the session may see: those live now and those
/// finished since (the API answers at most one page of the latter: 5,000 jobs).
async fn recent_jobs(apis: &Shared, session: &Session, now: u64) -> Result<Vec<pb::Job>, Failure> {
    let finished = pb::ListJobsRequest {
        finished_since_ms: Some(now.saturating_sub(DAY_MS)),
        page_size: 5_000,
        stale: true,
        ..pb::ListJobsRequest::default()
    };
    let mut jobs = apis
        .job
        .list_jobs(session.request(finished))
        .await?
        .into_inner()
        .jobs;
    let live = pb::ListJobsRequest {
        states: vec![pb::JobState::Bound as i32, pb::JobState::Running as i32],
        page_size: 5_000,
        stale: true,
        ..pb::ListJobsRequest::default()
    };
    jobs.extend(super::jobs::every_page(apis, session, live, usize::MAX).await?);
    Ok(jobs)
}

/// One tenant's last day, an hourly point each.
#[derive(Debug, Default, PartialEq)]
struct Usage {
    gpu_hours: Vec<(u64, f64)>,
    energy_kj: Vec<(u64, f64)>,
}

/// Each tenant's GPU hours and energy per hour of the day before `now`: a run's GPU time goes
/// to the hours it spans, a job's energy to the hour it ended in (or the last, while it runs).
fn hourly(jobs: &[pb::Job], now: u64) -> BTreeMap<String, Usage> {
    let start = now.saturating_sub(DAY_MS);
    let hour_of = |t: u64| (t.clamp(start, now.saturating_sub(1)) - start) / HOUR_MS;
    let mut gpu_ms: BTreeMap<String, [f64; 24]> = BTreeMap::new();
    let mut energy: BTreeMap<String, [f64; 24]> = BTreeMap::new();
    for job in jobs {
        let Some(spec) = &job.spec else { continue };
        let gpus = f64::from(spec.gpus * spec.nodes.max(1));
        let tenant = &spec.tenant;
        for run in &job.runs {
            let Some(from) = run.started_at_ms else {
                continue;
            };
            let (from, to) = (from.max(start), run.finished_at_ms.unwrap_or(now).min(now));
            let mut t = from;
            while t < to {
                let hour_end = start + (hour_of(t) + 1) * HOUR_MS;
                let until = to.min(hour_end);
                gpu_ms.entry(tenant.clone()).or_default()[hour_of(t) as usize] +=
                    gpus * (until - t) as f64;
                t = until;
            }
        }
        if job.energy_mj > 0 {
            let at = job.finished_at_ms.unwrap_or(now);
            if at >= start {
                energy.entry(tenant.clone()).or_default()[hour_of(at) as usize] +=
                    job.energy_mj as f64 / 1e6;
            }
        }
    }
    let points = |hours: Option<&[f64; 24]>, scale: f64| -> Vec<(u64, f64)> {
        (0..24u64)
            .map(|h| {
                (
                    start + (h + 1) * HOUR_MS,
                    hours.map_or(0.0, |v| v[h as usize] / scale),
                )
            })
            .collect()
    };
    let tenants: std::collections::BTreeSet<&String> = gpu_ms.keys().chain(energy.keys()).collect();
    tenants
        .into_iter()
        .map(|t| {
            let usage = Usage {
                gpu_hours: points(gpu_ms.get(t), HOUR_MS as f64),
                energy_kj: points(energy.get(t), 1.0),
            };
            (t.clone(), usage)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_time_spreads_over_the_hours_a_run_spans_and_energy_lands_where_it_ended() {
        let now = 100 * HOUR_MS;
        let job = pb::Job {
            spec: Some(pb::JobSpec {
                tenant: "vision".into(),
                gpus: 2,
                ..pb::JobSpec::default()
            }),
            runs: vec![pb::JobRun {
                // From 30 minutes before the second-to-last hour's end into the last hour.
                started_at_ms: Some(now - HOUR_MS - HOUR_MS / 2),
                finished_at_ms: Some(now - HOUR_MS / 2),
                ..pb::JobRun::default()
            }],
            finished_at_ms: Some(now - HOUR_MS / 2),
            energy_mj: 3_000_000,
            ..pb::Job::default()
        };
        let usage = hourly(&[job], now);
        let vision = &usage["vision"];
        let hours: Vec<f64> = vision.gpu_hours.iter().map(|p| p.1).collect();
        assert_eq!(
            hours[21..],
            [0.0, 1.0, 1.0],
            "two GPUs for half an hour in each"
        );
        assert_eq!(vision.energy_kj[23].1, 3.0);
        assert_eq!(vision.energy_kj.iter().map(|p| p.1).sum::<f64>(), 3.0);
        assert_eq!(vision.gpu_hours[23].0, now);
    }
}
