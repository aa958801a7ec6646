//! The scheduler page: the policy in force (changed here by those who may), and a replay of a
//! trace in the offline simulator under policies of one's choosing, with the JCT distribution
//! and utilization drawn. The trace is this cluster's own finished jobs, or a CSV pasted in the
//! simulator's format; the simulated cluster defaults to this one's nodes and GPUs.

use std::collections::BTreeMap;

use axum::Form;
use axum::extract::State;
use axum::response::{IntoResponse, Redirect};
use gpu_proto::v1 as pb;
use gpu_proto::v1::node_service_server::NodeService;
use gpu_proto::v1::scheduler_service_server::SchedulerService;
use maud::{Markup, PreEscaped, html};
use serde::Deserialize;
use tokio::sync::Semaphore;
use tonic::Status;

use super::Shared;
use super::failure::{Failure, Page};
use super::session::Session;
use super::view::{self, Section};
use crate::api::auth::rbac::Action;
use crate::tools::simulate::{self, Comparison, Estimates, trace};

/// Replays one agent runs at once (each keeps a core busy for seconds).
static REPLAYS: Semaphore = Semaphore::const_new(1);

/// The largest trace a replay takes, and the most policies.
const MAX_TRACE_JOBS: usize = 100_000;
const MAX_POLICIES: usize = 4;

const DEFAULT_POLICIES: &str = "fcfs+easy, sjf+easy, fairshare+easy";

pub(super) async fn page(State(apis): State<Shared>, session: Session) -> Page {
    let form = ReplayForm {
        cluster: this_cluster(&apis, &session).await?,
        policies: DEFAULT_POLICIES.into(),
        ..ReplayForm::default()
    };
    render(&apis, &session, &form, None).await
}

