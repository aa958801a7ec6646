//! Job webhooks (leader only): a few times a second the leader reads which jobs changed (the
//! state's `JobLog`), derives the events their records hold that were not posted yet
//! (`events.rs`), and posts each to the job's tenant's webhook and the job's own, as they ask,
//! signed (`signing.rs`), retried with backoff (`post.rs` makes one POST).
//!
//! Delivery is at least once: every event has an id that stays the same on every try and
//! from every leader (`j-7.2.start`), a new leader posts again what happened in the last
//! `TAKEOVER_MARGIN` before it took over, and receivers drop what they have seen. An agent has
//! at most `MAX_IN_FLIGHT` posts open and `MAX_QUEUED` waiting; beyond, new events are dropped
//! with a warning.

mod events;
pub(crate) mod post;
pub(crate) mod signing;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use gpu_raft_store::webhook::Webhook;
use gpu_raft_store::{ClusterState, Job, JobChanges, JobId};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use self::events::{Event, Seen, new_events};
use self::post::Poster;
use crate::clock::now_ms;
use crate::leader::ticks::LeaderTicks;
use crate::raft::Cluster;
use crate::tls::enroll::TlsIdentity;
use crate::tls::signature;

/// How often the leader looks for changes.
const LOOK: Duration = Duration::from_millis(500);
/// What a new leader posts again: what happened this long before it took over.
const TAKEOVER_MARGIN_MS: u64 = 30_000;
/// Posts open at once.
const MAX_IN_FLIGHT: usize = 16;
/// Posts waiting (retries included); beyond, new events are dropped.
const MAX_QUEUED: usize = 10_000;
/// Tries of one post; the waits between them double from `FIRST_BACKOFF`.
const ATTEMPTS: u32 = 6;
const FIRST_BACKOFF: Duration = Duration::from_secs(1);

pub(crate) struct JobNotifier {
    pub cluster: Cluster,
    pub tls: Option<TlsIdentity>,
    pub poster: Poster,
}

/// One post to make: an event's body to one webhook.
struct Post {
    url: String,
    tenant: String,
    event: String,
    id: String,
    body: Vec<u8>,
}

impl JobNotifier {
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let mut ticks = LeaderTicks::new(self.cluster.clone(), LOOK);
        let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        let queued = Arc::new(AtomicUsize::new(0));
        let mut watching: Option<Watching> = None;
        while let Some((_, since)) = ticks.next(&cancel).await {
            let w = match &mut watching {
                Some(w) if w.since == since => w,
                _ => watching.insert(Watching::new(since)),
            };
            let posts = self.cluster.state.read(|s| w.look(s, now_ms()));
            for post in posts {
                if queued.load(Ordering::Relaxed) >= MAX_QUEUED {
                    warn!(id = %post.id, url = %post.url, "webhook queue full; dropping the event");
                    continue;
                }
                queued.fetch_add(1, Ordering::Relaxed);
                let (slots, queued) = (Arc::clone(&slots), Arc::clone(&queued));
                let (poster, tls) = (self.poster.clone(), self.tls.clone());
                tokio::spawn(async move {
                    deliver(&poster, tls.as_ref(), &slots, post).await;
                    queued.fetch_sub(1, Ordering::Relaxed);
                });
            }
        }
    }
}

/// What one term of leadership has seen.
struct Watching {
    since: Instant,
    changes: JobChanges,
    seen: HashMap<JobId, Seen>,
    /// Events of a job not in `seen` count from this time on.
    cutoff_ms: u64,
}

impl Watching {
    fn new(since: Instant) -> Self {
        Self {
            since,
            changes: JobChanges::default(),
            seen: HashMap::new(),
            cutoff_ms: now_ms().saturating_sub(TAKEOVER_MARGIN_MS),
        }
    }

