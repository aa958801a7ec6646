//! Per-identity request rate limits: one token bucket per key (a token id for authenticated
//! callers, `source:<ip>` for refused ones). Pure: the caller passes the time.

use std::collections::HashMap;
use std::time::{Duration, Instant};

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
pub struct RateLimiter {
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
    pub fn new(per_second: u32, burst: u32) -> Self {
        Self {
            per_second: f64::from(per_second),
            burst: f64::from(burst.max(1)),
            buckets: HashMap::new(),
            last_sweep: None,
        }
    }

    pub fn check(&mut self, key: &str, now: Instant) -> Verdict {
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
}
