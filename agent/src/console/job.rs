//! One job's page: its spec, its attempts, why it waits and when it may start, its live log,
//! and the buttons the session's role allows (cancel, hold, release, requeue).

use axum::Form;
use axum::extract::{Path, State};
use axum::response::{Html, IntoResponse, Redirect};
use gpu_proto::v1 as pb;
use gpu_proto::v1::job_service_server::JobService;
use maud::{Markup, html};
use serde::Deserialize;
use tonic::Status;

use super::Shared;
use super::failure::{Failure, Page};
use super::session::Session;
use super::view::{self, Section, span, when};
use crate::api::auth::rbac::Action;

/// What the page shows of a job, read together.
struct Shown {
    job: pb::Job,
    why: Option<pb::JobExplanation>,
}

async fn read(apis: &Shared, session: &Session, id: u64) -> Result<Shown, Failure> {
    let job = apis
        .job
        .get_job(session.request(pb::GetJobRequest {
            id,
            ..pb::GetJobRequest::default()
        }))
        .await?
        .into_inner();
    let waiting = job.state == pb::JobState::Pending as i32;
    let why = if waiting {
        let req = pb::ExplainJobRequest { id, stale: true };
        apis.job
            .explain_job(session.request(req))
            .await
            .ok()
            .map(|r| r.into_inner())
    } else {
        None
    };
    Ok(Shown { job, why })
}

pub(super) async fn page(
    State(apis): State<Shared>,
    session: Session,
    Path(id): Path<u64>,
) -> Page {
    let shown = read(&apis, &session, id).await?;
    let job = &shown.job;
    let spec = job.spec.clone().unwrap_or_default();
    let title = format!("j-{id} {}", spec.name);
    let body = html! {
        div #job-panel data-rows={ "/console/jobs/" (id) "/panel" } data-watch={ "/console/events/jobs?job=" (id) } {
            (live_part(&session, &shown))
        }
        section {
            h2 { "Spec" }
            (spec_table(&spec))
        }
        section {
            h2 { "Log " span.hint { "(stdout of the latest attempt, live)" } }
            pre #log data-log={ "/console/events/logs/" (id) } {}
        }
    };
    Ok(view::page(&session, Section::Jobs, &title, body))
}

/// The parts that change while the job lives, alone, for a refresh in place.
pub(super) async fn panel(
    State(apis): State<Shared>,
    session: Session,
    Path(id): Path<u64>,
) -> Page {
    let shown = read(&apis, &session, id).await?;
    Ok(Html(live_part(&session, &shown).into_string()).into_response())
}

fn live_part(session: &Session, shown: &Shown) -> Markup {
    let job = &shown.job;
    let tenant = job
        .spec
        .as_ref()
        .map(|s| s.tenant.as_str())
        .unwrap_or_default();
    let state = pb::JobState::try_from(job.state).unwrap_or_default();
    let live = matches!(
        state,
        pb::JobState::Pending | pb::JobState::Bound | pb::JobState::Running
    );
    let may_write = session.may(Action::WriteJob(tenant));
    html! {
        p.status #job-state {
            (view::state_badge(job.state))
            @if job.held { " " span.tag { "held" } }
            @if job.cancel_requested { " " span.tag { "cancelling" } }
            @if !job.reason.is_empty() { " " span.reason { (job.reason) } }
        }
        @if may_write {
            div.actions {
                @if live { (button(session, job.id, "cancel", "Cancel")) }
                @if state == pb::JobState::Pending && !job.held { (button(session, job.id, "hold", "Hold")) }
                @if job.held { (button(session, job.id, "release", "Release")) }
                @if state != pb::JobState::Pending { (button(session, job.id, "requeue", "Requeue")) }
            }
        }
        @if let Some(why) = &shown.why { (explanation(why)) }
        dl.facts {
            dt { "Tenant" } dd { (tenant) }
            dt { "Submitted" } dd { (when(job.submitted_at_ms)) @if !job.submitted_by.is_empty() { " by " (job.submitted_by) } }
            @if let Some(n) = job.node_id { dt { "Node" } dd { "n" (n) " GPUs " (join(&job.gpus)) } }
            @if !job.slice.is_empty() { dt { "Slice" } dd { (job.slice) } }
            @if job.energy_mj > 0 { dt { "Energy" } dd { (format!("{:.1}", job.energy_mj as f64 / 1e6)) " kJ" } }
            @if let Some(code) = job.exit_code { dt { "Exit code" } dd { (code) } }
        }
        @if !job.runs.is_empty() {
            h2 { "Attempts" }
            table.runs {
                thead { tr { th { "#" } th { "Nodes" } th { "Bound" } th { "Ran for" } th { "Outcome" } } }
                tbody { @for r in &job.runs { tr {
                    td { (r.attempt) }
                    td { (r.nodes.iter().map(|n| format!("n{n}")).collect::<Vec<_>>().join(",")) }
                    td { (when(r.bound_at_ms)) }
                    td { @if let (Some(s), Some(f)) = (r.started_at_ms, r.finished_at_ms) { (span(f.saturating_sub(s))) } }
                    td { (r.outcome) }
                } } }
            }
        }
    }
}