    /// The posts the jobs that changed since the last look call for.
    fn look(&mut self, s: &ClusterState, now_ms: u64) -> Vec<Post> {
        // A set: the log names a job once per change, and a job done is forgotten at once.
        // The first look, or one after changes were missed: every job, as of the cutoff.
        let changed: BTreeSet<JobId> =
            (self.changes.since_last(s)).unwrap_or_else(|| s.jobs.keys().copied().collect());
        let mut posts = Vec::new();
        for id in changed {
            // A job no webhook hears about is not followed (nor kept track of): should one
            // appear, the job's events count from the cutoff on.
            let Some((job, hooks)) = s.jobs.get(&id).map(|j| (j, hooks_of(s, j))) else {
                self.seen.remove(&id);
                continue;
            };
            if hooks.is_empty() {
                self.seen.remove(&id);
                continue;
            }
            let cutoff = self.cutoff_ms;
            let seen = self
                .seen
                .entry(id)
                .or_insert_with(|| Seen::as_of(job, cutoff));
            let events = new_events(job, seen);
            if seen.is_done() {
                self.seen.remove(&id);
            }
            for event in events {
                posts.extend(posts_of(&hooks, job, &event));
            }
        }
        // A job seen next for the first time (done, then requeued) counts from about now;
        // the margin covers entries stamped by a leader whose clock ran behind this one's.
        self.cutoff_ms = now_ms.saturating_sub(2_000);
        posts
    }
}

/// The webhooks that hear about `job`: its tenant's and its own.
fn hooks_of<'a>(s: &'a ClusterState, job: &'a Job) -> Vec<&'a Webhook> {
    let tenant_hook = s
        .tenants
        .get(&job.spec.tenant)
        .and_then(|t| t.webhook.as_ref());
    tenant_hook
        .into_iter()
        .chain(job.spec.notify.as_ref())
        .collect()
}

/// The posts of `event` to each of `hooks` that asked for it.
fn posts_of(hooks: &[&Webhook], job: &Job, event: &Event) -> Vec<Post> {
    let wanted: Vec<&Webhook> = (hooks.iter().copied())
        .filter(|h| h.wants(event.kind))
        .collect();
    if wanted.is_empty() {
        return Vec::new();
    }
    let body = event.body(job);
    wanted
        .into_iter()
        .map(|h| Post {
            url: h.url.clone(),
            tenant: job.spec.tenant.clone(),
            event: event.kind.to_string(),
            id: event.id(),
            body: body.clone(),
        })
        .collect()
}

/// Post `post`, signed, until it is accepted (2xx), refused for good (another 4xx than 408
/// or 429), or `ATTEMPTS` tries fail.
async fn deliver(poster: &Poster, tls: Option<&TlsIdentity>, slots: &Semaphore, post: Post) {
    let Some(ca) = tls
        .and_then(TlsIdentity::current)
        .and_then(|t| t.signing_ca())
    else {
        warn!(id = %post.id, "cannot sign webhook posts: this agent holds no CA key");
        return;
    };
    let secret = signing::secret(&ca.key_pem, &post.tenant);
    let key_id = signature::key_id(&ca.cert_pem).unwrap_or_default();
    let mut backoff = FIRST_BACKOFF;
    for attempt in 1..=ATTEMPTS {
        let outcome = {
            let Ok(_slot) = slots.acquire().await else {
                return;
            };
            let timestamp = now_ms() / 1000;
            let headers = [
                ("x-gpumesh-event", post.event.clone()),
                ("x-gpumesh-delivery", post.id.clone()),
                ("x-gpumesh-timestamp", timestamp.to_string()),
                ("x-gpumesh-key-id", key_id.clone()),
                (
                    "x-gpumesh-signature",
                    signing::signature(&secret, timestamp, &post.body),
                ),
            ];
            poster.post(&post.url, &headers, post.body.clone()).await
        };
        match outcome {
            Ok(status) if (200..300).contains(&status) => {
                debug!(id = %post.id, url = %post.url, "webhook delivered");
                return;
            }
            Ok(status) if (400..500).contains(&status) && status != 408 && status != 429 => {
                warn!(id = %post.id, url = %post.url, status, "webhook refused the event; not retried");
                return;
            }
            Ok(status) => debug!(id = %post.id, url = %post.url, status, attempt, "webhook failed"),
            Err(e) => debug!(id = %post.id, url = %post.url, error = %e, attempt, "webhook failed"),
        }
        if attempt < ATTEMPTS {
            tokio::time::sleep(backoff).await;
            backoff *= 2;
        }
    }
    warn!(id = %post.id, url = %post.url, "giving up on the webhook for this event");
}

