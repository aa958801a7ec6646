//! The jobs page: a filterable table of the jobs the session's token may read, a page at a
//! time, refreshed in place when the server's event stream says that jobs changed.

use axum::extract::{Query, State};
use axum::response::{Html, IntoResponse};
use gpu_proto::v1 as pb;
use gpu_proto::v1::job_service_server::JobService;
use maud::{Markup, html};
use serde::{Deserialize, Serialize};

use super::Shared;
use super::failure::{Failure, Page};
use super::session::Session;
use super::view::{self, Section};

/// Lines per page of the table.
const PAGE: u32 = 50;

/// The table's filters, as the page's form and links carry them.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default)]
pub(super) struct JobQuery {
    /// `active` (the default), `finished`, `all`, or one state's name.
    pub state: String,
    pub tenant: String,
    pub name: String,
    pub user: String,
    /// `key=value`.
    pub label: String,
    /// Jobs below this id (an older page; the newest come first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before: Option<u64>,
    /// One job's changes only (the event stream of a job's page).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<u64>,
}

impl JobQuery {
    fn states(&self) -> Vec<i32> {
        use pb::JobState::*;
        let states: &[pb::JobState] = match self.state.as_str() {
            "" | "active" => &[Pending, Bound, Running],
            "finished" => &[Succeeded, Failed, Cancelled],
            "pending" => &[Pending],
            "bound" => &[Bound],
            "running" => &[Running],
            "succeeded" => &[Succeeded],
            "failed" => &[Failed],
            "cancelled" => &[Cancelled],
            _ => &[],
        };
        states.iter().map(|s| *s as i32).collect()
    }

    /// The API's request for this query's page.
    pub(super) fn request(&self) -> pb::ListJobsRequest {
        let labels = self
            .label
            .split_once('=')
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .into_iter()
            .collect();
        pb::ListJobsRequest {
            states: self.states(),
            tenant: self.tenant.trim().to_owned(),
            name: self.name.trim().to_owned(),
            user: self.user.trim().to_owned(),
            labels,
            fold_arrays: true,
            page_size: PAGE,
            newest_first: true,
            before_id: self.before.unwrap_or(0),
            ..pb::ListJobsRequest::default()
        }
    }

    /// This query as a URL's query string (without the page).
    pub(super) fn encoded(&self) -> String {
        let first_page = JobQuery {
            before: None,
            ..self.clone()
        };
        serde_urlencoded::to_string(first_page).unwrap_or_default()
    }
}

pub(super) async fn page(
    State(apis): State<Shared>,
    session: Session,
    Query(q): Query<JobQuery>,
) -> Page {
    let list = list(&apis, &session, &q).await?;
    let query = q.encoded();
    let body = html! {
        (filters(&q))
        table.jobs {
            thead { tr {
                th { "ID" } th { "Name" } th { "Tenant" } th { "User" } th { "State" }
                th { "GPUs" } th { "Where" } th { "Submitted" } th { "Reason" }
            } }
            tbody #job-rows data-rows={ "/console/jobs/rows?" (query) @if let Some(b) = q.before { "&before=" (b) } }
                data-watch={ "/console/events/jobs?" (query) } {
                (rows_of(&list.jobs))
            }
        }
        (pager(&q, &query, list.next_before_id))
    };
    Ok(view::page(&session, Section::Jobs, "Jobs", body))
}

/// The table's body alone, for a refresh in place.
pub(super) async fn rows(
    State(apis): State<Shared>,
    session: Session,
    Query(q): Query<JobQuery>,
) -> Page {
    let list = list(&apis, &session, &q).await?;
    Ok(Html(rows_of(&list.jobs).into_string()).into_response())
}

/// Every page of the jobs `req` asks for (up from its `after_id`), until the last page or
/// until more than `cap` jobs are gathered.
pub(super) async fn every_page(
    apis: &Shared,
    session: &Session,
    mut req: pb::ListJobsRequest,
    cap: usize,
) -> Result<Vec<pb::Job>, Failure> {
    let mut jobs = Vec::new();
    loop {
        let page = apis
            .job
            .list_jobs(session.request(req.clone()))
            .await?
            .into_inner();
        jobs.extend(page.jobs);
        match page.next_after_id {
            Some(after) if jobs.len() <= cap => req.after_id = after,
            _ => return Ok(jobs),
        }
    }
}

