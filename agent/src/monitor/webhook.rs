//! Alert notifications POSTed as JSON to the configured webhooks (`monitor.webhooks`, http or
//! https URLs, posted by `notify::post`). The evaluator hands notices over without waiting (`Notifier::notify`); a
//! task of its own delivers them in order, retrying each with backoff, so a webhook that is
//! down or slow never holds up sampling, evaluation or Raft. A full queue drops the newest
//! notice with a warning.

use std::time::Duration;

use gpu_raft_store::Alert;
use hyper::Uri;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::notify::post::Poster;

/// Notices waiting for delivery.
const QUEUE: usize = 256;
/// Deliveries of one notice to one webhook before it is given up.
const ATTEMPTS: u32 = 5;
/// The first retry's delay; each later one doubles it.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);

/// What happened to an alert.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Event {
    Raised,
    Resolved,
}

/// The JSON body of one POST.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Notice {
    pub event: Event,
    pub alert: Alert,
}

/// The evaluator's end: never blocks.
#[derive(Clone)]
pub(crate) struct Notifier {
    queue: Option<mpsc::Sender<Notice>>,
}

impl Notifier {
    /// A notifier and the sender task for `urls`; with no URLs, no task and notices go nowhere.
    pub(crate) fn new(urls: Vec<Uri>, poster: Poster) -> (Notifier, Option<WebhookSender>) {
        if urls.is_empty() {
            return (Notifier { queue: None }, None);
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        (
            Notifier { queue: Some(tx) },
            Some(WebhookSender { urls, rx, poster }),
        )
    }

    pub(crate) fn notify(&self, notice: Notice) {
        let Some(queue) = &self.queue else { return };
        if let Err(e) = queue.try_send(notice) {
            warn!(error = %e, "webhook queue full; dropping an alert notice");
        }
    }
}

pub(crate) struct WebhookSender {
    urls: Vec<Uri>,
    rx: mpsc::Receiver<Notice>,
    poster: Poster,
}

impl WebhookSender {
    pub(crate) async fn run(mut self, cancel: CancellationToken) {
        loop {
            let notice = tokio::select! {
                () = cancel.cancelled() => return,
                n = self.rx.recv() => match n {
                    Some(n) => n,
                    None => return,
                },
            };
            let body = match serde_json::to_vec(&notice) {
                Ok(b) => b,
                Err(e) => {
                    warn!(error = %e, "encoding an alert notice failed");
                    continue;
                }
            };
            for url in &self.urls {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = deliver(&self.poster, url, &body, notice.alert.id, FIRST_BACKOFF) => {}
                }
            }
        }
    }
}

/// POST `body` to `url`, retrying with backoff (starting at `backoff`, doubling) until it is
/// accepted (2xx) or `ATTEMPTS` fail.
async fn deliver(poster: &Poster, url: &Uri, body: &[u8], alert: u64, mut backoff: Duration) {
    for attempt in 1..=ATTEMPTS {
        match poster.post(&url.to_string(), &[], body.to_vec()).await {
            Ok(status) if (200..300).contains(&status) => {
                info!(alert, %url, "alert notice delivered");
                return;
            }
            Ok(status) => warn!(alert, %url, attempt, status, "webhook refused the notice"),
            Err(e) => warn!(alert, %url, attempt, error = %e, "webhook failed"),
        }
        if attempt < ATTEMPTS {
            tokio::time::sleep(backoff).await;
            backoff *= 2;
        }
    }
    warn!(alert, %url, "giving up on the webhook for this notice");
}

/// A webhook URL from the config: `http(s)://host[:port]/path`.
pub(crate) fn parse_url(s: &str) -> Result<Uri, String> {
    let uri: Uri = s.parse().map_err(|e| format!("webhook {s:?}: {e}"))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(_)) => Ok(uri),
        _ => Err(format!(
            "webhook {s:?}: expected http(s)://host[:port]/path"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_urls_must_be_plain_http_with_a_host() {
        assert!(parse_url("http://127.0.0.1:9000/alerts").is_ok());
        assert!(parse_url("http://hooks.local/x?y=1").is_ok());
        assert!(parse_url("https://hooks.slack.com/x").is_ok());
        for (bad, why) in [
            ("ftp://x/y", "expected http(s)://"),
            ("/just/a/path", "expected http(s)://"),
            ("http://", "webhook"),
        ] {
            let e = parse_url(bad).expect_err(bad);
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}

#[cfg(test)]
mod delivery {
    use super::*;

    fn poster() -> Poster {
        Poster::new(None).expect("a poster")
    }

    fn notice(id: u64) -> Notice {
        Notice {
            event: Event::Raised,
            alert: Alert {
                id,
                rule: "gpu-overheat".into(),
                node: 1,
                gpu: 0,
                severity: Default::default(),
                remediation: Default::default(),
                message: "hot".into(),
                raised_at_ms: 1,
                resolved_at_ms: None,
                migrated_job: None,
            },
        }
    }

    #[test]
    fn notifying_never_waits_even_when_nothing_delivers() {
        let url = parse_url("http://127.0.0.1:9/").expect("url");
        let (notifier, sender) = Notifier::new(vec![url], poster());
        let started = std::time::Instant::now();
        // Nobody drains the queue: past its capacity, notices are dropped, not waited for.
        for id in 0..(QUEUE as u64 * 4) {
            notifier.notify(notice(id));
        }
        assert!(started.elapsed() < Duration::from_secs(1));
        drop(sender);
    }

    #[tokio::test]
    async fn a_webhook_that_is_down_is_retried_with_backoff_then_given_up() {
        // A port nothing listens on: every attempt is refused at once.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url =
            parse_url(&format!("http://{}/", listener.local_addr().expect("addr"))).expect("url");
        drop(listener);
        let started = std::time::Instant::now();
        deliver(&poster(), &url, b"{}", 1, Duration::from_millis(20)).await;
        // It waited 20 + 40 + 80 + 160 ms between its five refused attempts, then gave up.
        assert!(
            started.elapsed() >= Duration::from_millis(300),
            "{:?}",
            started.elapsed()
        );
    }
}
