//! Webhooks: where the leader posts a job's state changes (start, end, failure, requeue). A
//! tenant's webhook hears about every job of the tenant; a job's own (`JobSpec::notify`) about
//! that job, and only at the origin of its tenant's webhook: an admin decides where the
//! cluster's requests may go, a user does not turn the leader into a client of any address.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The longest webhook URL.
pub const MAX_URL_LEN: usize = 2048;

/// A change of a job's state a webhook can hear about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NotifyEvent {
    /// A run started.
    Start,
    /// The job ended without failing: it succeeded, or it was cancelled.
    End,
    /// The job failed.
    Failure,
    /// A run ended and the job is pending again (retried, evicted, requeued, its node lost).
    Requeue,
}

impl NotifyEvent {
    pub const ALL: [NotifyEvent; 4] = [
        NotifyEvent::Start,
        NotifyEvent::End,
        NotifyEvent::Failure,
        NotifyEvent::Requeue,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NotifyEvent::Start => "start",
            NotifyEvent::End => "end",
            NotifyEvent::Failure => "failure",
            NotifyEvent::Requeue => "requeue",
        }
    }
}

impl fmt::Display for NotifyEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for NotifyEvent {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        NotifyEvent::ALL
            .into_iter()
            .find(|e| e.as_str() == s)
            .ok_or_else(|| format!("unknown event {s:?} (start, end, failure, requeue)"))
    }
}

/// Where to post, and which events (none named: all).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Webhook {
    pub url: String,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub events: BTreeSet<NotifyEvent>,
}

impl Webhook {
    /// Whether it asked to hear about `event`.
    pub fn wants(&self, event: NotifyEvent) -> bool {
        self.events.is_empty() || self.events.contains(&event)
    }

    /// What `apply` and the API check: an http(s) URL with a host, printable, bounded, with
    /// no credentials in it (they would be replicated in plain text).
    pub fn validate(&self) -> Result<(), String> {
        let url = &self.url;
        if url.is_empty() || url.len() > MAX_URL_LEN {
            return Err(format!(
                "a webhook URL must be 1..={MAX_URL_LEN} characters"
            ));
        }
        if url.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(format!(
                "webhook URL {url:?} has spaces or control characters"
            ));
        }
        let origin = origin(url);
        let authority = (origin.as_deref())
            .and_then(|o| o.split_once("://"))
            .map(|(_, a)| a)
            .filter(|a| !a.is_empty())
            .ok_or_else(|| {
                format!("webhook URL {url:?} must be http:// or https:// with a host")
            })?;
        if authority.contains('@') {
            return Err(format!(
                "webhook URL {url:?} must not carry credentials: the receiver checks the signature instead"
            ));
        }
        Ok(())
    }
}

/// `scheme://authority` of an http(s) URL, lower-cased scheme; `None` for any other URL.
pub fn origin(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "http" && scheme != "https" {
        return None;
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    Some(format!("{scheme}://{}", rest[..end].to_ascii_lowercase()))
}

/// A job's webhook may only post where its tenant's does (the same origin); `tenant_hook` is
/// the tenant's webhook, if it has one.
pub fn check_job_webhook(job_hook: &Webhook, tenant_hook: Option<&Webhook>) -> Result<(), String> {
    job_hook.validate()?;
    let allowed = tenant_hook.and_then(|t| origin(&t.url));
    if allowed.is_some() && allowed == origin(&job_hook.url) {
        return Ok(());
    }
    Err(match allowed {
        None => "a job's webhook must be at its tenant's webhook origin, and the tenant has no webhook (an admin sets one: gpuctl tenant update --webhook URL)".into(),
        Some(o) => format!("a job's webhook must be at its tenant's webhook origin {o}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(url: &str) -> Webhook {
        Webhook {
            url: url.into(),
            events: BTreeSet::new(),
        }
    }

    #[test]
    fn only_http_urls_with_a_host_and_no_credentials() {
        for good in [
            "https://hooks.example/x",
            "http://10.0.0.9:8080",
            "HTTPS://h/p?q#f",
        ] {
            assert!(hook(good).validate().is_ok(), "{good}");
        }
        for bad in [
            "ftp://hooks.example/x",
            "file:///etc/passwd",
            "https://",
            "hooks.example/x",
            "https://user:pw@hooks.example/x",
            "https://hooks.example/a b",
            "",
        ] {
            assert!(hook(bad).validate().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_jobs_webhook_stays_at_its_tenants_origin() {
        let tenant = hook("https://Hooks.example:8443/gpumesh");
        assert!(
            check_job_webhook(&hook("https://hooks.example:8443/mine?x=1"), Some(&tenant)).is_ok()
        );
        for elsewhere in [
            "https://hooks.example/mine",
            "http://hooks.example:8443/mine",
            "https://hooks.example:8443.evil/x",
            "https://169.254.169.254/latest",
        ] {
            assert!(
                check_job_webhook(&hook(elsewhere), Some(&tenant)).is_err(),
                "{elsewhere}"
            );
        }
        let none =
            check_job_webhook(&hook("https://hooks.example/x"), None).expect_err("no tenant hook");
        assert!(none.contains("tenant update --webhook"), "{none}");
    }

    #[test]
    fn events_parse_and_an_empty_list_wants_all() {
        assert_eq!("failure".parse(), Ok(NotifyEvent::Failure));
        assert!("BEGIN".parse::<NotifyEvent>().is_err());
        let h = hook("https://h");
        assert!(NotifyEvent::ALL.iter().all(|e| h.wants(*e)));
        let only = Webhook {
            events: BTreeSet::from([NotifyEvent::End]),
            ..h
        };
        assert!(only.wants(NotifyEvent::End) && !only.wants(NotifyEvent::Start));
    }
}
