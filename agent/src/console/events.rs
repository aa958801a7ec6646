//! Server-sent events that keep open pages current: which jobs changed (the page then fetches
//! its table or panel again, rendered on the server), and a job's log as it is written. Each
//! stream is pulled by the browser's connection: a slow reader holds one event, not a backlog,
//! and an agent serves at most `MAX_STREAMS` of them at once (job watches are also counted
//! against the API's own `WatchJobs` limit).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use gpu_proto::v1 as pb;
use gpu_proto::v1::job_service_server::JobService;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;

use super::Shared;
use super::failure::{Failure, Page};
use super::jobs::JobQuery;
use super::session::Session;

/// Event streams one agent's console serves at once.
pub(crate) const MAX_STREAMS: usize = 128;

pub(crate) fn streams() -> Arc<Semaphore> {
    Arc::new(Semaphore::new(MAX_STREAMS))
}

fn admit(apis: &Shared) -> Result<OwnedSemaphorePermit, Failure> {
    Arc::clone(&apis.streams).try_acquire_owned().map_err(|_| {
        Failure(Status::resource_exhausted(format!(
            "this agent's console already serves {MAX_STREAMS} live streams; reload later"
        )))
    })
}

/// `jobs` events naming the jobs of the query that changed (`resync` when the watch begins
/// or lost track), for the page to fetch what it shows again.
pub(super) async fn jobs(
    State(apis): State<Shared>,
    session: Session,
    Query(q): Query<JobQuery>,
) -> Page {
    let permit = admit(&apis)?;
    let mut req = q.request();
    // A job that leaves the page's states (ends, say) changed too: watch every state.
    req.states.clear();
    let watch = apis
        .job
        .watch_jobs(session.request(req))
        .await?
        .into_inner();
    let only = q.job;
    let events = watch.filter_map(move |answer| {
        let event = match answer {
            // The first answer says the watch has begun: what changed between the page's
            // rendering and now is fetched once.
            Ok(a) if a.resync || a.jobs.is_empty() => {
                Some(Event::default().event("jobs").data("resync"))
            }
            Ok(a) => {
                let ids: Vec<String> = (a.jobs.iter())
                    .map(|j| j.array_id.unwrap_or(j.id))
                    .filter(|id| only.is_none_or(|o| o == *id))
                    .map(|id| id.to_string())
                    .collect();
                (!ids.is_empty()).then(|| Event::default().event("jobs").data(ids.join(",")))
            }
            Err(e) => Some(Event::default().event("failed").data(e.message())),
        };
        std::future::ready(event.map(Ok::<_, Infallible>))
    });
    Ok(live(events, permit))
}

/// `log` events carrying the job's stdout (JSON strings), from its start, following it while
/// the job runs.
pub(super) async fn logs(
    State(apis): State<Shared>,
    session: Session,
    Path(id): Path<u64>,
) -> Page {
    let permit = admit(&apis)?;
    let req = pb::JobLogsRequest {
        job_id: id,
        stream: pb::LogStream::Stdout as i32,
        follow: true,
        ..pb::JobLogsRequest::default()
    };
    let chunks = apis.job.job_logs(session.request(req)).await?.into_inner();
    let events = chunks
        .map(|chunk| {
            let event = match chunk {
                Ok(c) => {
                    let mut text = String::new();
                    if c.skipped > 0 {
                        text.push_str(&format!("[… {} bytes not kept …]\n", c.skipped));
                    }
                    text.push_str(&String::from_utf8_lossy(&c.data));
                    Event::default()
                        .event("log")
                        .data(serde_json::to_string(&text).unwrap_or_default())
                }
                Err(e) => Event::default().event("failed").data(e.message()),
            };
            Ok::<_, Infallible>(event)
        })
        .chain(futures::stream::once(async {
            Ok(Event::default().event("end").data("end"))
        }));
    Ok(live(events, permit))
}

/// An event stream holding its place among the console's streams until the browser leaves.
fn live(
    events: impl Stream<Item = Result<Event, Infallible>> + Send + 'static,
    permit: OwnedSemaphorePermit,
) -> Response {
    let held = events.map(move |e| {
        let _ = &permit;
        e
    });
    Sse::new(held)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}