#[cfg(test)]
mod tests {
    use gpu_raft_store::tenant::TenantRecord;
    use gpu_raft_store::webhook::NotifyEvent;
    use gpu_raft_store::{Bind, Command, JobSpec, Outcome};

    use super::*;
    use crate::scheduler::testkit::{apply_at, gpu, node, spec};

    fn hook(url: &str, events: &[NotifyEvent]) -> Webhook {
        Webhook {
            url: url.into(),
            events: events.iter().copied().collect::<BTreeSet<_>>(),
        }
    }

    fn tenant(name: &str, webhook: Option<Webhook>) -> Command {
        Command::CreateTenant {
            tenant: TenantRecord {
                webhook,
                ..TenantRecord::named(name)
            },
        }
    }

    fn submit(s: &mut ClusterState, at: u64, spec: JobSpec) {
        let cmd = Command::submit(spec);
        apply_at(s, at, cmd);
    }

    /// Bind job `job` to GPU 0 of node 1, start it and end it with exit code 0.
    fn run(s: &mut ClusterState, at: u64, job: JobId) {
        let binds = vec![Bind {
            job,
            node: 1,
            gpus: vec![0],
        }];
        apply_at(s, at, Command::BindJobs { binds });
        apply_at(s, at + 1, Command::JobStarted { job, generation: 1 });
        let outcome = Outcome::Exited { code: 0 };
        let end = Command::JobFinished {
            job,
            generation: 1,
            outcome,
        };
        apply_at(s, at + 2, end);
    }

    #[test]
    fn a_look_posts_each_new_event_once_to_each_webhook_that_wants_it() {
        let now = now_ms();
        let mut s = ClusterState::new();
        node(&mut s, 1, vec![gpu(0, "A100", 0)]);
        let ends = hook("http://h:1/tenant", &[NotifyEvent::End]);
        apply_at(&mut s, now, tenant("vision", Some(ends)));
        apply_at(&mut s, now, tenant("quiet", None));
        let mine = hook("http://h:1/job", &[]);
        let hooked = JobSpec {
            tenant: "vision".into(),
            notify: Some(mine),
            ..spec(1, 0)
        };
        submit(&mut s, now, hooked);
        let quiet = JobSpec {
            tenant: "quiet".into(),
            ..spec(1, 0)
        };
        submit(&mut s, now, quiet);
        let mut w = Watching::new(Instant::now());
        assert!(w.look(&s, now).is_empty(), "nothing happened yet");
        run(&mut s, now + 1, 1);
        let posts: Vec<(String, String)> = w
            .look(&s, now + 5)
            .into_iter()
            .map(|p| (p.url, p.id))
            .collect();
        assert_eq!(
            posts,
            [
                ("http://h:1/job".to_owned(), "j-1.1.start".to_owned()),
                ("http://h:1/tenant".to_owned(), "j-1.1.end".to_owned()),
                ("http://h:1/job".to_owned(), "j-1.1.end".to_owned()),
            ]
        );
        run(&mut s, now + 10, 2);
        assert!(
            w.look(&s, now + 20).is_empty(),
            "no webhook hears of quiet's job"
        );
        assert!(
            w.seen.is_empty(),
            "ended jobs and unheard ones are not kept"
        );
    }
}