/// The page of jobs `q` asks for, as the session's token may see them.
async fn list(
    apis: &Shared,
    session: &Session,
    q: &JobQuery,
) -> Result<pb::ListJobsResponse, Failure> {
    let req = session.request(q.request());
    Ok(apis.job.list_jobs(req).await?.into_inner())
}

fn filters(q: &JobQuery) -> Markup {
    let states = [
        "active",
        "finished",
        "all",
        "pending",
        "bound",
        "running",
        "succeeded",
        "failed",
        "cancelled",
    ];
    let chosen = if q.state.is_empty() {
        "active"
    } else {
        q.state.as_str()
    };
    html! {
        form.filters method="get" action="/console/jobs" {
            label { "State " select name="state" {
                @for s in states { option value=(s) selected[s == chosen] { (s) } }
            } }
            label { "Tenant " input name="tenant" value=(q.tenant) size="10"; }
            label { "Name " input name="name" value=(q.name) size="12" placeholder="glob: train-*"; }
            label { "User " input name="user" value=(q.user) size="10"; }
            label { "Label " input name="label" value=(q.label) size="12" placeholder="key=value"; }
            button type="submit" { "Filter" }
        }
    }
}

fn pager(q: &JobQuery, query: &str, older: Option<u64>) -> Markup {
    html! {
        p.pager {
            @if q.before.is_some() { a href={ "/console/jobs?" (query) } { "Newest" } " " }
            @if let Some(before) = older { a #next-page href={ "/console/jobs?" (query) "&before=" (before) } { "Older" } }
        }
    }
}

fn rows_of(jobs: &[pb::Job]) -> Markup {
    html! {
        @if jobs.is_empty() { tr { td colspan="9" .empty { "No jobs." } } }
        @for j in jobs { (row(j)) }
    }
}

fn row(j: &pb::Job) -> Markup {
    let spec = j.spec.clone().unwrap_or_default();
    let gpus = if spec.nodes > 1 {
        spec.gpus * spec.nodes
    } else {
        spec.gpus
    };
    let place = if !j.gang_nodes.is_empty() {
        j.gang_nodes
            .iter()
            .map(|n| format!("n{n}"))
            .collect::<Vec<_>>()
            .join(",")
    } else {
        j.node_id.map(|n| format!("n{n}")).unwrap_or_default()
    };
    html! {
        tr data-job=(j.id) {
            td { a href={ "/console/jobs/" (j.id) } { "j-" (j.id) } }
            td.name { (spec.name) @if j.array_id.is_some() { " " span.tag { "array" } } }
            td { (spec.tenant) }
            td { (j.submitted_by) }
            td {
                @if j.array_task_states.is_empty() { (view::state_badge(j.state)) }
                @else {
                    @for (state, n) in &j.array_task_states { span class={ "state " (state) } { (n) " " (state) } " " }
                }
                @if j.held { " " span.tag { "held" } }
            }
            td { @if !j.slice.is_empty() { (j.slice) } @else { (gpus) } }
            td { (place) }
            td { (view::when(j.submitted_at_ms)) }
            td.reason { (j.reason) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_becomes_the_apis_filters() {
        let q = JobQuery {
            state: "finished".into(),
            label: "team = vision".into(),
            before: Some(40),
            ..JobQuery::default()
        };
        let req = q.request();
        assert_eq!(req.states.len(), 3);
        assert_eq!(req.labels.get("team").map(String::as_str), Some("vision"));
        assert_eq!(
            (req.before_id, req.page_size, req.newest_first),
            (40, PAGE, true)
        );
        assert!(req.fold_arrays);
        assert!(!q.encoded().contains("before"));
        assert_eq!(JobQuery::default().request().states.len(), 3);
    }

    #[test]
    fn hostile_text_renders_inert() {
        let job = pb::Job {
            id: 7,
            spec: Some(pb::JobSpec {
                name: "<script>alert(1)</script>".into(),
                tenant: "\"><img src=x onerror=alert(1)>".into(),
                ..pb::JobSpec::default()
            }),
            ..pb::Job::default()
        };
        let html = row(&job).into_string();
        assert!(!html.contains("<script>"), "{html}");
        assert!(!html.contains("<img"), "{html}");
        assert!(html.contains("&lt;script&gt;"), "{html}");
    }
}
