//! `WatchJobs`: the jobs matching a list's filters, as they change. The stream reads the
//! state's `JobLog` (the jobs each applied entry changed) a few times a second and answers
//! with the matching jobs that changed; it reads on only when the client has taken the last
//! answer, so a slow watcher holds one answer of at most a page, and an agent serves at most
//! `MAX_WATCHERS` watches at once.

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use gpu_proto::v1 as pb;
use gpu_raft_store::{ClusterState, Job, JobChanges, JobId, StateReader};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;

use crate::api::auth::rbac::{Action, Identity};
use crate::api::job_filter::JobFilter;
use crate::api::job_list::MAX_PAGE;

pub(crate) type WatchStream =
    Pin<Box<dyn Stream<Item = Result<pb::WatchJobsResponse, Status>> + Send>>;

/// Watches one agent serves at once; one more is refused (RESOURCE_EXHAUSTED).
pub(crate) const MAX_WATCHERS: usize = 64;

/// How often a watch looks for changes.
const POLL: Duration = Duration::from_millis(200);

/// The agent's count of open watches.
pub(crate) fn watchers() -> Arc<Semaphore> {
    Arc::new(Semaphore::new(MAX_WATCHERS))
}

/// A place among the open watches, or why there is none.
pub(crate) fn admit(watchers: &Arc<Semaphore>) -> Result<OwnedSemaphorePermit, Status> {
    Arc::clone(watchers).try_acquire_owned().map_err(|_| {
        Status::resource_exhausted(format!(
            "this agent already serves {MAX_WATCHERS} watches; try another agent or later"
        ))
    })
}

/// How a job is shown to the watcher.
pub(crate) type View = fn(&ClusterState, &Job) -> pb::Job;

/// One watch's progress.
struct Watch {
    state: StateReader,
    view: View,
    filter: JobFilter,
    identity: Identity,
    seen: JobChanges,
    /// Jobs that changed and are not sent yet (beyond one answer's page).
    queued: BTreeSet<JobId>,
    begun: bool,
    _permit: OwnedSemaphorePermit,
}

/// The stream of a watch for `identity` of the jobs `filter` selects, from now on, each
/// shown by `view`.
pub(crate) fn watch(
    state: StateReader,
    filter: JobFilter,
    identity: Identity,
    permit: OwnedSemaphorePermit,
    view: View,
) -> WatchStream {
    let watch = Watch {
        state,
        view,
        filter,
        identity,
        seen: JobChanges::default(),
        queued: BTreeSet::new(),
        begun: false,
        _permit: permit,
    };
    Box::pin(futures::stream::unfold(watch, |mut w| async move {
        let answer = w.next().await;
        Some((Ok(answer), w))
    }))
}

impl Watch {
    /// The next answer: the first says the watch has begun; then, once something matching
    /// changed, at most a page of it.
    async fn next(&mut self) -> pb::WatchJobsResponse {
        if !self.begun {
            self.poll();
            self.queued.clear();
            self.begun = true;
            return pb::WatchJobsResponse::default();
        }
        loop {
            let resync = self.poll();
            let jobs = self.take_page();
            if resync || !jobs.is_empty() {
                return pb::WatchJobsResponse { jobs, resync };
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Queue the jobs that changed since the last look; whether the record of changes had
    /// moved on too far (or the state was replaced) since.
    fn poll(&mut self) -> bool {
        let changed = self.state.read(|s| self.seen.since_last(s));
        match changed {
            Some(jobs) => {
                self.queued.extend(jobs);
                false
            }
            None => self.begun,
        }
    }

    /// The queued jobs that the caller may see and the filter selects, as they are now: at
    /// most a page of them, the rest left queued.
    fn take_page(&mut self) -> Vec<pb::Job> {
        let (filter, identity, queued) = (&self.filter, &self.identity, &mut self.queued);
        let view = self.view;
        self.state.read(|s| {
            let mut page = Vec::new();
            while page.len() < MAX_PAGE
                && let Some(id) = queued.pop_first()
            {
                let Some(job) = s.jobs.get(&id) else { continue };
                if identity.may(Action::ReadJob(&job.spec.tenant)).is_ok() && filter.matches(job) {
                    page.push(view(s, job));
                }
            }
            page
        })
    }
}
