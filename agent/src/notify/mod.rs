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

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use gpu_raft_store::webhook::Webhook;
use gpu_raft_store::{ClusterState, Job, JobId, KeptIndex};
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
    changes: KeptIndex<()>,
    seen: HashMap<JobId, Seen>,
    /// Events of a job not in `seen` count from this time on.
    cutoff_ms: u64,
}

impl Watching {
    fn new(since: Instant) -> Self {
        Self {
            since,
            changes: KeptIndex::default(),
            seen: HashMap::new(),
            cutoff_ms: now_ms().saturating_sub(TAKEOVER_MARGIN_MS),
        }
    }

    /// The posts the jobs that changed since the last look call for.
    fn look(&mut self, s: &ClusterState, now_ms: u64) -> Vec<Post> {
        let mut changed = Vec::new();
        let mut rebuilt = false;
        self.changes.get(
            s,
            |()| true,
            |_| rebuilt = true,
            |(), _, job| {
                changed.push(job);
            },
        );
        if rebuilt {
            // The first look, or changes were missed: every job, as of the cutoff.
            changed = s.jobs.keys().copied().collect();
        }
        let mut posts = Vec::new();
        for id in changed {
            let Some(job) = s.jobs.get(&id) else {
                self.seen.remove(&id);
                continue;
            };
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
                posts.extend(posts_of(s, job, &event));
            }
        }
        // A job seen next for the first time (done, then requeued) counts from about now;
        // the margin covers entries stamped by a leader whose clock ran behind this one's.
        self.cutoff_ms = now_ms.saturating_sub(2_000);
        posts
    }
}

/// The posts of `event`: to the tenant's webhook and the job's own, each if it asked for it.
fn posts_of(s: &ClusterState, job: &Job, event: &Event) -> Vec<Post> {
    let tenant_hook = s
        .tenants
        .get(&job.spec.tenant)
        .and_then(|t| t.webhook.as_ref());
    let hooks: Vec<&Webhook> = tenant_hook
        .into_iter()
        .chain(job.spec.notify.as_ref())
        .collect();
    let wanted: Vec<&Webhook> = hooks.into_iter().filter(|h| h.wants(event.kind)).collect();
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
