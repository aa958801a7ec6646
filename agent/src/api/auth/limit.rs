//! Request rate limits: one token bucket per key. An authenticated request passes three
//! (`CallerLimits`): its token's, its tenant's and its source address's; refusals of
//! unauthenticated requests are logged at a rate per source address. Pure: the caller passes
//! the time.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::config::ApiSettings;

/// Buckets idle this long are forgotten (the map cannot grow without bound).
const FORGET_AFTER: Duration = Duration::from_secs(60);

/// A key's refusals are audited at most once per this long: a flood is one audit entry even
/// when the bucket lets a request through now and then in the middle of it.
const AUDIT_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    /// Over the limit; `first` is true for the first refusal of the key in `AUDIT_EVERY` (so a
    /// flood is audited once, not once per request).
    Limited {
        first: bool,
    },
}

#[derive(Debug)]
struct RateLimiter {
    per_second: f64,
    burst: f64,
    buckets: HashMap<String, Bucket>,
    last_sweep: Option<Instant>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
    /// When a refusal of this key was last reported as `first`.
    audited_at: Option<Instant>,
}

impl RateLimiter {
    /// `per_second` sustained, up to `burst` at once. Zero `per_second` disables limiting.
    fn new(per_second: u32, burst: u32) -> Self {
        Self {
            per_second: f64::from(per_second),
            burst: f64::from(burst.max(1)),
            buckets: HashMap::new(),
            last_sweep: None,
        }
    }

    fn check(&mut self, key: &str, now: Instant) -> Verdict {
        if self.per_second == 0.0 {
            return Verdict::Allowed;
        }
        self.sweep(now);
        let (per_second, burst) = (self.per_second, self.burst);
        let bucket = self.buckets.entry(key.to_owned()).or_insert(Bucket {
            tokens: burst,
            at: now,
            audited_at: None,
        });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * per_second).min(burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Verdict::Allowed
        } else {
            let first = bucket
                .audited_at
                .is_none_or(|t| now.saturating_duration_since(t) >= AUDIT_EVERY);
            if first {
                bucket.audited_at = Some(now);
            }
            Verdict::Limited { first }
        }
    }

    fn sweep(&mut self, now: Instant) {
        if self
            .last_sweep
            .is_some_and(|t| now.saturating_duration_since(t) < FORGET_AFTER)
        {
            return;
        }
        self.last_sweep = Some(now);
        self.buckets
            .retain(|_, b| now.saturating_duration_since(b.at) < FORGET_AFTER);
    }
}

/// The buckets of the API: an authenticated request is checked against its token's, its
/// tenant's (every token of the tenant together: minting tokens buys no more) and its source
/// address's (every token used from one host together); `refusals` paces the log lines of
/// refused unauthenticated requests per source address.
#[derive(Debug)]
pub struct Limits {
    token: RateLimiter,
    tenant: RateLimiter,
    source: RateLimiter,
    refusals: RateLimiter,
}

/// Which limit a request went over, and whether this is the first refusal of its flood.
#[derive(Debug, PartialEq, Eq)]
pub struct Over {
    pub limit: String,
    pub first: bool,
}

impl Limits {
    pub fn new(api: &ApiSettings) -> Self {
        let doubled = |rate: u32| RateLimiter::new(rate, rate.saturating_mul(2));
        Self {
            token: RateLimiter::new(api.requests_per_second, api.burst),
            tenant: doubled(api.tenant_requests_per_second),
            source: doubled(api.source_requests_per_second),
            refusals: RateLimiter::new(api.requests_per_second, api.burst),
        }
    }

    /// An authenticated request of `token` (of `tenant`, if scoped to one) from `host`.
    pub fn caller(
        &mut self,
        token: &str,
        tenant: Option<&str>,
        host: &str,
        now: Instant,
    ) -> Result<(), Over> {
        let over = |limit: String, verdict| match verdict {
            Verdict::Allowed => Ok(()),
            Verdict::Limited { first } => Err(Over { limit, first }),
        };
        over(format!("token {token}"), self.token.check(token, now))?;
        if let Some(tenant) = tenant {
            over(format!("tenant {tenant}"), self.tenant.check(tenant, now))?;
        }
        over(format!("source {host}"), self.source.check(host, now))
    }