fn explanation(why: &pb::JobExplanation) -> Markup {
    html! {
        div.why {
            p { "Position " strong { (why.queue_position) } " of " (why.pending_jobs) " pending under " (why.policy) "." }
            @if !why.reason.is_empty() { p { (why.reason) } }
            @if let Some(at) = why.estimated_start_ms { p { "Expected start: " (when(at)) " UTC." } }
            @if !why.estimate_note.is_empty() { p.hint { (why.estimate_note) } }
        }
    }
}

fn button(session: &Session, id: u64, action: &str, label: &str) -> Markup {
    html! {
        form.inline method="post" action={ "/console/jobs/" (id) "/" (action) } {
            input type="hidden" name="csrf" value=(session.csrf);
            button type="submit" name="do" value=(action) { (label) }
        }
    }
}

fn spec_table(spec: &pb::JobSpec) -> Markup {
    html! {
        dl.facts {
            dt { "Command" } dd { code { (spec.command.join(" ")) } }
            @if !spec.workdir.is_empty() { dt { "Workdir" } dd { code { (spec.workdir) } } }
            dt { "GPUs" } dd { (spec.gpus) @if spec.nodes > 1 { " × " (spec.nodes) " nodes" } @if !spec.gpu_types.is_empty() { " (" (spec.gpu_types.join(", ")) ")" } }
            @if !spec.mig_profile.is_empty() { dt { "MIG profile" } dd { (spec.mig_profile) } }
            @if let Some(p) = spec.priority { dt { "Priority" } dd { (p) } }
            @if let Some(t) = spec.wall_time_limit_s { dt { "Time limit" } dd { (span(t * 1000)) } }
            @if let Some(c) = &spec.container { @if !c.image.is_empty() { dt { "Image" } dd { code { (c.image) } } } }
            @for (k, v) in &spec.labels { dt { "Label " (k) } dd { (v) } }
            @if !spec.after.is_empty() { dt { "After" } dd { (spec.after.join(", ")) } }
        }
    }
}

fn join(items: &[u32]) -> String {
    items
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

#[derive(Deserialize)]
pub(super) struct ActionForm {
    #[serde(default)]
    csrf: String,
}

/// A button's post: the API call it stands for, then back to the job's page.
pub(super) async fn act(
    State(apis): State<Shared>,
    session: Session,
    Path((id, action)): Path<(u64, String)>,
    Form(form): Form<ActionForm>,
) -> Page {
    session.check_csrf(&form.csrf)?;
    let api = &apis.job;
    match action.as_str() {
        "cancel" => {
            let req = pb::CancelJobRequest {
                id,
                array_index: None,
            };
            api.cancel_job(session.request(req)).await?;
        }
        "hold" => {
            let req = pb::HoldJobRequest {
                id,
                array_index: None,
            };
            api.hold_job(session.request(req)).await?;
        }
        "release" => {
            let req = pb::HoldJobRequest {
                id,
                array_index: None,
            };
            api.release_job(session.request(req)).await?;
        }
        "requeue" => {
            let req = pb::RequeueJobRequest {
                id,
                array_index: None,
            };
            api.requeue_job(session.request(req)).await?;
        }
        other => {
            return Err(Failure(Status::not_found(format!(
                "no job action {other:?}"
            ))));
        }
    }
    Ok(Redirect::to(&format!("/console/jobs/{id}")).into_response())
}