async fn render(
    apis: &Shared,
    session: &Session,
    form: &ReplayForm,
    result: Option<Markup>,
) -> Page {
    let status = apis
        .scheduler
        .get_scheduler_status(session.request(pb::GetSchedulerStatusRequest { stale: true }))
        .await?
        .into_inner();
    let policy = status.policy.unwrap_or_default();
    let manage = session.may(Action::ManageScheduler);
    let body = html! {
        dl.facts {
            dt { "Policy" } dd #policy { (policy.spec) }
            dt { "Ordering" } dd { (policy.ordering) }
            dt { "Backfill" } dd { (policy.backfill) }
            dt { "Preemption" } dd { (policy.preemption) }
            dt { "Aging" } dd { (policy.aging_per_hour) " per hour" }
            dt { "Jobs" } dd { (status.pending_jobs) " pending, " (status.running_jobs) " running" }
            dt { "GPUs" } dd { (status.gpus_free) " free of " (status.gpus_total) }
            @let accuracy = status.accuracy.unwrap_or_default();
            dt { "Users' estimates" } dd #estimates { (guesses(accuracy.estimates.as_ref())) }
            dt { "Predictions" } dd #predictions { (guesses(accuracy.predictions.as_ref())) }
        }
        @if manage {
            form.inline-form method="post" action="/console/scheduler/policy" {
                input type="hidden" name="csrf" value=(session.csrf);
                label { "New policy " input name="policy" placeholder="sjf+easy" required; }
                button type="submit" { "Set" }
            }
            h2 { "Replay a trace" }
            form.submit method="post" action="/console/scheduler/replay" {
                input type="hidden" name="csrf" value=(session.csrf);
                label.wide { "Simulated cluster " span.hint { "(nodes × GPUs × model, groups joined by +)" }
                    input #cluster name="cluster" value=(form.cluster) required; }
                label.wide { "Policies " span.hint { "(at most 4, comma-separated)" }
                    input #policies name="policies" value=(form.policies) required; }
                label { "Estimates" select name="estimates" {
                    option value="exact" selected[form.estimates != "predicted"] { "exact (an upper bound)" }
                    option value="predicted" selected[form.estimates == "predicted"] { "predicted from history" }
                } }
                label.wide { "Trace " span.hint { "(CSV: submit,duration,gpus[,tenant] in seconds; empty: this cluster's finished jobs)" }
                    textarea #trace name="trace" rows="6" { (form.trace) } }
                button #replay type="submit" { "Replay" }
            }
        }
        @if let Some(result) = result { (result) }
    };
    Ok(view::page(session, Section::Scheduler, "Scheduler", body))
}

#[derive(Deserialize)]
pub(super) struct PolicyForm {
    #[serde(default)]
    csrf: String,
    policy: String,
}

pub(super) async fn set_policy(
    State(apis): State<Shared>,
    session: Session,
    Form(form): Form<PolicyForm>,
) -> Page {
    session.check_csrf(&form.csrf)?;
    let req = pb::SetSchedulerPolicyRequest {
        policy: form.policy.trim().to_owned(),
        ..pb::SetSchedulerPolicyRequest::default()
    };
    apis.scheduler
        .set_scheduler_policy(session.request(req))
        .await?;
    Ok(Redirect::to("/console/scheduler").into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct ReplayForm {
    csrf: String,
    cluster: String,
    policies: String,
    estimates: String,
    trace: String,
}

pub(super) async fn replay(
    State(apis): State<Shared>,
    session: Session,
    Form(form): Form<ReplayForm>,
) -> Page {
    session.check_csrf(&form.csrf)?;
    if !session.may(Action::ManageScheduler) {
        return Err(Failure(Status::permission_denied(
            "replaying traces is for admins and operators (it keeps a core busy)",
        )));
    }
    let _turn = REPLAYS.try_acquire().map_err(|_| {
        Failure(Status::resource_exhausted(
            "this agent is already replaying a trace; try again in a moment",
        ))
    })?;
    let policies: Vec<String> = (form.policies.split(','))
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
        .collect();
    if policies.len() > MAX_POLICIES {
        return Err(invalid(format!("at most {MAX_POLICIES} policies at once")));
    }
    let (jobs, source) = if form.trace.trim().is_empty() {
        let jobs = cluster_history(&apis, &session).await?;
        let n = jobs.len();
        (jobs, format!("this cluster's {n} finished GPU jobs"))
    } else {
        let parsed = trace::parse(&form.trace, true).map_err(|e| invalid(e.to_string()))?;
        let skipped = parsed.skipped.len();
        (
            parsed.jobs,
            format!("the pasted trace ({skipped} bad rows skipped)"),
        )
    };
    if jobs.is_empty() {
        return Err(invalid("the trace has no jobs to replay".into()));
    }
    if jobs.len() > MAX_TRACE_JOBS {
        return Err(invalid(format!("at most {MAX_TRACE_JOBS} jobs per replay")));
    }
    let estimates = if form.estimates == "predicted" {
        Estimates::Predicted
    } else {
        Estimates::Exact
    };
    let cluster = form.cluster.trim().to_owned();
    let compared = tokio::task::spawn_blocking(move || {
        simulate::compare(
            &jobs,
            &simulate::Setup {
                cluster: cluster.clone(),
                ..simulate::Setup::default()
            },
            &policies,
            estimates,
        )
        .map(|c| (c.chart(&cluster), c))
    })
    .await
    .map_err(|e| Failure(Status::internal(format!("the replay failed: {e}"))))?
    .map_err(|e| invalid(format!("{e:#}")))?;
    let result = results(&source, &compared.1, &compared.0);
    render(&apis, &session, &form, Some(result)).await
}

/// How good one kind of runtime guess was, over the succeeded jobs the state holds.
fn guesses(e: Option<&pb::GuessErrors>) -> String {
    match e {
        Some(e) if e.count > 0 => format!(
            "{:.0}% median error, {:.0}% within 2× of the actual runtime ({} jobs)",
            e.median_relative_error * 100.0,
            e.within_2x * 100.0,
            e.count
        ),
        _ => "no succeeded job to judge them by yet".into(),
    }
}

fn invalid(why: String) -> Failure {
    Failure(Status::invalid_argument(why))
}

fn results(source: &str, c: &Comparison, chart: &str) -> Markup {
    html! {
        section #replay-results {
            h2 { "Replayed " (source) " on " (c.gpus) " GPUs" }
            table {
                thead { tr {
                    th { "Policy" } th { "Jobs" } th { "Avg JCT h" } th { "p50 JCT h" } th { "p99 JCT h" }
                    th { "Avg wait h" } th { "Makespan h" } th { "Utilization" } th { "Jain (tenants)" } th { "Never placed" }
                } }
                tbody { @for s in &c.summaries { tr {
                    td { (s.policy) } td { (s.jobs) }
                    td { (format!("{:.3}", s.avg_jct_h)) } td { (format!("{:.3}", s.p50_jct_h)) } td { (format!("{:.3}", s.p99_jct_h)) }
                    td { (format!("{:.3}", s.avg_queue_h)) } td { (format!("{:.2}", s.makespan_h)) }
                    td { (format!("{:.1}%", s.utilization * 100.0)) } td { (format!("{:.2}", s.jain_fairness)) } td { (s.never_placed) }
                } } }
            }
            // Drawn by the simulator's own chart code, which escapes its text.
            div.chart { (PreEscaped(chart)) }
        }
    }
}

/// This cluster as a simulator cluster spec: its nodes grouped by GPU count and model (a node
/// with two models counts as one node of each).
async fn this_cluster(apis: &Shared, session: &Session) -> Result<String, Failure> {
    let nodes = apis
        .node
        .list_nodes(session.request(pb::ListNodesRequest { stale: true }))
        .await?
        .into_inner()
        .nodes;
    let mut groups: BTreeMap<(u32, String), u32> = BTreeMap::new();
    for n in &nodes {
        let mut models: BTreeMap<&str, u32> = BTreeMap::new();
        for g in &n.gpus {
            *models.entry(g.model.as_str()).or_default() += 1;
        }
        for (model, count) in models {
            *groups.entry((count, model.to_owned())).or_default() += 1;
        }
    }
    Ok(groups
        .iter()
        .map(|((gpus, model), nodes)| format!("{nodes}x{gpus}x{model}"))
        .collect::<Vec<_>>()
        .join("+"))
}

/// The finished GPU jobs the session may read, as a trace (times from the first submission).
async fn cluster_history(
    apis: &Shared,
    session: &Session,
) -> Result<Vec<trace::TraceJob>, Failure> {
    let req = pb::ListJobsRequest {
        states: [
            pb::JobState::Succeeded,
            pb::JobState::Failed,
            pb::JobState::Cancelled,
        ]
        .map(|s| s as i32)
        .to_vec(),
        page_size: 5_000,
        stale: true,
        ..pb::ListJobsRequest::default()
    };
    let finished = super::jobs::every_page(apis, session, req, MAX_TRACE_JOBS).await?;
    Ok(as_trace(&finished))
}

fn as_trace(jobs: &[pb::Job]) -> Vec<trace::TraceJob> {
    let first = jobs.iter().map(|j| j.submitted_at_ms).min().unwrap_or(0);
    let mut trace: Vec<trace::TraceJob> = jobs
        .iter()
        .filter_map(|j| {
            let spec = j.spec.as_ref()?;
            // A gang's `gpus` counts every node's share already.
            let gpus = spec.gpus;
            let ran = j.finished_at_ms?.checked_sub(j.started_at_ms?)?;
            (gpus > 0).then(|| trace::TraceJob {
                line: 0,
                submit_ms: j.submitted_at_ms - first,
                duration_ms: ran.max(1),
                gpus,
                tenant: spec.tenant.clone(),
                name: spec.name.clone(),
                priority: spec.priority.unwrap_or(0),
                estimate_s: spec.runtime_estimate_s,
                // One type required; several are a preference the replay cannot express.
                gpu_type: match spec.gpu_types.as_slice() {
                    [only] => Some(only.clone()),
                    _ => None,
                },
                nodes: (spec.nodes > 1).then_some(spec.nodes),
                slice: if !spec.mig_profile.is_empty() {
                    Some(trace::TraceSlice::Mig(spec.mig_profile.clone()))
                } else {
                    (spec.gpu_share > 0).then_some(trace::TraceSlice::Share(spec.gpu_share))
                },
            })
        })
        .collect();
    trace.sort_by_key(|t| t.submit_ms);
    for (i, t) in trace.iter_mut().enumerate() {
        t.line = i + 2;
    }
    trace
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finished_gpu_jobs_become_a_trace_from_the_first_submission() {
        let job = |id, at, started, finished, gpus| pb::Job {
            id,
            submitted_at_ms: at,
            started_at_ms: Some(started),
            finished_at_ms: Some(finished),
            spec: Some(pb::JobSpec {
                gpus,
                tenant: "vision".into(),
                ..pb::JobSpec::default()
            }),
            ..pb::Job::default()
        };
        let trace = as_trace(&[
            job(2, 5_000, 6_000, 9_000, 2),
            job(1, 1_000, 2_000, 62_000, 1),
            job(3, 7_000, 7_000, 8_000, 0),
        ]);
        let got: Vec<(u64, u64, u32)> = trace
            .iter()
            .map(|t| (t.submit_ms, t.duration_ms, t.gpus))
            .collect();
        assert_eq!(
            got,
            [(0, 60_000, 1), (4_000, 3_000, 2)],
            "CPU jobs left out"
        );
    }
}