    /// A refused unauthenticated request from `host`: whether to log it.
    pub fn refusal(&mut self, host: &str, now: Instant) -> Verdict {
        self.refusals.check(host, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_sustained_rate_per_key() {
        let mut l = RateLimiter::new(10, 5);
        let t0 = Instant::now();
        for _ in 0..5 {
            assert_eq!(l.check("a", t0), Verdict::Allowed);
        }
        assert_eq!(l.check("a", t0), Verdict::Limited { first: true });
        assert_eq!(l.check("a", t0), Verdict::Limited { first: false });
        assert_eq!(l.check("b", t0), Verdict::Allowed, "keys are independent");
        // 10/s: one more request every 100 ms; the refusals around it are the same flood.
        let t1 = t0 + Duration::from_millis(100);
        assert_eq!(l.check("a", t1), Verdict::Allowed);
        assert_eq!(l.check("a", t1), Verdict::Limited { first: false });
        // Once `AUDIT_EVERY` has passed, a refusal is audited again.
        let later = t0 + AUDIT_EVERY;
        for _ in 0..5 {
            assert_eq!(l.check("a", later), Verdict::Allowed);
        }
        assert_eq!(l.check("a", later), Verdict::Limited { first: true });
        // Refilling never exceeds the burst.
        let t2 = later + Duration::from_secs(60);
        for _ in 0..5 {
            assert_eq!(l.check("a", t2), Verdict::Allowed);
        }
        assert!(matches!(l.check("a", t2), Verdict::Limited { .. }));
    }

    #[test]
    fn zero_disables_and_idle_keys_are_forgotten() {
        let mut off = RateLimiter::new(0, 0);
        let t0 = Instant::now();
        for _ in 0..1000 {
            assert_eq!(off.check("a", t0), Verdict::Allowed);
        }
        let mut l = RateLimiter::new(1, 1);
        for i in 0..100 {
            l.check(&format!("k{i}"), t0);
        }
        l.check("x", t0 + Duration::from_secs(120));
        assert_eq!(l.buckets.len(), 1);
    }

    #[test]
    fn a_tenant_and_a_source_are_limited_across_their_tokens() {
        let api = ApiSettings {
            requests_per_second: 10,
            burst: 10,
            tenant_requests_per_second: 3,
            source_requests_per_second: 5,
            max_array_tasks: 1,
            webhook_ca_file: None,
        };
        let t0 = Instant::now();
        let mut l = Limits::new(&api);
        // Tenant "a": 6 at once (a burst of twice its rate), whichever of its tokens asks.
        for i in 0..6 {
            assert_eq!(l.caller(&format!("t{i}"), Some("a"), "h1", t0), Ok(()));
        }
        let over = l.caller("t9", Some("a"), "h1", t0).expect_err("tenant a");
        assert_eq!(over.limit, "tenant a");
        // The source: 10 at once from h1 across tokens and tenants (6 already, 1 refused
        // by its tenant before reaching the source's bucket).
        for i in 0..4 {
            assert_eq!(l.caller(&format!("u{i}"), None, "h1", t0), Ok(()));
        }
        let over = l.caller("u9", None, "h1", t0).expect_err("source h1");
        assert_eq!((over.limit.as_str(), over.first), ("source h1", true));
        assert_eq!(l.caller("u9", None, "h2", t0), Ok(()), "another host");
        let off = ApiSettings {
            tenant_requests_per_second: 0,
            source_requests_per_second: 0,
            ..api
        };
        let mut l = Limits::new(&off);
        for _ in 0..10 {
            assert_eq!(l.caller("t", Some("a"), "h", t0), Ok(()));
        }
        assert_eq!(
            l.caller("t", Some("a"), "h", t0).expect_err("token").limit,
            "token t"
        );
    }
}
